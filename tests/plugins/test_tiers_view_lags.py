"""The tiered-storage view's lags: the table of each topic's offload, streaming and
hot-deletion lags, deletion backlog and tiered size (the metrics' figures, read in the same
request as the tiers), with totals; and the lag plot, step lines drawn by the same chart
code as the tiers' (each axis scaled on its own). Real SQLite metadata through the
offloader connection; the expected figures come from the ledger rows."""

from __future__ import annotations

from html.parser import HTMLParser
from pathlib import Path

import pytest

from fixtures.airflow import use_offloader_connection
from fixtures.backends import make_topic, produce_ledgers
from fixtures.metadata import file_store_id
from fixtures.tier_scenario import ledger_lags
from offloader.offload.ledger_offloader import LedgerOffloader
from offloader.runtime import Runtime, upgrade_database
from offloader.settings import Settings
from offloader_airflow.hooks import OffloaderHook
from offloader_airflow.ui.app import tiers_state
from offloader_airflow.ui.page import LAG_LINES, TIER_LINES, Line, chart_svg, render_page


class Cells(HTMLParser):
    """The text of every ``data-field`` cell, by the ``data-topic`` (or ``id``) of its row,
    those cells' attributes, and the attributes of every element that has an ``id``."""

    def __init__(self, html: str) -> None:
        super().__init__()
        self.rows: dict[str, dict[str, str]] = {}
        self.attrs: dict[str, dict[str, dict[str, str | None]]] = {}
        self.ids: dict[str, dict[str, str | None]] = {}
        self.texts: list[str] = []
        self._row: str | None = None
        self._field: str | None = None
        self.feed(html)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if a.get("id"):
            self.ids[str(a["id"])] = a
        if tag == "tr":
            self._row = a.get("data-topic") or a.get("id")
        elif a.get("data-field") and self._row:
            self._field = a["data-field"]
            self.rows.setdefault(self._row, {})[self._field] = ""
            self.attrs.setdefault(self._row, {})[self._field] = a

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th", "span"):
            self._field = None
        if tag == "tr":
            self._row = None

    def handle_data(self, data: str) -> None:
        self.texts.append(data)
        if self._row and self._field:
            self.rows[self._row][self._field] += data.strip()


@pytest.fixture
def known(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, dict[str, int]]:
    """`orders`: three sealed ledgers, the first offloaded (hot copy kept), a service level
    of 1000 bytes of offload lag (breached); `clicks`: two sealed ledgers, hot only, an
    hour of offload lag allowed (met); one orphan key queued. The connection points at
    them."""
    settings = Settings(data_dir=tmp_path / "offloader")
    upgrade_database(settings)
    with Runtime.open(settings) as rt:
        make_topic(rt, "orders", max_offload_lag_bytes=1000)
        make_topic(rt, "clicks", max_offload_lag_seconds=3600)
        orders = produce_ledgers(rt, "orders", [(40, 3000), (30, 3000), (20, 3000)], seed=1)
        produce_ledgers(rt, "clicks", [(50, 500), (10, 500)], seed=2)
        LedgerOffloader(rt).offload_topic("orders", up_to=orders[0])
        rt.metadata.deletions.enqueue(["orphan"], "sweep", store_id=file_store_id(rt.metadata))
        expected = {topic: ledger_lags(rt, topic) for topic in ("orders", "clicks")}
    assert expected["orders"]["tiered_bytes"] > 0 and expected["orders"]["offload_lag_ledgers"] == 2
    use_offloader_connection(monkeypatch, settings.resolved_metadata_url, tmp_path / "offloader")
    return expected


def test_the_state_carries_the_observed_lags_and_the_lag_history(
    known: dict[str, dict[str, int]],
) -> None:
    state = tiers_state(OffloaderHook())
    assert state["error"] is None
    observed = {t["topic"]: t for t in state["observations"]["topics"]}
    for topic, figures in known.items():
        assert {k: observed[topic][k] for k in figures} == figures
    totals = state["observations"]["totals"]
    assert totals["offload_lag_bytes"] == sum(f["offload_lag_bytes"] for f in known.values())
    assert totals["topics"] == 2
    lags = state["report"]["lag_history"]
    assert lags[-1]["offload_lag_bytes"] == totals["offload_lag_bytes"]
    assert lags[-1]["deletion_backlog"] == 1 == state["report"]["deletion_backlog"]["pending"]


