import asyncio
import threading
import time

import ipywidgets as W
import plotly.graph_objects as go
import pytest

from labtools.controls import slider
from labtools.runcache import RunCache
from labtools.widgets import Panel


def draw(a, b):
    if b < 0:
        raise ValueError("b must be >= 0")
    return go.Figure(go.Scatter(x=[0, 1, 2], y=[a * x + b for x in range(3)]))


def test_setting_a_control_redraws_the_figure():
    panel = Panel(draw, {"a": slider(1, 0, 5), "b": slider(0.0, -1.0, 1.0)}, debounce_ms=0)
    assert panel.figure.data[0].y == (0, 1, 2)
    panel.controls["a"].value = 3
    assert panel.figure.data[0].y == (0, 3, 6)
    panel.controls["b"].value = 0.5
    assert panel.figure.data[0].y == (0.5, 3.5, 6.5)


def test_a_bad_value_shows_the_error_and_keeps_the_figure():
    panel = Panel(draw, {"a": slider(1, 0, 5), "b": slider(0.0, -1.0, 1.0)}, debounce_ms=0)
    _ = panel.figure
    panel.controls["b"].value = -0.5
    assert "ValueError: b must be" in panel.status.value
    assert panel.figure.data[0].y == (0, 1, 2)


def test_trace_count_may_change():
    def draw_n(n):
        return go.Figure([go.Scatter(x=[0, 1], y=[i, i]) for i in range(n)])

    panel = Panel(draw_n, {"n": slider(1, 1, 4)}, debounce_ms=0)
    assert len(panel.figure.data) == 1
    panel.controls["n"].value = 3
    assert len(panel.figure.data) == 3


def test_changes_are_debounced_to_the_last_value():
    calls = []

    def counting(a):
        calls.append(a)
        return go.Figure(go.Scatter(x=[0], y=[a]))

    panel = Panel(counting, {"a": slider(0, 0, 10)}, debounce_ms=50)
    _ = panel.figure
    calls.clear()

    async def drag():
        for v in range(1, 6):
            panel.controls["a"].value = v
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.2)

    asyncio.run(drag())
    assert calls == [5]
    assert panel.figure.data[0].y == (5,)


def test_time_redraw_measures_and_restores():
    panel = Panel(draw, {"a": slider(1, 0, 5), "b": slider(0.0, -1.0, 1.0)})
    ms = panel.time_redraw("a", [2, 3, 4], repeats=2)
    assert ms > 0 and len(panel.draw_ms) >= 7
    assert panel.controls["a"].value == 1 and panel.debounce_ms == 120


def test_static_show_without_frontend(monkeypatch, capsys):
    monkeypatch.setenv("LABTOOLS_STATIC", "1")
    shown = []
    monkeypatch.setattr(go.Figure, "show", lambda self, *a, **k: shown.append(self))
    Panel(draw, {"a": slider(2, 0, 5), "b": slider(0.0, -1.0, 1.0)}).show()
    assert shown and shown[0].data[0].y == (0, 2, 4)


def test_run_cache_runs_once_per_config():
    calls = []
    cache = RunCache(lambda **cfg: calls.append(cfg) or len(calls))
    assert cache(x=1, y=2) == 1
    assert cache(y=2, x=1) == 1  # key order does not matter
    assert cache(x=2, y=2) == 2
    assert len(cache) == 2 and dict(x=1, y=2) in cache and calls == [{"x": 1, "y": 2}, {"x": 2, "y": 2}]
    cache.put("from a launch", y=3, x=1)  # a result computed elsewhere is served without calling fn
    assert cache(x=1, y=3) == "from a launch" and len(calls) == 2


def test_slider_kinds():
    assert isinstance(slider(3, 1, 5), W.IntSlider)
    assert isinstance(slider(0.5, 0.0, 1.0), W.FloatSlider)
    s = slider(1e-3, 1e-5, 1e-1, log=True)
    assert isinstance(s, W.FloatLogSlider) and s.value == pytest.approx(1e-3)
    assert slider(3, 1, 5, continuous=False).continuous_update is False


