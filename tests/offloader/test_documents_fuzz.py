"""Fuzzing the readers of documents that come from outside the process: the metadata
snapshot manifest and snapshot lines, the bulk export manifest, a segment part's block
table (metadata JSON), a scrub report read back, the filesystem store's object header,
and every run's params (a DAG's form, an XCom, the CLI). Inputs: arbitrary bytes, JSON of
any shape, and valid documents with bytes damaged or one field set to any JSON value.
Every reader returns what was written or raises its own clear error (``fixtures/
fuzzing.py``); run params that are accepted hold integers a database column can store.

Each property runs in a short form (CI) and a ``long`` one (docs/TESTING.md, "Fuzzing").
"""

from __future__ import annotations

import gzip
import hashlib
import json
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import example
from hypothesis import strategies as st
from pydantic import BaseModel

from fixtures.fuzzing import damaged, damages, extremes, fuzz_forms, outcome
from offloader.bulk.manifest import ExportManifest, ManifestFile
from offloader.bulk.params import ExportParams
from offloader.exceptions import CorruptObjectError, FormatError, ObjectStoreError
from offloader.format import BlockRef, ChunkRef, SegmentBlockRef
from offloader.gc.params import GcParams
from offloader.keys import MANIFEST_KEY
from offloader.metadata.migrate import head_revision
from offloader.metadata.snapshot import SnapshotError, SnapshotInfo, _verify, read_manifest
from offloader.objectstore.filesystem import FilesystemObjectStore
from offloader.offload.params import OffloadRunParams
from offloader.params import RunParams
from offloader.retention.params import RetentionParams
from offloader.rewrite.params import RewriteParams
from offloader.scrub.output import read_report_at
from offloader.scrub.params import ScrubParams
from offloader.settings import Settings
from offloader.stream.blocks_json import dump_blocks, load_blocks
from offloader.stream.params import StreamRunParams

