"""`--report FILE.html`: one self-contained page (inline CSS and SVG, no scripts, opens offline)."""

from __future__ import annotations

import math
from html import escape

from gradlint.runtime.report import CONFIRMED, NOT_REACHED, NOT_REPRODUCED, RUNTIME_ONLY, TraceReport

_COLORS = {CONFIRMED: "#c62828", RUNTIME_ONLY: "#ad1457", NOT_REPRODUCED: "#2e7d32", NOT_REACHED: "#757575"}
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
        _line_chart([int(str(s.get("graph_nodes", 0))) for s in steps]),
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
        rows.append(
            f"<tr><td>{badge}</td><td><code>{escape(d.path)}:{d.line}</code></td><td>{d.code} "
            f"<code>{escape(d.name)}</code></td><td>{escape(d.message)}"
            f"{'<br><b>Evidence:</b> ' + escape(finding.evidence) if finding.evidence else ''}</td></tr>"
        )
    header = "<tr><th>Status</th><th>Where</th><th>Rule</th><th>What</th></tr>"
    return f"<table>{header}{''.join(rows)}</table>"


def _line_chart(values: list[int], width: int = 640, height: int = 200) -> str:
    if not values:
        return "<p class=note>No optimizer step ran.</p>"
    top = max(max(values), 1)
    left, bottom = 50, height - 25
    span = max(len(values) - 1, 1)
    points = [(left + (width - left - 10) * i / span, bottom - (bottom - 10) * v / top) for i, v in enumerate(values)]
    path = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
    dots = "".join(f"<circle cx={x:.1f} cy={y:.1f} r=3 fill='#1565c0'/>" for x, y in points)
    labels = "".join(
        f"<text x={x:.1f} y={height - 8} text-anchor=middle>{i + 1}</text>" for i, (x, _) in enumerate(points)
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
    cell, label = 28, 260
    rows = []
    for row, name in enumerate(names):
        y = 20 + row * cell
        rows.append(f"<text x={label - 6} y={y + cell / 2 + 4} text-anchor=end>{escape(name[-40:])}</text>")
        for column, step in enumerate(norms):
            if name not in step:
                continue
            rows.append(_cell(label + column * cell, y, cell, step[name], low, high))
    header = "".join(
        f"<text x={label + c * cell + cell / 2} y=14 text-anchor=middle>{c + 1}</text>" for c in range(len(norms))
    )
    width, height = label + cell * len(norms) + 10, 30 + cell * len(names)
    return f"<svg width={width} height={height} role=img aria-label='gradient norms'>{header}{''.join(rows)}</svg>"


def _cell(x: int, y: int, size: int, value: object, low: float, high: float) -> str:
    if not isinstance(value, (int, float)):
        return (
            f"<rect x={x} y={y} width={size - 2} height={size - 2} fill=none stroke='#bbb'><title>None</title></rect>"
        )
    if value <= 0:
        color = "#000"
    else:
        share = (math.log10(value) - low) / (high - low) if high > low else 0.5
        color = f"hsl(210,80%,{int(85 - 60 * share)}%)"
    return f"<rect x={x} y={y} width={size - 2} height={size - 2} fill='{color}'><title>{value:.3g}</title></rect>"
