"""One line for any failure: what the operator sees when a command fails.

The CLI (and anything else that faces an operator) calls :func:`describe_error` at its
boundary. Library errors and bad arguments pass through as they are; SQLAlchemy, driver
and OS errors are named after the setting that led to them (``OFFLOADER_METADATA_URL``,
``OFFLOADER_DATA_DIR``, ...), with passwords and keys cut out of the text.
"""

from __future__ import annotations

import errno
import os
import re
import traceback
from pathlib import Path

from pydantic import ValidationError

from offloader.exceptions import OffloaderError
from offloader.policy import describe_validation_error
from offloader.settings import Settings

ENV_PREFIX = "OFFLOADER_"
_METADATA_URL = "OFFLOADER_METADATA_URL"
_REDACTED = "***"
# Shorter secrets would be cut out of ordinary words; the messages we build never hold one.
_MIN_SECRET = 4

# What an errno means for a directory the operator configured.
_OS_REASONS = {
    errno.EEXIST: "is not a directory (a file is in the way)",
    errno.ENOTDIR: "cannot be created (a file is in the way on its path)",
    errno.ENOENT: "cannot be created (a parent is missing or is not a real directory)",
    errno.EACCES: "is not accessible: permission denied",
    errno.EPERM: "is not accessible: operation not permitted",
    errno.EROFS: "is on a read-only file system",
    errno.ENOSPC: "has no space left on its device",
    errno.EDQUOT: "is over its disk quota",
}


def describe_error(exc: BaseException, settings: Settings | None = None) -> str:
    """One line naming what is wrong and, where one is to blame, the setting."""
    return _one_line(_redact(_describe(exc, settings), settings))


def _describe(exc: BaseException, settings: Settings | None) -> str:
    if isinstance(exc, ValidationError):
        if exc.title == Settings.__name__:
            return describe_settings_error(exc)
        return describe_validation_error(exc).replace("Value error, ", "")
    if isinstance(exc, OffloaderError | ValueError | LookupError | TypeError):
        return str(exc)
    sqlalchemy_text = _describe_sqlalchemy(exc, settings)
    if sqlalchemy_text is not None:
        return sqlalchemy_text
    if isinstance(exc, ModuleNotFoundError) and _raised_in_sqlalchemy(exc):
        return (
            f"the Python module {exc.name!r} is not installed; {_METADATA_URL} "
            f"({_metadata_url(settings)}) names a database driver this installation lacks "
            "(use sqlite:///... or postgresql+psycopg2://...)"
        )
    if isinstance(exc, OSError):
        return describe_os_error(exc, settings)
    if isinstance(exc, OverflowError | MemoryError):
        return f"a number or size is too large ({type(exc).__name__}: {exc})"
    return f"unexpected {type(exc).__name__}: {exc} (run with --debug for the traceback)"


def describe_settings_error(exc: ValidationError) -> str:
    """``OFFLOADER_FIELD: rule`` for each invalid setting, by its environment variable."""
    parts = []
    for err in exc.errors():
        names = [str(p) for p in err["loc"] if isinstance(p, str)]
        message = str(err["msg"]).removeprefix("Value error, ")
        if names:
            parts.append(f"{_variable(names[0])}: {message}")
        else:  # a rule across fields: name each field by its variable
            for field in Settings.model_fields:
                message = re.sub(rf"\b{field}\b", _variable(field), message)
            parts.append(message)
    return "invalid setting " + "; ".join(parts)


def _variable(field: str) -> str:
    return f"{ENV_PREFIX}{field.upper()}"


def _raised_in_sqlalchemy(exc: BaseException) -> bool:
    frames = traceback.extract_tb(exc.__traceback__)
    return any(f"{os.sep}sqlalchemy{os.sep}" in frame.filename for frame in frames)


def describe_os_error(exc: OSError, settings: Settings | None) -> str:
    """An OS error on a configured directory names the setting and what is wrong with it."""
    if exc.filename is None:
        return f"{exc.strerror or exc}"
    path = Path(os.fsdecode(exc.filename))
    setting = _setting_for_path(path, settings)
    reason = _OS_REASONS.get(exc.errno or 0, f"failed: {exc.strerror or exc}")
    if setting is None:
        return f"{path} {reason}"
    name, configured = setting
    if path == configured:
        return f"{name} {reason}"
    return f"{name}: {path} {reason}"


