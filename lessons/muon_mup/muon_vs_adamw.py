"""Lesson 19, section 2: is Muon better than AdamW at the same budget? Each at its best learning rate on a sweep
(seed 0; AdamW's sweep is section 3's standard runs at this width), then both over the same seeds, paired; how soon
Muon reaches AdamW's final loss; and what a Muon step costs in time, in alternating rounds. With yours: the best Muon
run again, your Newton–Schulz in it."""

import statistics
import time
from dataclasses import dataclass

import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from labtools import evidence, plots
from labtools.claims import Findings, Ledger, at_most, below, is_true
from labtools.device import cpu_has_units, pick_device
from labtools.evidence import Interval
from labtools.exercises import YourRun, losses_history, run_yours
from lessons.muon_mup import Settings
from lessons.muon_mup.runs import Recipe, Run, corpus, model, optimizer, train_all, train_run

SMOOTH = 10        # steps a training loss is averaged over before it is compared
TIME_ROUNDS = 5    # alternating rounds of AdamW steps and Muon steps
TIME_STEPS = 3     # steps per round


@dataclass(frozen=True)
class Sweep:
    lrs: tuple
    finals: tuple          # seed 0's final validation loss at each learning rate
    best_lr: float

    @property
    def inside(self) -> bool:
        """The best learning rate has a neighbour on each side: the sweep brackets it."""
        return self.lrs[0] < self.best_lr < self.lrs[-1]


@dataclass(frozen=True)
class Comparison:
    adamw: Sweep
    muon: Sweep
    adamw_finals: list     # final loss per seed at AdamW's best learning rate
    muon_finals: list      # the same seeds at Muon's best
    difference: Interval   # Muon − AdamW, paired by seed
    adamw_run: Run         # seed 0 at each best learning rate: the curves
    muon_run: Run
    steps_to_match: int | None  # the first step where Muon's smoothed loss reaches AdamW's final smoothed loss
    step_ratio: float      # a Muon step's time ÷ an AdamW step's, median over alternating rounds
    bf16_emulated: bool    # the step ran on a CPU without bf16 units: Newton–Schulz's bf16 products go through fp32


def adamw_recipe(S: Settings, lr: float, seed: int = 0) -> Recipe:
    return Recipe(S.n_embd, S.steps, lr, seed=seed)


def muon_recipe(S: Settings, lr: float, adam_lr: float, seed: int = 0) -> Recipe:
    return Recipe(S.n_embd, S.steps, lr, "muon", seed=seed, adam_lr=adam_lr)


def sweep(lrs, finals) -> Sweep:
    return Sweep(tuple(lrs), tuple(finals), lrs[min(range(len(lrs)), key=finals.__getitem__)])


def smoothed(losses) -> list[float]:
    return [statistics.fmean(losses[max(0, i - SMOOTH + 1):i + 1]) for i in range(len(losses))]


def run(S: Settings) -> Comparison:
    adamw = sweep(S.lrs, [r.final for r in train_all(S, [adamw_recipe(S, lr) for lr in S.lrs], "AdamW's sweep")])
    muon = sweep(S.muon_lrs, [r.final for r in train_all(S, [muon_recipe(S, lr, adamw.best_lr) for lr in S.muon_lrs],
                                                         "Muon's sweep")])
    both = train_all(S, [adamw_recipe(S, adamw.best_lr, s) for s in range(S.seeds)]
                     + [muon_recipe(S, muon.best_lr, adamw.best_lr, s) for s in range(S.seeds)], "both, over seeds")
    a, m = [r.final for r in both[:S.seeds]], [r.final for r in both[S.seeds:]]
    a_run = train_run(S, adamw_recipe(S, adamw.best_lr))
    m_run = train_run(S, muon_recipe(S, muon.best_lr, adamw.best_lr))
    target, curve = smoothed(a_run.losses)[-1], smoothed(m_run.losses)
    reached = next((i + 1 for i, v in enumerate(curve) if v <= target), None)
    return Comparison(adamw, muon, a, m, evidence.paired(m, a, S.confidence, over="seeds"), a_run, m_run, reached,
                      step_time_ratio(S, adamw.best_lr, muon.best_lr),
                      pick_device().type == "cpu" and not cpu_has_units("bf16"))


