"""The metadata store under test, on both databases (the ``metadata_url`` fixture)."""

from collections.abc import Iterator

import pytest

from offloader.metadata import MetadataStore


@pytest.fixture
def store(metadata_url: str) -> Iterator[MetadataStore]:
    store = MetadataStore.open(metadata_url)
    yield store
    store.close()
