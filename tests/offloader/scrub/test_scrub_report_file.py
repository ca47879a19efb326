"""The scrub report as operators and tools get it, without a backend: its whole JSON
document, its bytes (sorted, indented JSON), its summary and error line, the checks of a
report path (the exact refusals), the atomic file write (failed or interrupted), where a
report URL puts it (file or object) and the URLs refused."""

from __future__ import annotations

import dataclasses
import json
import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import pytest

from offloader.exceptions import ScrubFailedError
from offloader.objectstore import ObjectStore
from offloader.objectstore.location import FILE, StoreLocation
from offloader.objectstore.registry import open_object_store
from offloader.scrub import Action, Counts, Finding, FindingKind, LedgerVerdict, ScrubReport
from offloader.scrub import output as output_module
from offloader.scrub.output import read_report_at, write_report_at
from offloader.scrub.params import ScrubParams, report_location
from offloader.scrub.report import LedgerRepair, check_report_path
from offloader.settings import Settings


def _report() -> ScrubReport:
    """A report with every level of nesting: a damaged ledger, a damaged segment with the
    ledgers in it, findings on both."""
    finding = Finding("orders", 4, "k-ledger-4", 17, FindingKind.DAMAGED_BLOCK, "crc mismatch")
    lost = Finding("events", 7, "seg-data", None, FindingKind.TRUNCATED, "short by 3 bytes")
    return ScrubReport(
        topics=["orders", "events"],
        repair=True,
        started_ms=1_000,
        finished_ms=2_500,
        counts=Counts(ledgers=3, objects=6, blocks=9, bytes=4096, entries=30),
        damaged=[
            LedgerVerdict("orders", 4, "u-4", Action.REPAIRED, "again", (finding,), "u-5"),
            LedgerVerdict(
                "events",
                7,
                "seg",
                Action.NO_HOT_COPY,
                "segment seg is damaged",
                (lost,),
                ledgers=(
                    LedgerRepair(7, Action.NO_HOT_COPY, "hot copy deleted"),
                    LedgerRepair(8, Action.REPAIR_FAILED, "damaged too", "u-9", (finding,)),
                ),
            ),
        ],
    )


def _sorted_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [k for k, _ in pairs]
    assert keys == sorted(keys), keys
    return dict(pairs)


def test_report_bytes_are_sorted_two_space_indented_json_with_a_final_newline() -> None:
    """The written form is stable for diffs and greps: every object's keys in order, one
    member per line indented two spaces per level, a newline at the end."""
    report = _report()
    data = report.to_bytes()
    assert json.loads(data, object_pairs_hook=_sorted_pairs) == report.to_json()
    text = data.decode()
    assert text.endswith("}\n") and not text.endswith("\n\n")
    depth = 0
    for line in text.splitlines():
        stripped = line.lstrip(" ")
        closing = stripped[:1] in "]}"
        assert len(line) - len(stripped) == 2 * (depth - closing), line
        depth += sum(stripped.count(c) for c in "[{") - sum(stripped.count(c) for c in "]}")
    for key in report.to_json():
        assert f'\n  "{key}": ' in text


def test_a_report_path_in_a_missing_folder_is_refused_naming_it(tmp_path: Path) -> None:
    """A missing folder is refused, naming it, and nothing is made; an existing one is
    fine; a directory, or a folder that is a file, is refused with the path and the reason."""
    nested = tmp_path / "a" / "b" / "r.json"
    with pytest.raises(ValueError) as missing:
        check_report_path(nested)
    assert str(missing.value) == (
        f"scrub report {str(nested)!r}: the directory {str(nested.parent)!r} does not exist"
    )
    assert list(tmp_path.iterdir()) == []  # nothing created
    nested.parent.mkdir(parents=True)
    assert check_report_path(str(nested)) == nested  # the folder exists now
    with pytest.raises(ValueError) as raised:
        check_report_path(tmp_path)
    assert str(raised.value) == f"scrub report {str(tmp_path)!r} is a directory: name a file"
    blocker = tmp_path / "plain"
    blocker.write_text("not a folder")
    below = blocker / "r.json"
    with pytest.raises(ValueError) as raised:
        check_report_path(below)
    message = str(raised.value)
    assert message == (
        f"scrub report {str(below)!r}: the directory {str(blocker)!r} is not a directory"
    )
    assert str(blocker) in message and not below.exists()


