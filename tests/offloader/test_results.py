"""Every run result and report has one shape (offloader/results.py): ``to_json()`` is a
JSON-ready dict (what ``--json`` prints and an operator returns), ``str()`` the text for
people; and the list below is every such class of the library."""

from __future__ import annotations

import dataclasses
import datetime
import enum
import importlib
import inspect
import json
import pkgutil
from collections.abc import Callable
from typing import Any

import pytest
from pydantic import BaseModel

import offloader
from offloader.bulk.manifest import BulkExportResult, ExportManifest, ManifestFile
from offloader.bulk.plan import ExportPlan, ExportSlice
from offloader.gc.deletion_queue import DeletionPass, DrainResult
from offloader.gc.run import GcRun
from offloader.gc.stores import Retired, StoreStatus
from offloader.gc.sweep import Orphan, StaleUpload, StoreSweep, SweepResult
from offloader.metadata.locations import StoreUsage
from offloader.metadata.records import Deletion, DeletionBacklog, Position, StreamCut, TopicTiers
from offloader.metadata.snapshot import ExportResult, SnapshotInfo
from offloader.metrics.service_levels import ServiceLevelBreach, ServiceLevelReport
from offloader.objectstore.location import StoreLocation
from offloader.offload.hot_deletion import HotDeletion
from offloader.offload.outcome import OffloadResult, Outcome
from offloader.offload.runs import Batch, TopicOffloadResult
from offloader.read.topic_reader import Checksum
from offloader.recovery.rebuild import RebuildResult
from offloader.results import RunResult, jsonable
from offloader.retention.policy import RetentionBounds
from offloader.retention.run import RetentionResult
from offloader.retention.trim import TrimResult
from offloader.rewrite.report import PLANNED, REWRITTEN, GroupResult, RewriteReport
from offloader.scrub.check import Finding, FindingKind
from offloader.scrub.report import Action, Counts, LedgerRepair, LedgerVerdict, ScrubReport
from offloader.status import StatusReport
from offloader.stream.offloader import StreamPassResult
from offloader.stream.runs import StreamTopicResult
from offloader.verify import Breach, BreachKind, VerifyCounts, VerifyReport

STORE = StoreLocation("s3", "bucket", "tiered/", "http://127.0.0.1:8333")
UUID = "4b0c9e0e-8f3c-4a47-9b4e-0d6f0c5a1e2f"
SEGMENT = "0f9a3c1e-2b4d-4e6f-8a0b-1c2d3e4f5a6b"


def _deletion(n: int) -> Deletion:
    return Deletion(
        id=n,
        object_key=f"{UUID}-ledger-{n}",
        reason="retention",
        attempt_id=UUID,
        state="pending",
        enqueued_ms=1_700_000_000_000,
        tries=7,
        next_try_ms=1_700_000_600_000,
        last_error="SlowDown: reduce your request rate",
        done_ms=None,
        store_id=1,
        topic="orders",
        ledger_id=n,
    )


