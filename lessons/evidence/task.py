"""Lesson 18, section 5: does a lower loss mean more right answers? A small GPT learns two-digit addition (the loss
on the answer digits only); at half its steps and at the end it answers held-out problems, greedily, graded exactly:
the share right with Wilson's interval, and the change between the two, paired problem by problem."""

import math
from dataclasses import dataclass

import plotly.graph_objects as go
import torch

from labtools import evidence, plots
from labtools.claims import Findings, Ledger, above, at_least
from labtools.evidence import Interval
from labtools.model import GPT, GPTConfig
from labtools.progress import progress
from labtools.tasks import VOCAB, Addition, Graded, exact_match
from lessons.evidence import Settings

TASK = Addition(digits=2)
SHAPE = dict(n_layer=2, n_head=4, n_embd=64)  # one model for every profile: the task, not the size, is the point
FEW = 50  # problems: how wide the interval of a small test set is


@dataclass(frozen=True)
class Checkpoint:
    step: int
    val_loss: float     # nats per answer character on held-out problems
    graded: Graded


@dataclass(frozen=True)
class TaskRun:
    checkpoints: list[Checkpoint]
    change: Interval    # late − early exact answers, paired problem by problem
    few: Interval       # the late checkpoint's share, as if graded on FEW problems

    @property
    def early(self) -> Checkpoint:
        return self.checkpoints[0]

    @property
    def late(self) -> Checkpoint:
        return self.checkpoints[-1]


def run(S: Settings) -> TaskRun:
    train, test = TASK.split(test_share=0.2, seed=S.seed)
    test = test[:S.task_problems]
    corpus = TASK.corpus(train[:1], test)  # the characters, and the held-out lines as validation text
    X, Y = TASK.examples(train)
    Xv, Yv = TASK.examples(test)
    torch.manual_seed(S.seed)
    model = GPT(GPTConfig(vocab_size=len(VOCAB), block_size=TASK.line_len, **SHAPE))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1)
    g = torch.Generator().manual_seed(S.seed)
    marks, out = {S.task_steps // 2, S.task_steps}, []
    for step in progress(range(1, S.task_steps + 1), desc="addition"):
        idx = torch.randint(len(X), (64,), generator=g)
        model(X[idx], Y[idx])[1].backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step in marks:
            with torch.no_grad():
                val = float(model(Xv, Yv)[1])
            out.append(Checkpoint(step, val, exact_match(model, corpus, test, S.confidence)))
    early, late = out[0].graded.right, out[-1].graded.right
    change = evidence.paired([float(r) for r in late], [float(r) for r in early], S.confidence, over="problems")
    k = round(out[-1].graded.score.estimate * FEW)
    return TaskRun(out, change, evidence.share(k, FEW, S.confidence))


def figure(t: TaskRun) -> go.Figure:
    fig = go.Figure()
    for i, c in enumerate(t.checkpoints):
        s = c.graded.score
        fig.add_trace(go.Bar(x=[f"step {c.step}: loss {c.val_loss:.2f} nats"], y=[100 * s.estimate],
                             error_y=dict(type="data", symmetric=False, array=[100 * (s.high - s.estimate)],
                                          arrayminus=[100 * (s.estimate - s.low)]),
                             marker_color=plots.color(i), name=f"step {c.step}", showlegend=False,
                             hovertemplate=f"{100 * s.estimate:.1f}% [{100 * s.low:.1f}, {100 * s.high:.1f}]"
                                           "<extra></extra>"))
    fig.update_yaxes(title_text=f"% of {t.late.graded.score.n} held-out problems answered exactly", range=[0, 100])
    return plots.style(fig, "Lower loss on the answers, more answers right: each bar with its 95% interval",
                       height=360)


def findings(ledger: Ledger, S: Settings, t: TaskRun) -> Findings:
    e, l = t.early.graded.score, t.late.graded.score
    ledger.add("task_improves", f"Between step {t.early.step} and step {t.late.step} the share of held-out problems "
               f"answered exactly rises: the change, paired problem by problem over {l.n} problems", t.change,
               above(0.0), kind="measured")
    ledger.add("few_problems_wide", f"Graded on {FEW} problems instead of {l.n}, the same share's interval would be "
               "wider (half-width ratio, computed from Wilson's interval)", t.few.half_width / l.half_width,
               at_least(1.5), kind="computed", detail=True)
    return Findings([
        f"Here, yes: as the loss on the answers fell, the share right rose from {100 * e.estimate:.0f}% to "
        f"**{100 * l.estimate:.0f}%** of held-out problems, a rise whose interval, paired problem by problem, "
        "clears zero.",
        f"How many problems decide how sure: on {FEW} problems the same score would be uncertain by "
        f"±**{100 * t.few.half_width:.0f}** points.",
    ], ["| checkpoint | right | 95% interval | validation loss, nats per answer character | bits |\n"
        "|---|---|---|---|---|\n" + "\n".join(
            f"| step {c.step} | {100 * c.graded.score.estimate:.1f}% | [{100 * c.graded.score.low:.1f}, "
            f"{100 * c.graded.score.high:.1f}] | {c.val_loss:.3f} | {c.val_loss / math.log(2):.2f} |"
            for c in t.checkpoints),
        evidence.table([("later − earlier, right answers, paired by problem", t.change)])])
