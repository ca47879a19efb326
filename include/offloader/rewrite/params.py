"""One rewrite run's parameters: one model for `offloader rewrite`, the `bulk_rewrite` DAG's
form and the Spark driver, so the three can never disagree (built like
:class:`offloader.offload.params.OffloadRunParams`: :meth:`RewriteParams.parse` checks
values against the form's JSON schema first, then the rules between fields)."""

from __future__ import annotations

from typing import ClassVar, Final, Literal

from pydantic import Field, model_validator

from offloader.params import LedgerSelection, RunParams, topics_field

MiB = 1024 * 1024
GiB = 1024 * MiB
COMPACT: Final = "compact"
TO_V2: Final = "to-v2"
TO_V1: Final = "to-v1"
Mode = Literal["compact", "to-v2", "to-v1"]


class _ModeFirst(RunParams):
    """The mode alone, a base of :class:`RewriteParams` after the ledger selection: fields
    are ordered base first, so the mode, which says what the others mean, leads the form."""

    mode: Mode = Field(
        default=COMPACT,
        title="Mode",
        description="compact: merge runs of small objects into segments near the target "
        "size; to-v2: rewrite v1 ledger objects into v2 segments; to-v1: the reverse.",
    )


class RewriteParams(LedgerSelection, _ModeFirst):
    """What one rewrite run does. Empty means 'no limit'."""

    action: ClassVar[str] = "rewrite"

    topics: list[str] | None = topics_field("Rewrite")
    target_bytes: int = Field(
        default=128 * MiB,
        ge=1,
        le=64 * GiB,
        title="Target bytes",
        description="Sources are packed into one output object up to this many bytes (a "
        "larger source alone).",
    )
    small_bytes: int | None = Field(
        default=None,
        ge=1,
        title="Small bytes",
        description="compact only: objects smaller than this are candidates; empty: a "
        "quarter of the target.",
    )
    max_groups: int = Field(
        default=100,
        ge=1,
        le=100_000,
        title="Most groups",
        description="Rewrite at most this many output objects in this run; the next run goes on.",
    )
    dry_run: bool = Field(
        default=False,
        title="Dry run",
        description="Plan and report what would be rewritten; change nothing.",
    )

    @model_validator(mode="after")
    def _small_bytes_rule(self) -> RewriteParams:
        if self.small_bytes is not None:
            if self.mode != COMPACT:
                raise ValueError(f"small_bytes applies to mode compact only, not {self.mode}")
            if self.small_bytes > self.target_bytes:
                raise ValueError(
                    f"small_bytes ({self.small_bytes}) is above target_bytes "
                    f"({self.target_bytes}): every output would be 'small' again"
                )
        return self

    @property
    def small_limit(self) -> int:
        """Objects below this many bytes are compaction candidates."""
        return self.small_bytes if self.small_bytes is not None else max(1, self.target_bytes // 4)
