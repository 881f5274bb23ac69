"""Lesson 21, section 2: GRPO from the noisy fine-tune. Each step samples a group of answers to each of a few
problems, rewards them by the verifier, and raises the probability of answers that did better than their group,
clipped, with a KL penalty towards the start. Measured: reward and exact match, over seeds where the profile has
several; the KL to the start and the share of clipped ratios; what sampling costs with and without a KV cache. With
yours: the same run with your advantages. The panel runs a short GRPO at another group size, KL weight or
temperature."""

import copy
import dataclasses
import statistics
import time
from dataclasses import dataclass

import plotly.graph_objects as go
import torch

from labtools import chat, evidence, plots
from labtools.claims import Findings, Ledger, above, at_least, at_most, is_true
from labtools.evidence import Interval
from labtools.exercises import YOURS_NOT_WRITTEN, Outcome, YourRun, attempt, losses_history
from labtools.learner import bound_for, is_stub
from labtools.posttrain import GRPORun, grpo, group_advantages
from labtools.progress import progress
from labtools.tasks import Graded
from labtools.widgets import Panel
from lessons.rl_verifier import TEMPLATE, Settings, problems
from lessons.rl_verifier.start import Start, noisy_finetune

SMOOTH = 5          # steps a reward is averaged over in the figure
KL_BOUND = 0.5      # nats per answer character: the penalty keeps the policy near its start
CLIP_BOUND = 0.2    # share of answer characters whose ratio the clip held, at any step
TIME_ROUNDS = 5     # alternating rounds of sampling with and without the cache
YOURS_STEPS = 20    # steps over which your run's reward must follow the lab's
YOURS_TOL = 0.05    # mean |reward difference| over those steps (a sampled answer that flips moves it by 1/128)
SHOWN = 6           # held-out sums the start got wrong, shown before and after


def train(S: Settings, start: chat.GPT, seed: int = 0, advantages_fn=group_advantages, steps: int | None = None,
          desc: str = "GRPO", **changes) -> tuple[chat.GPT, GRPORun]:
    """A copy of `start` trained by GRPO on the pool's problems; changes override the settings' group, temperature,
    kl_weight, max_new or ask."""
    policy = copy.deepcopy(start)
    kw = dict(steps=steps or S.grpo_steps, prompts=S.prompts, group=S.group, temperature=S.temperature, clip=S.clip,
              kl_weight=S.kl_weight, lr=S.grpo_lr, epochs=S.epochs, max_new=S.max_new, seed=seed) | changes
    run = grpo(policy, TEMPLATE, problems(S, seed).pool, advantages_fn=advantages_fn, desc=desc, **kw)
    return policy, run


@dataclass(frozen=True)
class Learned:
    run: GRPORun
    before: Graded              # the start, exact match on the held-out sums
    after: Graded               # after GRPO
    gain: Interval              # after − before, seed 0, paired by problem
    seed_gains: list            # after − before, exact-match share, one per seed (seed 0 first)
    over_seeds: Interval | None  # the same, paired by seed (None with one seed)
    cache_ratio: float          # sampling a step's groups: seconds without the cache ÷ with it (median of rounds)
    cache_same: bool            # the same answers with and without the cache, from the same generator


def run(S: Settings, start: Start) -> Learned:
    policy, r = train(S, start.model, S.seed)
    test = problems(S).test
    after = chat.grade(policy, TEMPLATE, test, S.confidence)
    gain = evidence.paired([float(x) for x in after.right], [float(x) for x in start.graded.right], S.confidence,
                           over="problems")
    gains = [after.score.estimate - start.graded.score.estimate]
    for seed in progress(range(1, S.seeds), desc="the recipe, over seeds"):
        model = noisy_finetune(S, seed)
        before = chat.grade(model, TEMPLATE, test, S.confidence).score.estimate
        trained, _ = train(S, model, seed, desc=f"GRPO, seed {seed}")
        gains.append(chat.grade(trained, TEMPLATE, test, S.confidence).score.estimate - before)
    over = evidence.mean_interval(gains, S.confidence) if S.seeds >= 2 else None
    if over is not None:
        over = dataclasses.replace(over, what="paired difference", over="seeds")
    ratio, same = cache_timing(S, start.model)
    return Learned(r, start.graded, after, gain, gains, over, ratio, same)


