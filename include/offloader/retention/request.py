"""One retention run's request (its :class:`~offloader.retention.params.RetentionParams`),
checked against the metadata before anything changes, then run topic by topic.

Everything that can be checked is checked by :func:`check_request` first: the topic
exists, the cut exists, the position is within the topic, the override keeps offload below
retention (PIP-17).
"""

from __future__ import annotations

from offloader.metadata import Position, StreamCut
from offloader.policy import OffloadPolicy
from offloader.retention.params import RetentionParams
from offloader.retention.run import RetentionResult, apply_retention
from offloader.retention.trim import TrimResult, resolve_target, trim_topic
from offloader.runtime import Runtime


def check_request(rt: Runtime, request: RetentionParams) -> list[str]:
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


def override_policy(policy: OffloadPolicy, request: RetentionParams) -> OffloadPolicy | None:
    """The topic's policy with the run's overrides, validated as a whole (PIP-17)."""
    return policy.updated(request.overrides) if request.overrides else None


def run_request(
    rt: Runtime, request: RetentionParams, topic: str, end: StreamCut | None
) -> RetentionResult | TrimResult:
    """Do the run's work on one of its topics: trim, or apply the policy at ``end``."""
    if request.mode == "trim":
        return trim_topic(rt, topic, _target(rt, request, topic), dry_run=request.dry_run)
    policy = override_policy(rt.metadata.get_topic(topic).policy, request)
    return apply_retention(rt, topic, dry_run=request.dry_run, end=end, policy=policy)


def _target(rt: Runtime, request: RetentionParams, topic: str) -> Position:
    return resolve_target(rt, topic, cut_id=request.cut_id, position=request.position)