@pytest.fixture
def unprivileged(monkeypatch: pytest.MonkeyPatch) -> None:
    """os.access as an unprivileged owner sees it, when the tests run as root (who may
    write anywhere): the owner's permission bits decide."""
    if os.geteuid() != 0:
        return

    def access(path: str | os.PathLike[str], mode: int, **_: object) -> bool:
        owner = (os.stat(path).st_mode >> 6) & 0o7
        return owner & mode == mode

    monkeypatch.setattr(os, "access", access)


@pytest.mark.usefixtures("unprivileged")
def test_a_report_folder_this_process_cannot_write_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        with pytest.raises(ValueError) as raised:
            check_report_path(folder / "r.json")
        path = str(folder / "r.json")
        assert str(raised.value) == f"scrub report {path!r}: its directory is not writable"
        folder.chmod(stat.S_IRUSR | stat.S_IWUSR)  # writable, not searchable
        with pytest.raises(ValueError, match="its directory is not writable"):
            check_report_path(folder / "r.json")
    finally:
        folder.chmod(stat.S_IRWXU)


@pytest.fixture
def replaces(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[Path, Path]]]:
    """Every os.replace (source, target) made, still done."""
    done: list[tuple[Path, Path]] = []
    real: Callable[..., None] = os.replace

    def replace(src: str, dst: str | os.PathLike[str], **kw: Any) -> None:
        done.append((Path(src), Path(dst)))
        real(src, dst, **kw)

    monkeypatch.setattr(os, "replace", replace)
    yield done


def test_a_report_file_is_replaced_atomically_from_a_hidden_temp_beside_it(
    tmp_path: Path, replaces: list[tuple[Path, Path]]
) -> None:
    """Folders are made; the document is written to a dot-file in the target's folder (same
    file system, skipped by ``*.json`` globs) and renamed over it; nothing else is left."""
    report = _report()
    target = tmp_path / "x" / "y" / "scrub.json"
    assert report.write(target) == target
    target.write_bytes(b"an older report")
    report.write(str(target))
    assert target.read_bytes() == report.to_bytes()
    assert sorted(target.parent.iterdir()) == [target]
    assert len(replaces) == 2
    for src, dst in replaces:
        assert dst == target and src.parent == target.parent
        assert src.name.startswith(f".{target.name}.")