def cache_timing(S: Settings, model: chat.GPT) -> tuple[float, bool]:
    """One step's groups sampled with and without the KV cache, in alternating rounds: the median time ratio
    (without ÷ with), and whether the answers were the same."""
    prompts = [TEMPLATE.prompt(p) for p in problems(S).pool[:S.prompts] for _ in range(S.group)]
    n = S.max_new or S.answer_len

    def once(cache: bool):
        t0 = time.perf_counter()
        s = chat.sample(model, prompts, n, S.temperature, torch.Generator().manual_seed(0), end=TEMPLATE.end,
                        cache=cache)
        return time.perf_counter() - t0, s.text

    once(True), once(False)  # warm both up
    ratios, same = [], True
    for i in range(TIME_ROUNDS):
        order = (True, False) if i % 2 == 0 else (False, True)
        t = {c: once(c) for c in order}
        ratios.append(t[False][0] / t[True][0])
        same &= t[False][1] == t[True][1]
    return statistics.median(ratios), same


def smoothed(values: list) -> list[float]:
    return [statistics.fmean(values[max(0, i - SMOOTH + 1):i + 1]) for i in range(len(values))]


def figure(L: Learned) -> go.Figure:
    fig = plots.subplots(1, 2, ("mean reward of each step's sampled answers", "held-out sums answered exactly"),
                         title="Rewarded for right answers, the model gives more of them")
    steps = list(range(1, len(L.run.reward) + 1))
    fig.add_trace(go.Scatter(x=steps, y=L.run.reward, mode="markers", marker=dict(color=plots.color(0), size=4),
                             name="each step", opacity=0.5), row=1, col=1)
    fig.add_trace(go.Scatter(x=steps, y=smoothed(L.run.reward), mode="lines", line=dict(color=plots.color(0)),
                             name=f"mean of {SMOOTH} steps"), row=1, col=1)
    for i, (name, s) in enumerate((("before (the noisy fine-tune)", L.before.score), ("after GRPO", L.after.score))):
        fig.add_trace(go.Bar(x=[name], y=[100 * s.estimate], marker_color=plots.color(i + 1), showlegend=False,
                             error_y=dict(type="data", symmetric=False, array=[100 * (s.high - s.estimate)],
                                          arrayminus=[100 * (s.estimate - s.low)]),
                             texttemplate=f"{100 * s.estimate:.0f}%", textposition="inside"), row=1, col=2)
    fig.update_xaxes(title_text="GRPO step", row=1, col=1)
    fig.update_yaxes(title_text="reward (share right)", range=[0, 1], row=1, col=1)
    fig.update_yaxes(title_text="% exact, 95% interval", range=[0, 100], row=1, col=2)
    return fig


def findings(ledger: Ledger, S: Settings, L: Learned) -> Findings:
    ledger.add("grpo_improves", "GRPO raises exact match over its start, the noisy fine-tune (difference, paired "
               "by problem)", L.gain, above(0.1), kind="measured")
    if L.over_seeds is not None:
        ledger.add("grpo_recipe", f"the whole recipe, over {L.over_seeds.n} seeds: GRPO adds at least 20 points of "
                   "exact match to the noisy fine-tune it starts from (interval of the gain)", L.over_seeds,
                   above(0.2), kind="measured")
    ledger.add("kl_bounded", f"the policy stays near its start: KL per answer character at most {KL_BOUND} nats "
               "(the last step)", L.run.kl[-1], at_most(KL_BOUND), kind="measured")
    ledger.add("clip_bounded", f"the clip held at most {CLIP_BOUND:.0%} of the ratios at any step (share)",
               max(L.run.clipped), at_most(CLIP_BOUND), kind="measured", detail=True)
    ledger.add("cache_same", "sampling with a KV cache gives the same answers as without", L.cache_same, is_true(),
               kind="counted", detail=True)
    ledger.add("cache_faster", "sampling a step's answers with the KV cache is faster than recomputing every position "
               "(time without ÷ with, median of alternating rounds)", L.cache_ratio, at_least(1.1), kind="measured")
    share = L.run.sampling_s / L.run.seconds
    said = [f"Yes: with the verifier as its only teacher, exact answers rose from {L.before.score.estimate:.0%} to "
            f"{L.after.score.estimate:.0%}."]
    if L.over_seeds is not None:
        o = L.over_seeds
        said.append(f"It is the recipe, not luck: over {o.n} seeds GRPO added {100 * o.estimate:.0f} points on "
                    "average, an interval clear of zero." if o.low > 0 else
                    f"Over {o.n} seeds the gain's interval reaches zero: not settled.")
    else:
        said.append("One seed shows this model improved; whether the recipe always does needs seeds (`SEEDS`, or the "
                    "`cpu` profile).")
    test = problems(S).test
    wrong_before = [i for i, ok in enumerate(L.before.right) if not ok][:SHOWN]
    samples = "\n".join(f"| `{TEMPLATE.prompt(test[i])}` | `{L.before.completions[i] or '(nothing)'}` | "
                        f"`{L.after.completions[i] or '(nothing)'}` | `{test[i].answer}■` |" for i in wrong_before)
    return Findings(said, [
        "| held-out sum the start got wrong | before | after GRPO | right answer |\n|---|---|---|---|\n" + samples,
        "| GRPO | |\n|---|---|\n"
        f"| steps × problems × answers per problem | {S.grpo_steps} × {S.prompts} × {S.group} |\n"
        f"| KL weight, clip range, learning rate | {S.kl_weight:g}, {S.clip:g}, {S.grpo_lr:g} |\n"
        f"| KL to the start at the end, nats per character | {L.run.kl[-1]:.3f} |\n"
        f"| the largest share of ratios the clip held, in one step | {max(L.run.clipped):.1%} |\n"
        f"| time: whole run, of which sampling | {L.run.seconds:.1f} s, {share:.0%} |\n"
        f"| sampling a step without the KV cache ÷ with it | {L.cache_ratio:.1f}× |",
        evidence.table([("after − before, seed 0, paired by problem", L.gain)]
                       + ([("after − before, paired by seed", L.over_seeds)] if L.over_seeds else []),
                       label="exact-match share")])


