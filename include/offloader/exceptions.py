"""Every error the library raises on purpose, in one flat module.

Bad arguments raise ValueError/TypeError (or a subclass below); the classes here name the
conditions a caller may want to handle.
"""

from collections.abc import Callable
from typing import Any, TypeVar

_E = TypeVar("_E", bound=Exception)
# __reduce__ of an error whose __init__ takes keyword-only arguments: (_rebuild, its arguments)
_Reduced = tuple[Callable[..., Exception], tuple[type[Exception], tuple[Any, ...], dict[str, Any]]]


class OffloaderError(Exception):
    """Base of the library's own errors."""


# --- metadata -------------------------------------------------------------------------
class CommitFailedError(OffloaderError):
    """A compare-and-set found another version than expected: someone else moved first."""


class StreamBusyError(OffloaderError):
    """Another pass holds the topic's stream and its lease has not run out."""


class StreamFencedError(CommitFailedError):
    """A newer pass took the topic's stream (a higher epoch): this pass may not commit."""


class NotFoundError(OffloaderError, LookupError):
    """A topic, ledger or attempt named by the caller does not exist."""


class AlreadyExistsError(OffloaderError):
    """A topic or ledger that the caller wants to create exists already."""


# --- retention ------------------------------------------------------------------------
class TrimmedError(OffloaderError, LookupError):
    """A read below the topic's start: those entries were trimmed (invariant 4)."""


class TopicDeletedError(OffloaderError):
    """The topic was deleted (`offloader topic delete`): no writes, reads, cuts or trims."""


# --- object store ---------------------------------------------------------------------
class ObjectStoreError(OffloaderError):
    """The object store failed; the operation may succeed if retried."""


class ObjectNotFoundError(ObjectStoreError, LookupError):
    """The object (or multipart upload) does not exist."""


class ObjectExistsError(ObjectStoreError):
    """A conditional create found the key taken (HTTP 412 on S3)."""


class InvalidRangeError(ObjectStoreError, ValueError):
    """A byte range to copy does not lie inside the source object (416 on S3)."""


class PartTooSmallError(ObjectStoreError):
    """A multipart upload was completed with a part, not the last, below the store's
    minimum part size (S3's EntityTooSmall). Not a ValueError: the streaming offloader
    treats those as the end of an upload, and this one is a bug to report, not a reason to
    replace a segment."""


class CorruptObjectError(ObjectStoreError):
    """The store holds the object but cannot make sense of its own bytes (a filesystem-store
    header that is truncated or not valid JSON): retrying will not help; the object is
    damaged and must be replaced from another copy."""


class UnsupportedOperationError(ObjectStoreError):
    """The binding lacks the capability the caller asked for."""


# --- formats --------------------------------------------------------------------------
class FormatError(OffloaderError, ValueError):
    """Bytes that do not follow the documented format: bad magic, bad CRC, truncation.

    ``offset`` is where in the object the damage was found, when the codec knows it (the
    codec sees bytes, not keys: readers add the rest of the address, see DamagedObjectError).
    """

    def __init__(self, message: str, *, offset: int | None = None) -> None:
        super().__init__(message)
        self.offset = offset

    def __reduce__(self) -> _Reduced:
        return _rebuild, (type(self), self.args, self.__dict__)


def _rebuild(cls: type[_E], args: tuple[Any, ...], state: dict[str, Any]) -> _E:
    """Unpickle an error whose __init__ takes keyword-only arguments."""
    error = Exception.__new__(cls)
    error.args = args
    error.__dict__.update(state)
    return error


class DamagedObjectError(FormatError):
    """A stored object failed a format check. The message gives the whole address,
    "topic T ledger L object KEY offset O: what", so an operator can find the bytes;
    the codec's own error is kept as ``__cause__``."""

    def __init__(
        self, what: str, *, topic: str | None, ledger_id: int | None, key: str, offset: int
    ) -> None:
        topic_text = "?" if topic is None else topic
        ledger_text = "?" if ledger_id is None else str(ledger_id)
        super().__init__(
            f"topic {topic_text} ledger {ledger_text} object {key} offset {offset}: {what}",
            offset=offset,
        )
        self.topic = topic
        self.ledger_id = ledger_id
        self.key = key


class EntryTooLargeError(FormatError):
    """An entry does not fit into one block."""


class EmptyLedgerError(FormatError):
    """A ledger with no entries cannot be offloaded: there is nothing to index."""


# --- hot tier -------------------------------------------------------------------------
class LedgerSealedError(OffloaderError):
    """A sealed ledger is immutable; appends to it are refused."""


class LedgerInUseError(OffloaderError):
    """Another live writer holds the ledger open (its lock is held)."""


class HotLedgerMissingError(OffloaderError, LookupError):
    """The hot copy of a ledger is gone (deleted after offload, or never written)."""


# --- schema and stores ----------------------------------------------------------------
class SchemaOutOfDateError(OffloaderError):
    """The metadata database is not at the revision this code needs: run the upgrade."""


class StoreUnavailableError(ObjectStoreError):
    """A recorded object store cannot be opened or reached; the message names it."""


# --- scrub ----------------------------------------------------------------------------
class ScrubFailedError(OffloaderError):
    """A scrub found damaged ledgers it could not (or was told not to) repair. ``report``
    is the whole :class:`offloader.scrub.report.ScrubReport`."""

    def __init__(self, message: str, *, report: object) -> None:
        super().__init__(message)
        self.report = report

    def __reduce__(self) -> _Reduced:
        return _rebuild, (type(self), self.args, self.__dict__)


# --- rewrites -------------------------------------------------------------------------
class RewriteFailedError(OffloaderError):
    """Groups of a rewrite run failed or were refused; ``report`` is the whole
    :class:`offloader.rewrite.report.RewriteReport` (the groups done are in it too)."""

    def __init__(self, message: str, *, report: object) -> None:
        super().__init__(message)
        self.report = report

    def __reduce__(self) -> _Reduced:
        return _rebuild, (type(self), self.args, self.__dict__)


# --- metrics --------------------------------------------------------------------------
class MetricsExportError(OffloaderError):
    """Metrics could not be pushed: no OTLP endpoint set, or the export failed (the
    message names the endpoint without credentials, never a header)."""
