"""Lesson 20, sections 2-4: supervised fine-tuning on demonstrations in the chat template, the loss on the answer
only. Section 2: the lesson's fine-tune (and yours). Section 3: from the base or from random weights, with the mask
or without, over seeds where the profile has several. Section 4: the fine-tuned model asked without the assistant
tag, in the pre-training form, and with a tag it never saw."""

import copy
import dataclasses
import math
import statistics
import time
from dataclasses import dataclass

import plotly.graph_objects as go

from labtools import chat, evidence, plots
from labtools.claims import Findings, Ledger, above, at_least, below
from labtools.evidence import Interval
from labtools.exercises import Outcome, YourRun, losses_history, run_yours
from labtools.posttrain import FineTune, finetune, sft_loss
from labtools.tasks import Graded, Problem
from lessons.finetune import TEMPLATE, Settings, problems

SMOOTH = 10  # steps a training loss is averaged over before it is read


@dataclass(frozen=True)
class Tuned:
    model: chat.GPT
    history: FineTune
    graded: Graded       # exact match on the held-out sums, asked in the template
    prompts: list        # the prompts it was graded on, as asked
    seconds: float

    @property
    def final_loss(self) -> float:
        return statistics.fmean(self.history.loss[-SMOOTH:])


def tune(S: Settings, start: chat.GPT, demos: list[Problem], *, mask: bool = True, answers: list | None = None,
         seed: int = 0, loss_fn=sft_loss, desc: str = "fine-tuning") -> Tuned:
    """A copy of `start` fine-tuned on the demonstrations (their answers, or `answers`), then graded."""
    model = copy.deepcopy(start)
    X, Y = TEMPLATE.examples(demos, answers, mask)
    t0 = time.perf_counter()
    history = finetune(model, X, Y, steps=S.steps, lr=S.lr, batch_size=S.batch_size, seed=seed, loss_fn=loss_fn,
                       desc=desc)
    seconds = time.perf_counter() - t0
    test = problems(S).test
    return Tuned(model, history, chat.grade(model, TEMPLATE, test, S.confidence), [TEMPLATE.prompt(p) for p in test],
                 seconds)


# --- section 2: the lesson's fine-tune, and yours ------------------------------------------------------------------

def run(S: Settings, base: chat.GPT) -> Tuned:
    return tune(S, base, problems(S).demos)


def figure(base_share: Interval, tuned: Tuned) -> go.Figure:
    fig = plots.subplots(1, 2, ("the loss on the answer, each step", "held-out sums answered exactly"),
                         title="A hundred steps on the answers teach the base the template")
    loss = tuned.history.loss
    fig.add_trace(go.Scatter(x=list(range(1, len(loss) + 1)), y=loss, mode="lines", name="fine-tuning",
                             line=dict(color=plots.color(0)), showlegend=False), row=1, col=1)
    for i, (name, s) in enumerate((("base", base_share), ("fine-tuned", tuned.graded.score))):
        fig.add_trace(go.Bar(x=[name], y=[100 * s.estimate], marker_color=plots.color(i + 1), showlegend=False,
                             error_y=dict(type="data", symmetric=False, array=[100 * (s.high - s.estimate)],
                                          arrayminus=[100 * (s.estimate - s.low)]),
                             texttemplate=f"{100 * s.estimate:.0f}%", textposition="inside"), row=1, col=2)
    fig.update_xaxes(title_text="step", row=1, col=1)
    fig.update_yaxes(title_text="nats per answer character", row=1, col=1)
    fig.update_yaxes(title_text="% exact, with its 95% interval", range=[0, 100], row=1, col=2)
    return fig


def findings(ledger: Ledger, S: Settings, base_share: Interval, tuned: Tuned) -> Findings:
    s = tuned.graded.score
    ledger.add("sft_learns_format", "after fine-tuning on demonstrations, the model answers held-out sums in the "
               "template (share exact)", s, above(0.8), kind="measured")
    tagged = sum(p.endswith(TEMPLATE.assistant) for p in tuned.prompts) / len(tuned.prompts)
    ledger.add("graded_with_tag", "every prompt the fine-tune was graded on ended with the assistant tag it was "
               "trained with (share)", tagged, at_least(1.0), kind="counted")
    return Findings(
        [f"Yes, and quickly: a few hundred demonstrations took exact answers from {base_share.estimate:.0%} to "
         f"{s.estimate:.0%} of held-out sums.",
         "What changed is the format: where an answer starts, and where it stops."],
        ["| fine-tuning | |\n|---|---|\n"
         f"| steps × demonstrations per step | {S.steps} × {S.batch_size} |\n"
         f"| times each demonstration was seen, on average | {S.steps * S.batch_size / S.demos:.0f} |\n"
         f"| learning rate | {S.lr:g} |\n"
         f"| time | {tuned.seconds:.1f} s |\n"
         f"| final loss, nats per answer character (mean of the last {SMOOTH} steps) | {tuned.final_loss:.3f} |",
         evidence.table([("exact, fine-tuned", s)], label="held-out sums")])