def with_yours(S: Settings, start: Start, L: Learned, fn) -> YourRun:
    """The lesson's GRPO run again with your advantages: the same problems, samples and seed. Its reward must follow
    the lab's over the first YOURS_STEPS steps (mean difference within YOURS_TOL); the model it made is graded."""
    lab = losses_history(L.run.reward, L.run.seconds)
    if is_stub(fn):
        return YourRun(Outcome("not written", YOURS_NOT_WRITTEN), lab)
    tried = attempt(lambda f: train(S, start.model, S.seed, advantages_fn=f, desc="GRPO with your advantages"), fn,
                    seconds=bound_for(L.run.seconds), whose=fn)
    if not tried.returned:
        return YourRun(Outcome(tried.outcome.status, f"the run with your advantages stopped: "
                                                     f"{tried.outcome.message}"), lab)
    policy, r = tried.value
    yours = losses_history(r.reward, r.seconds)
    gap = statistics.fmean(abs(a - b) for a, b in zip(r.reward[:YOURS_STEPS], L.run.reward[:YOURS_STEPS]))
    if not gap <= YOURS_TOL:
        return YourRun(Outcome("fail", f"with your advantages the reward parts from the lab's: a mean difference of "
                                       f"{gap:.2f} over the first {YOURS_STEPS} steps (allowed {YOURS_TOL})", gap),
                       lab, yours, gap)
    score = chat.grade(policy, TEMPLATE, problems(S).test, S.confidence).score
    return YourRun(Outcome("pass", f"your advantages trained the model for {len(r.reward)} steps, its reward within "
                                   f"{gap:.3f} of the lab's over the first {YOURS_STEPS}; it answers "
                                   f"{score.estimate:.0%} of held-out sums exactly (the lab's run: "
                                   f"{L.after.score.estimate:.0%})", gap), lab, yours, gap)


def panel(S: Settings, start: Start, L: Learned) -> Panel:
    from ipywidgets import SelectionSlider
    lab = L.run.reward[:S.panel_steps]

    def draw(group, kl_weight, temperature):
        if (group, kl_weight, temperature) == (S.group, S.kl_weight, S.temperature):
            r = L.run  # the lesson's own run: its first steps are what this run would make, step for step
        else:
            _, r = train(S, start.model, S.seed, steps=S.panel_steps, group=group, kl_weight=kl_weight,
                         temperature=temperature, desc="GRPO, the panel's settings")
        reward, signal = r.reward[:S.panel_steps], statistics.fmean(r.signal[:S.panel_steps])
        fig = go.Figure([go.Scatter(x=list(range(1, len(lab) + 1)), y=smoothed(lab), mode="lines",
                                    name="the lesson's settings", line=dict(color=plots.color(0))),
                         go.Scatter(x=list(range(1, len(reward) + 1)), y=smoothed(reward), mode="lines",
                                    name="the panel's settings", line=dict(color=plots.color(1), dash="dash",
                                                                            width=3))])
        fig.update_yaxes(range=[0, 1])
        return plots.style(fig, f"Over these {len(reward)} steps {signal:.0%} of the groups had a signal; KL to the "
                                f"start at the end: {r.kl[len(reward) - 1]:.2f} nats per character", "GRPO step",
                           f"reward, mean of {SMOOTH} steps", height=340)

    def slider(options, value, description):  # the lesson's own value is always one of the choices
        return SelectionSlider(options=sorted({*options, value}), value=value, description=description)

    return Panel(draw, {"group": slider([2, 4, 8, 16], S.group, "answers per group"),
                        "kl_weight": slider([0.0, 0.04, 0.2, 1.0], S.kl_weight, "KL weight"),
                        "temperature": slider([0.2, 0.5, 1.0, 1.5], S.temperature, "temperature")},
                 title="A short run at other settings, beside the lesson's", cancellable=True)
