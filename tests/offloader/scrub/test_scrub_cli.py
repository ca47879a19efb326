"""``offloader scrub`` in a real process: the report on stdout (text or JSON) and in a file,
and damage left over is the report followed by one error line and exit status 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fixtures.cli import run_cli
from fixtures.scrub import DAMAGES, offloaded_topic
from offloader.runtime import Runtime

pytestmark = pytest.mark.parametrize("backend_settings", ["fs-sqlite"], indirect=True)


def test_a_clean_store_exits_0_with_its_report(runtime: Runtime, tmp_path: Path) -> None:
    ledgers = offloaded_topic(runtime)
    path = tmp_path / "report.json"
    done = run_cli(runtime.settings, "scrub", "--json", "--report", str(path), ok=False)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    report = json.loads(done.stdout)
    assert report == json.loads(path.read_text())
    assert report["counts"]["ledgers"] == 3 and report["counts"]["entries"] == 790
    assert (report["failed"], report["damaged_ledgers"], report["repair"]) == (False, [], True)
    text = run_cli(runtime.settings, "scrub", "orders", ok=False)
    assert text.returncode == 0
    assert text.stdout.startswith(f"scrubbed {len(ledgers)} ledgers: 6 objects, 4 blocks, ")


def test_damage_left_is_the_report_then_one_error_line(runtime: Runtime) -> None:
    victim = offloaded_topic(runtime)[1]
    planted = DAMAGES["truncated-data-object"](runtime, victim)
    before = runtime.metadata.get_ledger("orders", victim.ledger_id)
    done = run_cli(runtime.settings, "scrub", "--dry-run", "--json", ok=False)
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        f"error: scrub found 1 damaged ledger(s) it did not repair: orders/{victim.ledger_id} "
        "(not-repaired)"
    ]
    report = json.loads(done.stdout)
    assert report["failed"] is True and report["repair"] is False
    (ledger,) = report["damaged_ledgers"]
    assert (ledger["ledger_id"], ledger["action"], ledger["failed"]) == (
        victim.ledger_id,
        "not-repaired",
        True,
    )
    assert ledger["findings"][0] == {
        "key": planted.key,
        "offset": planted.offset,
        "kind": "truncated",
        "reason": ledger["findings"][0]["reason"],
    }
    assert planted.reason in ledger["findings"][0]["reason"]
    assert runtime.metadata.get_ledger("orders", victim.ledger_id) == before
    text = run_cli(runtime.settings, "scrub", "--no-repair", ok=False)
    assert text.returncode == 2 and f"orders/{victim.ledger_id} (" in text.stdout
    repaired = run_cli(runtime.settings, "scrub", "--json", ok=False)
    assert repaired.returncode == 0, repaired.stderr
    (ledger,) = json.loads(repaired.stdout)["damaged_ledgers"]
    assert ledger["action"] == "repaired" and ledger["replaced_by"]


def test_an_unknown_topic_is_one_line_and_exit_2(runtime: Runtime) -> None:
    offloaded_topic(runtime, "audit", [(5, 10)])
    done = run_cli(runtime.settings, "scrub", "audit", "nope", ok=False)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines() == ["error: topic 'nope' does not exist"]


def test_a_report_path_that_cannot_be_written_is_refused_first(
    runtime: Runtime, tmp_path: Path
) -> None:
    """A bad ``--report`` is one error line before anything is read or repaired."""
    victim = offloaded_topic(runtime)[1]
    DAMAGES["truncated-data-object"](runtime, victim)
    before = runtime.metadata.get_ledger("orders", victim.ledger_id)
    done = run_cli(runtime.settings, "scrub", "--report", str(tmp_path), ok=False)  # a directory
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines() == [
        f"error: scrub report {str(tmp_path)!r} is a directory: name a file"
    ]
    assert runtime.metadata.get_ledger("orders", victim.ledger_id) == before  # not repaired


def test_a_report_in_a_missing_directory_is_refused_and_nothing_made(
    runtime: Runtime, tmp_path: Path
) -> None:
    """`scrub --report DIR/x.json` into a missing DIR: one line naming DIR, exit 2, no
    directory made, nothing repaired."""
    victim = offloaded_topic(runtime)[1]
    DAMAGES["truncated-data-object"](runtime, victim)
    before = runtime.metadata.get_ledger("orders", victim.ledger_id)
    target = tmp_path / "missing" / "deeper" / "x.json"
    done = run_cli(runtime.settings, "scrub", "--report", str(target), ok=False)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines() == [
        f"error: scrub report {str(target)!r}: the directory {str(target.parent)!r} does not exist"
    ]
    assert not (tmp_path / "missing").exists()
    assert runtime.metadata.get_ledger("orders", victim.ledger_id) == before  # not repaired


def test_a_damaged_segment_left_names_its_ledgers_and_exits_2(runtime: Runtime) -> None:
    from fixtures.streamed import (
        flip_a_payload_byte,
        ledgers_by_segment,
        shared_segment,
        streamed_topic,
    )
    from offloader.offload.hot_deletion import delete_hot_copies

    streamed_topic(runtime, "events", 6)
    delete_hot_copies(runtime.metadata, runtime.hot, "events")
    victim = shared_segment(runtime, "events")
    ids = sorted(ledgers_by_segment(runtime, "events")[victim.segment_id])
    flip_a_payload_byte(runtime, victim)
    done = run_cli(runtime.settings, "scrub", "--json", "events", ok=False)
    assert done.returncode == 2
    named = ", ".join(f"events/{n} (no-hot-copy)" for n in ids)
    assert done.stderr.splitlines() == [
        f"error: scrub found {len(ids)} damaged ledger(s) it did not repair: {named}"
    ]
    (entry,) = json.loads(done.stdout)["damaged_ledgers"]
    assert [x["ledger_id"] for x in entry["ledgers"]] == ids


@pytest.mark.parametrize("role", ["data", "index"])
def test_a_corrupt_store_header_is_reported_damaged_and_repaired(
    runtime: Runtime, role: str
) -> None:
    """A filesystem-store object whose own header (the metadata JSON before the bytes) is
    damaged used to end the scrub with a raw JSONDecodeError from ``stat``: it is a damaged
    object, reported as such and replaced from the hot copy."""
    victim = offloaded_topic(runtime)[1]
    key = victim.data_key if role == "data" else victim.index_key
    assert key is not None
    path = runtime.objects.root / key  # type: ignore[attr-defined]
    raw = bytearray(path.read_bytes())
    raw[9] ^= 0xFF  # the first byte of the header's JSON: no longer valid UTF-8 JSON
    path.write_bytes(bytes(raw))
    done = run_cli(runtime.settings, "scrub", "--dry-run", "--json", ok=False)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.splitlines()) == 1
    (ledger,) = json.loads(done.stdout)["damaged_ledgers"]
    (finding,) = [f for f in ledger["findings"] if f["key"] == key]
    kind = "damaged-block" if role == "data" else "damaged-index"
    assert finding["kind"] == kind and f"{role} object damaged" in finding["reason"]
    assert "damaged header metadata" in finding["reason"]
    repaired = run_cli(runtime.settings, "scrub", "--json", ok=False)
    assert repaired.returncode == 0, repaired.stderr
    (ledger,) = json.loads(repaired.stdout)["damaged_ledgers"]
    assert ledger["action"] == "repaired"
