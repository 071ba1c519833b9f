"""`dflash tune`'s report as people read it: markdown (points, knee, speculative settings) and an SVG chart of
output tok/s and accept length by concurrency, drawn without a plotting library; the report's files, in the store
(`write_report`) and in a local directory (`write_local`)."""

from __future__ import annotations

from pathlib import Path

from dagster_project.ops import spec_compare
from dagster_project.ops.tune import REPORT_KEY, TuneReport
from dagster_project.store.dataclass_json import to_json
from dagster_project.store.storage import Store

CHART_KEY = "tuning/throughput.svg"
MARKDOWN_KEY = "tuning/report.md"


def write_report(store: Store, report: TuneReport) -> None:
    store.put_bytes(REPORT_KEY, to_json(report))
    store.put_bytes(MARKDOWN_KEY, render_markdown(report).encode())
    store.put_bytes(CHART_KEY, render_svg(report).encode())


def write_local(report: TuneReport, directory: Path) -> Path:
    """report.json, report.md and throughput.svg in `directory`; returns the markdown's path."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "report.json").write_bytes(to_json(report))
    (directory / "throughput.svg").write_text(render_svg(report))
    markdown = directory / "report.md"
    markdown.write_text(render_markdown(report))
    return markdown


def render_markdown(report: TuneReport, chart: str = "throughput.svg") -> str:
    lines = [
        "# Fleet tuning",
        "",
        f"{len(report.endpoints)} servers, {report.prompts} prompts ({report.prompts_source}); "
        f"knee: the least concurrency reaching {report.knee_fraction:.0%} of the best throughput, on a saturating "
        "curve fitted to the points (repeats included).",
        "",
        f"**{report.recommendation}**",
        "",
    ]
    if report.recommended_flags:
        lines += [f"Launch with: `{' '.join(report.recommended_flags)}`", ""]
    for estimate in report.estimates:
        lines.append(f"* fit [{estimate.server_setting}]: {estimate.describe()}, fitted best {estimate.peak:,.0f}")
    for label, text in report.capacity.items():
        lines.append(f"* capacity [{label}]: {text}")
    if report.speculative is not None:
        lines += ["", *spec_compare.markdown(report.speculative)]
    lines += [
        "",
        f"![output tokens/s by concurrency]({chart})",
        "",
        "| server setting | concurrency | cap | output tok/s | req/s | accept length | TTFT p50 (ms) | TTFT p99 (ms) "
        "| latency p50 (s) | latency p99 (s) | errors |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for p in report.points:
        mark = " **(knee)**" if report.knee == p else ""
        lines.append(
            f"| {p.server_setting} | {p.concurrency}{mark} | {_cell(p.cap)} | {p.output_tok_per_s:,.0f} | "
            f"{p.req_per_s:.2f} | {_cell(p.accept_length, 2)} | {_ms(p.ttft_p50_s)} | {_ms(p.ttft_p99_s)} | "
            f"{_cell(p.latency_p50_s, 2)} | {_cell(p.latency_p99_s, 2)} | {p.errors} |"
        )
    return "\n".join(lines) + "\n"


def _cell(value: float | int | None, digits: int = 0) -> str:
    if value is None:
        return "—"
    return f"{value:,.{digits}f}" if isinstance(value, float) else f"{value:,}"


def _ms(seconds: float | None) -> str:
    return "—" if seconds is None else f"{seconds * 1000:,.0f}"


_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")


def render_svg(report: TuneReport, width: int = 720, height: int = 400) -> str:
    """A line chart of output tok/s (solid) and accept length (dashed, right axis) by concurrency, one colour
    per server setting, the knee marked: plain SVG, no plotting library needed."""
    left, right, top, bottom = 70, 60, 30, 50
    plot_w, plot_h = width - left - right, height - top - bottom
    points = [p for p in report.points if p.output_tok_per_s > 0]
    max_c = max((p.concurrency for p in points), default=1) * 1.08  # room for the last point's marks
    max_t = max((p.output_tok_per_s for p in points), default=1.0) * 1.1
    max_a = max((p.accept_length or 0 for p in points), default=0.0) * 1.1 or 1.0

    def x(c: float) -> float:
        return left + plot_w * c / max_c

    def y(value: float, scale: float) -> float:
        return top + plot_h * (1 - value / scale)

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
        'font-size="11">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{left}" y="18" font-size="13">output tok/s (solid) and accept length (dashed) by client '
        "concurrency per server</text>",
        f'<line x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" y2="{top + plot_h}" stroke="black"/>',
        f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + plot_h}" stroke="black"/>',
        f'<line x1="{left + plot_w}" y1="{top}" x2="{left + plot_w}" y2="{top + plot_h}" stroke="gray"/>',
        f'<text x="{left + plot_w / 2}" y="{height - 10}" text-anchor="middle">requests in flight per server</text>',
    ]
    for k in range(6):
        t, a, c = max_t * k / 5, max_a * k / 5, max_c * k / 5
        out.append(f'<text x="{left - 6}" y="{y(t, max_t) + 4:.1f}" text-anchor="end">{t:,.0f}</text>')
        out.append(f'<text x="{left + plot_w + 6}" y="{y(a, max_a) + 4:.1f}" fill="gray">{a:.1f}</text>')
        out.append(f'<text x="{x(c):.1f}" y="{top + plot_h + 16}" text-anchor="middle">{c:.0f}</text>')
    settings = list(dict.fromkeys(p.server_setting for p in points))
    for index, label in enumerate(settings):
        color = _COLORS[index % len(_COLORS)]
        series = sorted((p for p in points if p.server_setting == label), key=lambda p: p.concurrency)
        path = " ".join(f"{x(p.concurrency):.1f},{y(p.output_tok_per_s, max_t):.1f}" for p in series)
        out.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2"/>')
        out += [
            f'<circle cx="{x(p.concurrency):.1f}" cy="{y(p.output_tok_per_s, max_t):.1f}" r="3" fill="{color}"/>'
            for p in series
        ]
        accepts = [p for p in series if p.accept_length]
        if accepts:
            path = " ".join(f"{x(p.concurrency):.1f},{y(p.accept_length or 0, max_a):.1f}" for p in accepts)
            out.append(
                f'<polyline points="{path}" fill="none" stroke="{color}" stroke-dasharray="4 3" stroke-width="1"/>'
            )
        out.append(f'<text x="{left + 10}" y="{top + 14 + 14 * index}" fill="{color}">{_xml(label)}</text>')
    estimate = report.knee_estimate
    if estimate is not None:
        low, high, kx = x(estimate.low), x(estimate.high), x(estimate.concurrency)
        out.append(
            f'<rect x="{low:.1f}" y="{top}" width="{max(high - low, 1):.1f}" height="{plot_h}" fill="gray" '
            'fill-opacity="0.15"/>'
        )
        fitted = " ".join(
            f"{x(c):.1f},{y(estimate.fit.rate(c), max_t):.1f}" for c in range(estimate.lowest, estimate.highest + 1)
        )
        out.append(f'<polyline points="{fitted}" fill="none" stroke="gray" stroke-width="1"/>')
        out.append(
            f'<line x1="{kx:.1f}" y1="{top}" x2="{kx:.1f}" y2="{top + plot_h}" stroke="black" stroke-dasharray="2 2"/>'
        )
        out.append(
            f'<text x="{kx - 4:.1f}" y="{top + plot_h - 6}" text-anchor="end">knee {estimate.concurrency} '
            f"({estimate.low}-{estimate.high})</text>"
        )
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _xml(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
