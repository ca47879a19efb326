"""Invariant 8 in the library: an S3 operation against a store that stops answering ends
within its deadline, with an error that names the endpoint and never a credential.

The store is a black hole on loopback (fixtures/blackhole.py): it accepts connections and
never answers, as a hung server or a dropped route does.
"""

from __future__ import annotations

import time
from typing import Any

import boto3
import pytest
from pydantic import SecretStr

from fixtures.blackhole import BlackHole
from offloader.exceptions import ObjectStoreError, StoreUnavailableError
from offloader.metadata import MetadataStore
from offloader.metadata.engine import create_metadata_engine
from offloader.metadata.migrate import upgrade
from offloader.objectstore.registry import StoreRegistry, default_location, open_object_store
from offloader.objectstore.s3 import S3ObjectStore, client_config
from offloader.settings import Settings

ACCESS_KEY = "AKIADEADLINETESTKEY1"
SECRET_KEY = "deadline-test-secret-9f8e7d6c5b4a"

# Small deadlines: an operation's worst case is deadline + connect + read timeout.
SMALL = {
    "s3_connect_timeout_seconds": 1.0,
    "s3_read_timeout_seconds": 0.5,
    "s3_operation_deadline_seconds": 1.5,
}
BOUND_SECONDS = 1.5 + 1.0 + 0.5 + 1.0  # the worst case, plus a second for a loaded machine


def hole_settings(hole: BlackHole, **overrides: object) -> Settings:
    values: dict[str, object] = {
        "object_store_url": "s3://never-answers/tier",
        "s3_endpoint_url": hole.endpoint_url,
        "s3_access_key_id": SecretStr(ACCESS_KEY),
        "s3_secret_access_key": SecretStr(SECRET_KEY),
        **SMALL,
        **overrides,
    }
    return Settings.from_values(**values)


def assert_clear(message: str, hole: BlackHole) -> None:
    assert f"127.0.0.1:{hole.port}" in message
    assert ACCESS_KEY not in message and SECRET_KEY not in message


def test_an_operation_ends_at_its_deadline_not_after_its_attempts(black_hole: BlackHole) -> None:
    """20 attempts of 0.5 s each would take over 10 s; the deadline stops them at 1.5 s."""
    settings = hole_settings(black_hole, s3_max_attempts=20)
    store = S3ObjectStore.from_url(settings.resolved_object_store_url, settings)
    started = time.monotonic()
    with pytest.raises(ObjectStoreError) as caught:
        store.stat("some-key")
    elapsed = time.monotonic() - started
    store.close()
    assert elapsed < BOUND_SECONDS, f"{elapsed:.1f} s"
    assert black_hole.accepted >= 1  # it did go to the store and wait
    message = str(caught.value)
    assert message.startswith("S3 HeadObject on s3://never-answers/tier/some-key failed: ")
    assert_clear(message, black_hole)


def test_a_host_factorys_client_gets_the_deadline_too(black_hole: BlackHole) -> None:
    """A client a host makes (the Airflow hook's factory: its own boto3 session, our
    client_config) is bounded the same way: opening the store installs the deadline."""
    settings = hole_settings(black_hole, s3_max_attempts=20)

    def host_factory(at: Settings) -> Any:
        session = boto3.session.Session(
            aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY
        )
        return session.client("s3", endpoint_url=at.s3_endpoint_url, config=client_config(at))

    store = S3ObjectStore.from_url(settings.resolved_object_store_url, settings, host_factory)
    started = time.monotonic()
    with pytest.raises(ObjectStoreError) as caught:
        store.check_available()
    elapsed = time.monotonic() - started
    store.close()
    assert elapsed < BOUND_SECONDS, f"{elapsed:.1f} s"
    assert_clear(str(caught.value), black_hole)


def test_the_default_store_is_recorded_only_once_it_answered(
    black_hole: BlackHole, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    """default_id against a black hole: StoreUnavailableError in bounded time naming the
    endpoint, and no store row recorded."""
    url = f"sqlite:///{tmp_path / 'metadata.db'}"
    engine = create_metadata_engine(url)
    settings = hole_settings(black_hole, metadata_url=url)
    upgrade(engine, default_location(settings))
    engine.dispose()
    metadata = MetadataStore.open(url)
    store = open_object_store(settings.resolved_object_store_url, settings)
    registry = StoreRegistry(metadata, settings, store)
    try:
        started = time.monotonic()
        with pytest.raises(StoreUnavailableError) as caught:
            registry.default_id()
        assert time.monotonic() - started < BOUND_SECONDS
        assert "is not reachable" in str(caught.value)
        assert_clear(str(caught.value), black_hole)
        assert metadata.list_locations() == []
    finally:
        store.close()
        metadata.close()
