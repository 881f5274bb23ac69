"""Lesson 21, section 1: the start. Lesson 20's recipe for a weak model: the base fine-tuned on demonstrations of which
a share drop their carries. It samples a group of answers to each of a few problems; the verifier rewards each
answer 1 or 0; a group whose answers all scored alike says nothing about which answer was better."""

import copy
import time
from dataclasses import dataclass

import plotly.graph_objects as go
import torch

from labtools import chat, plots
from labtools.claims import Findings, Ledger, between
from labtools.device import pick_device
from labtools.posttrain import finetune
from labtools.tasks import Graded
from lessons.rl_verifier import TEMPLATE, Settings, problems

SHOWN = 8  # problems whose group is drawn


@dataclass(frozen=True)
class Start:
    model: chat.GPT
    graded: Graded           # exact match on the held-out sums, greedy
    shown: list              # SHOWN problems of GRPO's pool
    answers: list            # their groups' answers, SHOWN lists of S.group
    rewards: torch.Tensor    # (SHOWN, S.group): 1 where the verifier accepted the answer
    seconds: float

    @property
    def signal(self) -> float:
        """The share of the groups shown whose answers did not all score alike."""
        return (self.rewards.std(dim=1) > 0).float().mean().item()


def noisy_finetune(S: Settings, seed: int = 0) -> chat.GPT:
    """The base, fine-tuned on S.demos demonstrations drawn by seed, a share S.noise of them without carries."""
    base = chat.pretrained(S.recipe, pick_device())
    model = copy.deepcopy(base)
    demos = problems(S, seed).demos
    X, Y = TEMPLATE.examples(demos, chat.noisy_answers(demos, S.noise))
    finetune(model, X, Y, steps=S.steps, lr=S.lr, batch_size=S.batch_size, seed=seed,
             desc="fine-tuning on noisy demonstrations")
    return model


def run(S: Settings) -> Start:
    t0 = time.perf_counter()
    model = noisy_finetune(S, S.seed)
    seconds = time.perf_counter() - t0
    pre = problems(S)
    shown = pre.pool[:SHOWN]
    s = chat.sample(model, [TEMPLATE.prompt(p) for p in shown for _ in range(S.group)], S.max_new or S.answer_len,
                    S.temperature, torch.Generator().manual_seed(S.seed), end=TEMPLATE.end)
    ok = chat.right(TEMPLATE, [p for p in shown for _ in range(S.group)], s.text)
    rewards = torch.tensor(ok, dtype=torch.float32).view(SHOWN, S.group)
    answers = [s.text[i * S.group:(i + 1) * S.group] for i in range(SHOWN)]
    return Start(model, chat.grade(model, TEMPLATE, pre.test, S.confidence), shown, answers, rewards, seconds)


def figure(st: Start) -> go.Figure:
    z = st.rewards.tolist()
    text = [[a or "(nothing)" for a in row] for row in st.answers]
    fig = go.Figure(go.Heatmap(z=z, text=text, texttemplate="%{text}", colorscale=[[0, "#f4c7c3"], [1, "#b7e1cd"]],
                               zmin=0, zmax=1, showscale=False, xgap=2, ygap=2,
                               y=[TEMPLATE.prompt(p) for p in st.shown], x=[f"{i + 1}" for i in range(len(z[0]))],
                               hovertemplate="%{y} %{text}: reward %{z}<extra></extra>"))
    fig.update_yaxes(autorange="reversed", title_text="problem (prompt)")
    fig.update_xaxes(title_text="sampled answer")
    return plots.style(fig, "Each row is one group: green answers earn reward 1; an all-red or all-green row teaches "
                            "nothing", height=380)


def findings(ledger: Ledger, S: Settings, st: Start) -> Findings:
    score = st.graded.score
    ledger.add("start_weak_but_able", "the noisy fine-tune answers some held-out sums and misses others (share exact): "
               "a group can hold right and wrong answers", score, between(0.2, 0.9), kind="measured", detail=True)
    mixed = int(round(st.signal * len(st.shown)))
    return Findings(
        [f"It gets {score.estimate:.0%} of held-out sums right when it answers greedily; sampled, its answers to one "
         "problem differ, some right and some wrong.",
         f"Here {mixed} of {len(st.shown)} groups mix right and wrong answers. Only those say which answer to prefer; "
         "a group that scored alike has nothing to compare."],
        ["| start | |\n|---|---|\n"
         f"| demonstrations, of which a share drop their carries | {S.demos} (chance {S.noise:g}) |\n"
         f"| answers per group, temperature | {S.group}, {S.temperature:g} |\n"
         f"| fine-tuning time | {st.seconds:.1f} s |"])
