"""Write it yourself: a learner's function checked against the lab's reference, with a number or a hint.

    def my_clip(grads, max_norm):                       # the learner's cell
        raise NotImplementedError                       # the stub: "not written yet", the lesson goes on

    check(my_clip, clip_by_global_norm, [Case("3 tensors", (grads, 1.0)), Case("one huge", ..., hint="...")])

gives one of
    ✓ your function matches the reference on 2 cases (largest difference 3.0e-08)
    ✗ case 'one huge': expected 1.0, got 4.0 — hint: ...          (the first failing case, never a traceback)
    … not written yet: the lesson goes on with the reference

A function that changes its arguments in place (and returns None) is compared on its arguments after the call;
one that does both (like torch's clip_grad_norm_, which scales the gradients and returns their norm) is compared on
both with `in_place=True`.
Exercises whose mechanism runs across ranks send the learner's source to the ranks (labtools.learner.source_of),
where the lesson's rank function rebuilds it (load_function) in a namespace of its choosing and reports per-case
results that `outcome()` turns into the same message. `run_yours` makes the lesson's real run with the learner's
function. Every call of a learner's code goes through labtools.learner (a time bound, errors at their line).
"""

import copy
import html
import linecache
import math
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from labtools.learner import BOUND_FLOOR_S, LEARNER_ERRORS, bound_for, failure, is_stub, time_bound

NOT_WRITTEN = "not written yet: the lesson goes on with the reference"


@dataclass(frozen=True)
class Case:
    """One input to try: a name the learner reads, the arguments, and a hint shown if this case fails."""
    name: str
    args: tuple
    hint: str = ""


@dataclass(frozen=True)
class Outcome:
    """The verdict on a learner's function: status 'pass', 'fail' or 'not written', and what to tell them."""
    status: str
    message: str
    worst: float | None = None  # the largest difference from the reference over all cases (pass or fail)

    @property
    def passed(self) -> bool:
        return self.status == "pass"

    def _repr_html_(self) -> str:
        mark, color = {"pass": ("✓", "#1a7f37"), "fail": ("✗", "#cf222e")}.get(self.status, ("…", "#6e7781"))
        return f"<p style='color:{color}'><b>{mark}</b> {html.escape(self.message)}</p>"

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True)
class Attempt:
    """One call of a learner's function: what it returned, or (where it did not return) the outcome to show."""
    value: object = None
    outcome: Outcome | None = None  # "not written" for the stub, "fail" for an error, an exit or a loop out of time

    @property
    def returned(self) -> bool:
        return self.outcome is None


def attempt(fn: Callable, *args, case: str = "", hint: str = "", seconds: float = BOUND_FLOOR_S,
            whose: Callable | None = None) -> Attempt:
    """Call fn(*args) within `seconds` (time_bound): its value, or the outcome that ends the check (the stub's
    "not written yet", or the error, exit or endless loop as a message naming the case and the learner's line).
    whose: the learner's function, where fn is the lab's code that calls it (a training run using it)."""
    try:
        with time_bound(seconds):
            return Attempt(fn(*args))
    except NotImplementedError as e:
        if _raised_in(e, whose or fn):  # the stub's own raise: "not written yet"
            return Attempt(outcome=Outcome("not written", NOT_WRITTEN))
        return Attempt(outcome=failed(case, failure(e, whose or fn), hint))  # torch's, for an unsupported dtype
    except LEARNER_ERRORS as e:  # the learner's error, exit or endless loop becomes a message
        return Attempt(outcome=failed(case, failure(e, whose or fn), hint))


def _raised_in(error: BaseException, learner) -> bool:
    """Whether the error was raised by the learner's own code (a function, or a class's methods), not by a library
    it called: torch raises NotImplementedError too (an operation a dtype does not support)."""
    tb, last = error.__traceback__, None
    while tb is not None:
        last, tb = tb, tb.tb_next
    if last is None:
        return False
    members = vars(learner).values() if isinstance(learner, type) else [learner]
    codes = {getattr(getattr(m, "__func__", m), "__code__", None) for m in members} - {None}
    if last.tb_frame.f_code not in codes:
        return False
    line = linecache.getline(last.tb_frame.f_code.co_filename, last.tb_lineno).strip()
    if line:  # a raise statement of theirs, or a call into torch that raised from C on this line
        return line.startswith("raise")
    return not error.args  # no source to read: the stub's bare raise carries no message, torch's does


def failed(case: str, message: str, hint: str = "") -> Outcome:
    """The failure of one case: "case 'name': message — hint: ..." (no case: the message alone)."""
    return Outcome("fail", f"{f'case {case!r}: ' if case else ''}{message}{f' — hint: {hint}' if hint else ''}")


