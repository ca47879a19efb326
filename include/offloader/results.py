"""One shape for what a run did or found, for machines and for people.

Every run result and report (an offload, a streaming pass, a garbage collection, a sweep,
retention and trim, scrub, rewrite, a bulk export, snapshots, a rebuild, the status) is a
:class:`RunResult`:

- ``to_json()``: a JSON-ready dict (str keys; lists, str, int, float, bool, None inside),
  what ``offloader ... --json`` prints, what an operator returns as XCom, what a Spark app
  writes as its result file;
- ``str()``: the line or few lines for people that the CLI prints without ``--json`` and a
  task logs.

:func:`jsonable` makes anything the CLI prints or an operator returns JSON-ready, a result
through its ``to_json()``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields, is_dataclass
from enum import Enum
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel


@runtime_checkable
class RunResult(Protocol):
    """What a run did, as JSON (``to_json``) and as text for people (``str``)."""

    def to_json(self) -> dict[str, Any]: ...

    def __str__(self) -> str: ...


class BreachReport:
    """A check's report (``offloader verify``, ``offloader check-service-levels``): ok when
    it found no breach; the CLI exits 0 then, and 1 with breaches (one line each)."""

    breaches: Sequence[object]

    @property
    def ok(self) -> bool:
        return not self.breaches

    @property
    def exit_status(self) -> int:
        """What the CLI exits with: 0 when nothing is breached, 1 otherwise."""
        return 0 if self.ok else 1


def jsonable(value: Any) -> Any:
    """``value`` made JSON-ready: a result through its ``to_json()``, a pydantic model (a
    record, run params) in its JSON mode, a dataclass field by field, an enum as its value,
    containers item by item (dict keys as str, tuples as lists)."""
    if isinstance(value, RunResult) and not isinstance(value, type):
        return value.to_json()
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if is_dataclass(value) and not isinstance(value, type):
        return fields_json(value)
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, Enum):
        return value.value
    return value


def fields_json(result: Any) -> dict[str, Any]:
    """A dataclass's fields in order, each made JSON-ready: the ``to_json()`` of a result
    that is its fields."""
    return {f.name: jsonable(getattr(result, f.name)) for f in fields(result)}
