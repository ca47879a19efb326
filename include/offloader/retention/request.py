"""One retention run's parameters (the `retention` DAG's Params), validated before anything
changes.

A run either applies each topic's retention policy (the scheduled run; from the UI, one
topic, optionally with a policy override for this run), or trims one topic at a cut or a
position ``L:E`` (PDP-19's manual truncation). Everything that can be checked is checked
by :func:`check_request` first: the topic exists, the cut exists, the position is within
the topic, the override keeps offload below retention (PIP-17).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from offloader.metadata import Position, StreamCut
from offloader.policy import OffloadPolicy
from offloader.retention.run import RetentionResult, apply_retention
from offloader.retention.trim import TrimResult, resolve_target, trim_topic
from offloader.runtime import Runtime

OVERRIDES = ("retention_time_seconds", "retention_size_bytes")


class RetentionRequest(BaseModel):
    """What a run of `retention` is asked to do. Empty form fields arrive as '' or None."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    topic: str | None = Field(default=None, max_length=512)
    cut_id: int | None = Field(default=None, ge=0)
    position: str | None = None
    dry_run: bool = False
    retention_time_seconds: float | None = Field(default=None, ge=0)
    retention_size_bytes: int | None = Field(default=None, ge=0)

    @field_validator("topic", "position", "cut_id", *OVERRIDES, mode="before")
    @classmethod
    def _empty_is_none(cls, value: Any) -> Any:
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("position")
    @classmethod
    def _position_parses(cls, value: str | None) -> str | None:
        return None if value is None else str(Position.parse(value))

    @model_validator(mode="after")
    def _one_mode(self) -> RetentionRequest:
        if self.cut_id is not None and self.position is not None:
            raise ValueError("give a cut_id or a position, not both")
        if self.mode == "trim" and self.topic is None:
            raise ValueError("a trim at a cut or a position needs a topic")
        if self.overrides and self.topic is None:
            raise ValueError("a retention override for one run needs a topic")
        if self.overrides and self.mode == "trim":
            raise ValueError("a trim at a cut or position takes no retention override")
        return self

    @property
    def mode(self) -> Literal["trim", "policy"]:
        return "trim" if self.cut_id is not None or self.position is not None else "policy"

    @property
    def overrides(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in OVERRIDES if getattr(self, k) is not None}


def check_request(rt: Runtime, request: RetentionRequest) -> list[str]:
    """The topics the run acts on, after every check that needs the metadata; raises
    (NotFoundError, ValueError, ValidationError) with one clear message otherwise."""
    if request.topic is None:
        return [t.name for t in rt.metadata.list_topics() if not t.is_deleted]
    topic = rt.metadata.get_topic(request.topic)
    if topic.is_deleted:
        raise ValueError(f"topic {topic.name!r} was deleted")
    if request.mode == "trim":
        trim_topic(rt, topic.name, _target(rt, request, topic.name), dry_run=True)
    else:
        override_policy(topic.policy, request)
    return [topic.name]


def override_policy(policy: OffloadPolicy, request: RetentionRequest) -> OffloadPolicy | None:
    """The topic's policy with the run's overrides, validated as a whole (PIP-17)."""
    return policy.updated(request.overrides) if request.overrides else None


def run_request(
    rt: Runtime, request: RetentionRequest, topic: str, end: StreamCut | None
) -> RetentionResult | TrimResult:
    """Do the run's work on one of its topics: trim, or apply the policy at ``end``."""
    if request.mode == "trim":
        return trim_topic(rt, topic, _target(rt, request, topic), dry_run=request.dry_run)
    policy = override_policy(rt.metadata.get_topic(topic).policy, request)
    return apply_retention(rt, topic, dry_run=request.dry_run, end=end, policy=policy)


def _target(rt: Runtime, request: RetentionRequest, topic: str) -> Position:
    return resolve_target(rt, topic, cut_id=request.cut_id, position=request.position)
