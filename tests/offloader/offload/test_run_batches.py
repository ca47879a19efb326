"""Planning an offload run (parameters, batches, the age rule) and offloading one batch.

Complements test_runs.py: parameters are checked before anything is read, each batch
reports exactly the bytes of its ledgers, and a batch is offloaded ledger by ledger.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fixtures.backends import make_topic, produce_ledgers
from fixtures.databases import upgraded
from offloader.offload.ledger_offloader import Outcome
from offloader.offload.runs import Batch, offload_batch, plan_batches
from offloader.params import RunParamsError
from offloader.runtime import Runtime
from offloader.settings import Settings


@pytest.fixture
def rt(tmp_path: Path) -> Runtime:  # type: ignore[misc]
    with Runtime.open(upgraded(Settings(data_dir=tmp_path / "data"))) as runtime:
        make_topic(runtime, "a")
        produce_ledgers(runtime, "a", [(10, 1000)] * 5)
        yield runtime


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"topic": 5}, RunParamsError, "topic: 5 is not of type 'null', 'string'"),
        ({"up_to": True}, RunParamsError, "up_to_ledger: True is not of type 'null', 'integer'"),
        ({"up_to": "3"}, RunParamsError, "up_to_ledger: '3' is not of type 'null', 'integer'"),
        ({"batch_size": None}, RunParamsError, "batch_size: None is not of type 'integer'"),
        ({"batch_bytes": 1.5}, RunParamsError, "batch_bytes: 1.5 is not of type 'null', 'integer'"),
    ],
)
def test_bad_run_params_are_named_before_anything_is_read(
    rt: Runtime, kwargs: dict, error: type[Exception], message: str
) -> None:
    args = {"topic": "a", "up_to": 3, "batch_size": 10, "batch_bytes": None, **kwargs}
    with pytest.raises(error) as raised:
        plan_batches(rt.metadata, **args)
    assert str(raised.value) == message


def test_up_to_ledger_zero_is_valid_and_takes_nothing(rt: Runtime) -> None:
    assert plan_batches(rt.metadata, "a", 0, batch_size=10) == []


def test_each_batch_reports_exactly_the_bytes_of_its_ledgers(rt: Runtime) -> None:
    sizes = {x.ledger_id: x.size_bytes for x in rt.metadata.list_ledgers("a")}
    for batch_bytes in (None, sizes[1] + sizes[2], 1):
        batches = plan_batches(rt.metadata, "a", 99, batch_size=2, batch_bytes=batch_bytes)
        assert [i for b in batches for i in b.ledger_ids] == [1, 2, 3, 4, 5]
        for batch in batches:
            assert batch.bytes == sum(sizes[i] for i in batch.ledger_ids)


def test_the_age_rule_plans_with_the_current_time(rt: Runtime) -> None:
    topic = rt.metadata.get_topic("a")
    rt.metadata.set_policy(topic, topic.policy.updated({"offload_age_seconds": 0}))
    batches = plan_batches(rt.metadata, "a", None, batch_size=3)
    assert [b.ledger_ids for b in batches] == [[1, 2, 3], [4, 5]]
    rt.metadata.set_policy(
        rt.metadata.get_topic("a"), topic.policy.updated({"offload_age_seconds": 3600})
    )
    assert plan_batches(rt.metadata, "a", None, batch_size=3) == []


def test_a_batch_is_a_plain_dict_for_xcom() -> None:
    assert Batch("a", [1, 2], 300).to_json() == {"topic": "a", "ledger_ids": [1, 2], "bytes": 300}


def test_offload_batch_offloads_each_ledger_in_order(runtime: Runtime) -> None:
    make_topic(runtime, "b")
    ids = produce_ledgers(runtime, "b", [(5, 100)] * 3)
    results = offload_batch(runtime, "b", [ids[2], ids[0]])
    assert [(r.topic, r.ledger_id, r.outcome) for r in results] == [
        ("b", ids[2], Outcome.OFFLOADED),
        ("b", ids[0], Outcome.OFFLOADED),
    ]
    offloaded = {x.ledger_id for x in runtime.metadata.list_ledgers("b") if x.is_offloaded}
    assert offloaded == {ids[0], ids[2]}
