"""A retention run's request (the `retention` DAG's Params), in-process: the checks that need
the metadata, and the run itself (the model's own rules: test_retention_params.py). Every
refusal changes nothing."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from fixtures.backends import make_topic, produce_ledgers
from fixtures.retention import mixed_topic
from offloader.exceptions import NotFoundError
from offloader.metadata import Position
from offloader.retention.cuts import take_cut
from offloader.retention.params import RetentionParams
from offloader.retention.request import check_request, override_policy, run_request
from offloader.retention.run import RetentionResult
from offloader.retention.trim import TrimResult, delete_topic
from offloader.runtime import Runtime


def test_override_policy_is_validated_as_a_whole(runtime: Runtime) -> None:
    mixed_topic(runtime)
    policy = runtime.metadata.get_topic("orders").policy
    assert override_policy(policy, RetentionParams(topic="orders")) is None
    kept = override_policy(policy, RetentionParams(topic="orders", retention_size_bytes=10**9))
    assert kept is not None and kept.retention_size_bytes == 10**9
    assert kept.offload_threshold_bytes == policy.offload_threshold_bytes
    low = (policy.offload_threshold_bytes or 0) // 2
    with pytest.raises(ValidationError, match=r"must be below retention_size_bytes .*PIP-17"):
        override_policy(
            policy.updated({"offload_threshold_bytes": low * 2 or 10}),
            RetentionParams(topic="orders", retention_size_bytes=low),
        )


def test_check_request_names_the_topics_the_run_acts_on(runtime: Runtime) -> None:
    mixed_topic(runtime, "orders")
    mixed_topic(runtime, "payments")
    assert check_request(runtime, RetentionParams()) == ["orders", "payments"]
    assert check_request(runtime, RetentionParams(topic="payments")) == ["payments"]
    start = runtime.metadata.get_topic("orders").start
    cut = take_cut(runtime, "orders")
    trim = RetentionParams(topic="orders", cut_id=cut.cut_id)
    assert check_request(runtime, trim) == ["orders"]
    assert runtime.metadata.get_topic("orders").start == start  # checked by a dry run


def test_check_request_leaves_out_deleted_topics_and_refuses_them(runtime: Runtime) -> None:
    mixed_topic(runtime, "orders")
    mixed_topic(runtime, "payments")
    delete_topic(runtime, "payments")
    assert check_request(runtime, RetentionParams()) == ["orders"]
    with pytest.raises(ValueError, match=r"^topic 'payments' was deleted$"):
        check_request(runtime, RetentionParams(topic="payments"))


@pytest.mark.parametrize(
    ("fields", "error", "message"),
    [
        ({"topic": "nope"}, NotFoundError, "nope"),
        ({"topic": "orders", "position": "99:0"}, ValueError, "beyond the end of topic"),
        ({"topic": "orders", "cut_id": 99}, NotFoundError, "99"),
        ({"topic": "orders", "retention_size_bytes": 1}, ValidationError, "PIP-17"),
    ],
)
def test_check_request_refuses_what_the_metadata_rules_out_and_changes_nothing(
    runtime: Runtime, fields: dict[str, object], error: type[Exception], message: str
) -> None:
    mixed_topic(runtime)
    topic = runtime.metadata.get_topic("orders")
    topic = runtime.metadata.set_policy(
        topic, topic.policy.updated({"offload_threshold_bytes": 1000})
    )
    before = runtime.metadata.list_ledgers("orders")
    with pytest.raises(error, match=message):
        check_request(runtime, RetentionParams(**fields))
    assert runtime.metadata.list_ledgers("orders") == before
    assert runtime.metadata.get_topic("orders") == topic


def test_run_request_trims_at_the_position_or_only_reports_it(runtime: Runtime) -> None:
    ids = mixed_topic(runtime)
    start = runtime.metadata.get_topic("orders").start
    dry = run_request(
        runtime,
        RetentionParams(topic="orders", position=f"{ids[2]}:0", dry_run=True),
        "orders",
        None,
    )
    assert isinstance(dry, TrimResult) and dry.dry_run
    assert dry.ledgers_deleting == ids[:2]
    assert runtime.metadata.get_topic("orders").start == start
    done = run_request(
        runtime, RetentionParams(topic="orders", position=f"{ids[2]}:0"), "orders", None
    )
    assert isinstance(done, TrimResult) and not done.dry_run and done.changed
    assert done.ledgers_deleting == ids[:2]
    assert runtime.metadata.get_topic("orders").start == Position(ledger_id=ids[2], entry_id=0)


def test_run_request_applies_the_policy_with_the_runs_override(runtime: Runtime) -> None:
    make_topic(runtime)
    ids = []
    for _ in range(3):  # a cut after each ledger: the size policy picks among them
        ids += produce_ledgers(runtime, "orders", [(4, 3000)])
        end = take_cut(runtime, "orders")
    # no override: the topic keeps everything
    plain = run_request(runtime, RetentionParams(topic="orders", dry_run=True), "orders", end)
    assert isinstance(plain, RetentionResult) and plain.chosen is None and plain.dry_run
    # keep at least one byte: the cut after the second ledger is the least that does
    keep_one = RetentionParams(topic="orders", retention_size_bytes=1)
    done = run_request(runtime, keep_one, "orders", end)
    assert isinstance(done, RetentionResult) and done.changed and not done.dry_run
    assert done.end == end
    assert done.trim is not None and done.trim.ledgers_deleting == ids[:2]
    assert runtime.metadata.get_topic("orders").start == Position(ledger_id=ids[2], entry_id=0)
    # the override was for this run only
    assert runtime.metadata.get_topic("orders").policy.retention_size_bytes is None


def test_run_request_trims_at_the_cut_of_its_topic(runtime: Runtime) -> None:
    ids = mixed_topic(runtime)
    cut = take_cut(runtime, "orders")
    done = run_request(runtime, RetentionParams(topic="orders", cut_id=cut.cut_id), "orders", None)
    assert isinstance(done, TrimResult) and done.changed
    assert (done.start_after, done.ledgers_deleting) == (cut.position, ids)
    assert runtime.metadata.get_topic("orders").start == cut.position