def launch_yours(rank_fn, world: int, job, *, desc: str, timeout_s: float, hint: str):
    """Launch a lesson's rank function that runs a learner's code on `world` gloo ranks: its results, or the
    Outcome that ends the check (a run out of time, with the line a rank was on; a rank that failed)."""
    from labtools.parallel import RankFailed, RunTimedOut, launch
    try:
        return launch(rank_fn, world, job, backend="gloo", collective_timeout_s=20, timeout_s=timeout_s, desc=desc)
    except RunTimedOut as e:
        at = ""
        if e.where:
            r, (_, line) = min(e.where.items())
            at = f" (rank {r} was at line {line})"
        return Outcome("fail", f"your code did not finish in {e.seconds:.0f} s on {world} ranks{at} — hint: {hint}")
    except RankFailed as e:
        return Outcome("fail", f"on {world} ranks the run stopped: {rank_failure(e)}")


def rank_failure(e) -> str:
    """A failed rank in a few words: how it ended, and for a library's fatal error (no Python traceback) what the
    library printed last ("received data size doesn't match expected size"), without its source paths."""
    first = e.error.splitlines()[0][:200]
    said = next((ln.split("what():", 1)[1] for ln in reversed((e.logs or "").splitlines()) if "what():" in ln), "")
    said = re.sub(r"\[[^\]]*\]\s*", "", said).strip()[:240]
    if not said:
        return first
    return first.replace("; its last output below says which", "") + f": it said “{said}”"


def show_solution(exercise) -> None:
    """An exercise module's solution (its solution_source(), as the learner's cell would hold it), folded: open it
    once you have tried."""
    from IPython.display import HTML, display
    source = html.escape(exercise.solution_source())
    display(HTML(f"<details><summary>A solution</summary><pre>{source}</pre></details>"))


YOURS_NOT_WRITTEN = "not written yet: once your function passes its check, run this cell again to train with it"


@dataclass(frozen=True)
class YourRun:
    """The lesson's real run made again with the learner's function in place of the lab's (the same model, seed,
    data and schedule), beside the lab's run. Histories are labtools.train.History (step, loss, val_step, ...)."""
    outcome: Outcome            # pass: the two loss curves agree; fail; not written (the lab's run alone)
    lab: object
    yours: object | None = None
    difference: float | None = None  # the largest |training loss difference| over the steps both ran, nats

    def figure(self, title: str):
        from labtools import plots
        runs = {"the lab's": self.lab} | ({"yours": self.yours} if self.yours is not None else {})
        return plots.loss_curves(runs, title=title)

    def _repr_html_(self) -> str:
        return self.outcome._repr_html_()

    def show(self, title: str) -> None:
        """The verdict, and the two curves where yours ran (not written: the lab's run is already above)."""
        from IPython.display import display
        display(self)
        if self.yours is not None:
            self.figure(title).show()


# Two runs that differ only by rounding agree closely at first, then drift apart as training amplifies the
# difference (by hundredths of a nat after a few hundred steps); a wrong mechanism parts within a few steps
EARLY_STEPS = 20


def run_yours(fn: Callable, run: Callable[[Callable], object], lab, *, what: str, tol: float) -> YourRun:
    """run(fn): the lesson's training run with the learner's fn in it (a History, as long as the lab's or shorter),
    compared with the lab's History `lab`: its first EARLY_STEPS training losses must agree within tol; the largest
    difference over the whole run is reported. The run is bounded by BOUND_FACTOR times the lab's own; a stub is not
    run at all."""
    if is_stub(fn):
        return YourRun(Outcome("not written", YOURS_NOT_WRITTEN), lab)
    tried = attempt(run, fn, seconds=bound_for(lab.seconds), whose=fn)
    if not tried.returned:
        message = tried.outcome.message if tried.outcome.status == "not written" else \
            f"the run with {what} stopped: {tried.outcome.message}"
        return YourRun(Outcome(tried.outcome.status, message), lab)
    return compare_runs(tried.value, lab, what=what, tol=tol)


