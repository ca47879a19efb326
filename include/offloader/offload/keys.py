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


# what ledger_object_keys makes of a uuid4 attempt id (the orphan sweep touches nothing else)
LEDGER_OBJECT_KEY = re.compile(
    r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}-ledger-\d+(?:-index)?"
)


def is_ledger_object_key(key: str) -> bool:
    """Whether ``key`` has the shape of an offloaded ledger's data or index object."""
    return LEDGER_OBJECT_KEY.fullmatch(key) is not None


def object_user_metadata(topic: str, ledger_id: int, role: str) -> dict[str, str]:
    """S3 user metadata must be ASCII: the topic is percent-encoded."""
    return {
        "format-version": FORMAT_VERSION,
        "software-version": __version__,
        "managed-ledger": quote(topic, safe=""),
        "ledger-id": str(ledger_id),
        "role": role,
    }