def step_time_ratio(S: Settings, adamw_lr: float, muon_lr: float) -> float:
    """A Muon step's time ÷ an AdamW step's on the same model and batch: the median over rounds that alternate
    which goes first (a machine that slows down slows both)."""
    X, Y = corpus().batch("train", S.batch_size, S.block_size, generator=torch.Generator().manual_seed(0),
                          device=pick_device())
    kinds = {"adamw": adamw_recipe(S, adamw_lr), "muon": muon_recipe(S, muon_lr, adamw_lr)}
    steppers = {}
    for name, r in kinds.items():
        m = model(S, r.width, False, 0)
        steppers[name] = (m, optimizer(m, r))

    def steps(name: str) -> float:
        m, opt = steppers[name]
        start = time.perf_counter()
        for _ in range(TIME_STEPS):
            _, loss = m(X, Y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        if X.device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - start

    steps("adamw"), steps("muon")  # warm both up
    ratios = []
    for i in range(TIME_ROUNDS):
        order = ("adamw", "muon") if i % 2 == 0 else ("muon", "adamw")
        t = {name: steps(name) for name in order}
        ratios.append(t["muon"] / t["adamw"])
    return statistics.median(ratios)


def figure(c: Comparison) -> go.Figure:
    fig = make_subplots(rows=1, cols=2, subplot_titles=("the sweeps (seed 0)", "the best of each (seed 0)"))
    for i, (name, sw) in enumerate((("AdamW", c.adamw), ("Muon", c.muon))):
        fig.add_trace(go.Scatter(x=list(sw.lrs), y=list(sw.finals), mode="lines+markers", name=name,
                                 line=dict(color=plots.color(i)), legendgroup=name,
                                 hovertemplate=f"{name}: lr %{{x:.4g}} → %{{y:.3f}}<extra></extra>"), row=1, col=1)
    for i, (name, r) in enumerate((("AdamW", c.adamw_run), ("Muon", c.muon_run))):
        fig.add_trace(go.Scatter(x=list(range(1, len(r.losses) + 1)), y=smoothed(r.losses), mode="lines",
                                 name=name, line=dict(color=plots.color(i)), legendgroup=name, showlegend=False),
                      row=1, col=2)
    fig.update_xaxes(type="log", title_text="learning rate (log scale)", row=1, col=1)
    fig.update_xaxes(title_text="step", row=1, col=2)
    fig.update_yaxes(title_text="final validation loss (nats)", row=1, col=1)
    fig.update_yaxes(title_text=f"training loss, mean of {SMOOTH} steps", row=1, col=2)
    return plots.style(fig, "Muon at its best learning rate ends below AdamW at its best", height=400)


def findings(ledger: Ledger, S: Settings, c: Comparison) -> Findings:
    d = c.difference
    ledger.add("muon_lower", f"Muon ends below AdamW, each at its best learning rate (paired over "
               f"{len(c.muon_finals)} seeds)", d, below(0), kind="measured")
    share = c.steps_to_match / S.steps if c.steps_to_match else 1.0
    ledger.add("muon_sooner", "Muon reaches AdamW's final training loss before the end, in at most 90% of the "
               "steps (share)", share, at_most(0.9), kind="measured")
    ledger.add("sweeps_bracket", "each sweep's best learning rate has a neighbour on each side",
               c.adamw.inside and c.muon.inside, is_true(), kind="measured", detail=True)
    ledger.note("muon_step_time_ratio", c.step_ratio)
    settled = d.high < 0
    return Findings(
        [f"Yes, here: at their best learning rates Muon ended {-d.estimate:.2f} nats below AdamW"
         + (", on every seed" if all(m < a for m, a in zip(c.muon_finals, c.adamw_finals)) else "")
         + ("." if settled else ", though the interval over these seeds reaches zero: more seeds would settle it."),
         (f"It got there in fewer steps, and sooner by the clock: Muon matched AdamW's final loss after {share:.0%} "
          f"of the steps, each {c.step_ratio:.1f} times as long." if share * c.step_ratio < 1 else
          f"It got there in fewer steps, but not sooner by the clock here: Muon matched AdamW's final loss after "
          f"{share:.0%} of the steps, each {c.step_ratio:.1f} times as long"
          + (" (its iteration runs in bf16, which this CPU has no units for)." if c.bf16_emulated else "."))],
        [evidence.table([("Muon − AdamW, paired by seed", d)], label="final validation loss"),
         "| best learning rate, seed 0's sweep | |\n|---|---|\n"
         f"| AdamW | {c.adamw.best_lr:.4g} |\n| Muon, the blocks' matrices | {c.muon.best_lr:.4g} |\n"
         f"| Muon's embeddings, head, biases and norms (stepped by AdamW) | {c.adamw.best_lr:.4g} |",
         "| seed | " + " | ".join(str(s) for s in range(len(c.muon_finals))) + " |\n|---|"
         + "---|" * len(c.muon_finals) + "\n| AdamW | " + " | ".join(f"{v:.3f}" for v in c.adamw_finals)
         + " |\n| Muon | " + " | ".join(f"{v:.3f}" for v in c.muon_finals) + " |"])


def run_with_yours(S: Settings, c: Comparison, fn) -> YourRun:
    """The best Muon run of seed 0 again, with your Newton–Schulz in place of the lab's."""
    r = c.muon_run.recipe

    def yours(orthogonalize):
        return losses_history(train_run(S, r, orthogonalize=orthogonalize, desc="Muon, your Newton–Schulz").losses)

    return run_yours(fn, yours, losses_history(c.muon_run.losses, c.muon_run.seconds), what="your Newton–Schulz",
                     tol=0.05)
