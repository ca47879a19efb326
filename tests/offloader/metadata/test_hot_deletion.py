"""Hot deletion in the metadata store: an offloaded ledger's hot copy marked deleting, then
deleted, by CAS, on SQLite and PostgreSQL (the ``metadata_url`` fixture): the fields each
step writes and the exact errors.

While a replacement is in flight: test_replacement.py; the deletion lag on the database's
clock: test_metadata_clock.py; the library's pass: tests/offloader/offload/test_hot_deletion.py.
"""

from __future__ import annotations

import pytest

from fixtures.metadata import begin, sealed_ledger
from offloader.exceptions import CommitFailedError
from offloader.metadata import HotState, MetadataStore, now_ms


def test_hot_copy_is_marked_before_it_is_deleted(store: MetadataStore) -> None:
    ledger = sealed_ledger(store)
    with pytest.raises(ValueError, match="not offloaded"):
        store.mark_hot_deleting(ledger)
    ledger, attempt = begin(store, ledger, "a1")
    ledger = store.attempts.commit(attempt, 1)
    marked = store.mark_hot_deleting(ledger)
    assert marked.hot_state is HotState.DELETING
    with pytest.raises(CommitFailedError):
        store.mark_hot_deleting(ledger)
    assert store.mark_hot_deleted(marked).hot_state is HotState.DELETED


def test_a_stale_ledger_version_is_named(store: MetadataStore) -> None:
    ledger = sealed_ledger(store)
    _, attempt = begin(store, ledger, "a1")
    offloaded = store.attempts.commit(attempt, 1)
    deleting = store.mark_hot_deleting(offloaded)
    with pytest.raises(CommitFailedError) as raised:
        store.mark_hot_deleting(offloaded)
    assert str(raised.value) == (
        f"ledger t/{ledger.ledger_id} changed since version {offloaded.version}: someone else moved"
    )
    store.mark_hot_deleted(deleting)  # the plain CAS of a ledger row names it the same way
    with pytest.raises(CommitFailedError) as raised:
        store.mark_hot_deleted(deleting)
    assert str(raised.value) == (
        f"ledger t/{ledger.ledger_id} changed since version {deleting.version}: someone else moved"
    )


def test_hot_copies_are_marked_with_their_deletion_time(store: MetadataStore) -> None:
    ledger = sealed_ledger(store)
    with pytest.raises(ValueError) as raised:
        store.mark_hot_deleting(ledger)
    assert str(raised.value) == (
        f"ledger t/{ledger.ledger_id} is not offloaded; its hot copy is the only one"
    )
    ledger, attempt = begin(store, ledger, "a1")
    marked = store.mark_hot_deleting(store.attempts.commit(attempt, 1))
    assert (marked.hot_state, marked.hot_deleted_ms) == (HotState.DELETING, None)
    before = now_ms()
    deleted = store.mark_hot_deleted(marked)
    assert deleted.hot_state is HotState.DELETED
    assert deleted.hot_deleted_ms is not None and before <= deleted.hot_deleted_ms <= now_ms()
    assert deleted.version == marked.version + 1
