"""labtools.plots: long titles wrapped so a 1024-px window shows them whole, timelines that name their actions."""

import re

import plotly.graph_objects as go

from labtools import plots


def test_a_long_title_is_wrapped_at_spaces_tags_uncounted_and_the_margin_grows():
    words = " ".join(f"word{i}" for i in range(40))  # 279 characters
    title = plots.wrap_title(f"<b>{words}</b>", width=80)
    lines = title.split("<br>")
    assert len(lines) == 4 and all(len(re.sub(r"<[^>]+>", "", line)) <= 80 for line in lines)
    assert all(len(line) <= plots.TITLE_CHARS for line in plots.wrap_title(words).split("<br>"))
    assert re.sub(r"<[^>]+>", "", title.replace("<br>", " ")) == words  # nothing lost, nothing added
    assert plots.wrap_title("short<br>kept as written") == "short<br>kept as written"
    fig = plots.style(go.Figure(), f"<b>{words}</b>", height=300)
    extra = fig.layout.title.text.count("<br>")
    assert extra == 3 and fig.layout.margin.t == 50 + 22 * extra and fig.layout.height == 300 + 22 * extra
    assert plots.style(go.Figure(), "short", height=300).layout.margin.t == 50


def test_subplots_keep_room_for_a_wrapped_title():
    one = plots.subplots(1, 2, ["a", "b"], title="short")
    two = plots.subplots(1, 2, ["a", "b"], title="long " * 30)
    assert two.layout.margin.t - one.layout.margin.t == 22 * two.layout.title.text.count("<br>") > 0


def test_a_timeline_names_split_backwards_and_each_bars_stage():
    fig = plots.timeline([{"row": 0, "kind": "backward_input", "mb": 0, "stage": 3, "start": 0, "end": 1,
                           "label": "I0"}, {"row": 0, "kind": "backward_weight", "mb": 0, "stage": 3, "start": 1,
                                            "end": 2, "label": "W0"}])
    assert [t.name for t in fig.data] == ["input gradient (I)", "weight gradient (W)"]
    assert "stage %{customdata}" in fig.data[0].hovertemplate and fig.data[0].customdata == (3,)
