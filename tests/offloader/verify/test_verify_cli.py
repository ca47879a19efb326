"""``offloader verify`` in a real process: exit 0 when every promise holds, 1 with one line
per breach (or the JSON document), 2 with one error line when it cannot run."""

from __future__ import annotations

import json

import pytest

from fixtures.backends import make_topic, produce_ledgers
from fixtures.cli import run_cli
from fixtures.verify import healthy_topics
from offloader.runtime import Runtime

pytestmark = pytest.mark.parametrize("backend_settings", ["fs-sqlite"], indirect=True)

COUNTS = {
    "stores",
    "ledgers",
    "segments",
    "objects_listed",
    "referenced",
    "awaiting_sweep",
    "foreign",
    "stale_uploads",
    "blocks_read",
    "entries_checked",
}


def test_all_promises_kept_exit_0(runtime: Runtime) -> None:
    healthy_topics(runtime, streamed=False)
    make_topic(runtime, "other")
    done = run_cli(runtime.settings, "verify", ok=False)
    assert (done.returncode, done.stderr) == (0, "")
    (line,) = done.stdout.splitlines()
    assert line.startswith("ok: 2 topic(s), 2 ledgers, 0 segments, 12 entries readable")
    done = run_cli(runtime.settings, "verify", "--deep", "--json", ok=False)
    assert (done.returncode, done.stderr) == (0, "")
    document = json.loads(done.stdout)
    assert (document["ok"], document["deep"], document["breaches"]) == (True, True, [])
    assert set(document["counts"]) == COUNTS and document["counts"]["blocks_read"] == 2


def test_breaches_exit_1_one_line_each(runtime: Runtime) -> None:
    healthy_topics(runtime, streamed=False)
    make_topic(runtime, "other")
    produce_ledgers(runtime, "other", [(3, 100)])
    victim = next(x for x in runtime.metadata.list_ledgers("orders", live=True))
    assert victim.data_key is not None
    runtime.objects.delete_many([victim.data_key])
    orphan = "0b1c2d3e-4f50-4a6b-8c7d-9e0f1a2b3c4d-ledger-7"
    runtime.objects.put(orphan, b"nobody's")
    done = run_cli(runtime.settings, "verify", ok=False)
    assert (done.returncode, done.stderr) == (1, "")
    lines = done.stdout.splitlines()
    assert len(lines) == 3, done.stdout
    assert sorted(line.split(":")[0] for line in lines) == [
        "missing_object",
        "orphan",
        "unreadable",
    ]
    assert any(orphan in line for line in lines)
    assert any(victim.data_key in line and line.startswith("missing_object") for line in lines)

    done = run_cli(runtime.settings, "verify", "--json", ok=False)
    assert (done.returncode, done.stderr) == (1, "")
    document = json.loads(done.stdout)
    assert document["ok"] is False and document["deep"] is False
    assert set(document["counts"]) == COUNTS
    assert len(document["breaches"]) == 3
    for breach in document["breaches"]:
        assert {"kind", "message", "topic", "key"} <= set(breach)
    missing = next(b for b in document["breaches"] if b["kind"] == "missing_object")
    assert (missing["topic"], missing["key"], missing["ledger_id"]) == (
        "orders",
        victim.data_key,
        victim.ledger_id,
    )
    orphaned = next(b for b in document["breaches"] if b["kind"] == "orphan")
    assert (orphaned["topic"], orphaned["key"]) == (None, orphan)

    # --topic narrows the topics' promises; an orphan belongs to no topic and is still found
    done = run_cli(runtime.settings, "verify", "--topic", "other", ok=False)
    assert done.returncode == 1 and done.stdout.splitlines() == [
        line for line in lines if line.startswith("orphan")
    ]
    runtime.objects.delete_many([orphan])
    done = run_cli(runtime.settings, "verify", "--topic", "other", ok=False)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.startswith("ok: 1 topic(s), 1 ledgers")


def test_an_unknown_topic_or_no_database_is_exit_2(runtime: Runtime) -> None:
    healthy_topics(runtime, streamed=False)
    done = run_cli(runtime.settings, "verify", "--topic", "nope", ok=False)
    assert (done.returncode, done.stdout) == (2, "")
    (line,) = done.stderr.splitlines()
    assert line.startswith("error: ") and "'nope'" in line
    down = {"OFFLOADER_METADATA_URL": "postgresql+psycopg://nobody@127.0.0.1:1/none"}
    done = run_cli(runtime.settings, "verify", env=down, ok=False)
    assert (done.returncode, done.stdout) == (2, "")
    (line,) = done.stderr.splitlines()
    assert line.startswith("error: ")