def test_a_failed_report_write_keeps_the_old_report_and_leaves_no_temp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "scrub.json"
    target.write_bytes(b"the last report")

    def fail(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", fail)
    with pytest.raises(OSError, match="No space left"):
        _report().write(target)
    assert target.read_bytes() == b"the last report"
    assert sorted(tmp_path.iterdir()) == [target]


def test_an_interrupt_once_the_report_is_renamed_propagates_as_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C (or a task kill) landing just after the rename: the interrupt propagates,
    not an error about the temp file being gone already, and the new report is whole."""
    target = tmp_path / "scrub.json"
    real: Callable[..., None] = os.replace

    def rename_then_interrupt(src: str, dst: str | os.PathLike[str], **kw: Any) -> None:
        real(src, dst, **kw)
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", rename_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        _report().write(target)
    assert target.read_bytes() == _report().to_bytes()
    assert sorted(tmp_path.iterdir()) == [target]


def test_a_file_url_report_lands_in_nested_new_folders(tmp_path: Path) -> None:
    report = _report()
    path = tmp_path / "reports" / "weekly" / "scrub.json"
    url = path.as_uri()
    assert read_report_at(url, cast(Settings, None)) is None
    write_report_at(report, url, cast(Settings, None))
    assert path.read_bytes() == report.to_bytes()
    assert read_report_at(url, cast(Settings, None)) == report.to_json()


def test_an_s3_url_report_is_one_object_in_the_store_it_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store is opened from the URL's bucket and prefix with the caller's settings (the
    offloader connection's endpoint and keys); the report is the key under it. A local store
    stands in for the bucket: the S3 binding itself is tested against a server."""
    settings = cast(Settings, object())
    opened: list[tuple[str, Settings]] = []
    bucket = tmp_path / "bucket"
    bucket.mkdir()

    def open_store(url: str, given: Settings | None = None) -> ObjectStore:
        assert given is not None
        opened.append((url, given))
        return open_object_store(bucket.as_uri())

    monkeypatch.setattr(output_module, "open_object_store", open_store)
    report = _report()
    url = "s3://backups/scrub/weekly.json"
    assert read_report_at(url, settings) is None
    write_report_at(report, url, settings)
    assert read_report_at(url, settings) == report.to_json()
    assert opened == [("s3://backups/scrub", settings)] * 3
    store = open_object_store(bucket.as_uri())
    try:
        assert [info.key for info in store.list()] == ["weekly.json"]
        assert store.get("weekly.json") == report.to_bytes()
    finally:
        store.close()


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("s3://b/reports/", "report 's3://b/reports/' names a folder: end it with a file name"),
        ("s3://b/reports/ ", "report 's3://b/reports/ ' names a folder: end it with a file name"),
        ("file:///data/.", "report 'file:///data/.': '.' is not a file name"),
        ("file:///data/..", "report 'file:///data/..': '..' is not a file name"),
        (
            "file:/r.json",
            "report 'file:/r.json': expected file:///abs/file.json or s3://bucket/key.json",
        ),
        (
            "s3:/r.json",
            "report 's3:/r.json': expected file:///abs/file.json or s3://bucket/key.json",
        ),
    ],
)
def test_a_report_url_naming_no_file_is_refused_saying_why(url: str, message: str) -> None:
    with pytest.raises(ValueError) as raised:
        report_location(url)
    assert str(raised.value) == message


def test_a_report_url_names_its_store_and_key() -> None:
    """Trailing whitespace is not part of the name; a file at the root is in the store
    rooted at ``/``."""
    assert report_location("s3://b/x/r.json \n") == (StoreLocation.from_url("s3://b/x"), "r.json")
    assert report_location("file:///r.json") == (StoreLocation(FILE, "/"), "r.json")
    assert report_location("file:///d/e/r.json") == (StoreLocation(FILE, "/d/e"), "r.json")


def test_the_default_report_goes_under_the_store_url_as_given() -> None:
    """Only the store URL's trailing slash is dropped, never a character of its name."""
    params = ScrubParams.parse({})
    assert params.with_defaults("run", "s3://b/TIERX/").report == (
        "s3://b/TIERX/scrub-reports/run.json"
    )
    assert params.with_defaults("run", "s3://b/TIERX").report == (
        "s3://b/TIERX/scrub-reports/run.json"
    )


