"""Cutting a run's due ledgers into batches, and the run summary."""

from __future__ import annotations

from pathlib import Path

import pytest

from fixtures.backends import make_topic, produce_ledgers
from fixtures.databases import upgraded
from offloader.exceptions import NotFoundError
from offloader.offload.ledger_offloader import OffloadResult, Outcome
from offloader.offload.runs import plan_batches, summarize
from offloader.runtime import Runtime
from offloader.settings import Settings


@pytest.fixture
def rt(tmp_path: Path) -> Runtime:  # type: ignore[misc]
    with Runtime.open(upgraded(Settings(data_dir=tmp_path / "data"))) as runtime:
        make_topic(runtime, "a")
        make_topic(runtime, "b")
        produce_ledgers(runtime, "a", [(10, 1000)] * 5)  # ~5 kB ledgers
        produce_ledgers(runtime, "b", [(2, 1000)] * 2)
        yield runtime


def shape(batches) -> list[tuple[str, list[int]]]:  # type: ignore[no-untyped-def]
    return [(b.topic, b.ledger_ids) for b in batches]


def test_batches_by_count_per_topic(rt: Runtime) -> None:
    batches = plan_batches(rt.metadata, None, 99, batch_size=2)
    assert shape(batches) == [("a", [1, 2]), ("a", [3, 4]), ("a", [5]), ("b", [1, 2])]
    assert shape(plan_batches(rt.metadata, "b", 99, batch_size=10)) == [("b", [1, 2])]
    assert plan_batches(rt.metadata, "a", None, batch_size=10) == []  # no rule makes any due


def test_batches_by_bytes_give_a_large_ledger_its_own_task(rt: Runtime) -> None:
    sizes = {x.ledger_id: x.size_bytes for x in rt.metadata.list_ledgers("a")}
    limit = sizes[1] + sizes[2]  # two ledgers fit, a third would not
    batches = plan_batches(rt.metadata, "a", 99, batch_size=100, batch_bytes=limit)
    assert shape(batches) == [("a", [1, 2]), ("a", [3, 4]), ("a", [5])]
    assert all(b.bytes <= limit for b in batches)
    tiny = plan_batches(rt.metadata, "a", 99, batch_size=100, batch_bytes=1)
    assert shape(tiny) == [("a", [i]) for i in range(1, 6)]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"up_to": -1}, "up_to_ledger: -1 is less than the minimum of 0"),
        ({"batch_size": 0}, "batch_size: 0 is less than the minimum of 1"),
        ({"batch_size": True}, "batch_size: True is not of type 'integer'"),
        ({"batch_bytes": 0}, "batch_bytes: 0 is less than the minimum of 1"),
    ],
)
def test_bad_run_params_are_named(rt: Runtime, kwargs, message) -> None:
    args = {"topic": "a", "up_to": 3, "batch_size": 10, **kwargs}
    with pytest.raises(ValueError, match=message):
        plan_batches(
            rt.metadata, args["topic"], args["up_to"], args["batch_size"], args.get("batch_bytes")
        )


def test_unknown_topic_is_named(rt: Runtime) -> None:
    with pytest.raises(NotFoundError, match="'nope'"):
        plan_batches(rt.metadata, "nope", None, 10)


def test_summary_counts_outcomes_and_throughput() -> None:
    results = [
        OffloadResult("a", 1, Outcome.OFFLOADED, "x", 2_000_000, 1.0),
        OffloadResult("a", 2, Outcome.RECOVERED, "y", 1_000_000, 0.0),
        OffloadResult("a", 3, Outcome.ALREADY_OFFLOADED, "z"),
    ]
    summary = summarize(results, seconds=2.0)
    assert summary["ledgers"] == 3 and summary["offloaded"] == 2
    assert summary["bytes"] == 3_000_000 and summary["mb_per_second"] == 1.5
    assert summary["outcomes"] == {"offloaded": 1, "recovered": 1, "already-offloaded": 1}