def _describe_sqlalchemy(exc: BaseException, settings: Settings | None) -> str | None:
    try:
        from sqlalchemy import exc as sa_exc
    except ImportError:  # pragma: no cover - sqlalchemy is a dependency
        return None
    where = f"{_METADATA_URL} ({_metadata_url(settings)})"
    if isinstance(exc, sa_exc.NoSuchModuleError):
        return f"{where} names an unknown database dialect or driver: {exc}"
    if isinstance(exc, sa_exc.ArgumentError):
        return (
            f"{_METADATA_URL} does not parse as a SQLAlchemy URL "
            "(expected dialect+driver://user:password@host:port/database or sqlite:///path)"
        )
    if isinstance(exc, sa_exc.DBAPIError):
        return f"metadata database {where} failed: {exc.orig}"
    if isinstance(exc, sa_exc.SQLAlchemyError):
        return f"metadata database {where} failed: {exc}"
    return None


def _metadata_url(settings: Settings | None) -> str:
    """The metadata URL as it may be shown: password replaced, or a placeholder."""
    from sqlalchemy.engine import make_url

    raw = _raw_metadata_url(settings)
    if raw is None:
        return "unset"
    try:
        return make_url(raw).render_as_string(hide_password=True)
    except Exception:
        return "unparseable"


def _raw_metadata_url(settings: Settings | None) -> str | None:
    if settings is not None:
        return settings.resolved_metadata_url
    return os.environ.get(_METADATA_URL)


def _setting_for_path(path: Path, settings: Settings | None) -> tuple[str, Path] | None:
    """The configured directory to blame for an OS error on ``path``, as it is to be named.

    Preference: the directory itself; else the deepest one that holds ``path``; else the
    shallowest one below ``path`` (mkdir failed on a parent of a configured directory).
    """
    if settings is None:
        return None
    ranked = []
    for label, variable, configured in _configured_dirs(settings):
        if path == configured:
            rank: tuple[int, int] = (0, 0)
        elif configured in path.parents:
            rank = (1, -len(configured.parts))
        elif path in configured.parents:
            rank = (2, len(configured.parts))
        else:
            continue
        ranked.append((rank, _name_dir(label, variable, configured, settings), configured))
    if not ranked:
        return None
    _, name, configured = min(ranked)
    return name, configured


def _name_dir(label: str, variable: str, configured: Path, settings: Settings) -> str:
    """``OFFLOADER_X=/p`` when the variable holds that path, else what the path is for."""
    if variable == "OFFLOADER_LEDGER_DIR" or configured == settings.data_dir:
        return f"{variable}={configured}"
    if variable == "OFFLOADER_DATA_DIR":
        return f"{label} {configured} (in OFFLOADER_DATA_DIR={settings.data_dir})"
    return f"{label} {configured} (from {variable})"


def _configured_dirs(settings: Settings) -> list[tuple[str, str, Path]]:
    """Each directory the settings put data in: what it is for, the variable that chose it."""

    def chosen(field: str) -> str:
        return _variable(field) if getattr(settings, field) else "OFFLOADER_DATA_DIR"

    dirs = [("data directory", "OFFLOADER_DATA_DIR", settings.data_dir)]
    dirs.append(("ledger directory", chosen("ledger_dir"), settings.resolved_ledger_dir))
    objects = settings.resolved_object_store_url
    if objects.startswith("file://"):
        root = Path(objects.removeprefix("file://"))
        dirs.append(("object store directory", chosen("object_store_url"), root))
    metadata = settings.resolved_metadata_url
    if metadata.startswith("sqlite:///"):
        database = Path(metadata.removeprefix("sqlite:///"))
        dirs.append(("metadata database directory", chosen("metadata_url"), database.parent))
    return dirs


def _secrets(settings: Settings | None) -> list[str]:
    """Every secret value that must never reach an error message."""
    from sqlalchemy.engine import make_url

    found = []
    raw = _raw_metadata_url(settings)
    if raw:
        try:
            password = make_url(raw).password
        except Exception:
            password = None
        if password and len(password) >= _MIN_SECRET:
            found.append(str(password))
    if settings is not None:
        for field in ("s3_access_key_id", "s3_secret_access_key", "s3_session_token"):
            value = getattr(settings, field)
            if value is not None and len(value.get_secret_value()) >= _MIN_SECRET:
                found.append(value.get_secret_value())
        found += [v for v in settings.otel_header_map().values() if len(v) >= _MIN_SECRET]
    return found


def _redact(text: str, settings: Settings | None) -> str:
    for secret in sorted(_secrets(settings), key=len, reverse=True):
        text = text.replace(secret, _REDACTED)
    return text


def _one_line(text: str) -> str:
    return " ".join(text.split())
