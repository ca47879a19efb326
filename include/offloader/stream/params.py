"""One streaming run's parameters: the `streaming_offload` DAG's trigger form and its pass
task check the same model, so the two can never disagree.

Built like :class:`offloader.offload.params.OffloadRunParams`: the form's schema is generated
from :class:`StreamRunParams` and :meth:`StreamRunParams.parse` checks values against it
first, so a bad value gets one line naming the field (RunParamsError).
"""

from __future__ import annotations

from pydantic import Field, field_validator

from offloader.params import RunParams


class StreamRunParams(RunParams):
    """What one run of `streaming_offload` is asked to do."""

    topic: str | None = Field(
        default=None,
        max_length=512,
        # a name pasted with a stray space is refused by the form, not looked up
        pattern=r"^(\S(.*\S)?)?$",
        title="Topic",
        description="Stream this topic only (it may have streaming off: its open segment is "
        "completed); leave empty for every topic whose policy has streaming on. No leading "
        "or trailing spaces.",
    )
    close_now: bool = Field(
        default=False,
        title="Close now",
        description="Complete each topic's current segment at once, however small, instead "
        "of waiting for its size or age limit.",
    )

    @field_validator("topic")
    @classmethod
    def _empty_is_every_topic(cls, value: str | None) -> str | None:
        return value or None
