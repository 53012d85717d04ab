"""`--report FILE.html`: one self-contained page (inline CSS and SVG, no scripts, opens offline)."""

from __future__ import annotations

import json
import math
from html import escape

from gradlint.runtime.report import CONFIRMED, NOT_CHECKED, NOT_REACHED, NOT_REPRODUCED, RUNTIME_ONLY, TraceReport

_COLORS = {
    CONFIRMED: "#c62828",
    RUNTIME_ONLY: "#ad1457",
    NOT_REPRODUCED: "#2e7d32",
    NOT_REACHED: "#757575",
    NOT_CHECKED: "#8d6e63",
}
_STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222}
table{border-collapse:collapse;width:100%}td,th{border-bottom:1px solid #ddd;padding:4px 8px;text-align:left;
vertical-align:top}.badge{color:#fff;border-radius:3px;padding:1px 6px;font-size:12px;white-space:nowrap}
code{background:#f3f3f3;padding:0 3px}.note{color:#666}svg text{font:11px sans-serif}
"""


def render_html(report: TraceReport) -> str:
    """The page: the run's outcome, the findings with evidence, and the per-step plots."""
    steps = report.run.of_kind("step")
    body = [
        f"<h1>gradlint trace: <code>{escape(report.path)}</code></h1>",
        f"<p>{escape(report.summary()).replace(chr(10), '<br>')}</p>",
        "<h2>Findings</h2>",
        _findings(report),
        "<h2>Autograd graph held by the script's variables</h2>",
        "<p class=note>Nodes reachable from the script's tensors after each optimizer step. "
        "A line that keeps rising is a leak (GL001).</p>",
        _line_chart([(int(str(s.get("step", 0))), int(str(s.get("graph_nodes", 0)))) for s in steps]),
        "<h2>Gradient norm per parameter</h2>",
        "<p class=note>L2 norm of each parameter's gradient when the optimizer stepped (log scale). "
        "Empty cells got no gradient (None), black ones an all-zero gradient (GL006); "
        "very bright or very dark rows are exploding or vanishing.</p>",
        _heatmap(steps),
    ]
    return (
        "<!DOCTYPE html><html lang=en><head><meta charset=utf-8>"
        f"<title>gradlint trace {escape(report.path)}</title><style>{_STYLE}</style></head>"
        f"<body>{''.join(body)}</body></html>\n"
    )


def _findings(report: TraceReport) -> str:
    if not report.findings:
        return "<p>No findings.</p>"
    rows = []
    for finding in report.findings:
        d = finding.diagnostic
        badge = f"<span class=badge style='background:{_COLORS.get(finding.status, '#555')}'>{finding.status}</span>"
        static = "".join(f"<li>line {place.line}: {escape(place.note)}</li>" for place in d.related)
        observed = "".join(
            f"<li>{escape(key.replace('_', ' '))}: <code>{escape(json.dumps(value))}</code></li>"
            for key, value in report.observed(finding).items()
        )
        runtime = f"<li>{escape(finding.evidence)}</li>{observed}" if finding.evidence else observed
        rows.append(
            f"<tr><td>{badge}</td><td><code>{escape(d.path)}:{d.line}</code></td><td>{d.code} "
            f"<code>{escape(d.name)}</code></td><td>{escape(d.message)}</td>"
            f"<td><ul>{static}</ul></td><td><ul>{runtime}</ul></td></tr>"
        )
    header = (
        "<tr><th>Status</th><th>Where</th><th>Rule</th><th>What</th>"
        "<th>Static evidence</th><th>Observed at runtime</th></tr>"
    )
    return f"<table>{header}{''.join(rows)}</table>"


def _line_chart(series: list[tuple[int, int]], width: int = 640, height: int = 200) -> str:
    if not series:
        return "<p class=note>No optimizer step ran.</p>"
    values = [value for _, value in series]
    top = max(max(values), 1)
    left, bottom = 50, height - 25
    span = max(len(values) - 1, 1)
    points = [(left + (width - left - 10) * i / span, bottom - (bottom - 10) * v / top) for i, v in enumerate(values)]
    path = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
    dots = "".join(f"<circle cx={x:.1f} cy={y:.1f} r=3 fill='#1565c0'/>" for x, y in points)
    every = max(1, len(points) // 20)
    labels = "".join(
        f"<text x={x:.1f} y={height - 8} text-anchor=middle>{step}</text>"
        for i, ((x, _), (step, _)) in enumerate(zip(points, series, strict=True))
        if i % every == 0
    )
    return (
        f"<svg width={width} height={height} role=img aria-label='graph nodes per step'>"
        f"<line x1={left} y1={bottom} x2={width} y2={bottom} stroke='#999'/>"
        f"<line x1={left} y1=10 x2={left} y2={bottom} stroke='#999'/>"
        f"<text x={left - 4} y=14 text-anchor=end>{top}</text><text x={left - 4} y={bottom} text-anchor=end>0</text>"
        f"<polyline points='{path}' fill=none stroke='#1565c0' stroke-width=2/>{dots}{labels}</svg>"
    )


def _heatmap(steps: list[dict[str, object]]) -> str:
    norms = [dict(s.get("grad_norms") or {}) for s in steps]  # type: ignore[call-overload]  # a JSON object
    names = list(dict.fromkeys(name for step in norms for name in step))
    if not names:
        return "<p class=note>No gradients were recorded.</p>"
    values = [v for step in norms for v in step.values() if isinstance(v, (int, float)) and v > 0]
    low, high = (math.log10(min(values)), math.log10(max(values))) if values else (0.0, 1.0)
    width, height, label = max(4, min(28, 840 // len(norms))), 28, 260
    every = max(1, 40 // width)  # label every column when they are wide, fewer when narrow
    cells = []
    for row, name in enumerate(names):
        y = 20 + row * height
        cells.append(f"<text x={label - 6} y={y + height / 2 + 4} text-anchor=end>{escape(name[-40:])}</text>")
        for column, step in enumerate(norms):
            if name in step:
                cells.append(_cell(label + column * width, y, (width, height), step[name], (low, high)))
    header = "".join(
        f"<text x={label + c * width + width / 2} y=14 text-anchor=middle>{s.get('step', c + 1)}</text>"
        for c, s in enumerate(steps)
        if c % every == 0
    )
    size = f"width={label + width * len(norms) + 10} height={30 + height * len(names)}"
    return f"<svg {size} role=img aria-label='gradient norms'>{header}{''.join(cells)}</svg>"


def _cell(x: int, y: int, size: tuple[int, int], value: object, scale: tuple[float, float]) -> str:
    box = f"x={x} y={y} width={max(size[0] - 2, 1)} height={size[1] - 2}"
    if not isinstance(value, (int, float)):
        return f"<rect {box} fill=none stroke='#bbb'><title>None</title></rect>"
    low, high = scale
    if value <= 0:
        color = "#000"
    else:
        share = (math.log10(value) - low) / (high - low) if high > low else 0.5
        color = f"hsl(210,80%,{int(85 - 60 * share)}%)"
    return f"<rect {box} fill='{color}'><title>{value:.3g}</title></rect>"