def with_yours(S: Settings, base: chat.GPT, tuned: Tuned, fn) -> YourRun:
    """Section 2's fine-tune again with your loss in place of the lab's: the same demonstrations, batches and seed;
    its losses must follow the lab's, and the model it made is graded."""
    demos = problems(S).demos
    made = {}

    def yours(loss_fn):
        made["run"] = tune(S, base, demos, loss_fn=loss_fn, desc="fine-tuning with your loss")
        return losses_history(made["run"].history.loss, made["run"].seconds)

    result = run_yours(fn, yours, losses_history(tuned.history.loss, tuned.seconds), what="your loss", tol=1e-4)
    if result.outcome.passed:
        score = made["run"].graded.score
        result = dataclasses.replace(result, outcome=Outcome(
            "pass", f"{result.outcome.message}; the model your loss fine-tuned answers {score.estimate:.0%} of "
                    f"held-out sums exactly", result.outcome.worst))
    return result


# --- section 3: from the base or from scratch; with the mask or without ------------------------------------------

@dataclass(frozen=True)
class Ablation:
    masked: list          # exact match per seed: from the base, the loss on the answer only (seed 0: section 2's)
    unmasked: list        # from the base, the loss on every character
    scratch: list         # from random weights, the loss on the answer only
    needs_base: Interval  # from the base − from scratch, seed 0, paired by problem
    mask_effect: Interval | None  # masked − unmasked, paired by seed (None with one seed: a recipe needs seeds)
    over_seeds: bool
    masked_loss: float    # the final training loss of each, seed 0
    unmasked_loss: float
    entropy_floor: float  # nats per character the unmasked loss cannot go below: the question's random digits


def ablation(S: Settings, base: chat.GPT, tuned: Tuned) -> Ablation:
    masked, unmasked, scratch = [tuned], [], []
    for seed in range(S.seeds):
        demos = problems(S, seed).demos
        if seed:
            masked.append(tune(S, base, demos, seed=seed, desc=f"masked, seed {seed}"))
        unmasked.append(tune(S, base, demos, mask=False, seed=seed, desc=f"unmasked, seed {seed}"))
        if seed == 0:
            fresh = chat.new_model(S.recipe).to(next(base.parameters()).device)
            scratch.append(tune(S, fresh, demos, seed=seed, desc="from random weights"))

    def right(t: Tuned) -> list[float]:
        return [float(r) for r in t.graded.right]

    over_seeds = S.seeds >= 2
    effect = evidence.paired([t.graded.score.estimate for t in masked],
                             [t.graded.score.estimate for t in unmasked], S.confidence, over="seeds") \
        if over_seeds else None
    line = len(TEMPLATE.line(problems(S).test[0]))
    digits = S.digits * 2 - 1  # the question's digits after its first, which no model can predict
    return Ablation([t.graded.score.estimate for t in masked], [t.graded.score.estimate for t in unmasked],
                    [t.graded.score.estimate for t in scratch],
                    evidence.paired(right(masked[0]), right(scratch[0]), S.confidence, over="problems"), effect,
                    over_seeds, masked[0].final_loss, unmasked[0].final_loss, digits * math.log(10) / (line - 1))


def ablation_figure(a: Ablation) -> go.Figure:
    names = ("from the base, answer only", "from the base, every character", "from random weights, answer only")
    fig = go.Figure()
    for i, (name, values) in enumerate(zip(names, (a.masked, a.unmasked, a.scratch))):
        fig.add_trace(go.Box(y=[100 * v for v in values], name=name, boxpoints="all", marker_color=plots.color(i),
                             showlegend=False) if len(values) > 1 else
                      go.Bar(x=[name], y=[100 * values[0]], marker_color=plots.color(i), showlegend=False,
                             texttemplate=f"{100 * values[0]:.0f}%", textposition="inside"))
    fig.update_yaxes(title_text="% of held-out sums exact" + (", one point per seed" if a.over_seeds else ""),
                     range=[0, 100])
    return plots.style(fig, "Fine-tuning draws on the base's skill: from random weights it teaches almost nothing",
                       height=380)