BACKLOG = DeletionBacklog(
    pending=12,
    due=4,
    oldest_enqueued_ms=1_700_000_000_000,
    oldest_age_ms=93_000,
    failing_tries=5,
    failing_count=3,
    failing=[_deletion(3), _deletion(4)],
)
PASSED = StreamPassResult(
    topic="orders",
    epoch=3,
    committed=[SEGMENT],
    parts_uploaded=4,
    bytes_uploaded=21_000_000,
    settled_ledgers=[7, 8],
    open_segment="5d1e0c2b-3a4f-4b6c-9d8e-7f6a5b4c3d2e",
    offloaded_to="9:120",
    waiting_bytes=4096,
)
OFFLOADED = [
    OffloadResult("orders", 7, Outcome.OFFLOADED, UUID, 1_048_576, 0.5),
    OffloadResult("orders", 8, Outcome.IN_PROGRESS),
]
TRIM = TrimResult(
    topic="orders",
    start_before=Position(ledger_id=0, entry_id=0),
    start_after=Position(ledger_id=9, entry_id=0),
    ledgers_deleting=list(range(1, 25)),
    queued_keys=48,
    hot_deleted=[1, 2],
    changed=True,
)
END = StreamCut(
    topic="orders", cut_id=6, ledger_id=9, entry_id=120, created_ms=1_700_000_000, offset_bytes=9000
)
CHOSEN = StreamCut(
    topic="orders", cut_id=4, ledger_id=9, entry_id=0, created_ms=1_699_000_000, offset_bytes=7000
)
FINDING = Finding("orders", 7, f"{UUID}-ledger-7", 4096, FindingKind.DAMAGED_BLOCK, "bad CRC")
GROUP = GroupResult(
    topic="orders",
    kind="ledger",
    ledgers=[3, 4, 5],
    sources=3,
    objects_before=6,
    bytes_before=3000,
    outcome=REWRITTEN,
    objects_after=2,
    bytes_after=3000,
    segment_id=SEGMENT,
)
SNAPSHOT = SnapshotInfo(
    key="_metadata/snapshots/20261206T101010Z-1a2b3c.json.gz",
    created_ms=1_700_000_000_000,
    revision="0007",
    sha256="ab" * 32,
    bytes=20_480,
    rows={"topics": 2, "ledgers": 40},
)
MANIFEST = ExportManifest(
    export_id="daily",
    attempt="a1",
    root="a1/",
    created_ms=1_700_000_000_000,
    params={"topics": ["orders"]},
    files=[
        ManifestFile(
            path=f"topic=orders/ledger={n}/{n}-0-99.parquet",
            topic="orders",
            ledger_id=n,
            first_entry_id=0,
            last_entry_id=99,
            rows=100,
            bytes=5000,
            sha256="cd" * 32,
        )
        for n in (7, 8)
    ],
)
SLICE = ExportSlice("orders", 7, 0, 99, f"{UUID}-ledger-7", f"{UUID}-ledger-7-index", 199, STORE, 1)


