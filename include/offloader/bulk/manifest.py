"""The manifest that publishes an export (docs/FORMAT.md, "Export manifest"): written last,
in one atomic step; a reader reads it first and then only the files it lists."""

from __future__ import annotations

import builtins
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class ManifestFile(BaseModel):
    """One Parquet file: ``path`` is relative to the manifest's folder plus ``root``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    path: str
    topic: str
    ledger_id: int
    first_entry_id: int
    last_entry_id: int
    rows: int
    bytes: int
    sha256: str  # of the file's bytes


class ExportManifest(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    format: Literal["offloader-export"] = "offloader-export"
    format_version: Literal[1] = 1
    export_id: str
    attempt: str
    root: str  # the attempt's folder relative to the manifest's: "" or "<attempt>/"
    created_ms: int
    params: dict[str, Any]
    files: list[ManifestFile] = Field(default_factory=list)

    @property
    def rows(self) -> int:
        return sum(f.rows for f in self.files)

    @property
    def bytes(self) -> int:
        return sum(f.bytes for f in self.files)

    def file_paths(self) -> list[str]:
        """Every file relative to the manifest's folder: what a reader opens."""
        return [self.root + f.path for f in self.files]

    def to_bytes(self) -> builtins.bytes:
        return self.model_dump_json(indent=1).encode()

    @classmethod
    def from_bytes(cls, data: builtins.bytes, where: str) -> ExportManifest:
        """ValueError naming ``where`` if ``data`` is not an export manifest."""
        try:
            return cls.model_validate_json(data)
        except ValueError as exc:
            raise ValueError(f"{where} is not an export manifest: {exc}") from None


@dataclass(frozen=True)
class BulkExportResult:
    """A published export: what the bulk_export DAG's task returns, with ``output`` (where
    it was published, when the caller names it) and what its Spark job logs."""

    manifest: ExportManifest
    output: str | None = None

    def to_json(self) -> dict[str, Any]:
        m = self.manifest
        published = {
            "export_id": m.export_id,
            "attempt": m.attempt,
            "files": len(m.files),
            "rows": m.rows,
            "bytes": m.bytes,
            "ledgers": len({(f.topic, f.ledger_id) for f in m.files}),
        }
        return published if self.output is None else {**published, "output": self.output}

    def __str__(self) -> str:
        m, where = self.manifest, "" if self.output is None else f" at {self.output}"
        return (
            f"export {m.export_id} (attempt {m.attempt}){where}: {len(m.files)} files, "
            f"{m.rows} rows, {m.bytes} bytes"
        )