def test_the_page_shows_the_lag_table_with_totals_and_the_lag_plot(
    known: dict[str, dict[str, int]],
) -> None:
    page = Cells(render_page({"dags": [], **tiers_state(OffloaderHook())}))
    for topic, figures in known.items():
        row = page.rows[topic]
        assert row["offload_lag_ledgers"] == str(figures["offload_lag_ledgers"])
        assert row["offload_lag_bytes"].startswith(f"{figures['offload_lag_bytes']:,} B")
        assert row["tiered_bytes"].startswith(f"{figures['tiered_bytes']:,} B")
        assert row["tiered_objects"] == str(figures["tiered_objects"])
        assert row["stream_lag_bytes"] == "-"  # not a streaming topic
        assert row["deletion_backlog_keys"] == "0"  # the orphan is no topic's
    totals = page.rows["lag-totals"]
    lag = sum(f["offload_lag_bytes"] for f in known.values())
    assert totals["offload_lag_bytes"].startswith(f"{lag:,} B")
    assert totals["offload_lag_ledgers"] == "4"
    for line in (*TIER_LINES, *LAG_LINES):
        assert page.ids[line.css_id]["points"], line
        assert line.label in "".join(page.texts)
    assert page.ids["lag-chart"]["aria-label"] == "offload lag bytes and deletion backlog over time"


def test_each_axis_is_scaled_to_its_own_lines() -> None:
    """Lag bytes on the left (top 300 B), backlog keys on the right (top 2): the same
    step code, exact points (width 720, height 220, margin 40: x 40..680, y 180..40)."""
    samples = [
        {"at_ms": 1000, "offload_lag_bytes": 300, "deletion_backlog": 0},
        {"at_ms": 2000, "offload_lag_bytes": 150, "deletion_backlog": 2},
    ]
    chart = chart_svg(samples, 3000, LAG_LINES)
    assert chart is not None
    lines = {line["id"]: line["points"] for line in chart["lines"]}
    assert lines == {
        "lag-offload": "40.0,40.0 360.0,40.0 360.0,110.0 680.0,110.0",
        "lag-backlog": "40.0,180.0 360.0,180.0 360.0,40.0 680.0,40.0",
    }
    assert (chart["top"], chart["right_top"]) == ("300 B", "keys: 2")
    assert chart_svg([], 3000, LAG_LINES) is None
    left_only = chart_svg(samples, 3000, (Line("deletion_backlog", "x", "#000", "x", "keys"),))
    assert left_only is not None and left_only["right_top"] is None


def test_a_breached_service_level_is_listed_and_marks_its_figure(
    known: dict[str, dict[str, int]],
) -> None:
    state = tiers_state(OffloaderHook())
    [breach] = state["service_levels"]["breaches"]
    lag = known["orders"]["offload_lag_bytes"]
    assert (breach["topic"], breach["level"], breach["observed"], breach["limit"]) == (
        "orders",
        "max_offload_lag_bytes",
        lag,
        1000,
    )
    assert state["service_levels"]["levels_checked"] == 2
    page = Cells(render_page({"dags": [], **state}))
    assert f"offload lag {lag} bytes exceeds max_offload_lag_bytes 1000" in breach["message"]
    assert breach["message"] in "".join(page.texts)  # the list above the table
    marked = {
        (topic, field): cell["title"]
        for topic, cells in page.attrs.items()
        for field, cell in cells.items()
        if "breach" in (cell.get("class") or "").split()
    }
    assert marked == {("orders", "offload_lag_bytes"): breach["message"]}
    # an unbreached bytes figure shows its short form on hover instead
    assert page.attrs["clicks"]["offload_lag_bytes"]["title"].endswith("KiB)")
