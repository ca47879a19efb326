"""Racing creates: one wins, every other racer gets a clear AlreadyExistsError (both databases).

On PostgreSQL the racers are held at their INSERT until all have passed any check before
it (``fixtures.races``), so the collision happens on every run. SQLite serializes writers
at BEGIN; there the race shows that the outcome is the same.
"""

import contextlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager

from fixtures.races import inserts_held
from offloader.exceptions import AlreadyExistsError
from offloader.metadata import MetadataStore
from offloader.policy import OffloadPolicy

RACERS = 4


def collisions_forced(url: str, table: str) -> AbstractContextManager[Callable[[int], None]]:
    if url.startswith("postgresql"):
        return inserts_held(url, table)
    return contextlib.nullcontext(lambda n: None)


def test_racing_topic_creates_give_one_topic_and_exists_errors(store: MetadataStore) -> None:
    url = store.engine.url.render_as_string(hide_password=False)

    def create() -> BaseException | None:
        try:
            store.create_topic("race", OffloadPolicy())
        except BaseException as exc:
            return exc
        return None

    with ThreadPoolExecutor(RACERS) as pool:
        with collisions_forced(url, "topics") as wait_for:
            futures = [pool.submit(create) for _ in range(RACERS)]
            wait_for(RACERS)
        outcomes = [f.result(timeout=60) for f in futures]

    errors = [e for e in outcomes if e is not None]
    assert len(errors) == RACERS - 1, outcomes
    for error in errors:
        assert isinstance(error, AlreadyExistsError), repr(error)
        assert str(error) == "topic 'race' exists already"
    assert [t.name for t in store.list_topics()] == ["race"]
