"""The S3 user metadata every offloaded object carries (FORMAT.md, "Objects, keys and user
metadata"): with its key (``offloader/keys.py``), what identifies an object to outside tools
and to a metadata rebuild, so every field and its spelling is part of the format.

S3 user metadata must be ASCII: the topic is percent-encoded.
"""

from __future__ import annotations

from urllib.parse import quote

from offloader import __version__
from offloader.format.layout import FORMAT_VERSION
from offloader.format.segment_layout import SEGMENT_FORMAT_VERSION

LEDGER_OBJECT_FORMAT_VERSION = str(FORMAT_VERSION)  # "1": a v1 ledger object's format-version
SEGMENT_OBJECT_FORMAT_VERSION = str(SEGMENT_FORMAT_VERSION)  # "2": a v2 segment object's


def ledger_user_metadata(topic: str, ledger_id: int, role: str) -> dict[str, str]:
    """An offloaded ledger's data (``role`` "data") or index ("index") object's."""
    return {
        "format-version": LEDGER_OBJECT_FORMAT_VERSION,
        "software-version": __version__,
        "managed-ledger": quote(topic, safe=""),
        "ledger-id": str(ledger_id),
        "role": role,
    }


def segment_user_metadata(topic: str, segment_id: str, role: str) -> dict[str, str]:
    """A streaming segment's data or index object's: the segment id, no ledger id (a
    segment spans ledgers)."""
    return {
        "format-version": SEGMENT_OBJECT_FORMAT_VERSION,
        "software-version": __version__,
        "managed-ledger": quote(topic, safe=""),
        "segment-id": segment_id,
        "role": role,
    }
