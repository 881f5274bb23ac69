"""`make book`: every lesson executed and rendered to HTML, with an index, the notation page and "Claims, measured".

    python -m labtools.book [--profile smoke] [--out build/book] [LESSON ...]   # LESSON: e.g. 06_memory_budget

Offline: plotly.js is embedded in each page, MathJax 2.7 (jupyter-server-mathjax's static files) is copied beside
the pages, and every page names it by a relative path. tests/test_book.py builds one lesson and opens the pages in
Chromium with every non-file request refused.
"""

import argparse
import html
import json
import os
import re
import shutil
from contextlib import contextmanager
from pathlib import Path

from labtools.claims import LEGEND, read_ledgers

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
MATHJAX_URL = "mathjax/MathJax.js?config=TeX-AMS-MML_HTMLorMML-full,Safe"
# Inline maths as the notebooks write it ($…$), as JupyterLab and nbconvert's template read it
MATHJAX_CONFIG = ("MathJax.Hub.Config({tex2jax: {inlineMath: [['$','$'], ['\\\\(','\\\\)']], processEscapes: true}});")


def mathjax_dir() -> Path:
    import jupyter_server_mathjax
    return Path(jupyter_server_mathjax.__file__).parent / "static"


@contextmanager
def _environ(**values):
    """Set environment variables for the kernels started inside, and restore them after: a caller's later kernels
    (the browser test's JupyterLab) must not inherit the book's static rendering."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def render(lesson: str, out: Path, profile: str) -> Path:
    """Execute notebooks/<lesson>.ipynb at `profile` into out/<lesson>.ipynb and render out/<lesson>.html."""
    import papermill as pm
    from nbconvert import HTMLExporter

    src = NOTEBOOKS / f"{lesson}.ipynb"
    if not src.exists():
        raise FileNotFoundError(f"no lesson {lesson!r}: expected {src}")
    executed = out / f"{lesson}.ipynb"
    with _environ(LABTOOLS_STATIC="1", PLOTLY_RENDERER="plotly_mimetype+notebook"):  # the kernel inherits them
        pm.execute_notebook(str(src), str(executed), parameters={"PROFILE": profile}, cwd=str(NOTEBOOKS),
                            kernel_name="python3", progress_bar=False,
                            # papermill fails a cell whose last output arrives over 4 s after it ends (a busy host)
                            iopub_timeout=120)
    body, _ = HTMLExporter(mathjax_url=MATHJAX_URL).from_filename(str(executed))
    page = out / f"{lesson}.html"
    page.write_text(body)
    return page


def _page(title: str, body: str, math: bool = False) -> str:
    script = (f"<script type='text/x-mathjax-config'>{MATHJAX_CONFIG}</script><script src='{MATHJAX_URL}'></script>"
              if math else "")
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>{script}"
            "<style>body{font-family:system-ui,sans-serif;max-width:60em;margin:2em auto;padding:0 1em;"
            "line-height:1.5}table{border-collapse:collapse}td,th{border:1px solid #ddd;padding:.3em .5em;"
            "vertical-align:top}th{background:#f6f8fa}.ok{color:#1a7f37}.no{color:#cf222e}small{color:#666}</style>"
            f"</head><body><nav><a href='index.html'>Lessons</a> · <a href='notation.html'>Notation</a> · "
            f"<a href='claims.html'>Claims, measured</a></nav>{body}</body></html>")


def _markdown(text: str) -> str:
    import mistune
    return mistune.create_markdown(plugins=["table"], escape=False)(text)


def _readme_section(title: str) -> str:
    readme = (ROOT / "README.md").read_text()
    i = readme.index(title)
    j = readme.find("\n## ", i + len(title))
    return readme[i:j if j != -1 else len(readme)]


def index_page(lessons: list[str]) -> str:
    """The course map (README's reading order) and the lesson table, linking the rendered lessons."""
    table = _readme_section("## Lessons")
    for lesson in lessons:  # a rendered lesson links to its page, the rest to the notebook in the repository
        table = table.replace(f"(notebooks/{lesson}.ipynb)", f"({lesson}.html)")
    table = re.sub(r"\]\(notebooks/", "](../../notebooks/", table)
    order = _readme_section("## How to go through it").replace("(docs/notation.md)", "(notation.html)")
    order = order.replace("(docs/course-map.svg)", "(course-map.svg)")
    intro = ("<h1>LLM Training Lab</h1><p>Every lesson below was executed for this book; its numbers were measured "
             "in that run and checked in its ledger. <a href='claims.html'>Claims, measured</a> gathers the outside "
             "statements the course checks.</p>")
    return _page("LLM Training Lab", intro + _markdown(order) + _markdown(table))


def notation_page() -> str:
    text = (ROOT / "docs" / "notation.md").read_text()
    return _page("Notation", _markdown(text), math=True)


def claims_page(executed: list[Path]) -> tuple[str, int]:
    """Every claim that quotes an outside statement (it has a source), per lesson: the statement, its source, the
    lab's value, the verdict; and how many claims each lesson checked in all. Returns (page, statements shown)."""
    rows, counts, shown = [], [], 0
    for path in executed:
        ledgers = read_ledgers(json.loads(path.read_text()))
        claims = [c for ledger in ledgers for c in ledger["claims"]]
        counts.append(f"<li><a href='{path.stem}.html'>{path.stem}</a>: {len(claims)} claims, "
                      f"{sum(c['passed'] for c in claims)} held</li>")
        for c in claims:
            if not c.get("source"):
                continue
            shown += 1
            mark = "<span class='ok'>✓ holds</span>" if c["passed"] else "<span class='no'>✗ did not hold</span>"
            rows.append(f"<tr><td><a href='{path.stem}.html'>{path.stem[:2]}</a></td><td>{html.escape(c['source'])}"
                        f"</td><td>{html.escape(c['statement'])}</td><td>{html.escape(str(c['measured']))[:40]}"
                        f"<br><small>{c['kind']}</small></td><td>{html.escape(c['expected'])}</td><td>{mark}</td></tr>")
    body = ("<h1>Claims, measured</h1><p>Statements from outside the lab that the course checks, each beside the value "
            "the book's own run measured or computed, and the verdict. The lesson holds the experiment.</p>"
            "<table><tr><th>lesson</th><th>the statement's source</th><th>what the lab checked</th><th>value</th>"
            f"<th>expected</th><th>verdict</th></tr>{''.join(rows)}</table><p><small>{LEGEND}</small></p>"
            f"<h2>Every claim</h2><ul>{''.join(counts)}</ul>")
    return _page("Claims, measured", body), shown


def build(lessons: list[str], out: Path, profile: str) -> dict:
    """Render the lessons and write index.html, notation.html and claims.html beside them. Returns what was built."""
    out.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(out / "mathjax", ignore_errors=True)
    shutil.copytree(mathjax_dir(), out / "mathjax")
    pages = [render(lesson, out, profile) for lesson in lessons]
    (out / "index.html").write_text(index_page(lessons))
    shutil.copy(ROOT / "docs" / "course-map.svg", out / "course-map.svg")  # the index shows it
    (out / "notation.html").write_text(notation_page())
    claims, shown = claims_page([out / f"{lesson}.ipynb" for lesson in lessons])
    (out / "claims.html").write_text(claims)
    return {"pages": pages, "statements": shown}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("lessons", nargs="*", help="lessons to render (default: all), e.g. 06_memory_budget")
    parser.add_argument("--profile", default="auto", choices=("smoke", "cpu", "gpu", "auto"))
    parser.add_argument("--out", default=str(ROOT / "build" / "book"))
    args = parser.parse_args(argv)
    lessons = args.lessons or sorted(p.stem for p in NOTEBOOKS.glob("*.ipynb"))
    built = build(lessons, Path(args.out), args.profile)
    print(f"{len(built['pages'])} lessons, {built['statements']} outside statements checked: {args.out}/index.html")


if __name__ == "__main__":
    main()
