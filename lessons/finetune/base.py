"""Lesson 20, section 1: the base model. Pre-trained on addition written as plain text ("07+45=052" and a line
break), it completes held-out sums in that form; asked the same sums in the chat template ("07+45▶"), it answers
almost none: it has never seen the assistant tag or the end tag."""

from dataclasses import dataclass

import plotly.graph_objects as go

from labtools import chat, plots
from labtools.claims import Findings, Ledger, above, below
from labtools.device import pick_device
from labtools.tasks import Graded
from lessons.finetune import TEMPLATE, Settings, problems

SHOWN = 4  # completions shown


@dataclass(frozen=True)
class Base:
    model: chat.GPT
    plain: Graded      # the held-out sums asked as plain text ("07+45=")
    chat: Graded       # the same sums asked in the chat template ("07+45▶")
    prompts: list      # the first SHOWN problems, as each form asks them
    answers: list


def run(S: Settings) -> Base:
    model = chat.pretrained(S.recipe, pick_device())
    test = problems(S).test
    plain, asked = chat.plain_skill(model, test, S.confidence), chat.grade(model, TEMPLATE, test, S.confidence)
    return Base(model, plain, asked, [(p.prompt, TEMPLATE.prompt(p)) for p in test[:SHOWN]],
                [p.answer for p in test[:SHOWN]])


def figure(b: Base) -> go.Figure:
    return plots.shares({"asked as plain text (07+45=)": b.plain.score, "asked in the chat template (07+45▶)":
                         b.chat.score}, title="The base model adds, but only in the form it read",
                        yaxis=f"% of {b.plain.score.n} held-out sums answered exactly")


def _shown(text: str) -> str:
    return text.replace("\n", "↵") or "(nothing)"


def findings(ledger: Ledger, b: Base) -> Findings:
    ledger.add("base_adds", "the base model completes held-out sums written as plain text (share exact)",
               b.plain.score, above(0.6), kind="measured")
    ledger.add("base_no_chat", "asked the same sums in the chat template, it answers almost none exactly (share)",
               b.chat.score, below(0.05), kind="measured")
    rows = "\n".join(f"| `{plain}` | `{_shown(b.plain.completions[i])}` | `{asked}` | "
                     f"`{_shown(b.chat.completions[i])}` | `{b.answers[i]}` |"
                     for i, (plain, asked) in enumerate(b.prompts))
    return Findings(
        [f"It can add: {b.plain.score.estimate:.0%} of sums it never trained on come out right in the plain form.",
         f"It cannot answer: in the chat template it got {b.chat.score.estimate:.0%} right. The skill is there; the "
         "format is not."],
        ["| plain prompt | its completion | chat prompt | its completion | answer |\n|---|---|---|---|---|\n" + rows
         + "\n\n↵ is the line break that ends a plain line; a right chat answer ends with ■."],
        summary="What the base model wrote")
