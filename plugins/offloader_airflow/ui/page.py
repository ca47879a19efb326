"""Server-rendered HTML of the tiered-storage view, with an inline SVG chart (no scripts,
no CDN: the page must work on a machine without internet)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, select_autoescape

_ENV = Environment(
    loader=FileSystemLoader(Path(__file__).with_name("templates")),
    autoescape=select_autoescape(default=True),
)
CHART_WIDTH, CHART_HEIGHT, CHART_MARGIN = 720, 220, 40


def render_page(data: dict[str, Any]) -> str:
    report = data.get("report")
    chart = chart_svg(report["history"], report["now_ms"]) if report else None
    return _ENV.get_template("tiers.html").render(
        data=data, report=report, chart=chart, bytes=fmt_bytes, when=fmt_ms, age=fmt_age
    )


def chart_svg(history: list[dict[str, int]], now_ms: int) -> dict[str, Any] | None:
    """Step lines of hot and offloaded bytes from the first change to now, as SVG points."""
    if not history:
        return None
    start = history[0]["at_ms"]
    span = max(now_ms - start, 1)
    top = max(max(s["hot_bytes"], s["offloaded_bytes"]) for s in history) or 1
    width, height, m = CHART_WIDTH, CHART_HEIGHT, CHART_MARGIN

    def x(at: int) -> float:
        return round(m + (min(at, now_ms) - start) / span * (width - 2 * m), 1)

    def y(value: int) -> float:
        return round(height - m - value / top * (height - 2 * m), 1)

    def steps(key: str) -> str:
        points = []
        previous = None
        for sample in history:
            if previous is not None:
                points.append((x(sample["at_ms"]), y(previous)))
            points.append((x(sample["at_ms"]), y(sample[key])))
            previous = sample[key]
        points.append((x(now_ms), y(history[-1][key])))
        return " ".join(f"{px},{py}" for px, py in points)

    return {
        "width": width,
        "height": height,
        "margin": m,
        "hot": steps("hot_bytes"),
        "offloaded": steps("offloaded_bytes"),
        "top": fmt_bytes(top),
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
