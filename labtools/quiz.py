"""Questions on paper: a question with answer boxes, a Check button and a Show-solution button. Not to be confused
with labtools.exercises, which checks a function the learner writes against a reference.

    Question("Chinchilla-optimal 70B", "... how many days?", {"days": "days"}, answer_check({"days": 8.4}), "...")
"""

import html
import inspect
import re
from collections.abc import Callable, Mapping

import ipywidgets as W
from IPython.display import display

from labtools.controls import parse_number
from labtools.progress import has_frontend


def answer_check(expected: Mapping[str, float], rel: float = 0.01, unit: str = ""):
    """A Question's check: every answer within rel of its expected value (absolute rel below 1). labels: the
    boxes' names as the learner sees them, used to say which answers are not yet right."""
    def check(answers: dict, labels: Mapping[str, str] | None = None) -> tuple[bool, str]:
        wrong = [k for k, v in expected.items() if abs(answers.get(k, 0.0) - v) > rel * max(1.0, abs(v))]
        names = [(labels or {}).get(k, k) for k in wrong]
        return (not wrong, f"right (within {rel:.0%})" if not wrong else f"not yet: {', '.join(names)}{unit}")
    return check


class Question:
    """A question with answer boxes, a Check button and a Show-solution button.

    check(answers: dict[str, float]) -> (ok, message); solution is markdown. Without a frontend, show()
    prints the question and the solution inside a collapsed <details> block.
    """

    def __init__(self, title: str, question: str, fields: Mapping[str, str],
                 check: Callable[[dict], tuple[bool, str]], solution: str):
        self.title, self.question, self.check, self.solution = title, question, check, solution
        self.labels = dict(fields)
        self.inputs = {key: W.Text(description=name, placeholder="a number", style={"description_width": "initial"})
                       for key, name in fields.items()}
        self.result = W.HTML()
        self.revealed = W.Output()

    def answers(self) -> dict:
        """The typed answers as numbers; a ValueError naming the box for one that is not a number."""
        return {k: parse_number(w.value, self.labels[k]) for k, w in self.inputs.items()}

    def on_check(self, *_) -> tuple[bool, str]:
        try:
            answers = self.answers()
        except ValueError as e:
            ok, message = False, str(e)
        else:
            takes_labels = "labels" in inspect.signature(self.check).parameters
            ok, message = self.check(answers, labels=self.labels) if takes_labels else self.check(answers)
        color = "#1a7f37" if ok else "#cf222e"
        self.result.value = f"<span style='color:{color}'>{'✓' if ok else '✗'} {message}</span>"
        return ok, message

    def on_reveal(self, *_) -> None:
        from IPython.display import Markdown
        self.revealed.clear_output()
        self.revealed.append_display_data(Markdown(self.solution))

    def show(self) -> None:
        header = f"**{self.title}.** {self.question}"
        if not has_frontend():
            display({"text/markdown": f"{header}\n\n<details><summary>Solution</summary>\n\n{self.solution}\n\n"
                                      "</details>"}, raw=True)
            return
        check, reveal = W.Button(description="Check"), W.Button(description="Show solution")
        check.on_click(self.on_check)
        reveal.on_click(self.on_reveal)
        inputs = W.HBox(list(self.inputs.values()), layout=W.Layout(flex_flow="row wrap"))
        display(W.VBox([W.HTML(_md_to_html(header)), inputs,
                        W.HBox([check, reveal]), self.result, self.revealed]))


def _md_to_html(text: str) -> str:
    """Just enough markdown for a question line: **bold** and `code`."""
    text = html.escape(text)
    text = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", text)
    return re.sub(r"`(.+?)`", r"<code>\1</code>", text)
