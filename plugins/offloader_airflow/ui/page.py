"""Server-rendered HTML of the tiered-storage view, with an inline SVG chart (no scripts,
no CDN: the page must work on a machine without internet)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, select_autoescape

from offloader.metrics.service_levels import LEVELS

_ENV = Environment(
    loader=FileSystemLoader(Path(__file__).with_name("templates")),
    autoescape=select_autoescape(default=True),
)
CHART_WIDTH, CHART_HEIGHT, CHART_MARGIN = 720, 220, 40


@dataclass(frozen=True)
class Line:
    """One step line of a chart: the samples' ``field``, drawn as ``css_id``; lines on
    the same axis share its scale (the right axis is for a second unit)."""

    field: str
    css_id: str
    color: str
    label: str
    unit: str = "bytes"  # or a counted noun: "keys"
    right: bool = False


TIER_LINES = (
    Line("hot_bytes", "chart-hot", "#dd6b20", "hot"),
    Line("offloaded_bytes", "chart-offloaded", "#3182ce", "offloaded"),
)
LAG_LINES = (
    Line("offload_lag_bytes", "lag-offload", "#805ad5", "offload lag (bytes, left axis)"),
    Line(
        "deletion_backlog",
        "lag-backlog",
        "#c53030",
        "deletion backlog (keys, right axis)",
        unit="keys",
        right=True,
    ),
)


def render_page(data: dict[str, Any]) -> str:
    report = data.get("report")
    breaches = (data.get("service_levels") or {}).get("breaches", [])
    charts = {}
    if report:
        charts["tiers"] = chart_svg(report["history"], report["now_ms"], TIER_LINES)
        charts["lags"] = chart_svg(report["lag_history"], report["now_ms"], LAG_LINES)
    return _ENV.get_template("tiers.html").render(
        data=data,
        report=report,
        obs=data.get("observations"),
        breaches=breaches,
        breached=breached_cells(breaches),
        charts=charts,
        bytes=fmt_bytes,
        when=fmt_ms,
        age=fmt_age,
        seconds=fmt_seconds,
    )


def breached_cells(breaches: list[dict[str, Any]]) -> dict[str, dict[str, str]]:
    """Per topic, the lag table's fields (the observed figures) whose service level is
    breached, each with the breach's message."""
    bounded = {level.policy_field: level.observed_field for level in LEVELS}
    cells: dict[str, dict[str, str]] = {}
    for breach in breaches:
        field = bounded[breach["level"]]
        cells.setdefault(breach["topic"], {})[field] = breach["message"]
    return cells


def chart_svg(
    samples: list[dict[str, int]], now_ms: int, lines: tuple[Line, ...]
) -> dict[str, Any] | None:
    """Step lines of ``lines`` from the first sample to now, as SVG points, each axis
    scaled to the largest value of its lines; None without samples."""
    if not samples:
        return None
    start = samples[0]["at_ms"]
    span = max(now_ms - start, 1)
    width, height, m = CHART_WIDTH, CHART_HEIGHT, CHART_MARGIN
    tops = {
        right: max(
            (s[line.field] for line in lines if line.right is right for s in samples), default=0
        )
        or 1
        for right in (False, True)
    }

    def x(at: int) -> float:
        return round(m + (min(at, now_ms) - start) / span * (width - 2 * m), 1)

    def steps(line: Line) -> str:
        top = tops[line.right]

        def y(value: int) -> float:
            return round(height - m - value / top * (height - 2 * m), 1)

        points = []
        previous = None
        for sample in samples:
            if previous is not None:
                points.append((x(sample["at_ms"]), y(previous)))
            points.append((x(sample["at_ms"]), y(sample[line.field])))
            previous = sample[line.field]
        points.append((x(now_ms), y(samples[-1][line.field])))
        return " ".join(f"{px},{py}" for px, py in points)

    def top_label(right: bool) -> str | None:
        units = {line.unit for line in lines if line.right is right}
        if not units:
            return None
        [unit] = units  # one unit per axis
        return fmt_bytes(tops[right]) if unit == "bytes" else f"{unit}: {tops[right]:,}"

    return {
        "width": width,
        "height": height,
        "margin": m,
        "lines": [
            {"id": line.css_id, "color": line.color, "label": line.label, "points": steps(line)}
            for line in lines
        ],
        "top": top_label(False),
        "right_top": top_label(True),
        "start": fmt_ms(start),
        "end": fmt_ms(now_ms),
    }


def fmt_bytes(n: int) -> str:
    """Exact bytes (what an operator compares with ``offloader status``) and a short form."""
    short = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if short < 1024 or unit == "TiB":
            break
        short /= 1024
    return f"{n:,} B" if unit == "B" else f"{n:,} B ({short:.1f} {unit})"


def fmt_ms(ms: int | None) -> str:
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def fmt_age(ms: int | None) -> str:
    if ms is None:
        return "-"
    seconds = ms // 1000
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    return f"{seconds // 3600}h {seconds % 3600 // 60}m"


def fmt_seconds(seconds: float | None) -> str:
    """An observed age (seconds, None when there is nothing of its kind)."""
    return "-" if seconds is None else fmt_age(int(seconds * 1000))
