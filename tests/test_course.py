"""The course map: read from every notebook's own "Before you start", and the committed SVG is the one they give."""

import pytest

from labtools import course


def test_every_lesson_is_on_the_map_below_what_it_builds_on():
    lessons = course.lessons()
    numbers = [n for n, _, _ in lessons]
    assert numbers == list(range(len(numbers)))  # 00, 01, … without gaps
    depth = course.depths(lessons)
    for n, _, uses in lessons:
        assert all(depth[u] < depth[n] for u in uses)
    assert dict((n, uses) for n, _, uses in lessons)[16]  # the capstone builds on earlier lessons
    assert all(course.colour(n) != "#777777" for n in numbers)  # every lesson belongs to a part of the course


def test_the_committed_map_is_the_one_the_notebooks_give():
    svg = course.svg(course.lessons())
    assert (course.ROOT / "docs" / "course-map.svg").read_text() == svg, \
        "docs/course-map.svg is stale: run python -m labtools.course docs/course-map.svg"
    for n, title, _ in course.lessons():
        assert f">{n:02d}</tspan> {title}" in svg.replace("&#x27;", "'")
    assert "docs/course-map.svg" in (course.ROOT / "README.md").read_text()


def test_a_lesson_naming_a_later_lesson_is_refused():
    with pytest.raises(ValueError, match="lesson 03 builds on \\[5\\]"):
        course.depths([(0, "a", []), (3, "b", [5]), (5, "c", [0])])
