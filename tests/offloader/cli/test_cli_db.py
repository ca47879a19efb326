"""`offloader db upgrade|check`: migrations run once, by the operator; every other command
on a database that is not at head fails fast saying so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from offloader.cli import main
from offloader.metadata.migrate import head_revision


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_check_then_upgrade_then_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("OFFLOADER_DATA_DIR", str(tmp_path / "data"))
    head = head_revision()
    needs_upgrade = (
        f"error: the metadata database has no offloader schema, this offloader needs "
        f"revision {head}: run `offloader db upgrade`\n"
    )
    assert run(capsys, "db", "check") == (2, "", needs_upgrade)
    # every other command refuses too, and creates nothing
    assert run(capsys, "topic", "create", "orders") == (2, "", needs_upgrade)

    code, out, err = run(capsys, "db", "upgrade", "--json")
    assert (code, err) == (0, "")
    assert json.loads(out) == {"before": None, "revision": head}
    assert run(capsys, "db", "check") == (0, f"metadata database at revision {head} (head)\n", "")
    assert run(capsys, "db", "upgrade") == (
        0,
        f"metadata database already at revision {head}\n",
        "",
    )
    assert run(capsys, "topic", "create", "orders")[0] == 0
    code, out, _ = run(capsys, "topic", "list", "--json")
    assert [t["name"] for t in json.loads(out)] == ["orders"]
