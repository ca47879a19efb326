"""Topic folder names of the file hot tier: every topic gets one folder under the root.

Names are escaped so that they are reversible, collision-free and safe on any file system;
names too long for a folder are hashed, and the folder then records its topic in a name file
(``topic.name``). The files inside a folder: :mod:`offloader.hottier.ledger_files`.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from offloader.exceptions import FormatError
from offloader.fsutil import fsync_dir
from offloader.hottier.ledger_files import write_file_durably

# Topic folder names: lowercase letters, digits and "-_." pass through, every other byte of
# the UTF-8 form becomes %XX (uppercase hex). Uppercase letters are escaped so that names
# that differ only in case stay apart on case-insensitive file systems too.
_SAFE = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-_.")
_HEX = frozenset("0123456789ABCDEF")
_MAX_ENCODED = 200  # well below NAME_MAX (255); longer names are hashed
HASHED_PREFIX = "~h-"  # "~" never appears in an escaped name
NAME_FILE = "topic.name"


# --- topic names ----------------------------------------------------------------------
def encode_topic(topic: str) -> str:
    """The folder name for ``topic``: reversible, collision-free and safe on any file system."""
    if not isinstance(topic, str) or not topic:
        raise ValueError(f"topic must be a non-empty string, not {topic!r}")
    parts: list[str] = []
    for i, ch in enumerate(topic):
        if ch in _SAFE and not (i == 0 and ch == "."):  # no hidden folders, no "." or ".."
            parts.append(ch)
        else:
            parts.extend(f"%{b:02X}" for b in ch.encode("utf-8"))
    encoded = "".join(parts)
    if len(encoded) > _MAX_ENCODED:
        return HASHED_PREFIX + hashlib.sha256(topic.encode("utf-8")).hexdigest()
    return encoded


def decode_topic(folder: str) -> str:
    """The topic of an escaped folder name; ValueError for hashed or foreign names."""
    raw = bytearray()
    i = 0
    while i < len(folder):
        ch = folder[i]
        if ch == "%" and i + 2 < len(folder) and set(folder[i + 1 : i + 3]) <= _HEX:
            raw.append(int(folder[i + 1 : i + 3], 16))
            i += 3
        elif ch in _SAFE:
            raw.append(ord(ch))
            i += 1
        else:
            raise ValueError(f"not an encoded topic folder: {folder!r}")
    topic = raw.decode("utf-8")  # UnicodeDecodeError is a ValueError
    if encode_topic(topic) != folder:  # only the canonical form is ours
        raise ValueError(f"not an encoded topic folder: {folder!r}")
    return topic


# --- the name file of a hashed folder -------------------------------------------------
def ensure_name_file(folder: Path, topic: str) -> None:
    """Record ``topic`` in the name file of ``folder`` durably; FormatError if the folder
    records another topic already."""
    name_file = folder / NAME_FILE
    try:
        stored = name_file.read_text("utf-8")
    except FileNotFoundError:
        tmp = folder / (NAME_FILE + ".tmp")
        write_file_durably(tmp, topic.encode("utf-8"))
        os.replace(tmp, name_file)
        fsync_dir(folder)
        return
    if stored != topic:
        raise FormatError(f"folder {folder} belongs to topic {stored!r}, not {topic!r}")


def topic_of_folder(folder: Path) -> str | None:
    """The topic of a folder under the root: its decoded name or, for a hashed name, its name
    file; None for a foreign folder or a hashed one without a name file."""
    if folder.name.startswith(HASHED_PREFIX):
        try:
            return (folder / NAME_FILE).read_text("utf-8")
        except FileNotFoundError:
            return None
    try:
        return decode_topic(folder.name)
    except ValueError:
        return None