def test_the_report_document_is_the_documented_schema_with_every_value() -> None:
    """Operators' tools read these exact keys (docs/OPERATIONS.md, "The report"): the run's
    fields, each damaged ledger or segment with its findings and, for a segment, each
    ledger's fate; a missing object's finding has a null offset."""
    crc = {"key": "k-ledger-4", "offset": 17, "kind": "damaged-block", "reason": "crc mismatch"}
    assert json.loads(_report().to_bytes()) == {
        "format": "offloader-scrub-report",
        "format_version": 1,
        "topics": ["orders", "events"],
        "repair": True,
        "started_ms": 1_000,
        "finished_ms": 2_500,
        "counts": {"ledgers": 3, "objects": 6, "blocks": 9, "bytes": 4096, "entries": 30},
        "failed": True,
        "damaged_ledgers": [
            {
                "topic": "orders",
                "ledger_id": 4,
                "offload_uuid": "u-4",
                "action": "repaired",
                "failed": False,
                "detail": "again",
                "replaced_by": "u-5",
                "findings": [crc],
                "ledgers": [],
            },
            {
                "topic": "events",
                "ledger_id": 7,
                "offload_uuid": "seg",
                "action": "no-hot-copy",
                "failed": True,
                "detail": "segment seg is damaged",
                "replaced_by": None,
                "findings": [
                    {
                        "key": "seg-data",
                        "offset": None,
                        "kind": "truncated",
                        "reason": "short by 3 bytes",
                    }
                ],
                "ledgers": [
                    {
                        "ledger_id": 7,
                        "action": "no-hot-copy",
                        "failed": True,
                        "detail": "hot copy deleted",
                        "replaced_by": None,
                        "findings": [],
                    },
                    {
                        "ledger_id": 8,
                        "action": "repair-failed",
                        "failed": True,
                        "detail": "damaged too",
                        "replaced_by": "u-9",
                        "findings": [crc],
                    },
                ],
            },
        ],
    }


def test_the_summary_has_the_counts_then_a_line_per_damaged_entry_finding_and_ledger() -> None:
    """What ``offloader scrub`` prints without ``--json`` and the Spark job logs: settled
    (repaired or changed) and failed are counted apart; each finding and each ledger of a
    segment is indented under its entry, with its offset where the damage has one (a
    missing object has none)."""
    report = _report()
    segment = report.damaged[1]
    assert [f.offset for f in segment.findings] == [None]
    gone = Finding("orders", 5, "k-ledger-5", 0, FindingKind.DAMAGED_INDEX, "bad magic")
    trimmed = LedgerVerdict("orders", 5, "u-6", Action.CHANGED, "trimmed", (gone,))
    report = dataclasses.replace(report, damaged=[report.damaged[0], trimmed, segment])
    assert str(report) == "\n".join(
        [
            "scrubbed 3 ledgers: 6 objects, 9 blocks, 4096 bytes, 30 entries; "
            "3 damaged, 2 settled, 1 failed",
            "orders/4 (u-4): repaired: again",
            "  k-ledger-4 offset 17: crc mismatch",
            "orders/5 (u-6): changed: trimmed",
            "  k-ledger-5 offset 0: bad magic",
            "events/7 (seg): no-hot-copy: segment seg is damaged",
            "  seg-data: short by 3 bytes",
            "  ledger events/7: no-hot-copy: hot copy deleted",
            "  ledger events/8: repair-failed: damaged too",
        ]
    )


@pytest.mark.parametrize(("left", "more"), [(10, ""), (11, " and 1 more")])
def test_the_failure_names_the_first_ten_ledgers_left_damaged_and_counts_the_rest(
    left: int, more: str
) -> None:
    """The error line stays one readable line for a large damaged segment: ten ledgers by
    name, then how many more; settled ledgers (repaired ones) are not named."""
    ids = range(20, 20 + left)
    segment = LedgerVerdict(
        "events",
        19,
        "seg",
        Action.NO_HOT_COPY,
        "segment seg is damaged",
        (),
        ledgers=(
            LedgerRepair(19, Action.REPAIRED, "again", "u-19"),
            *(LedgerRepair(n, Action.NO_HOT_COPY, "hot copy deleted") for n in ids),
        ),
    )
    repaired = LedgerVerdict("orders", 4, "u-4", Action.REPAIRED, "again", (), "u-5")
    report = dataclasses.replace(_report(), damaged=[repaired, segment])
    shown = ", ".join(f"events/{n} (no-hot-copy)" for n in list(ids)[:10])
    with pytest.raises(ScrubFailedError) as raised:
        report.raise_for_failure()
    assert str(raised.value) == (
        f"scrub found {left} damaged ledger(s) it did not repair: {shown}{more}"
    )
    assert raised.value.report is report
