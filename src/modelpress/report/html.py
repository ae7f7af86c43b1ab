"""A small, self-contained HTML page builder for command reports.

A ``Page`` is a title and a list of sections; a section holds paragraphs, tables and matplotlib
figures. Figures are embedded as inline SVG (no CDN, no external file), so the page can be mailed
or archived alone. Text is escaped; the page is written atomically.

    page = Page("modelpress advise")
    s = page.section("Ranking")
    s.table(["gpu", "throughput"], [["A100", "1,234"]])
    s.figure(fig)                       # a matplotlib Figure
    page.write("report.html")
"""

from __future__ import annotations

import html
import io
import os
from dataclasses import dataclass, field
from pathlib import Path

from modelpress.errors import require
from modelpress.ir.files import atomic

_STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:2rem auto;max-width:1100px;color:#222;padding:0 1rem}
h1{font-size:1.6rem}h2{font-size:1.25rem;margin-top:2rem;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:.9rem;margin:.5rem 0}th,td{padding:.25rem .6rem;border-bottom:1px solid #eee;text-align:left}
th{background:#f6f6f6}td.n{text-align:right;font-variant-numeric:tabular-nums}figure{margin:1rem 0}
.note{color:#666;font-size:.85rem}
"""


@dataclass
class Section:
    title: str
    parts: list[str] = field(default_factory=list)

    def text(self, paragraph: str, *, note: bool = False) -> Section:
        cls = ' class="note"' if note else ""
        self.parts.append(f"<p{cls}>{html.escape(paragraph)}</p>")
        return self

    def table(self, headers: list[str], rows: list[list]) -> Section:
        head = "".join(f"<th>{html.escape(str(h))}</th>" for h in headers)
        body = []
        for row in rows:
            cells = []
            for v in row:
                numeric = isinstance(v, (int, float)) and not isinstance(v, bool)
                text = f"{v:,.4g}" if isinstance(v, float) else str(v)
                cells.append(
                    f'<td class="n">{html.escape(text)}</td>'
                    if numeric
                    else f"<td>{html.escape(text)}</td>"
                )
            body.append("<tr>" + "".join(cells) + "</tr>")
        self.parts.append(
            f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"
        )
        return self

    def figure(self, fig, *, caption: str = "") -> Section:
        """Embed a matplotlib figure as inline SVG (and close it)."""
        import matplotlib
        import matplotlib.pyplot as plt

        buf = io.StringIO()
        # text as paths: the page needs no font file and reads the same on every machine
        with matplotlib.rc_context({"svg.fonttype": "path"}):
            # (no metadata block: it carries the date, so the same chart would differ run to run)
            metadata = {"Creator": None, "Date": None, "Format": None, "Type": None}
            fig.savefig(buf, format="svg", bbox_inches="tight", metadata=metadata)

        plt.close(fig)
        svg = buf.getvalue()
        svg = svg[svg.index("<svg") :]  # drop the XML prolog and doctype: inline SVG needs neither
        cap = f"<figcaption>{html.escape(caption)}</figcaption>" if caption else ""
        self.parts.append(f"<figure>{svg}{cap}</figure>")
        return self


@dataclass
class Page:
    title: str
    sections: list[Section] = field(default_factory=list)

    def section(self, title: str) -> Section:
        s = Section(title)
        self.sections.append(s)
        return s

    def render(self) -> str:
        body = "".join(
            f"<section><h2>{html.escape(s.title)}</h2>{''.join(s.parts)}</section>"
            for s in self.sections
        )
        return (
            f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{html.escape(self.title)}</title>'
            f"<style>{_STYLE}</style></head><body><h1>{html.escape(self.title)}</h1>{body}</body></html>\n"
        )

    def write(self, path: str | os.PathLike) -> Path:
        """Write the page atomically (a temporary file renamed into place)."""
        out = Path(path)
        with atomic(out, "w") as f:
            f.write(self.render())
        return out


def new_figure(width: float = 7.0, height: float = 4.5, *, ncols: int = 1):
    """A matplotlib figure on the non-interactive backend (the ``report`` extra), with ``ncols``
    axes side by side. Text is drawn as paths in the SVG, so the page needs no font."""

    require("matplotlib", extra="report", purpose="plots in the HTML report")
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt.subplots(1, ncols, figsize=(width, height))


# Where a point's label may go, in points from the point: right-up first, then around it.
_OFFSETS = ((4, 4), (4, -11), (-4, 4), (-4, -11), (4, 15), (4, -22), (-4, 15), (-4, -22))


def label_points(ax, points: list[tuple[float, float, str]], *, fontsize: float = 7) -> int:
    """Label ``(x, y, text)`` points of ``ax`` so that no label covers another: each takes the
    first place around its point (``_OFFSETS``) where its box overlaps no label placed before
    it; one that fits nowhere is left out (the point stays). Call it once the axes' limits and
    scales are set. Returns how many labels were left out."""
    fig = ax.figure
    fig.canvas.draw()  # the transforms of the final limits, and a renderer to measure text
    renderer = fig.canvas.get_renderer()
    placed = []
    left_out = 0
    for x, y, text in points:
        for dx, dy in _OFFSETS:
            label = ax.annotate(
                text,
                (x, y),
                xytext=(dx, dy),
                textcoords="offset points",
                fontsize=fontsize,
                ha="left" if dx >= 0 else "right",
            )
            box = label.get_window_extent(renderer)
            if not any(box.overlaps(other) for other in placed):
                placed.append(box)
                break
            label.remove()
        else:
            left_out += 1
    return left_out


__all__ = ["Page", "Section", "label_points", "new_figure"]