#: One realistic instance (or several) of every run result and report class.
EXAMPLES: dict[type, list[Callable[[], Any]]] = {
    Batch: [lambda: Batch("orders", [7, 8], 2_097_152)],
    OffloadResult: [lambda: OFFLOADED[0]],
    TopicOffloadResult: [
        lambda: TopicOffloadResult("orders", OFFLOADED, [HotDeletion("orders", 5, 1024)], 1.25),
        lambda: TopicOffloadResult("orders", [], [], 0.0),
    ],
    StreamPassResult: [lambda: PASSED, lambda: StreamPassResult(topic="orders", epoch=1)],
    StreamTopicResult: [lambda: StreamTopicResult(PASSED, [5, 6])],
    DeletionPass: [lambda: DeletionPass(40, 2, 12, 3, BACKLOG)],
    DrainResult: [lambda: DrainResult(3, 40, 2, 5, 12.345, "drained", False, BACKLOG)],
    GcRun: [
        lambda: GcRun(DeletionPass(40, 2, 12, 3, BACKLOG), 2, [SEGMENT]),
        lambda: GcRun(DrainResult(0, 0, 0, 0, 0.0, "dry run", True, BACKLOG), 0, []),
    ],
    SweepResult: [
        lambda: SweepResult(
            dry_run=True,
            grace_seconds=3600.0,
            multipart_max_age_seconds=86400.0,
            stores=[
                StoreSweep(
                    1,
                    str(STORE),
                    listed=10,
                    referenced=7,
                    foreign=1,
                    orphans=2,
                    orphan_bytes=300,
                    stale_uploads=1,
                    objects=[Orphan(f"{UUID}-ledger-9", 100, 7200.0)],
                    uploads=[StaleUpload(f"{SEGMENT}", "upload-1", 90000.0)],
                ),
                StoreSweep(2, "file:///gone", error="ObjectStoreError: no such directory"),
            ],
        ),
        lambda: SweepResult(False, 3600.0, 86400.0, []),
    ],
    TrimResult: [
        lambda: TRIM,
        lambda: dataclasses.replace(TRIM, ledgers_deleting=[1, 2], hot_deleted=[], dry_run=True),
        lambda: dataclasses.replace(
            TRIM, ledgers_deleting=[], queued_keys=0, hot_deleted=[], changed=False
        ),
    ],
    RetentionResult: [
        lambda: RetentionResult(
            "orders", END, RetentionBounds(1_699_500_000, 8000), CHOSEN, 2000, TRIM, False
        ),
        lambda: RetentionResult("orders", END, RetentionBounds(None, None), None, None, None, True),
    ],
    ScrubReport: [
        lambda: ScrubReport(
            topics=["orders"],
            repair=True,
            started_ms=1_700_000_000_000,
            finished_ms=1_700_000_060_000,
            counts=Counts(ledgers=3, objects=6, blocks=30, bytes=3_000_000, entries=300),
            damaged=[
                LedgerVerdict(
                    "orders", 7, UUID, Action.REPAIRED, "offloaded again", (FINDING,), "new-uuid"
                ),
                LedgerVerdict(
                    "orders",
                    8,
                    SEGMENT,
                    Action.NO_HOT_COPY,
                    "segment damaged",
                    (FINDING,),
                    ledgers=(LedgerRepair(8, Action.NO_HOT_COPY, "hot copy deleted"),),
                ),
            ],
        )
    ],
    GroupResult: [lambda: GROUP],
    RewriteReport: [
        lambda: RewriteReport("compact", False, [GROUP], left=2, recovered=[SEGMENT]),
        lambda: RewriteReport(
            "to-v2", True, [GroupResult("orders", "ledger", [], 0, 0, 0, PLANNED)]
        ),
    ],
    ExportPlan: [lambda: ExportPlan([SLICE], 1, 20_000, [("orders", 9)], [])],
    BulkExportResult: [
        lambda: BulkExportResult(MANIFEST),
        lambda: BulkExportResult(MANIFEST, "s3://bucket/exports"),
    ],
    SnapshotInfo: [lambda: SNAPSHOT],
    ExportResult: [
        lambda: ExportResult(SNAPSHOT, [SNAPSHOT.key], ["_metadata/snapshots/old.json.gz"])
    ],
    RebuildResult: [
        lambda: RebuildResult(["orders"], 40, [f"{UUID}-ledger-3-index: no data object"], 2, 6),
        lambda: RebuildResult(["a", "b"], 3, ["x-index: no data object", "y-index: bad magic"]),
    ],
    Checksum: [lambda: Checksum("ef" * 32, 300, 3_000_000)],
    StatusReport: [
        lambda: StatusReport(
            metadata_url="postgresql://offloader:***@db/offloader",
            object_store="s3://bucket/tiered",
            ledger_dir="/var/lib/offloader/ledgers",
            counts={"topics": 2, "ledgers": 40, "pending_deletions": 12},
            deletion_backlog=BACKLOG,
            tiers=[
                TopicTiers(
                    topic="orders",
                    state="active",
                    hot_ledgers=3,
                    hot_bytes=3000,
                    offloaded_ledgers=37,
                    offloaded_bytes=37_000,
                    pending_deletions=12,
                    oldest_pending_deletion_ms=1_700_000_000_000,
                )
            ],
        )
    ],
}

