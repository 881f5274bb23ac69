"""`make book`, one lesson: labtools.book renders lesson 06 (the shortest) at the smoke profile, then Chromium opens
its page, the index, the notation page and "Claims, measured" with every request that is not a local file refused:
the figures draw and the maths is typeset offline, the index links the page, the claims page lists the lesson's
outside statements with their verdicts."""

import os
import secrets

import pytest
from jupyter_browser import Browser, leftovers

from labtools import book

pytestmark = [pytest.mark.notebook, pytest.mark.browser, pytest.mark.book]
LESSON = "06_memory_budget"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("book")
    before = {k: os.environ.get(k) for k in ("LABTOOLS_STATIC", "PLOTLY_RENDERER")}
    built = book.build([LESSON], out, profile="smoke")
    # the browser test runs after this one in the same process: its JupyterLab must not inherit static rendering
    assert {k: os.environ.get(k) for k in before} == before
    return out, built


def offline(page) -> list[str]:
    """Refuse every request that is not a file of the book; return what was refused."""
    refused = []

    def route(r):
        if r.request.url.startswith("file://"):
            r.continue_()
        else:
            refused.append(r.request.url)
            r.abort()
    page.route("**/*", route)
    return refused


def test_a_lesson_page_draws_its_figures_and_typesets_its_maths_offline(built):
    out, result = built
    assert [p.name for p in result["pages"]] == [f"{LESSON}.html"]
    marker = secrets.token_hex(8)
    with Browser(marker) as browser:
        page = browser.new_page()
        refused = offline(page)
        page.goto((out / f"{LESSON}.html").as_uri())
        page.wait_for_function("document.querySelectorAll('.MathJax, .MathJax_Display').length > 0", timeout=30_000)
        figures = page.locator(".plotly-graph-div .main-svg").count()
        raw = page.evaluate("document.body.innerText.includes('$$') || document.body.innerText.includes('\\\\lVert')")
        page.goto((out / "notation.html").as_uri())
        page.wait_for_function("document.querySelectorAll('.MathJax').length > 10", timeout=30_000)
        page.goto((out / "index.html").as_uri())
        linked = page.locator(f"a[href='{LESSON}.html']").count()
        page.wait_for_function("[...document.images].every(i => i.complete)", timeout=10_000)
        course_map = page.evaluate("[...document.images].filter(i => i.src.endsWith('course-map.svg'))"
                                   ".map(i => i.naturalWidth)")
        page.goto((out / "claims.html").as_uri())
        verdicts = page.locator("td .ok, td .no").count()
        failed = page.locator("td .no").count()
    assert figures >= 5, f"{figures} plotly figures drawn"
    assert not raw, "LaTeX left untypeset on the lesson's page"
    assert linked == 1 and verdicts == result["statements"] > 0 and failed == 0
    assert len(course_map) == 1 and course_map[0] > 500, course_map  # the course map is on the index, drawn
    # what was refused (require.js, plotly's own MathJax 3) the page did not need: figures and maths rendered above
    assert not any("plotly" in url.lower() and "mathjax" not in url.lower() for url in refused), refused
    assert not leftovers(marker)
