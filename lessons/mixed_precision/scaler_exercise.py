"""Lesson 04, your turn: the dynamic loss scaler's update rule, checked against torch.amp.GradScaler's scale over
sequences of clean and overflowing steps."""

import inspect
import math

import plotly.graph_objects as go
import torch
from IPython.display import display

from labtools import plots
from labtools.exercises import Outcome, attempt, failed, outcome

INIT_SCALE = 2.0**16
F, T = False, True
# (name, found_inf at each step, growth_interval, hint shown if this case fails)
CASES = [
    ("ten clean steps", [F] * 10, 3,
     "count the clean steps; after growth_interval of them, double the scale and start counting again"),
    ("one overflow", [F, T, F, F, F], 3, "an overflow halves the scale and restarts the count of clean steps"),
    ("an overflow just before growth", [F, F, T, F, F, F, F], 3,
     "an overflow also restarts the count: growth needs growth_interval clean steps in a row"),
    ("three overflows in a row", [T, T, T, F], 2, "each overflow halves the scale again"),
    ("growth_interval 1", [F, F, T, F, F], 1, "with growth_interval = 1 every clean step doubles the scale"),
]


def gradscaler_scales(found_inf: list[bool], growth_interval: int) -> list[float]:
    """The reference: torch.amp.GradScaler's scale after each step, where a step's gradient is made inf or not."""
    scaler = torch.amp.GradScaler("cpu", init_scale=INIT_SCALE, growth_factor=2.0, backoff_factor=0.5,
                                  growth_interval=growth_interval)
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=0.0)
    scales = []
    for inf in found_inf:
        opt.zero_grad()
        scaler.scale(p.sum()).backward()
        if inf:
            p.grad.fill_(float("inf"))  # what an overflow in the backward pass leaves in a gradient
        scaler.step(opt)                # skipped when a gradient is not finite
        scaler.update()
        scales.append(scaler.get_scale())
    return scales


def reference(scale, clean_steps, found_inf, growth_interval):
    """After one step: the new (scale, clean_steps). Growth ×2, back-off ×0.5, as GradScaler's defaults."""
    if found_inf:           # a gradient was inf or nan: the step was skipped
        return scale * 0.5, 0
    clean_steps += 1
    if clean_steps == growth_interval:
        return scale * 2.0, 0
    return scale, clean_steps


UNPAIRED = "return the pair (scale, clean_steps)"


def learner_scales(fn, found_inf: list[bool], growth_interval: int,
                   init_scale: float = INIT_SCALE) -> list[float] | None:
    """The scale after each step with fn as the update rule, from init_scale; None where fn did not return a pair."""
    scale, clean, scales = init_scale, 0, []
    for inf in found_inf:
        out = fn(scale, clean, inf, growth_interval)
        if not (isinstance(out, tuple) and len(out) == 2):
            return None
        scale, clean = out
        scales.append(float(scale))
    return scales


def check_update(fn) -> Outcome:
    """Your update rule against GradScaler's scale after every step, on five sequences of steps."""
    results = []
    for name, found_inf, interval, hint in CASES:
        tried = attempt(learner_scales, fn, found_inf, interval, case=name, hint=hint, whose=fn)  # the whole sequence
        if not tried.returned:
            return tried.outcome
        got = tried.value
        if got is None:
            return failed(name, UNPAIRED)
        expected = gradscaler_scales(found_inf, interval)
        wrong = next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b), None)
        if wrong is not None:
            return failed(name, f"after step {wrong + 1} the scale is 2^{_log2(got[wrong])}, GradScaler's is "
                                f"2^{_log2(expected[wrong])}", hint)
        results.append({"case": name, "difference": 0.0})
    return outcome(results, tol=0.0, what="your scaler update", reference="torch.amp.GradScaler's scale, step by step,")


def replay(fn, runs: dict, S) -> Outcome:
    """Your update rule in the real run: the dynamic fp16 run's overflows (the steps it skipped), fed through your
    function from the run's first scale, drawn beside the scale the run used (the lab's DynamicLossScaler)."""
    from lessons.mixed_precision.loss_scaling import Recipe  # here, so the exercise cell imports no training code
    h = runs[Recipe.FP16_DYNAMIC]
    fig = go.Figure(go.Scatter(x=h.step, y=h.loss_scale, mode="lines", name="the run's scale",
                               line=dict(color="black", width=4)))
    tried = attempt(learner_scales, fn, h.skipped[:-1], S.growth_interval, h.loss_scale[0], whose=fn)
    if not tried.returned:  # not written, or the learner's error, exit or endless loop as a message
        result = tried.outcome
    elif tried.value is None:
        result = failed("", UNPAIRED)
    else:
        mine = [h.loss_scale[0]] + tried.value
        fig.add_trace(go.Scatter(x=h.step, y=mine, mode="lines", name="your update rule",
                                 line=dict(color=plots.color(1), dash="dash")))
        wrong = next((i for i, (a, b) in enumerate(zip(mine, h.loss_scale)) if a != b), None)
        result = (Outcome("pass", f"your update rule gives the run's scale at all {len(h.step)} steps "
                                  f"({sum(h.skipped)} overflows, {h.loss_scale[0]:g} → {h.loss_scale[-1]:g})", 0.0)
                  if wrong is None else
                  Outcome("fail", f"from step {h.step[wrong]} your scale differs from the run's: "
                                  f"2^{_log2(mine[wrong])} vs 2^{_log2(h.loss_scale[wrong])}"))
    skipped = [s for s, k in zip(h.step, h.skipped) if k]
    fig.add_trace(go.Scatter(x=skipped, y=[h.loss_scale[s - h.step[0]] for s in skipped], mode="markers",
                             name="overflow: step skipped", marker=dict(color="red", symbol="x", size=9)))
    fig.update_yaxes(type="log")
    plots.style(fig, "Your scaler on the run's overflows", "step", "scale κ", height=340)
    display(fig)
    return result


def _log2(x: float) -> str:
    return f"{math.log2(x):g}" if x > 0 else repr(x)


def solution_source() -> str:
    """The reference as the learner's cell would hold it."""
    return inspect.getsource(reference).replace("def reference(", "def my_scaler_update(")