BREACH = Breach(
    BreachKind.MISSING_OBJECT,
    f"ledger orders/7: object {UUID}-ledger-7 is missing from {STORE}",
    topic="orders",
    key=f"{UUID}-ledger-7",
    ledger_id=7,
    store=str(STORE),
)
EXAMPLES[Breach] = [
    lambda: BREACH,
    lambda: Breach(BreachKind.STORE_UNAVAILABLE, "store file:///gone could not be listed"),
]
EXAMPLES[VerifyReport] = [
    lambda: VerifyReport(
        deep=True,
        topics=["orders"],
        breaches=[
            BREACH,
            Breach(BreachKind.ORPHAN, f"object {UUID}-ledger-9 is recorded nowhere"),
        ],
        counts=VerifyCounts(stores=1, ledgers=3, objects_listed=7, blocks_read=12),
    ),
    lambda: VerifyReport(deep=False, topics=["orders", "s"], counts=VerifyCounts(ledgers=5)),
]
LEVEL_BREACH = ServiceLevelBreach(
    "orders",
    "max_offload_lag_seconds",
    7260.0,
    3600.0,
    "topic orders: offload lag 7260 s exceeds max_offload_lag_seconds 3600 (3 ledgers, "
    "12.0 MiB not offloaded)",
)
EXAMPLES[ServiceLevelBreach] = [lambda: LEVEL_BREACH]
EXAMPLES[ServiceLevelReport] = [
    lambda: ServiceLevelReport(1_000, ["orders", "events"], 3, [LEVEL_BREACH]),
    lambda: ServiceLevelReport(1_000, ["orders"], 0),
]

USAGE = StoreUsage(
    store_id=2,
    location="s3://old-bucket/tiered at http://127.0.0.1:9",
    retired=False,
    committed_ledgers=0,
    live_segments=0,
    started_attempts=0,
    queued_deletions=2,
)
EXAMPLES[StoreStatus] = [
    lambda: StoreStatus(USAGE, False, "object store s3://old-bucket/tiered is not reachable"),
    lambda: StoreStatus(USAGE.model_copy(update={"retired": True}), None),
    lambda: StoreStatus(USAGE.model_copy(update={"committed_ledgers": 4}), True),
]
EXAMPLES[Retired] = [lambda: Retired(2, USAGE.location, 2), lambda: Retired(3, "file:///x", 0)]

#: Classes named like results that are not run results: nothing prints or returns them.
NOT_RUN_RESULTS = {
    "offloader.objectstore.DeleteResult": "an object store's answer to one batch delete",
    "offloader.rewrite.to_v1.ToV1Result": "one ledger's migration, reported as a GroupResult",
    "offloader.rewrite.work.WorkResult": "a Spark executor's answer to the rewrite driver",
    "offloader.scrub.check.LedgerScrubResult": "an executor's reading, settled into ScrubReport",
    "offloader.status.TiersReport": "the tiered-storage view's model (pydantic, for the page)",
}
RESULT_NAMES = ("Result", "Report", "Pass", "Run", "Summary")


def _name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


CASES = [
    pytest.param(cls, make, id=f"{cls.__name__}-{i}")
    for cls, makers in EXAMPLES.items()
    for i, make in enumerate(makers)
]


@pytest.mark.parametrize(("cls", "make"), CASES)
def test_a_result_is_json_and_text(cls: type, make: Callable[[], Any]) -> None:
    result = make()
    assert type(result) is cls and isinstance(result, RunResult)
    document = result.to_json()
    assert isinstance(document, dict) and document
    # JSON-ready as it is: no tuple, enum, record or dataclass left to convert
    assert json.loads(json.dumps(document)) == document
    assert _plain(document)
    assert jsonable(result) == document == jsonable([result])[0]
    text = str(result)
    assert isinstance(text, str) and text.strip()
    assert "object at 0x" not in text and not text.startswith(type(result).__name__ + "(")


def _plain(value: Any) -> bool:
    if isinstance(value, dict):
        return all(type(k) is str and _plain(v) for k, v in value.items())
    if isinstance(value, list):
        return all(_plain(v) for v in value)
    return value is None or type(value) in (str, int, float, bool)


