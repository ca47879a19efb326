"""Offloaded objects carry the user metadata FORMAT.md documents, on both backends.

Outside tools (and a metadata rebuild) identify an object by its key and this metadata
alone, so every field and its spelling is part of the contract.
"""

from urllib.parse import unquote

from fixtures.backends import make_topic, produce_ledgers
from offloader import __version__
from offloader.offload.ledger_offloader import LedgerOffloader, Outcome
from offloader.runtime import Runtime

# S3 user metadata is ASCII: the slash, the space and the non-ASCII letter are encoded
TOPIC = "tenant/orders ü"


def test_data_and_index_objects_carry_the_documented_metadata(runtime: Runtime) -> None:
    rt = runtime
    make_topic(rt, TOPIC)
    (ledger_id,) = produce_ledgers(rt, TOPIC, [(20, 1000)])
    (result,) = LedgerOffloader(rt).offload_topic(TOPIC, up_to=ledger_id)
    assert result.outcome is Outcome.OFFLOADED

    ledger = rt.metadata.get_ledger(TOPIC, ledger_id)
    attempt_id = ledger.data_key.removesuffix(f"-ledger-{ledger_id}")
    assert ledger.data_key == f"{attempt_id}-ledger-{ledger_id}"
    assert ledger.index_key == f"{ledger.data_key}-index"
    for key, role in [(ledger.data_key, "data"), (ledger.index_key, "index")]:
        metadata = dict(rt.objects.stat(key).metadata)
        assert metadata == {
            "format-version": "1",
            "software-version": __version__,
            "managed-ledger": "tenant%2Forders%20%C3%BC",
            "ledger-id": str(ledger_id),
            "role": role,
        }
        assert unquote(metadata["managed-ledger"]) == TOPIC
