"""Per-topic policies, stored as JSON in the metadata and settable from the CLI.

Invalid values are rejected by pydantic with an error naming the field and the rule.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

KiB = 1024
MiB = 1024 * KiB


class ReadPriority(StrEnum):
    """Which copy serves reads while both exist (Pulsar's offloadedReadPriority)."""

    TIERED_FIRST = "tiered-first"
    HOT_FIRST = "hot-first"


class OffloadPolicy(BaseModel):
    """When ledgers are offloaded and how their objects are laid out and read.

    A ledger is due when either rule says so: the size rule keeps at most
    ``offload_threshold_bytes`` of the topic in the hot tier (oldest sealed ledgers go
    first, Pulsar's offload threshold); the age rule offloads ledgers sealed longer than
    ``offload_age_seconds`` ago. ``None`` turns a rule off.

    Streaming (PIP-76, ``streaming``) offloads a stream of entries, the open ledger's up to
    its last confirmed entry included, into segments that span ledgers: a segment rolls
    over at ``segment_max_bytes`` or ``segment_max_age_seconds`` after it was assigned,
    whichever comes first, and its multipart parts are at least ``min_part_bytes`` (S3
    refuses parts under 5 MiB but the last; the filesystem store takes any size). A tail
    smaller than a part waits in the hot tier until it grows or the age limit forces it.

    Retention (PDP-19) keeps at least ``retention_time_seconds`` of the topic's history
    and at least ``retention_size_bytes`` of its committed bytes; ``None`` keeps forever.
    Each retention threshold must sit above its offload threshold (PIP-17), or data would
    be deleted before it is offloaded.

    Service levels (``max_*``, docs/OPERATIONS.md "Service levels and alerts"): each bounds
    one figure the metrics observe for the topic (``offloader.metrics.observe``), and
    ``offloader check-service-levels`` fails naming the topic when it is exceeded; being
    exactly at the limit meets it, ``None`` (the default) sets no level. A level on the lag
    that a threshold of this policy creates by design must sit above that threshold, or it
    would fire on a topic working as configured.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", use_enum_values=False)

    offload_threshold_bytes: int | None = Field(default=None, ge=0)
    offload_age_seconds: float | None = Field(default=None, ge=0)
    deletion_lag_seconds: float = Field(default=4 * 3600, ge=0)
    read_priority: ReadPriority = ReadPriority.TIERED_FIRST
    max_block_size: int = Field(default=64 * MiB, ge=64 * KiB, le=5 * 1024 * MiB)
    read_buffer_size: int = Field(default=1 * MiB, ge=4 * KiB, le=256 * MiB)
    ledger_max_entries: int = Field(default=50_000, ge=1)
    ledger_max_bytes: int = Field(default=2048 * MiB, ge=1)
    ledger_max_age_seconds: float | None = Field(default=4 * 3600, gt=0)
    retention_time_seconds: float | None = Field(default=None, ge=0)
    retention_size_bytes: int | None = Field(default=None, ge=0)
    streaming: bool = False
    segment_max_bytes: int = Field(default=1024 * MiB, ge=1, le=5 * 1024 * 1024 * MiB)
    segment_max_age_seconds: float = Field(default=600, gt=0)
    min_part_bytes: int = Field(default=8 * MiB, ge=1, le=5 * 1024 * MiB)
    # service levels: None = no level (see the class docstring)
    max_offload_lag_seconds: float | None = Field(default=None, gt=0)
    max_offload_lag_bytes: int | None = Field(default=None, ge=0)
    max_stream_lag_seconds: float | None = Field(default=None, gt=0)
    max_hot_deletion_lag_seconds: float | None = Field(default=None, gt=0)
    max_deletion_backlog_age_seconds: float | None = Field(default=None, gt=0)
    max_deletion_failing_keys: int | None = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _part_within_segment(self) -> OffloadPolicy:
        if self.min_part_bytes > self.segment_max_bytes:
            raise ValueError(
                f"min_part_bytes ({self.min_part_bytes}) must not exceed "
                f"segment_max_bytes ({self.segment_max_bytes}): a segment is one or more parts"
            )
        return self

    @model_validator(mode="after")
    def _buffer_within_block(self) -> OffloadPolicy:
        if self.read_buffer_size > self.max_block_size:
            raise ValueError(
                f"read_buffer_size ({self.read_buffer_size}) must not exceed "
                f"max_block_size ({self.max_block_size})"
            )
        return self

    @model_validator(mode="after")
    def _offload_before_retention(self) -> OffloadPolicy:
        """PIP-17: what retention deletes must have had its chance to be offloaded."""
        pairs = (
            ("offload_threshold_bytes", "retention_size_bytes"),
            ("offload_age_seconds", "retention_time_seconds"),
        )
        if unordered := self._first_unordered(pairs):
            offload, low, retention, high = unordered
            raise ValueError(
                f"{offload} ({low}) must be below {retention} ({high}): "
                "data would be deleted before it is offloaded (PIP-17)"
            )
        return self

    @model_validator(mode="after")
    def _levels_above_thresholds(self) -> OffloadPolicy:
        """A service level the policy's own thresholds break by design is refused: ledgers
        wait in the hot tier up to ``offload_age_seconds`` or ``offload_threshold_bytes``,
        and a streaming segment stays open up to ``segment_max_age_seconds``."""
        pairs = [
            ("offload_age_seconds", "max_offload_lag_seconds"),
            ("offload_threshold_bytes", "max_offload_lag_bytes"),
        ]
        if self.streaming:  # a ledger is settled once the segment holding its end commits
            pairs.append(("segment_max_age_seconds", "max_stream_lag_seconds"))
            pairs.append(("segment_max_age_seconds", "max_offload_lag_seconds"))
        if unordered := self._first_unordered(pairs):
            threshold, low, level, high = unordered
            raise ValueError(
                f"{level} ({high}) must be above {threshold} ({low}): the policy holds "
                "that much back by design, so the level would always be breached"
            )
        return self

    def _first_unordered(
        self, pairs: Sequence[tuple[str, str]]
    ) -> tuple[str, Any, str, Any] | None:
        """The first (low field, value, high field, value) of ``pairs`` both set and not
        strictly ordered, or None."""
        for low_field, high_field in pairs:
            low, high = getattr(self, low_field), getattr(self, high_field)
            if low is not None and high is not None and not low < high:
                return low_field, low, high_field, high
        return None

    def updated(self, changes: dict[str, Any]) -> OffloadPolicy:
        """A new policy with ``changes`` applied and validated as a whole."""
        unknown = sorted(set(changes) - set(type(self).model_fields))
        if unknown:
            raise ValueError(
                f"unknown policy field(s): {', '.join(unknown)}; "
                f"known: {', '.join(type(self).model_fields)}"
            )
        return type(self).model_validate({**self.model_dump(), **changes})


def describe_validation_error(exc: ValidationError) -> str:
    """One line per problem: ``field: rule`` (what users of the CLI and the DAG forms see)."""
    lines = []
    for err in exc.errors():
        field = ".".join(str(p) for p in err["loc"]) or "policy"
        lines.append(f"{field}: {err['msg']}")
    return "; ".join(lines)
