"""Every error the library raises on purpose, in one flat module.

Bad arguments raise ValueError/TypeError (or a subclass below); the classes here name the
conditions a caller may want to handle.
"""


class OffloaderError(Exception):
    """Base of the library's own errors."""


# --- metadata -------------------------------------------------------------------------
class CommitFailedError(OffloaderError):
    """A compare-and-set found another version than expected: someone else moved first."""


class NotFoundError(OffloaderError, LookupError):
    """A topic, ledger or attempt named by the caller does not exist."""


class AlreadyExistsError(OffloaderError):
    """A topic or ledger that the caller wants to create exists already."""


# --- object store ---------------------------------------------------------------------
class ObjectStoreError(OffloaderError):
    """The object store failed; the operation may succeed if retried."""


class ObjectNotFoundError(ObjectStoreError, LookupError):
    """The object (or multipart upload) does not exist."""


class ObjectExistsError(ObjectStoreError):
    """A conditional create found the key taken (HTTP 412 on S3)."""


class UnsupportedOperationError(ObjectStoreError):
    """The binding lacks the capability the caller asked for."""


# --- formats --------------------------------------------------------------------------
class FormatError(OffloaderError, ValueError):
    """Bytes that do not follow the documented format: bad magic, bad CRC, truncation."""


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