def _library_classes() -> list[type]:
    found = []
    for module in pkgutil.walk_packages(offloader.__path__, "offloader."):
        loaded = importlib.import_module(module.name)
        for _, cls in inspect.getmembers(loaded, inspect.isclass):
            if cls.__module__ == module.name:
                found.append(cls)
    return found


def _named_like_a_result(cls: type) -> bool:
    record = dataclasses.is_dataclass(cls) or issubclass(cls, BaseModel)
    return record and cls.__name__.endswith(RESULT_NAMES)


def test_every_run_result_of_the_library_is_listed() -> None:
    """A class named like a result (…Result, …Report, …Pass, …Run, …Summary), or one that
    has ``to_json``, conforms and has an example above, or is named as not a run result."""
    listed = {_name(cls) for cls in EXAMPLES}
    candidates = {
        _name(cls)
        for cls in _library_classes()
        if cls is not RunResult and (_named_like_a_result(cls) or "to_json" in vars(cls))
    }
    assert candidates - listed - set(NOT_RUN_RESULTS) == set()
    assert set(NOT_RUN_RESULTS) <= candidates - listed  # no stale exclusion
    assert all(dataclasses.is_dataclass(cls) for cls in EXAMPLES)


FAILING = (
    "deletion backlog: 12 pending (4 due), oldest 93s, 3 failing (>= 5 tries)\n"
    f"  failing: {UUID}-ledger-3 (store 1, 7 tries): SlowDown: reduce your request rate\n"
    f"  failing: {UUID}-ledger-4 (store 1, 7 tries): SlowDown: reduce your request rate\n"
    "  ... and 1 more"
)
PASS_TEXT = (
    "epoch 3: 4 parts, 21000000 bytes\n"
    f"segments committed: ['{SEGMENT}']; failed: -\n"
    "open segment: 5d1e0c2b-3a4f-4b6c-9d8e-7f6a5b4c3d2e, offloaded to 9:120, 4096 bytes "
    "waiting in the hot tier\n"
    "ledgers offloaded: [7, 8]"
)