def test_panel_puts_progress_bars_in_its_own_output(monkeypatch):
    from labtools import progress as P
    monkeypatch.setattr(P, "has_frontend", lambda: True)  # as in JupyterLab
    displayed = []
    monkeypatch.setattr("IPython.display.display", lambda *a, **k: displayed.append(a))

    def draw(a):
        for _ in P.progress(range(3), desc="work"):
            pass
        return go.Figure(go.Scatter(x=[0], y=[a]))

    panel = Panel(draw, {"a": slider(1, 0, 5)}, debounce_ms=0)
    _ = panel.figure
    panel.controls["a"].value = 2
    assert len(panel.output.outputs) == 1  # this draw's bar only; the previous one was dropped
    assert "application/vnd.jupyter.widget-view+json" in panel.output.outputs[0]["data"]
    assert not displayed


def test_exercise_checks_answers_and_reveals_the_solution(monkeypatch):
    from labtools.quiz import Question
    ex = Question("Sum", "What is 2 + 2?", {"x": "answer"},
                  check=lambda a: (a["x"] == 4, "right" if a["x"] == 4 else "try again"), solution="**4**")
    ex.inputs["x"].value = "5"
    assert ex.on_check() == (False, "try again") and "✗" in ex.result.value
    ex.inputs["x"].value = "4"
    assert ex.on_check()[0] and "✓" in ex.result.value
    for typed in ("abc", "1,5", "1e400", ""):  # refused, naming the box: never read as 0 or 15
        ex.inputs["x"].value = typed
        ok, message = ex.on_check()
        assert not ok and message.startswith("answer:") and repr(typed) in message, message
    ex.on_reveal()
    assert "**4**" in str(ex.revealed.outputs)


def test_answer_check_accepts_within_its_tolerance_only():
    from labtools.quiz import answer_check
    check = answer_check({"a": 200.0, "b": 0.5}, rel=0.01)
    assert check({"a": 201.9, "b": 0.509})[0]
    ok, message = check({"a": 202.5, "b": 0.5})
    assert not ok and message == "not yet: a"
    assert not check({"b": 0.5})[0]  # a missing answer is wrong


def test_answer_check_names_the_boxes_as_the_learner_sees_them():
    from labtools.quiz import Question, answer_check
    ex = Question("Volume", "How much?", {"gb": "GB sent per GPU", "s": "seconds"},
                  check=answer_check({"gb": 280.0, "s": 1.0}), solution="")
    ex.inputs["gb"].value, ex.inputs["s"].value = "100", "1"
    assert ex.on_check() == (False, "not yet: GB sent per GPU")


def test_typed_numbers_mean_what_they_say_or_are_refused_by_name():
    import pytest

    from labtools.controls import parse_number
    assert parse_number("3.5", "x") == 3.5 and parse_number("1e9", "GPUs", integer=True) == 1_000_000_000
    assert parse_number(" 42 ", "n", integer=True) == 42 and parse_number("1e400", "x", finite=False) == float("inf")
    for typed, integer, says in (("3.5", True, "whole number"), ("abc", False, "a number is needed"),
                                 ("1,5", False, "without commas"), ("1e400", False, "finite"),
                                 ("-5", True, "must be in [1, inf]")):
        with pytest.raises(ValueError, match="^GPUs") as e:
            parse_number(typed, "GPUs", integer=integer, lo=1)
        assert says in str(e.value)


def test_a_choice_slider_holds_the_lessons_own_values_exactly():
    from labtools.controls import choice_slider, nice_values
    s = choice_slider(175.0, 0.1, 2000.0, "parameters (B)", include=(405,))
    assert s.value == 175.0 and s.label == "175"
    s.value = 405.0
    assert s.label == "405"
    assert nice_values(1, 10) == [1.0, 1.5, 2.0, 3.0, 5.0, 7.0, 10.0]
    t = choice_slider(15_600.0, 1.0, 100_000.0, "tokens (B)")
    assert t.label == "15,600"


def _long_draw(started: "threading.Event"):
    """n = 1 draws at once; any other n is a 'training' of 200 steps that checks for Cancel at each step."""
    from labtools.progress import check_cancelled

    def long_draw(n):
        if n != 1:
            started.set()
            for _ in range(200):
                check_cancelled()
                time.sleep(0.02)
        return go.Figure(go.Scatter(x=[0], y=[n]))
    return long_draw