def compare_runs(yours, lab, *, what: str, tol: float) -> YourRun:
    """The learner's run against the lab's (both Histories): their first EARLY_STEPS training losses must agree
    within tol nats; the largest difference over the steps both ran is reported."""
    gaps = [abs(a - b) if math.isfinite(a) else math.inf for a, b in zip(yours.loss, lab.loss)]
    early = gaps[:EARLY_STEPS]
    worst = max(gaps, default=math.inf)
    if not max(early, default=math.inf) <= tol:
        i = next((k for k, gap in enumerate(early) if not gap <= tol), 0)
        return YourRun(Outcome("fail", f"with {what} the run parts from the lab's at step {yours.step[i]}: training "
                                       f"loss {yours.loss[i]:.4f} where the lab's was {lab.loss[i]:.4f} nats "
                                       f"(allowed difference {tol:.0e})", worst), lab, yours, worst)
    whole = f", and the whole curve stays within {worst:.0e} (training amplifies rounding)" \
        if len(gaps) > len(early) else ""
    return YourRun(Outcome("pass", f"{what} trained the model for {len(gaps)} steps: its first {len(early)} losses "
                                   f"are the lab's to {max(early):.0e} nats{whole}", worst), lab, yours, worst)


def losses_history(losses: Sequence[float], seconds: float = 0.0):
    """Training losses of steps 1, 2, … (a run made on ranks) as a labtools.train.History."""
    from labtools.train import History
    return History(step=list(range(1, len(losses) + 1)), loss=list(losses), seconds=seconds)


def difference(a, b) -> float:
    """The largest absolute difference between two results: tensors, numbers, or (nested) lists/tuples/dicts of
    them; inf when their structure, shape or type differs."""
    if isinstance(a, torch.Tensor) and a.ndim == 0 and isinstance(b, (int, float)) and not isinstance(b, bool):
        a = a.item()  # a norm returned as a 0-d tensor or as a number: the same answer
    if isinstance(b, torch.Tensor) and b.ndim == 0 and isinstance(a, (int, float)) and not isinstance(a, bool):
        b = b.item()
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or a.shape != b.shape \
                or _kind(a) != _kind(b):
            return math.inf
        return (a.double() - b.double()).abs().max().item() if a.numel() else 0.0
    if isinstance(a, dict) and isinstance(b, dict):
        return math.inf if a.keys() != b.keys() else max([difference(a[k], b[k]) for k in a], default=0.0)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return math.inf if len(a) != len(b) else max([difference(x, y) for x, y in zip(a, b)], default=0.0)
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return abs(a - b)
    return 0.0 if a == b else math.inf


def _kind(t: torch.Tensor) -> str:
    """A tensor's kind of number: a mask, whole numbers (indices) or floats; its precision aside."""
    return "bool" if t.dtype == torch.bool else "float" if t.is_floating_point() or t.is_complex() else "int"


def _short(x, unit: str = "") -> str:
    """A value in a few words; a number with its unit (bytes also in GiB or MiB, so 12952880859 reads as a size)."""
    if unit and isinstance(x, (int, float)) and not isinstance(x, bool):
        return _with_unit(x, unit)
    if isinstance(x, torch.Tensor):
        return f"a tensor of shape {tuple(x.shape)}" if x.numel() > 6 else "[" + ", ".join(f"{v:.4g}" for v in
                                                                                             x.flatten().tolist()) + "]"
    if isinstance(x, (list, tuple)):
        return f"{len(x)} values"
    return repr(x)[:80]


def _with_unit(x: float, unit: str) -> str:
    if unit == "bytes":  # a model's budget in GB and TB, as they are published; a tensor's in MiB, as measured
        for size, name in ((1e12, "TB"), (1e9, "GB"), (2**20, "MiB"), (2**10, "KiB")):
            if abs(x) >= size:
                return f"{x:,.0f} bytes ({x / size:.2f} {name})"
        return f"{x:,.0f} bytes"
    return f"{x:,.6g} {unit}"


