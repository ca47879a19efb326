"""What every offloader operator shares: the connection ids (templated) and a cached hook,
after the amazon provider's ``AwsBaseOperator`` and ``aws_template_fields``."""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property
from typing import Any

from airflow.sdk import BaseOperator

from offloader_airflow.hooks import OffloaderHook


def offloader_template_fields(*fields: str) -> tuple[str, ...]:
    """``fields`` plus the connection ids, once each: every subclass templates both ids."""
    return tuple(dict.fromkeys(("offloader_conn_id", "aws_conn_id", *fields)))


class OffloaderBaseOperator(BaseOperator):
    """An operator working through :class:`OffloaderHook`.

    ``offloader_conn_id`` names the offloader connection; ``aws_conn_id`` overrides the AWS
    connection that one names (None: the connection's own, or ``aws_default``). Both are
    templated, so a Param or an upstream XCom may choose them; the hook is built once per
    task instance, after rendering.
    """

    template_fields: Sequence[str] = offloader_template_fields()
    # An operator taking a ``dry_run`` argument keeps it under that name (a template field,
    # named as the run's Param), which hides BaseOperator.dry_run(), a method nothing in
    # Airflow 3 calls; declared here so the subclasses' attribute has one type.
    dry_run: bool  # type: ignore[assignment]

    def __init__(
        self,
        *,
        offloader_conn_id: str = OffloaderHook.default_conn_name,
        aws_conn_id: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.offloader_conn_id = offloader_conn_id
        self.aws_conn_id = aws_conn_id

    @cached_property
    def hook(self) -> OffloaderHook:
        return OffloaderHook(self.offloader_conn_id, aws_conn_id=self.aws_conn_id)
