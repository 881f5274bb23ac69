"""Lesson 21, section 3: three ways a GRPO run learns nothing and raises no error, each run for a few steps from the
same start: answers cut short (max_new one character short of the answer and its end tag), prompts without the
assistant tag, and a temperature so low that a group's answers all come out alike. The ledger's claims on the
lesson's own run catch each one."""

import statistics
from dataclasses import dataclass

import plotly.graph_objects as go

from labtools import chat, plots
from labtools.claims import Findings, Ledger, at_least, at_most
from labtools.posttrain import GRPORun
from labtools.tasks import Graded
from lessons.rl_verifier import TEMPLATE, Settings, problems
from lessons.rl_verifier.grpo import Learned, smoothed, train
from lessons.rl_verifier.start import Start

LOW_TEMPERATURE = 0.1
SIGNAL_FLOOR = 0.5    # the lesson's run: at least half its groups mixed right and wrong answers, on average
TRUNCATED_MAX = 0.05  # at most this share of its answers never reached the end tag
FIRST_REWARD = 0.2    # its first steps earned at least this reward: the prompts are in the form it was tuned on
FIRST = 5             # steps the first reward is averaged over


@dataclass(frozen=True)
class Probe:
    name: str
    run: GRPORun
    graded: Graded  # exact match on the held-out sums after the run

    @property
    def signal(self) -> float:
        return statistics.fmean(self.run.signal)

    @property
    def truncated(self) -> float:
        return statistics.fmean(self.run.truncated)

    @property
    def first_reward(self) -> float:
        return statistics.fmean(self.run.reward[:FIRST])


def probes(S: Settings, start: Start) -> list[Probe]:
    """The lesson's settings, then each failure, every run S.probe_steps steps from the same start."""
    n = S.max_new or S.answer_len
    kinds = {"the lesson's settings": {},
             "answers cut one character short": dict(max_new=n - 1),
             "prompts without the assistant tag": dict(ask=lambda p: p.prompt[:-1]),
             f"temperature {LOW_TEMPERATURE}": dict(temperature=LOW_TEMPERATURE)}
    out, test = [], problems(S).test
    for name, kw in kinds.items():
        model, run = train(S, start.model, S.seed, steps=S.probe_steps, desc=name, **kw)
        out.append(Probe(name, run, chat.grade(model, TEMPLATE, test, S.confidence)))
    return out


def figure(ps: list[Probe]) -> go.Figure:
    fig = plots.subplots(1, 2, ("reward, each step", "groups that mixed right and wrong answers"),
                         title="Cut short or untagged, every reward is 0 and nothing is learned; too cold, few "
                               "groups differ")
    for i, p in enumerate(ps):
        steps = list(range(1, len(p.run.reward) + 1))
        fig.add_trace(go.Scatter(x=steps, y=smoothed(p.run.reward), mode="lines", name=p.name, legendgroup=p.name,
                                 line=dict(color=plots.color(i))), row=1, col=1)
        fig.add_trace(go.Scatter(x=steps, y=smoothed(p.run.signal), mode="lines", name=p.name, legendgroup=p.name,
                                 showlegend=False, line=dict(color=plots.color(i))), row=1, col=2)
    fig.update_xaxes(title_text="GRPO step")
    fig.update_yaxes(title_text="reward, mean of a few steps", range=[0, 1], row=1, col=1)
    fig.update_yaxes(title_text="share of groups", range=[0, 1], row=1, col=2)
    return fig


def guards(ledger: Ledger, L: Learned) -> None:
    """The claims on the lesson's own run that each failure would break."""
    r = L.run
    ledger.add("signal", f"over the lesson's {len(r.signal)} steps, at least {SIGNAL_FLOOR:.0%} of its groups mixed "
               "right and wrong answers, on average (share): rewards that are all alike give no signal",
               statistics.fmean(r.signal),
               at_least(SIGNAL_FLOOR), kind="measured")
    ledger.add("not_truncated", f"at most {TRUNCATED_MAX:.0%} of the lesson's answers were cut off before their end "
               "tag (share)", statistics.fmean(r.truncated), at_most(TRUNCATED_MAX), kind="measured")
    ledger.add("first_reward", f"the lesson's first {FIRST} steps earned a mean reward of at least {FIRST_REWARD}: its "
               "prompts are in the form the model was fine-tuned on", statistics.fmean(r.reward[:FIRST]),
               at_least(FIRST_REWARD), kind="measured")


def findings(ledger: Ledger, L: Learned, ps: list[Probe]) -> Findings:
    guards(ledger, L)
    rows = "\n".join(f"| {p.name} | {p.first_reward:.2f} | {p.signal:.0%} | {p.truncated:.0%} | "
                     f"{p.graded.score.estimate:.1%} |" for p in ps)
    own, cut, untagged, cold = ps
    fewer = cold.graded.score.estimate < own.graded.score.estimate
    return Findings(
        [("Cut short or asked without the tag, every answer scored 0: every group scored alike, so every advantage "
          "was 0 and nothing moved." if cut.first_reward == untagged.first_reward == 0 else
          "Cut short or asked without the tag, almost every answer scored 0: nearly every group scored alike, and "
          "almost nothing moved."),
         f"Too cold, most groups came out alike: only {cold.signal:.0%} had a signal. Its answers were nearly greedy, "
         "so its reward started high" + (", yet after the same steps it answered fewer held-out sums than the "
                                          "lesson's run." if fewer else
                                          ", and here it learned as much as the lesson's run: a cold run is slow, "
                                          "not always."),
         "Three claims in the ledger below check the lesson's own run for each failure: the share of groups with a "
         "signal, the share of answers cut off, and the first steps' reward."],
        [f"| run ({len(own.run.reward)} steps) | reward, first {FIRST} steps | groups with a signal | answers cut off "
         "| held-out sums exact after |\n|---|---|---|---|---|\n" + rows])
