"""The course map: every lesson and the lessons it builds on, read from each notebook's own "Before you start", drawn
as an SVG (docs/course-map.svg, shown in the README and on the book's index).

    lessons()            [(number, title, [prerequisites])] from notebooks/*.ipynb
    svg(lessons())       the map: one row per depth (a lesson sits below everything it builds on), arrows from
                         each prerequisite, colours by part of the course

    $ python -m labtools.course docs/course-map.svg     # regenerate after a lesson's prerequisites change

tests/test_course.py checks that the committed map is the one the notebooks give.
"""

import html
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PARTS = (  # (name, lessons, colour): the README's reading order
    ("the step", range(0, 3), "#1f77b4"), ("the data", (17,), "#17becf"), ("evidence", (18,), "#8c564b"),
    ("stability", range(3, 5), "#2ca02c"),
    ("memory", range(5, 7), "#9467bd"), ("parallelism", (7, 8, 9, 10, 14, 15), "#d62728"),
    ("time", (11, 12, 13, 22), "#ff7f0e"), ("tuning at scale", (19,), "#bcbd22"), ("the whole run", (16,), "#444444"),
    ("post-training", (20, 21), "#e377c2"),
)
BOX_W, BOX_H, GAP_X, ROW_H, MARGIN = 250, 34, 22, 62, 20


def _prerequisites(opening: str) -> list[int]:
    """The two-digit lesson numbers in the opening's "Before you start" paragraph (before its symbols)."""
    m = re.search(r"\*\*Before you start\*\*:(.*?)(?:\n\n|$)", opening, re.S)
    if not m:
        return []
    return sorted({int(n) for n in re.findall(r"\b(\d\d)\b", m.group(1).split("Symbols")[0])})


def lessons(root: Path = ROOT) -> list[tuple[int, str, list[int]]]:
    out = []
    for path in sorted((root / "notebooks").glob("*.ipynb")):
        opening = "".join(json.loads(path.read_text())["cells"][0]["source"])
        m = re.match(r"# (\d\d) · ([^:\n]+)", opening)
        if not m:
            raise ValueError(f"{path.name}: the first cell must open with '# NN · Title'")
        out.append((int(m.group(1)), m.group(2).strip(), _prerequisites(opening)))
    return out


def depths(course: list[tuple[int, str, list[int]]]) -> dict[int, int]:
    """Each lesson's row: one below the deepest lesson it builds on."""
    known = {n for n, _, _ in course}
    depth: dict[int, int] = {}
    for n, _, uses in sorted(course):
        missing = [u for u in uses if u not in known or u >= n]
        if missing:
            raise ValueError(f"lesson {n:02d} builds on {missing}: only earlier lessons of the course may be named")
        depth[n] = 1 + max((depth[u] for u in uses), default=-1)
    return depth


def colour(n: int) -> str:
    return next((c for _, ns, c in PARTS if n in ns), "#777777")


def svg(course: list[tuple[int, str, list[int]]]) -> str:
    depth = depths(course)
    rows: dict[int, list[int]] = {}
    for n, _, _ in sorted(course):
        rows.setdefault(depth[n], []).append(n)
    widest = max(len(r) for r in rows.values())
    width = 2 * MARGIN + widest * BOX_W + (widest - 1) * GAP_X
    height = 2 * MARGIN + len(rows) * ROW_H + 30
    pos = {}
    for d, ns in rows.items():
        row_w = len(ns) * BOX_W + (len(ns) - 1) * GAP_X
        for i, n in enumerate(ns):
            pos[n] = (MARGIN + (width - 2 * MARGIN - row_w) / 2 + i * (BOX_W + GAP_X), MARGIN + d * ROW_H)
    title = {n: t for n, t, _ in course}
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
             f'viewBox="0 0 {width:.0f} {height:.0f}" font-family="Helvetica, Arial, sans-serif" font-size="13">',
             '<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" '
             'orient="auto-start-reverse"><path d="M 0 0 L 10 5 L 0 10 z" fill="#999"/></marker></defs>',
             '<rect width="100%" height="100%" fill="white"/>']
    # arrows first, boxes drawn over them; each box's arrows leave (and arrive) spread along its edge, ordered by
    # where they go (come from), so that they do not all meet in one point
    outgoing = {n: sorted((m for m, _, uses in course if n in uses), key=lambda m: pos[m][0]) for n in pos}
    incoming = {n: sorted(uses, key=lambda u: pos[u][0]) for n, _, uses in course}
    spread = lambda i, k: BOX_W * (0.5 if k == 1 else 0.2 + 0.6 * i / (k - 1))  # noqa: E731
    for n, _, uses in sorted(course):
        x1, y1 = pos[n]
        for u in uses:
            x0, y0 = pos[u]
            a = (x0 + spread(outgoing[u].index(n), len(outgoing[u])), y0 + BOX_H)
            b = (x1 + spread(incoming[n].index(u), len(incoming[n])), y1)
            mid = (a[1] + b[1]) / 2
            parts.append(f'<path d="M {a[0]:.1f} {a[1]:.1f} C {a[0]:.1f} {mid:.1f}, {b[0]:.1f} {mid:.1f}, '
                         f'{b[0]:.1f} {b[1] - 2:.1f}" fill="none" stroke="#bbb" stroke-width="1.2" '
                         'marker-end="url(#arrow)"/>')
    for n, x_y in sorted(pos.items()):
        x, y = x_y
        parts.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{BOX_W}" height="{BOX_H}" rx="6" fill="white" '
                     f'stroke="{colour(n)}" stroke-width="2"/>')
        parts.append(f'<text x="{x + 10:.1f}" y="{y + BOX_H / 2 + 4.5:.1f}"><tspan font-weight="bold" '
                     f'fill="{colour(n)}">{n:02d}</tspan> {html.escape(title[n])}</text>')
    x = MARGIN
    for name, _, c in PARTS:  # the legend along the bottom
        y = height - MARGIN
        parts.append(f'<rect x="{x}" y="{y - 10}" width="12" height="12" rx="2" fill="{c}"/>'
                     f'<text x="{x + 17}" y="{y}">{name}</text>')
        x += 26 + 7.2 * len(name) + 14
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        raise SystemExit("usage: python -m labtools.course OUT.svg")
    Path(argv[0]).write_text(svg(lessons()))


if __name__ == "__main__":
    main()
