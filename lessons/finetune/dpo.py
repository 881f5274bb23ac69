"""Lesson 20, sections 5-6: preferences. A fine-tune made from noisy demonstrations (a share of them drop every
carry) answers fewer sums; its own samples on new problems, judged by the verifier, give pairs of a right and a
wrong answer; DPO trains on them at each β of the settings, against the noisy fine-tune as the reference. Measured:
exact match, the implicit reward margin, the chosen answers' own log-probability, and the KL to the reference. With
yours: the lesson's DPO run again, your loss in it."""

import copy
import dataclasses
import statistics
import time
from dataclasses import dataclass

import plotly.graph_objects as go
import torch

from labtools import chat, evidence, plots
from labtools.claims import Findings, Ledger, above, at_least, at_most, below
from labtools.evidence import Interval
from labtools.exercises import Outcome, YourRun, losses_history, run_yours
from labtools.posttrain import DPORun, Pair, dpo, dpo_loss, preference_pairs, sampled_kl
from labtools.progress import progress
from labtools.tasks import Graded
from labtools.widgets import Panel
from lessons.finetune import TEMPLATE, Settings, problems
from lessons.finetune.sft import Tuned, tune

SMOOTH = 10     # steps a margin or log-probability is averaged over before it is read
KL_BOUND = 2.0  # nats per answer: DPO's reference term keeps the policy near the model it started from
@dataclass(frozen=True)
class ByBeta:
    beta: float
    run: DPORun
    graded: Graded
    kl: float             # KL(policy ‖ reference) per answer, nats, on the held-out sums
    seconds: float

    def late(self, values: list) -> float:
        return statistics.fmean(values[-SMOOTH:])


@dataclass(frozen=True)
class Preferences:
    noisy: Tuned                 # the fine-tune on noisy demonstrations: DPO's start and reference
    wrong_demos: int             # demonstrations whose answer lost its carries
    pairs: list                  # Pair: a right and a wrong answer the noisy model sampled to the same problem
    pool: int                    # problems sampled for pairs
    runs: dict                   # β -> ByBeta
    gain: Interval               # exact, DPO at the lesson's β − the noisy fine-tune, paired by problem
    beta: float
    noise_cost: Interval         # exact, the noisy fine-tune − section 2's clean one, paired by problem

    @property
    def lesson(self) -> ByBeta:
        return self.runs[self.beta]


def run(S: Settings, base: chat.GPT, clean: Tuned) -> Preferences:
    pre = problems(S)
    wrong = chat.noisy_answers(pre.demos, S.noise)
    noisy = tune(S, base, pre.demos, answers=wrong, desc="fine-tuning on noisy demonstrations")
    pairs = preference_pairs(noisy.model, TEMPLATE, pre.pool, answers=S.answers, seed=S.seed)
    runs = {beta: dpo_at(S, noisy, pairs, beta) for beta in progress(S.betas, desc="DPO, by β_DPO")}
    gain = evidence.paired([float(r) for r in runs[S.beta].graded.right], [float(r) for r in noisy.graded.right],
                           S.confidence, over="problems")
    cost = evidence.paired([float(r) for r in noisy.graded.right], [float(r) for r in clean.graded.right],
                           S.confidence, over="problems")
    return Preferences(noisy, sum(w != p.answer for w, p in zip(wrong, pre.demos)), pairs, len(pre.pool), runs, gain,
                       S.beta, cost)


def dpo_at(S: Settings, noisy: Tuned, pairs: list[Pair], beta: float, loss_fn=dpo_loss,
           desc: str | None = None) -> ByBeta:
    policy = copy.deepcopy(noisy.model)
    t0 = time.perf_counter()
    r = dpo(policy, TEMPLATE, pairs, steps=S.dpo_steps, beta=beta, lr=S.dpo_lr, batch_size=S.batch_size,
            seed=S.seed, loss_fn=loss_fn, desc=desc or f"DPO, β_DPO = {beta:g}")
    seconds = time.perf_counter() - t0
    test = problems(S).test
    kl = sampled_kl(policy, noisy.model, TEMPLATE, test, generator=torch.Generator().manual_seed(S.seed))
    return ByBeta(beta, r, chat.grade(policy, TEMPLATE, test, S.confidence), kl, seconds)


def figure(p: Preferences, beta: float | None = None) -> go.Figure:
    b = p.runs[p.beta if beta is None else beta]
    said = ("more sums right, the right answers more likely" if b.late(b.run.chosen_change) > 0 else
            "the margin grows while the right answers grow less likely")
    fig = plots.subplots(1, 2, ("held-out sums answered exactly", "each DPO step, on its batch of pairs"),
                         title=f"DPO at β<sub>DPO</sub> = {b.beta:g}: {said}")
    bars = (("noisy fine-tune", p.noisy.graded.score), (f"after DPO, β<sub>DPO</sub> = {b.beta:g}", b.graded.score))
    for i, (name, s) in enumerate(bars):
        fig.add_trace(go.Bar(x=[name], y=[100 * s.estimate], marker_color=plots.color(i), showlegend=False,
                             error_y=dict(type="data", symmetric=False, array=[100 * (s.high - s.estimate)],
                                          arrayminus=[100 * (s.estimate - s.low)]),
                             texttemplate=f"{100 * s.estimate:.0f}%", textposition="inside"), row=1, col=1)
    steps = list(range(1, len(b.run.margin) + 1))
    fig.add_trace(go.Scatter(x=steps, y=b.run.margin, mode="lines", name="implicit reward margin",
                             line=dict(color=plots.color(2))), row=1, col=2)
    fig.add_trace(go.Scatter(x=steps, y=b.run.chosen_change, mode="lines",
                             name="log π(chosen) − log π_ref(chosen)", line=dict(color=plots.color(3))), row=1, col=2)
    fig.update_yaxes(title_text="% exact, 95% interval", range=[0, 100], row=1, col=1)
    fig.update_yaxes(title_text="nats, mean over the batch", row=1, col=2)
    fig.update_xaxes(title_text="DPO step", row=1, col=2)
    return fig