JSON = st.recursive(
    st.none() | st.booleans() | extremes | st.floats() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
DEEP = b"[" * 100_000  # nested past any recursion limit


def as_json(value: Any) -> bytes:
    return json.dumps(value, allow_nan=True).encode()


@st.composite
def edited(draw: st.DrawFn, document: Any) -> bytes:
    """``document`` as JSON bytes with one drawn damage: any JSON at all, a field (at any
    depth) replaced by any JSON value, or the bytes damaged."""
    kind = draw(st.sampled_from(["any", "field", "bytes"]))
    if kind == "any":
        return as_json(draw(JSON))
    if kind == "bytes":
        return damaged(as_json(document), draw(damages))
    doc = json.loads(json.dumps(document))
    node = doc
    while True:
        keys = list(node) if isinstance(node, dict) else list(range(len(node)))
        if not keys:
            break
        key = draw(st.sampled_from(keys))
        if isinstance(node[key], dict | list) and node[key] and draw(st.booleans()):
            node = node[key]
            continue
        node[key] = draw(JSON)
        break
    return as_json(doc)


# --- metadata snapshot manifest -------------------------------------------------------------
INFO = SnapshotInfo("_metadata/snapshots/1-x.jsonl.gz", 1, "abc", "0" * 64, 10, {"topics": 2})
MANIFEST = {
    "format": "offloader-metadata-snapshot",
    "format_version": 1,
    "snapshots": [INFO.to_json(), INFO.to_json()],
}


@example(DEEP)  # found: RecursionError leaked
@example(as_json({**MANIFEST, "snapshots": [{"key": "k"}]}))  # found: TypeError leaked
@example(b"\xff")  # found: UnicodeDecodeError leaked
@example(b"[]")  # found: AttributeError leaked
def snapshot_manifest_is_read_or_refused(raw: bytes) -> None:
    """The manifest a restore starts from: its snapshots, or SnapshotError."""
    with tempfile.TemporaryDirectory() as root:
        store = FilesystemObjectStore(Path(root))
        store.put(MANIFEST_KEY, raw)
        got = outcome(lambda: read_manifest(store), (SnapshotError,), size=len(raw))
    if raw == as_json(MANIFEST):
        assert got == [INFO, INFO]
    if isinstance(got, list):
        assert all(isinstance(s.created_ms, int) and isinstance(s.rows, dict) for s in got)


test_snapshot_manifest, test_snapshot_manifest_long = fuzz_forms(edited(MANIFEST))(
    snapshot_manifest_is_read_or_refused
)


# --- metadata snapshot lines ----------------------------------------------------------------
def snapshot_lines(items: list[Any], *, seal: bool) -> bytes:
    """A gzip'd snapshot of ``items`` (header, rows: objects, or bytes of a line as they
    are), its end line with the lines' SHA-256 and row counts when ``seal`` (a writer
    that sealed what it framed wrong)."""
    lines = [
        x.replace(b"\n", b" ") + b"\n"
        if isinstance(x, bytes)
        else json.dumps(x, separators=(",", ":"), sort_keys=True).encode() + b"\n"
        for x in items
    ]
    body = b"".join(lines)
    if seal:
        rows: dict[str, int] = {}
        for x in items[1:]:
            if isinstance(x, dict) and isinstance(x.get("t"), str):
                rows[x["t"]] = rows.get(x["t"], 0) + 1
        end = {"end": True, "rows": rows, "sha256": hashlib.sha256(body).hexdigest()}
        body += json.dumps(end).encode() + b"\n"
    return gzip.compress(body, mtime=0)


HEADER = {
    "format": "offloader-metadata-snapshot",
    "format_version": 1,
    "revision": head_revision(),
    "created_ms": 5,
    "tables": {"topics": ["topic_id", "name"]},
}
ROWS = [{"t": "topics", "r": [1, "a"]}, {"t": "topics", "r": [2, "b"]}]


@st.composite
def snapshots(draw: st.DrawFn) -> bytes:
    """A snapshot with one line replaced by any JSON or one field edited, resealed (so the
    checks behind the checksum are reached), or the gzip'd bytes damaged."""
    items: list[Any] = [HEADER, *ROWS]
    if draw(st.booleans()):
        return damaged(snapshot_lines(items, seal=True), draw(damages))
    at = draw(st.integers(0, len(items)))
    if at == len(items):
        items.append(draw(JSON))
    else:
        items[at] = draw(edited(items[at]))
    return snapshot_lines(items, seal=draw(st.booleans()))


def snapshot_is_verified_or_refused(raw: bytes) -> None:
    """A downloaded snapshot is checked whole before an import writes anything: its header
    and end line, or SnapshotError."""
    with tempfile.TemporaryDirectory() as root:
        path = Path(root) / "s.jsonl.gz"
        path.write_bytes(raw)
        got = outcome(lambda: _verify(path, "k", None), (SnapshotError,), size=len(raw))
    if raw == snapshot_lines([HEADER, *ROWS], seal=True):
        assert not isinstance(got, BaseException), got
    if isinstance(got, tuple):  # what an import reads next, there and of the right type
        header, trailer = got
        assert isinstance(header["created_ms"], int) and isinstance(header["tables"], dict)
        assert isinstance(trailer["sha256"], str)
        assert set(trailer["rows"]) <= set(header["tables"])


test_snapshot_lines, test_snapshot_lines_long = fuzz_forms(
    st.one_of(snapshots(), st.binary(max_size=200))
)(
    # found: a header without created_ms passed, and the import's KeyError followed
    example(snapshot_lines([{**HEADER, "created_ms": None}, *ROWS], seal=True))(
        # found: a row of a table the header does not name passed, and the load's KeyError
        example(snapshot_lines([HEADER, {"t": "x", "r": []}], seal=True))(
            example(snapshot_lines([HEADER, *ROWS], seal=True))(snapshot_is_verified_or_refused)
        )
    )
)


# --- bulk export manifest -------------------------------------------------------------------
EXPORT = ExportManifest(
    export_id="e",
    attempt="a",
    root="a/",
    created_ms=1,
    params={"topics": ["t"]},
    files=[
        ManifestFile(
            path="t/1.parquet",
            topic="t",
            ledger_id=1,
            first_entry_id=0,
            last_entry_id=9,
            rows=10,
            bytes=100,
            sha256="0" * 64,
        )
    ],
)


@example(DEEP)
def export_manifest_is_read_or_refused(raw: bytes) -> None:
    """An export's manifest, as a reader of the export reads it: the manifest, or a
    ValueError naming it."""
    got = outcome(lambda: ExportManifest.from_bytes(raw, "m.json"), (ValueError,), size=len(raw))
    if isinstance(got, ValueError):
        assert "m.json is not an export manifest" in str(got)
    elif raw == EXPORT.to_bytes():
        assert got == EXPORT


test_export_manifest, test_export_manifest_long = fuzz_forms(
    st.one_of(edited(EXPORT.model_dump(mode="json")), st.just(EXPORT.to_bytes()))
)(export_manifest_is_read_or_refused)


# --- a segment part's block table (metadata JSON) -------------------------------------------
BLOCKS = [
    SegmentBlockRef(3, BlockRef(1, 0, 300, 5, 77), (ChunkRef(5, 0, 300, 2, 88, True),)),
    SegmentBlockRef(4, BlockRef(1, 300, 200, 0, None), ()),
]


@example(DEEP)  # found: RecursionError leaked
@example(b"[[1,1,0,1,0,null,[[0,0,1,1,0]]]]")  # found: a chunk of 5 fields read as sound
@example(b'[[1,1,0,1,0,null,[[0,0,1,1,0,"x"]]]]')  # found: a string read as starts_block
@example(b"{}")  # found: an object read as an empty table
def block_table_is_read_or_refused(raw: bytes) -> None:
    """The block table a pass recorded with each part: exactly the blocks it holds (dumped
    again, the same JSON), or FormatError."""
    text = raw.decode("utf-8", errors="replace")
    got = outcome(lambda: load_blocks(text), (FormatError,), size=len(raw))
    if text == dump_blocks(BLOCKS):
        assert got == BLOCKS
    if isinstance(got, list):
        assert json.loads(dump_blocks(got)) == json.loads(text)
        for block in got:
            assert all(isinstance(c.starts_block, bool) for c in block.chunks)


test_block_table, test_block_table_long = fuzz_forms(
    st.one_of(edited(json.loads(dump_blocks(BLOCKS))), st.just(dump_blocks(BLOCKS).encode()))
)(block_table_is_read_or_refused)


# --- a scrub report read back -----------------------------------------------------------------
REPORT = {
    "counts": {"ledgers": 1},
    "failed": True,
    "repair": False,
    "damaged_ledgers": [
        {"topic": "t", "ledger_id": 1, "action": "not-repaired"},
        {"topic": "t", "ledger_id": None, "ledgers": [{"ledger_id": 2, "action": "no-hot-copy"}]},
    ],
}


@example(DEEP)  # found: RecursionError leaked
@example(b"\xff")  # found: UnicodeDecodeError leaked
@example(b"[]")  # found: a list where the operator reads report["counts"]
def scrub_report_is_read_or_refused(raw: bytes) -> None:
    """The report a Spark scrub leaves at its URL, as the operator reads it: the report
    with the fields the operator uses, or FormatError."""
    with tempfile.TemporaryDirectory() as root:
        path = Path(root) / "report.json"
        path.write_bytes(raw)
        settings = Settings(data_dir=Path(root))
        got = outcome(
            lambda: read_report_at(path.as_uri(), settings), (FormatError,), size=len(raw)
        )
    if not isinstance(got, BaseException):
        assert isinstance(got, dict) and isinstance(got["counts"], dict), got
        for v in got["damaged_ledgers"]:
            assert [(x["ledger_id"], x["action"]) for x in v.get("ledgers") or [v]]


test_scrub_report, test_scrub_report_long = fuzz_forms(
    st.one_of(edited(REPORT), st.just(as_json(REPORT)))
)(scrub_report_is_read_or_refused)


# --- the filesystem store's object header --------------------------------------------------
@example(b"OFSO\x01\x7f\xff\xff\xff{}")  # found: a claimed 2 GiB header was allocated
@example(b"OFSO\x01\x00\x00\x00\x02\xff}data")  # the scrub bug: a raw JSONDecodeError
@example(b"OFSO\x01\x00\x00\x00\x02[]data")  # JSON, but not an object of strings
def object_header_is_read_or_refused(raw: bytes) -> None:
    """A file under a filesystem store's root, whatever it holds: stat, get and a ranged
    read answer, or raise ObjectStoreError (CorruptObjectError for a damaged header);
    list skips it."""
    with tempfile.TemporaryDirectory() as root:
        store = FilesystemObjectStore(Path(root))
        (Path(root) / "obj").write_bytes(raw)
        for call in (
            lambda: store.stat("obj"),
            lambda: store.get("obj"),
            lambda: store.read_range("obj", 0, 4),
        ):
            got = outcome(call, (ObjectStoreError,), size=len(raw))
            if isinstance(got, ObjectStoreError):
                assert isinstance(got, CorruptObjectError), got
        outcome(lambda: list(store.list()), (ObjectStoreError,), size=len(raw))


header_bytes = st.one_of(
    st.binary(max_size=64),
    st.tuples(st.integers(0, 2**32 - 1), st.binary(max_size=64)).map(
        lambda t: b"OFSO\x01" + t[0].to_bytes(4, "big") + t[1]
    ),
    st.tuples(JSON, st.binary(max_size=16)).map(
        lambda t: b"OFSO\x01" + len(as_json(t[0])).to_bytes(4, "big") + as_json(t[0]) + t[1]
    ),
)
test_object_header, test_object_header_long = fuzz_forms(header_bytes)(
    object_header_is_read_or_refused
)


# --- run params (DAG forms, XCom, CLI) ---------------------------------------------------------
MODELS: list[type[RunParams]] = [
    OffloadRunParams,
    StreamRunParams,
    RetentionParams,
    GcParams,
    ScrubParams,
    RewriteParams,
    ExportParams,
]


for _model in MODELS:  # build each form's JSON schema once, outside any reader's deadline
    _model.parse({})


@st.composite
def params_values(draw: st.DrawFn) -> tuple[type[RunParams], dict[str, Any]]:
    """A model and values for some of its fields (any JSON, or a number at an edge), now
    and then an unknown name."""
    model = draw(st.sampled_from(MODELS))
    names = list(model.model_fields)
    chosen = draw(st.lists(st.sampled_from(names), max_size=4, unique=True))
    values = {name: draw(st.one_of(JSON, extremes, st.text(max_size=12))) for name in chosen}
    if draw(st.integers(0, 9)) == 0:
        values[draw(st.text(max_size=8))] = None
    return model, values


def ints_in(value: Any) -> list[int]:
    if isinstance(value, bool):
        return []
    if isinstance(value, int):
        return [value]
    if isinstance(value, dict):
        return [i for v in value.values() for i in ints_in(v)]
    if isinstance(value, list | tuple):
        return [i for v in value for i in ints_in(v)]
    return []


def accepted_params_fit_the_database(pair: tuple[type[RunParams], dict[str, Any]]) -> None:
    """A run's params, from a form or the CLI (``parse``) or from an XCom
    (``model_validate``): the model, whose integers an int64 column can hold, or a
    ValueError (RunParamsError, pydantic's ValidationError) naming the field."""
    model, values = pair
    for read in (model.parse, model.model_validate):
        got = outcome(lambda r=read: r(values), (ValueError,), size=len(repr(values)))
        if isinstance(got, BaseModel):
            too_big = [i for i in ints_in(got.model_dump()) if not -(2**63) <= i < 2**63]
            assert not too_big, f"{model.__name__} accepted {too_big} from {values}"


test_run_params, test_run_params_long = fuzz_forms(params_values(), short=60)(
    example((OffloadRunParams, {"up_to_ledger": 2**63}))(  # found: accepted past int64
        accepted_params_fit_the_database
    )
)
