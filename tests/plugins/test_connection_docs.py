"""docs/CONFIGURATION.md's table of the offloader connection's extra is the model's."""

from __future__ import annotations

import re
from pathlib import Path

from offloader_airflow.hooks import OffloaderConnectionExtra, extra_docs_table

DOC = Path(__file__).resolve().parents[2] / "docs" / "CONFIGURATION.md"


def test_the_documented_extra_is_the_models() -> None:
    text = DOC.read_text()
    found = re.search(r"<!-- connection-extra-table:[^\n]*-->\n(.*?)\n<!-- /connection", text, re.S)
    assert found, "docs/CONFIGURATION.md lost its connection-extra-table markers"
    expected = extra_docs_table()
    assert found.group(1) == expected, f"regenerate the table in {DOC.name}:\n{expected}"
    for name in OffloaderConnectionExtra.model_fields:
        assert f"| `{name}` |" in found.group(1)
