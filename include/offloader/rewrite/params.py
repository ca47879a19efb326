"""One rewrite run's parameters: one model for `offloader rewrite`, the `bulk_rewrite` DAG's
form and the Spark driver, so the three can never disagree (built like
:class:`offloader.offload.params.OffloadRunParams`: :meth:`RewriteParams.parse` checks
values against the form's JSON schema first, then the rules between fields)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from offloader.offload.params import RunParams, topic_names

MiB = 1024 * 1024
GiB = 1024 * MiB
COMPACT, TO_V2, TO_V1 = "compact", "to-v2", "to-v1"
Mode = Literal["compact", "to-v2", "to-v1"]


class RewriteParams(RunParams):
    """What one rewrite run does. Empty means 'no limit'."""

    mode: Mode = Field(
        default=COMPACT,
        title="Mode",
        description="compact: merge runs of small objects into segments near the target "
        "size; to-v2: rewrite v1 ledger objects into v2 segments; to-v1: the reverse.",
    )
    topics: list[str] | None = Field(
        default=None,
        title="Topics",
        description="Rewrite these topics; leave empty for every topic.",
    )
    first_ledger: int | None = Field(
        default=None, ge=0, title="First ledger", description="Lowest ledger id; empty: 0."
    )
    last_ledger: int | None = Field(
        default=None, ge=0, title="Last ledger", description="Highest ledger id; empty: no limit."
    )
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

    @field_validator("topics")
    @classmethod
    def _topic_names(cls, value: list[str] | None) -> list[str] | None:
        return topic_names(value)

    @model_validator(mode="after")
    def _rules(self) -> RewriteParams:
        first, last = self.first_ledger, self.last_ledger
        if first is not None and last is not None and first > last:
            raise ValueError(
                f"first_ledger {first} is above last_ledger {last}: nothing to rewrite"
            )
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

    def in_range(self, ledger_id: int) -> bool:
        """Whether ``ledger_id`` is inside the run's ledger range."""
        low = self.first_ledger if self.first_ledger is not None else 0
        return low <= ledger_id and (self.last_ledger is None or ledger_id <= self.last_ledger)


def parse_ledger_range(text: str) -> tuple[int, int]:
    """``"FIRST:LAST"`` -> (first, last), both ids >= 0; ValueError naming the text."""
    first, sep, last = text.strip().partition(":")
    try:
        if not sep:
            raise ValueError(text)
        low, high = int(first), int(last)
        if low < 0 or high < 0:
            raise ValueError(text)
    except ValueError:
        raise ValueError(
            f"ledgers {text!r}: expected FIRST:LAST, two ledger ids >= 0 (e.g. 10:200)"
        ) from None
    return low, high
