"""Credentials never reach a log, at any level: a logging filter that cuts them out.

botocore logs every request at DEBUG, headers included: the ``Authorization`` header (the
access key id in its ``Credential=`` scope, and the signature), a session token, and the
signature's inputs (``botocore.auth``). `offloader --debug` turns DEBUG on, so the filter
sits on the handler and sees every record, the third-party ones too.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable

REDACTED = "***"
# Shorter values would be cut out of ordinary words; keys and secrets are longer.
_MIN_SECRET = 4

_PATTERNS = [
    # Authorization: the whole header value (scheme, credential scope, signature)
    re.compile(r"""(?i)(authorization['"]?\s*[:=]\s*b?['"]?)[^'"\r\n]+"""),
    # a signature's parts wherever they appear (presigned URLs, the auth module's lines)
    re.compile(r"(?i)(credential=)[^,&\s'\"]+"),
    re.compile(r"(?i)(signature=)[0-9a-f]+"),
    re.compile(r"(?i)(x-amz-credential=)[^&\s'\"]+"),
    re.compile(r"(?i)(x-amz-signature=)[0-9a-f]+"),
    re.compile(r"""(?i)(x-amz-security-token['"]?\s*[:=]\s*b?['"]?)[^'"&\s]+"""),
    re.compile(r"(?i)(signature:\s*)[0-9a-f]{16,}"),
]


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with credentials replaced by ``***``: header values, signature parts and
    every value of ``secrets`` (the configured keys)."""
    for pattern in _PATTERNS:
        text = pattern.sub(lambda m: m.group(1) + REDACTED, text)
    for secret in secrets:
        if len(secret) >= _MIN_SECRET:
            text = text.replace(secret, REDACTED)
    return text


class RedactingFilter(logging.Filter):
    """Rewrites each record's message with :func:`redact` (it never drops a record)."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        super().__init__()
        self.secrets = [s for s in secrets if s]

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a broken format string: leave it to the handler to report
            return True
        cleaned = redact(message, self.secrets)
        if cleaned != message:
            record.msg, record.args = cleaned, None
        if record.exc_text:
            record.exc_text = redact(record.exc_text, self.secrets)
        return True