def test_a_cancellable_panel_runs_beside_the_kernel_and_cancel_puts_its_controls_back(monkeypatch):
    from labtools import widgets
    monkeypatch.setattr(widgets, "has_frontend", lambda: True)  # as in JupyterLab
    started = threading.Event()
    panel = Panel(_long_draw(started), {"n": slider(1, 1, 5, description="layers")}, cancellable=True)
    assert panel.cancel_button in panel.widget().children[0].children

    async def learner():
        assert panel.figure.data[0].y == (1,)
        t0 = time.monotonic()
        panel.controls["n"].value = 3
        assert time.monotonic() - t0 < 1.0  # the change returned at once: the run is in the panel's thread
        assert not panel.cancel_button.disabled and "running" in panel.status.value
        await asyncio.to_thread(started.wait, 5)
        panel.cancel_button.click()
        await asyncio.to_thread(panel.wait, 5)
        await asyncio.sleep(0.05)  # the end of the run is handed to the kernel's loop
        assert time.monotonic() - t0 < 3.0  # stopped long before its 4 s of work

    asyncio.run(learner())
    assert panel.controls["n"].value == 1 and panel.figure.data[0].y == (1,)  # controls and figure agree
    shown = panel.plot.outputs[0]["data"]["application/vnd.plotly.v1+json"]  # what the notebook draws
    assert len(panel.plot.outputs) == 1 and shown["data"][0]["y"] == [1]
    assert "cancelled" in panel.status.value and "layers 1" in panel.status.value
    assert panel.cancel_button.disabled and not panel._worker.is_alive()


def test_a_cancel_that_arrives_after_the_runs_last_check_still_cancels_it(monkeypatch):
    """A short run may be in its last step (past its last check) when Cancel is pressed: the figure stays, the
    controls go back, the panel says "cancelled" (seen in CI: lesson 21's short GRPO runs)."""
    from labtools import widgets
    monkeypatch.setattr(widgets, "has_frontend", lambda: True)

    def draw(n):
        fig = go.Figure(go.Scatter(y=[n]))
        if n != 1:
            panel.cancel()  # the click, landing after every check of this run
        return fig

    panel = Panel(draw, {"n": slider(1, 1, 5, description="layers")}, cancellable=True)

    async def learner():
        assert panel.figure.data[0].y == (1,)
        panel.controls["n"].value = 3
        await asyncio.to_thread(panel.wait, 5)
        await asyncio.sleep(0.05)

    asyncio.run(learner())
    assert panel.controls["n"].value == 1 and panel.figure.data[0].y == (1,)
    assert "cancelled" in panel.status.value


def test_a_cancellable_panel_draws_the_last_value_moved_during_a_run(monkeypatch):
    from labtools import widgets
    monkeypatch.setattr(widgets, "has_frontend", lambda: True)
    calls = []

    def quick(n):
        calls.append(n)
        time.sleep(0.2)
        return go.Figure(go.Scatter(x=[0], y=[n]))

    panel = Panel(quick, {"n": slider(1, 1, 5)}, cancellable=True)

    async def learner():
        _ = panel.figure
        for v in (2, 3, 4):  # moved while the first run is going
            panel.controls["n"].value = v
        for _ in range(100):
            await asyncio.sleep(0.05)
            if panel.figure.data[0].y == (4,) and not panel._worker.is_alive():
                break

    asyncio.run(learner())
    assert calls == [1, 2, 4] and panel.figure.data[0].y == (4,)


def test_the_kernels_interrupt_during_a_draw_cancels_it_and_puts_the_controls_back():
    import _thread
    import signal
    started = threading.Event()
    panel = Panel(_long_draw(started), {"n": slider(1, 1, 5)}, debounce_ms=0)  # a draw on the kernel's thread
    _ = panel.figure
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # the kernel's handler during a message
    threading.Thread(target=lambda: started.wait(5) and _thread.interrupt_main(), daemon=True).start()
    try:
        panel.controls["n"].value = 2
    finally:
        signal.signal(signal.SIGINT, previous)
    assert panel.controls["n"].value == 1 and panel.figure.data[0].y == (1,)
    assert "cancelled" in panel.status.value