def panel(p: Preferences) -> Panel:
    from ipywidgets import SelectionSlider
    return Panel(lambda beta: figure(p, beta),
                 {"beta": SelectionSlider(options=list(sorted(p.runs)), value=p.beta, description="β_DPO")},
                 title="A smaller β_DPO lets the policy stray further from its reference")


def findings(ledger: Ledger, S: Settings, p: Preferences) -> Findings:
    b = p.lesson
    ledger.add("noisy_sft_weaker", "fine-tuned on demonstrations of which a share drop their carries, the model "
               "answers fewer held-out sums than section 2's (difference, paired by problem)", p.noise_cost,
               below(-0.1), kind="measured")
    ledger.add("dpo_improves", f"DPO at β_DPO = {b.beta:g} on the model's own right and wrong answers raises exact "
               "match over the noisy fine-tune (difference, paired by problem)", p.gain, above(0.05), kind="measured")
    ledger.add("margin_rises", "the implicit reward margin rises from zero (mean of the last steps)",
               b.late(b.run.margin), at_least(0.5), kind="measured", detail=True)
    ledger.add("chosen_likelier", f"at β_DPO = {b.beta:g} the right answers themselves become more likely than under "
               "the reference (log-probability change, nats)", b.late(b.run.chosen_change), at_least(0.01),
               kind="measured")
    ledger.add("kl_bounded", f"the policy stays near its reference: KL per sampled answer at most {KL_BOUND} nats",
               b.kl, at_most(KL_BOUND), kind="measured")
    won = p.gain.estimate / -p.noise_cost.estimate if p.noise_cost.estimate < 0 else 1.0
    said = [("Yes" if won >= 0.9 else "Mostly" if won >= 0.5 else "Partly")
            + f": DPO took exact answers from {p.noisy.graded.score.estimate:.0%} to {b.graded.score.estimate:.0%} "
            "with no new demonstration, only the verifier's verdicts on the model's own answers"
            + (", most of the way back to the clean fine-tune." if 0.5 <= won < 0.9 else
               ", part of the way back to the clean fine-tune." if won < 0.5 else ".")]
    small = min(p.runs)
    if small < b.beta:
        s = p.runs[small]
        ledger.add("small_beta_pitfall", f"at β_DPO = {small:g} the margin still rises, yet the right answers become "
                   "less likely (log-probability change, nats)", s.late(s.run.chosen_change), at_most(0.0),
                   kind="measured")
        said.append(f"A rising margin is not enough: at $\\beta_{{\\text{{DPO}}}}$ = {small:g} the margin rose too, "
                    "but by pushing the wrong answers down faster than the right ones, and exact match "
                    + (f"fell to {s.graded.score.estimate:.0%}, below where it started."
                       if s.graded.score.estimate < p.noisy.graded.score.estimate else
                       f"rose only to {s.graded.score.estimate:.0%}."))
    rows = "\n".join(f"| {r.beta:g} | {r.graded.score.estimate:.1%} | {r.late(r.run.margin):.2f} | "
                     f"{r.late(r.run.chosen_change):+.2f} | {r.kl:.2f} |" for r in sorted(p.runs.values(),
                                                                                     key=lambda r: r.beta))
    return Findings(said, [
        "| the data | |\n|---|---|\n"
        f"| demonstrations that lost their carries (drawn with chance {S.noise:g}; a sum with no carry keeps its "
        f"answer) | {p.wrong_demos} of {S.demos} |\n"
        f"| problems sampled for pairs ({S.answers} answers each, temperature 1) | {p.pool} |\n"
        f"| of them with a right and a wrong answer: pairs | {len(p.pairs)} |\n"
        f"| DPO: steps × pairs per step | {S.dpo_steps} × {S.batch_size} |\n| DPO's learning rate | {S.dpo_lr:g} |",
        "| β_DPO | exact | reward margin | log π − log π_ref, chosen | KL(π ‖ π_ref) per answer, nats |\n"
        "|---|---|---|---|---|\n"
        + rows,
        evidence.table([("noisy fine-tune − clean fine-tune", p.noise_cost),
                        (f"after DPO − noisy fine-tune, β_DPO = {b.beta:g}", p.gain)], label="exact-match share")])


def with_yours(S: Settings, p: Preferences, fn) -> YourRun:
    """The lesson's DPO run again with your loss in place of the lab's: the same pairs, batches, β and seed; its
    losses must follow the lab's, and the model it made is graded."""
    made = {}

    def yours(loss_fn):
        made["run"] = dpo_at(S, p.noisy, p.pairs, p.beta, loss_fn=loss_fn, desc="DPO with your loss")
        return losses_history(made["run"].run.loss, made["run"].seconds)

    result = run_yours(fn, yours, losses_history(p.lesson.run.loss, p.lesson.seconds), what="your DPO loss", tol=1e-4)
    if result.outcome.passed:
        score = made["run"].graded.score
        result = dataclasses.replace(result, outcome=Outcome(
            "pass", f"{result.outcome.message}; the model your loss trained answers {score.estimate:.0%} of held-out "
                    f"sums exactly (the noisy fine-tune: {p.noisy.graded.score.estimate:.0%})", result.outcome.worst))
    return result