@pytest.mark.parametrize(
    ("cls", "index", "text"),
    [
        (Batch, 0, "orders: ledgers [7, 8] (2097152 bytes)"),
        (
            TopicOffloadResult,
            0,
            "ledger 7: offloaded (1048576 bytes)\nledger 8: in-progress (0 bytes)\n"
            "hot copies deleted: [5]",
        ),
        (TopicOffloadResult, 1, "hot copies deleted: []"),
        (StreamPassResult, 0, PASS_TEXT),
        (
            StreamPassResult,
            1,
            "epoch 1: 0 parts, 0 bytes\nsegments committed: -; failed: -\n"
            "open segment: -, offloaded to -, 0 bytes waiting in the hot tier\n"
            "ledgers offloaded: -",
        ),
        (StreamTopicResult, 0, f"{PASS_TEXT}; hot copies deleted: [5, 6]"),
        (DeletionPass, 0, f"deleted 40, failed 2, pending 12 (3 delete requests)\n{FAILING}"),
        (
            DrainResult,
            0,
            "3 passes: deleted 40, failed 2 in 5 delete requests, 12.3s (stopped: drained)",
        ),
        (
            GcRun,
            0,
            "deleted 40, failed 2, pending 12 (3 delete requests); 2 trimmed ledgers now "
            f"deleted; dead rewrites recovered: {SEGMENT}\n{FAILING}",
        ),
        (
            GcRun,
            1,
            "0 passes: deleted 0, failed 0 in 0 delete requests, 0.0s (stopped: dry run); "
            "0 trimmed ledgers now deleted",
        ),
        (
            TrimResult,
            0,
            f"topic orders: start 0:0 -> 9:0; marked 24 ledgers deleting {list(range(1, 21))} "
            "..., 48 object keys queued, 2 hot copies removed",
        ),
        (
            TrimResult,
            1,
            "topic orders: start 0:0 -> 9:0; would mark 2 ledgers deleting [1, 2], 48 object "
            "keys queued",
        ),
        (
            TrimResult,
            2,
            "topic orders: start 0:0 -> 9:0; marked 0 ledgers deleting [], 0 object keys "
            "queued, 0 hot copies removed (nothing to do)",
        ),
        (
            ExportPlan,
            0,
            "1 ledgers (0 streamed) in 1 slices: 100 entries, 20000 bytes; 1 "
            "selected ledgers not offloaded",
        ),
        (BulkExportResult, 0, "export daily (attempt a1): 2 files, 200 rows, 10000 bytes"),
        (
            BulkExportResult,
            1,
            "export daily (attempt a1) at s3://bucket/exports: 2 files, 200 rows, 10000 bytes",
        ),
        (SnapshotInfo, 0, f"{SNAPSHOT.key} (42 rows, revision 0007, sha256 {'ab' * 32})"),
        (
            ExportResult,
            0,
            f"wrote {SNAPSHOT.key} (20480 bytes, sha256 {'ab' * 32}, revision 0007); queued 1 "
            "older snapshot(s) for deletion",
        ),
        (
            RebuildResult,
            0,
            "rebuilt 1 topic(s), 40 offloaded ledger(s); skipped 1 index object(s):\n"
            f"  {UUID}-ledger-3-index: no data object",
        ),
        (
            RebuildResult,
            1,
            "rebuilt 2 topic(s), 3 offloaded ledger(s); skipped 2 index object(s):\n"
            "  x-index: no data object\n  y-index: bad magic",
        ),
        (Checksum, 0, f"{'ef' * 32}  300 entries, 3000000 bytes"),
        (
            StatusReport,
            0,
            "metadata_url: postgresql://offloader:***@db/offloader\n"
            "object_store: s3://bucket/tiered\nledger_dir: /var/lib/offloader/ledgers\n"
            "topics: 2\nledgers: 40\npending_deletions: 12\n"
            "topic orders: hot 3 ledger(s) 3000 B, offloaded 37 ledger(s) 37000 B, 12 "
            f"deletion(s) pending\n{FAILING}",
        ),
        (
            VerifyReport,
            0,
            f"missing_object: ledger orders/7: object {UUID}-ledger-7 is missing from {STORE}\n"
            f"orphan: object {UUID}-ledger-9 is recorded nowhere",
        ),
        (
            VerifyReport,
            1,
            "ok: 2 topic(s), 5 ledgers, 0 segments, 0 entries readable, 0 objects listed in 0 "
            "store(s) (0 awaiting the sweep, 0 foreign, 0 stale uploads)",
        ),
        (Breach, 1, "store_unavailable: store file:///gone could not be listed"),
        (ServiceLevelReport, 0, LEVEL_BREACH.message),
        (ServiceLevelReport, 1, "ok: 0 service level(s) met on 1 topic(s)"),
    ],
)
def test_the_text_of_a_result(cls: type, index: int, text: str) -> None:
    """What the CLI prints, and a task logs, of the results whose text was the CLI's or an
    operator's before (their other callers check it too: tests/offloader/cli)."""
    assert str(EXAMPLES[cls][index]()) == text


