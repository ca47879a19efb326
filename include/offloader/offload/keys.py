"""Object keys and user metadata of offloaded ledgers (FORMAT.md: a new uuid per attempt)."""

from __future__ import annotations

import re
from urllib.parse import quote

from offloader import __version__

FORMAT_VERSION = "1"


def ledger_object_keys(attempt_id: str, ledger_id: int) -> tuple[str, str]:
    """(data key, index key): ``<uuid>-ledger-<id>`` and ``<uuid>-ledger-<id>-index``."""
    data = f"{attempt_id}-ledger-{ledger_id}"
    return data, f"{data}-index"


# a uuid4 as str(uuid.uuid4()) spells it: lower-case hex in 8-4-4-4-12
_UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"

# what ledger_object_keys makes of a uuid4 attempt id (the orphan sweep touches nothing else)
LEDGER_OBJECT_KEY = re.compile(_UUID + r"-ledger-\d+(?:-index)?")

# what stream/offloader.py's segment_object_keys makes of a uuid4 segment id: ``<uuid>``
# (the data object) and ``<uuid>-index``
SEGMENT_OBJECT_KEY = re.compile(_UUID + r"(?:-index)?")


def is_ledger_object_key(key: str) -> bool:
    """Whether ``key`` has the shape of an offloaded ledger's data or index object."""
    return LEDGER_OBJECT_KEY.fullmatch(key) is not None


def is_segment_object_key(key: str) -> bool:
    """Whether ``key`` has the shape of a streaming segment's data or index object."""
    return SEGMENT_OBJECT_KEY.fullmatch(key) is not None


def is_offloaded_object_key(key: str) -> bool:
    """Whether ``key`` has the shape of any object an offload writes (ledger or segment)."""
    return is_ledger_object_key(key) or is_segment_object_key(key)


def object_user_metadata(topic: str, ledger_id: int, role: str) -> dict[str, str]:
    """S3 user metadata must be ASCII: the topic is percent-encoded."""
    return {
        "format-version": FORMAT_VERSION,
        "software-version": __version__,
        "managed-ledger": quote(topic, safe=""),
        "ledger-id": str(ledger_id),
        "role": role,
    }
