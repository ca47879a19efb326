"""Console-script findings, each fixed and held here: a negative `offload --up-to`, a
reader that closes the pipe early, credentials in `--debug` output."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from fixtures.cli import CLI, child_env, run_cli
from fixtures.databases import migrated_sqlite_url
from fixtures.seaweedfs_server import SeaweedS3
from offloader.metadata import MetadataStore
from offloader.settings import Settings


def topic_with_ledgers(settings: Settings, ledgers: int = 3) -> None:
    run_cli(settings, "topic", "create", "orders", "--set", "ledger_max_entries=1")
    run_cli(settings, "produce", "orders", "--count", str(ledgers), "--size", "10")


@pytest.fixture
def local(tmp_path: Path) -> Settings:
    data = tmp_path / "data"
    data.mkdir()
    return Settings.from_values(data_dir=data, metadata_url=migrated_sqlite_url(data))


def test_offload_up_to_a_negative_ledger_is_refused(local: Settings) -> None:
    topic_with_ledgers(local)
    done = run_cli(local, "offload", "orders", "--up-to", "-3", ok=False)
    assert done.returncode == 2 and done.stdout == ""
    (line,) = done.stderr.splitlines()
    assert line.startswith("error: offloader offload: argument --up-to: ")
    assert "'-3'" in line and "0 or more" in line
    metadata = MetadataStore.open(local.resolved_metadata_url)
    try:
        assert {x.offload_state for x in metadata.list_ledgers("orders")} == {"none"}
    finally:
        metadata.close()


def test_the_library_refuses_a_negative_up_to_too(local: Settings) -> None:
    from offloader.offload.ledger_offloader import LedgerOffloader
    from offloader.runtime import Runtime

    topic_with_ledgers(local)
    with Runtime.open(local) as rt, pytest.raises(ValueError, match=r"^up_to -3: "):
        LedgerOffloader(rt).offload_topic("orders", up_to=-3)


def test_a_reader_that_goes_away_ends_the_output_quietly(local: Settings) -> None:
    """`offloader ledgers --json | head -1`: the pipe's reader is gone before the first
    write (its end closed here, so the case does not depend on timing): no traceback."""
    topic_with_ledgers(local)
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run(
            [*CLI, "ledgers", "orders", "--json"],
            env=child_env(local),
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    finally:
        os.close(write_end)
    assert done.stderr == ""
    assert done.returncode == 0


@pytest.mark.s3
def test_debug_output_never_holds_a_credential(s3_server: SeaweedS3, tmp_path: Path) -> None:
    """`--debug` logs every botocore request; the Authorization header (access key id in
    its credential scope, the signature) and the keys themselves are cut out."""
    settings = s3_server.make_settings(
        "debug", data_dir=tmp_path, metadata_url=migrated_sqlite_url(tmp_path)
    )
    topic_with_ledgers(settings, 2)
    done = run_cli(settings, "--debug", "offload", "orders", "--up-to", "100")
    output = done.stdout + done.stderr
    assert "Authorization" in output  # the headers were logged: the check below means something
    assert s3_server.access_key not in output
    assert s3_server.secret_key not in output
    assert not re.search(r"(?i)signature=[0-9a-f]{8}", output)
    assert not re.search(r"(?i)credential=(?!\*\*\*)", output)