def ablation_findings(ledger: Ledger, S: Settings, a: Ablation) -> Findings:
    ledger.add("base_needed", "the same fine-tuning from random weights answers far fewer sums than from the base "
               "(from the base − from scratch, share exact, paired by problem)", a.needs_base, above(0.5),
               kind="measured")
    ledger.add("unmasked_loss_floor", "without the mask the loss also counts the question's random digits, and stays "
               "near what they alone cost (final loss ÷ their entropy per counted character)",
               a.unmasked_loss / a.entropy_floor, at_least(0.9), kind="measured")
    e = a.mask_effect
    one = a.masked[0] - a.unmasked[0]
    if e is None:
        here = ("both runs answered the same share exactly" if one == 0 else
                f"the masked run answered {abs(100 * one):.1f} points {'more' if one > 0 else 'fewer'} sums exactly "
                "than the unmasked one")
        mask = (f"One seed cannot say whether the mask helps: here {here}, but a comparison of recipes needs several "
                "seeds (lesson 18). Set `SEEDS`, or run the `cpu` profile.")
    else:
        ledger.note("mask_effect", dataclasses.asdict(e))
        pts = f"{100 * e.estimate:+.1f} points"
        mask = (f"The mask helped: {pts} exact over {e.n} seeds, an interval clear of zero." if e.low > 0
                else f"The mask hurt: {pts} exact over {e.n} seeds, an interval clear of zero."
                if e.high < 0 else f"The mask made no difference these {e.n} seeds can settle ({pts} exact, an "
                "interval that spans zero). What it changes for sure is what the loss measures.")
    return Findings(
        [f"The base matters: from random weights the same fine-tuning reached {statistics.fmean(a.scratch):.0%}, "
         f"against {a.masked[0]:.0%} from the base. Fine-tuning draws out what pre-training put in.", mask],
        ["Without the mask the loss also counts the question's digits, which are random: the two losses measure "
         "different things.",
         "| final training loss, seed 0 | nats per character |\n|---|---|\n"
         f"| answer only | {a.masked_loss:.3f} |\n| every character | {a.unmasked_loss:.3f} |\n"
         f"| the question's random digits alone: their entropy, spread over the characters the loss counts "
         f"(computed) | {a.entropy_floor:.3f} |",
         evidence.table([("from the base − from scratch (seed 0, paired by problem)", a.needs_base)]
                        + ([("answer only − every character (paired by seed)", e)] if e else []),
                        label="exact-match share"),
         "| seed | " + " | ".join(str(s) for s in range(len(a.masked))) + " |\n|---|" + "---|" * len(a.masked)
         + "\n| answer only | " + " | ".join(f"{v:.1%}" for v in a.masked)
         + " |\n| every character | " + " | ".join(f"{v:.1%}" for v in a.unmasked) + " |"])


# --- section 4: a prompt that is not the template's ---------------------------------------------------------------

ASKED = {"the template (07+45▶)": lambda p: TEMPLATE.prompt(p),
         "no assistant tag (07+45)": lambda p: p.prompt[:-1],
         "the pre-training form (07+45=)": lambda p: p.prompt,
         "a tag it never saw (07+45▷)": lambda p: p.prompt[:-1] + "▷"}


@dataclass(frozen=True)
class Mismatch:
    scores: dict          # how it was asked -> exact match (Interval)
    completions: dict     # how it was asked -> the first completions
    problems: list


def mismatch(S: Settings, tuned: Tuned) -> Mismatch:
    test = problems(S).test
    n = len(test[0].answer) + 1
    scores, shown = {}, {}
    for name, ask in ASKED.items():
        s = chat.sample(tuned.model, [ask(p) for p in test], n, temperature=0.0, end=TEMPLATE.end)
        ok = chat.right(TEMPLATE, test, s.text)
        scores[name] = evidence.share(sum(ok), len(ok), S.confidence)
        shown[name] = s.text[:3]
    return Mismatch(scores, shown, test[:3])


def mismatch_figure(m: Mismatch) -> go.Figure:
    return plots.shares(m.scores, title="Without the assistant tag the fine-tuned model scores zero",
                        yaxis="% of held-out sums exact, 95% interval")


def mismatch_findings(ledger: Ledger, m: Mismatch) -> Findings:
    names = list(ASKED)
    ledger.add("no_tag_fails", "asked without the assistant tag, the fine-tuned model answers almost no sums exactly "
               "(share)", m.scores[names[1]], below(0.05), kind="measured")
    rows = "\n".join(f"| {name} | " + " · ".join(f"`{ASKED[name](p)}` → `{c or '(nothing)'}`" for p, c in
                                                 zip(m.problems, m.completions[name]))
                     + f" | {m.scores[name].estimate:.1%} |" for name in names)
    other = m.scores[names[3]].estimate
    return Findings(
        [f"It fails without a word: with no assistant tag the model answered {m.scores[names[1]].estimate:.0%} of "
         "sums exactly, and nothing raised an error. Training was the same; only the prompt differed, so no loss "
         "curve could warn you.",
         (f"Other prompts fail less predictably: a tag it never saw still worked ({other:.0%}). You learn which "
          "ones work only by grading with the exact template you serve." if other > 0.5 else
          f"A tag it never saw failed too ({other:.0%}): grade with the exact template you serve.")],
        ["| asked | the first three problems → completions | exact |\n|---|---|---|\n" + rows])
