"""Two ``offloader topic create X`` at once on PostgreSQL: exit 0 and exit 2 with one line.

Both processes are held at their INSERT until both have passed any check before it
(``fixtures.races``), so they collide on every run. (SQLite serializes writers at BEGIN,
so two creates there cannot collide.)
"""

from collections.abc import Iterator
from pathlib import Path

import pytest

from fixtures.cli import spawn_cli
from fixtures.databases import postgres_database, upgraded
from fixtures.races import inserts_held
from offloader.metadata import MetadataStore
from offloader.settings import Settings


@pytest.fixture
def postgres_url() -> Iterator[str]:
    yield from postgres_database()


def test_racing_topic_creates_through_the_cli(postgres_url: str, tmp_path: Path) -> None:
    # the schema exists before the race
    settings = upgraded(Settings(data_dir=tmp_path / "data", metadata_url=postgres_url))
    with inserts_held(postgres_url, "topics") as wait_for:
        racers = [spawn_cli(settings, "topic", "create", "X") for _ in range(2)]
        try:
            wait_for(2)
        except TimeoutError:
            for racer in racers:
                racer.kill()
            raise
    outputs = [racer.communicate(timeout=120) for racer in racers]
    done = sorted(
        (racer.returncode, out.decode(), err.decode())
        for racer, (out, err) in zip(racers, outputs, strict=True)
    )
    assert [code for code, _, _ in done] == [0, 2], done
    (_, won, _), (_, _, lost) = done
    assert won.strip() == "created topic X"
    assert lost == "error: topic 'X' exists already\n"
    store = MetadataStore.open(postgres_url)
    try:
        assert [t.name for t in store.list_topics()] == ["X"]
    finally:
        store.close()