def test_the_json_of_a_result_adds_what_it_derives() -> None:
    offload, nothing = (make() for make in EXAMPLES[TopicOffloadResult])
    assert {k: offload.to_json()[k] for k in ("bytes", "seconds", "mb_per_second")} == {
        "bytes": 1_048_576,
        "seconds": 1.25,
        "mb_per_second": 0.84,
    }
    assert nothing.to_json()["mb_per_second"] is None
    assert TopicOffloadResult("t", OFFLOADED, [], 0.0004).to_json()["seconds"] == 0.0
    published, at = (make().to_json() for make in EXAMPLES[BulkExportResult])
    assert at == {**published, "output": "s3://bucket/exports"}
    assert published == {
        "export_id": "daily",
        "attempt": "a1",
        "files": 2,
        "rows": 200,
        "bytes": 10_000,
        "ledgers": 2,
    }
    swept = EXAMPLES[SweepResult][0]().to_json()
    assert swept["orphans"] == 2 and [s["store_id"] for s in swept["stores"]] == [1, 2]
    run = EXAMPLES[GcRun][0]()
    assert run.to_json() == {
        **run.drained.to_json(),
        "ledgers_deleted": 2,
        "rewrites_recovered": [SEGMENT],
    }
    assert run.to_json()["backlog"]["failing"][0]["object_key"] == f"{UUID}-ledger-3"
    assert TRIM.to_json()["start_after"] == {"ledger_id": 9, "entry_id": 0}
    assert EXAMPLES[StreamTopicResult][0]().to_json() == {**PASSED.to_json(), "hot_deleted": [5, 6]}
    assert OFFLOADED[0].to_json()["outcome"] == "offloaded"
    status = EXAMPLES[StatusReport][0]().to_json()
    assert list(status)[:6] == [
        "metadata_url",
        "object_store",
        "ledger_dir",
        "topics",
        "ledgers",
        "pending_deletions",
    ]
    assert status["deletion_backlog"]["pending"] == 12 and status["tiers"][0]["topic"] == "orders"


class _Tier(enum.Enum):
    HOT = "hot"


class _Record(BaseModel):
    at: datetime.datetime
    tier: _Tier
    tags: frozenset[str]


def test_jsonable_converts_what_it_finds_inside_containers_and_models() -> None:
    """A pydantic record in its JSON mode (a datetime as ISO text, an enum as its value, a
    set as a list), dict keys as text and values converted, tuples as lists."""
    at = datetime.datetime(2026, 12, 6, 23, 0, tzinfo=datetime.UTC)
    record = _Record(at=at, tier=_Tier.HOT, tags=frozenset({"x"}))
    value = {7: (_Tier.HOT, record), "plain": [1, "two", None]}
    assert jsonable(value) == {
        "7": ["hot", {"at": "2026-12-06T23:00:00Z", "tier": "hot", "tags": ["x"]}],
        "plain": [1, "two", None],
    }


def test_a_topics_offload_as_json_and_its_rate() -> None:
    """The document ``offloader offload --json`` prints per topic; the rate is decimal MB/s,
    rounded to two places, for any run that took time (under a second too)."""
    offload = EXAMPLES[TopicOffloadResult][0]()
    assert offload.to_json() == {
        "topic": "orders",
        "results": [r.to_json() for r in OFFLOADED],
        "hot_deleted": [{"topic": "orders", "ledger_id": 5, "bytes": 1024}],
        "bytes": 1_048_576,
        "seconds": 1.25,
        "mb_per_second": 0.84,
    }
    moved = OffloadResult("orders", 7, Outcome.OFFLOADED, UUID, 12_500_001, 0.5)
    assert TopicOffloadResult("t", [moved], [], 100.0).to_json()["mb_per_second"] == 0.13
    assert TopicOffloadResult("t", [moved], [], 0.5).to_json()["mb_per_second"] == 25.0


def test_texts_at_their_edges() -> None:
    """A trim lists at most 20 ledgers and says when there are more; a streaming step with
    no hot copy deleted says so; a GC run names every dead rewrite it recovered."""
    twenty = dataclasses.replace(TRIM, ledgers_deleting=list(range(1, 21)))
    assert f"deleting {list(range(1, 21))}, 48" in str(twenty)
    more = dataclasses.replace(TRIM, ledgers_deleting=list(range(1, 22)))
    assert f"deleting {list(range(1, 21))} ..., 48" in str(more)
    assert str(StreamTopicResult(PASSED, [])).endswith("; hot copies deleted: -")
    run = GcRun(DeletionPass(40, 2, 12, 3, BACKLOG), 2, ["a", "b"])
    assert "; 2 trimmed ledgers now deleted; dead rewrites recovered: a, b\n" in str(run)