def check(fn: Callable, reference: Callable, cases: Sequence[Case], *, tol: float = 1e-6, relative: bool = False,
          in_place: bool = False, what: str = "your function", against: str = "the reference",
          unit: str = "") -> Outcome:
    """Run fn and the reference on every case (each on its own copy of the arguments) and compare: the return
    values, or the arguments after the call when the reference returns None (an in-place function); in_place: the
    return value and the arguments after the call, both. relative: the difference is divided by the largest
    magnitude in the reference's result (at least 1). against: what the pass message names the reference. unit: what
    a number returned measures ("bytes", "s"), said with it when a case fails."""
    if not cases:
        raise ValueError("check needs at least one case: with none, any function would pass")
    if not tol >= 0:  # NaN too: every comparison with it is False, so everything would fail, or pass
        raise ValueError(f"tol must be a number ≥ 0, got {tol!r}")
    if is_stub(fn):
        return Outcome("not written", NOT_WRITTEN)
    worst = 0.0
    for case in cases:
        mine, theirs = copy.deepcopy(case.args), copy.deepcopy(case.args)
        start = time.perf_counter()
        expected = reference(*theirs)
        bound = bound_for(time.perf_counter() - start)
        tried = attempt(fn, *mine, case=case.name, hint=case.hint, seconds=bound)
        if not tried.returned:
            return tried.outcome
        got = tried.value
        if in_place:
            parts = [("the value returned", got, expected, "output"),
                     ("the arguments after the call", mine, theirs, "argument")]
        else:
            parts = [("", mine, theirs, "argument") if expected is None else ("", got, expected, "output")]
        for label, g, e, noun in parts:
            d = _relative(g, e) if relative else difference(g, e)
            worst = max(worst, d)
            if not d <= tol:
                where = f"{label} — {_where(g, e, noun, unit)}" if label else _where(g, e, noun, unit)
                hint = f" — hint: {case.hint}" if case.hint else ""
                return Outcome("fail", f"case '{case.name}': {where} (largest {'relative ' * relative}"
                                       f"difference {d:.1e}, allowed {tol:.0e}){hint}", d)
    return Outcome("pass", f"{what} matches {against} on {len(cases)} cases (largest "
                           f"{'relative ' * relative}difference {worst:.1e})", worst)


def _relative(got, expected) -> float:
    """The difference of each output divided by that output's largest magnitude (at least 1), worst output."""
    if isinstance(expected, (list, tuple)) and isinstance(got, (list, tuple)) and len(got) == len(expected):
        return max([_relative(g, e) for g, e in zip(got, expected)], default=0.0)
    return difference(got, expected) / _magnitude(expected)


def _magnitude(x) -> float:
    if isinstance(x, torch.Tensor):
        return max(1.0, x.abs().max().item() if x.numel() else 0.0)
    if isinstance(x, (list, tuple)):
        return max([_magnitude(v) for v in x], default=1.0)
    if isinstance(x, dict):
        return max([_magnitude(v) for v in x.values()], default=1.0)
    return max(1.0, abs(x)) if isinstance(x, (int, float)) else 1.0


def _where(got, expected, noun: str = "output", unit: str = "") -> str:
    """Which output differs, and how, in a few words ("output 2 of 3: item 1 of 4: expected …, got …")."""
    if isinstance(expected, (list, tuple)) and isinstance(got, (list, tuple)) and len(got) == len(expected) \
            and expected:
        i = max(range(len(expected)), key=lambda k: difference(got[k], expected[k]))
        inner = _where(got[i], expected[i], "item", unit)
        return inner if len(expected) == 1 else f"{noun} {i + 1} of {len(expected)}: {inner}"
    if isinstance(got, torch.Tensor) and isinstance(expected, torch.Tensor) and _kind(got) != _kind(expected):
        names = {"bool": "a mask (bool)", "int": "whole numbers (an integer dtype)", "float": "floats"}
        return f"expected {names[_kind(expected)]} ({expected.dtype}), got {names[_kind(got)]} ({got.dtype})"
    if isinstance(got, torch.Tensor) and isinstance(expected, torch.Tensor) and got.shape == expected.shape \
            and got.numel() > 6:  # too long to print: the entry that differs most, where it is
        gap = (got.double() - expected.double()).abs().nan_to_num(nan=math.inf)
        at = tuple(int(k) for k in torch.unravel_index(gap.argmax(), gap.shape))
        return (f"in a tensor of shape {tuple(got.shape)}, entry {list(at)} differs most: expected "
                f"{_short(expected[at].item())}, got {_short(got[at].item())}")
    return f"expected {_short(expected, unit)}, got {_short(got, unit)}"


def outcome(results: Sequence[dict], *, tol: float, what: str, reference: str, relative: bool = False) -> Outcome:
    """The verdict from per-case results computed elsewhere (e.g. inside ranks): each {"case", "difference",
    "error", "hint"}; the first case that raised or differs by more than tol fails. relative: the differences are
    relative ones (say so)."""
    worst, kind = 0.0, "relative " * relative
    for r in results:
        hint = f" — hint: {r['hint']}" if r.get("hint") else ""
        if r.get("error"):
            return Outcome("fail", f"case '{r['case']}': {r['error']}{hint}")
        worst = max(worst, r["difference"])
        if not r["difference"] <= tol:
            by = f"{'a ' * relative}{kind}{r['difference']:.1e}"
            return Outcome("fail", f"case '{r['case']}': differs from {reference} by {by} (allowed {tol:.0e}){hint}",
                           r["difference"])
    return Outcome("pass", f"{what} matches {reference} on {len(results)} cases (largest {kind}difference "
                           f"{worst:.1e})", worst)
