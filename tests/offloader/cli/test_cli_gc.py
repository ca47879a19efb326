"""`offloader gc [--limit N]` and the deletion backlog in `offloader status`, in a real
process on the embedded default."""

from __future__ import annotations

from pathlib import Path

import pytest

from fixtures.cli import assert_one_line_error, run_cli, run_cli_json, upgraded_data_dir
from fixtures.metadata import pending_deletions, retry_deletion_later
from offloader.runtime import Runtime
from offloader.settings import Settings


def queue(data_dir: Path, keys: list[str]) -> list[int]:
    """Queue keys of the default store (none of them exist: each counts as deleted)."""
    with Runtime.open(Settings(data_dir=data_dir)) as rt:
        rt.metadata.deletions.enqueue(keys, "test", store_id=rt.stores.default_id())
        return [d.id for d in pending_deletions(rt.metadata)]


def test_gc_limit_bounds_the_pass_and_reports_the_backlog(tmp_path: Path) -> None:
    d = upgraded_data_dir(tmp_path / "data")
    queue(d, ["a", "b", "c"])
    first = run_cli_json(d, "gc", "--limit", "2")
    assert (first["deleted"], first["failed"], first["remaining"]) == (2, 0, 1)
    assert first["backlog"]["pending"] == 1 and first["backlog"]["failing"] == []
    assert first["backlog"]["oldest_age_ms"] >= 0
    text = run_cli(d, "gc").stdout
    assert text.startswith(
        "deleted 1, failed 0, pending 0 (1 delete requests); 0 trimmed ledgers now deleted\n"
    )
    assert "deletion backlog: 0 pending (0 due), oldest -, 0 failing (>= 5 tries)" in text


def test_status_shows_items_that_keep_failing_with_their_last_error(tmp_path: Path) -> None:
    d = upgraded_data_dir(tmp_path / "data")
    queue(d, ["stuck", "fine"])
    with Runtime.open(Settings(data_dir=d)) as rt:
        stuck = next(x for x in pending_deletions(rt.metadata) if x.object_key == "stuck")
        for _ in range(2):
            retry_deletion_later(rt.metadata, stuck, "AccessDenied", 0)
    env = {"OFFLOADER_GC_FAILING_TRIES": "2"}
    status = run_cli_json(d, "status", env=env)["deletion_backlog"]
    assert (status["pending"], status["failing_count"], status["failing_tries"]) == (2, 1, 2)
    (failing,) = status["failing"]
    assert (failing["object_key"], failing["tries"], failing["last_error"]) == (
        "stuck",
        2,
        "AccessDenied",
    )
    text = run_cli(d, "status", env=env).stdout
    assert "deletion backlog: 2 pending (2 due)" in text
    assert "  failing: stuck (store 1, 2 tries): AccessDenied" in text


@pytest.mark.parametrize(
    ("args", "env", "fragments"),
    [
        (("gc", "--limit", "0"), {}, ("--limit", "positive integer", "'0'")),
        (("gc", "--limit", "many"), {}, ("--limit", "'many'")),
        (
            ("gc",),
            {"OFFLOADER_GC_BATCH_KEYS": "1001"},
            ("OFFLOADER_GC_BATCH_KEYS", "less than or equal to 1000"),
        ),
        (
            ("status",),
            {"OFFLOADER_GC_FAILING_TRIES": "0"},
            ("OFFLOADER_GC_FAILING_TRIES", "greater than or equal to 1"),
        ),
    ],
)
def test_bad_gc_input_is_one_line_and_changes_nothing(
    tmp_path: Path, args: tuple[str, ...], env: dict[str, str], fragments: tuple[str, ...]
) -> None:
    d = upgraded_data_dir(tmp_path / "data")
    ids = queue(d, ["a"])
    assert_one_line_error(run_cli(d, *args, env=env, ok=False), *fragments)
    with Runtime.open(Settings(data_dir=d)) as rt:
        assert [(x.id, x.tries) for x in pending_deletions(rt.metadata)] == [(ids[0], 0)]
