"""A task a small model can learn on a CPU and be graded on exactly: generated addition problems, a verifier, and
exact match over held-out problems with a confidence interval (lessons 18 onwards).

    task = Addition(digits=2)
    train, test = task.split(test_share=0.2, seed=0)      # disjoint sets of problems
    corpus = task.corpus(train, test)                       # "12+34=46\n…" as characters, to pre-train on
    score = exact_match(model, corpus, test[:200])          # Graded: the share right, with Wilson's interval

Every problem has the same shape: both numbers written with `digits` digits, the sum with one more ("07+45=052"), so
that each digit sits at the same position in every problem. A model's completion counts only if it is the answer
followed by the end of the line, generated greedily (no sampling). The characters are the digits, "+", "=" and a line
break: 13 tokens.

    X, Y = task.examples(train)     # one problem per row; targets on the answer only (IGNORE elsewhere)
"""

import random
from dataclasses import dataclass

import torch

from labtools.data import Corpus
from labtools.evidence import Interval, share
from labtools.packing import IGNORE
from labtools.validate import check_range

VOCAB = "0123456789+=\n"
END = "\n"


@dataclass(frozen=True)
class Problem:
    prompt: str   # "12+34="
    answer: str   # "46"

    @property
    def line(self) -> str:
        return self.prompt + self.answer + END


@dataclass(frozen=True)
class Addition:
    """Every sum a + b of two numbers with at most `digits` digits."""
    digits: int = 2

    def __post_init__(self):
        check_range("digits", self.digits, 1, 4, int)

    def problems(self) -> list[Problem]:
        d, top = self.digits, 10 ** self.digits
        return [Problem(f"{a:0{d}d}+{b:0{d}d}=", f"{a + b:0{d + 1}d}") for a in range(top) for b in range(top)]

    def split(self, test_share: float = 0.2, seed: int = 0) -> tuple[list[Problem], list[Problem]]:
        """(train, test): the problems shuffled by seed, the last test_share held out."""
        check_range("test_share", test_share, 0.0, 1.0, open_lo=True, open_hi=True)
        problems = self.problems()
        random.Random(seed).shuffle(problems)
        cut = len(problems) - max(1, round(len(problems) * test_share))
        return problems[:cut], problems[cut:]

    @property
    def line_len(self) -> int:
        """Characters of a problem's line: two numbers, +, =, the sum and the end of the line."""
        return 2 * self.digits + 2 + self.digits + 1 + 1

    def examples(self, problems: list[Problem]) -> tuple[torch.Tensor, torch.Tensor]:
        """(X, Y), one problem per row: X the line but its last character, Y the next characters, IGNORE except
        where the answer and its end of line are predicted (the loss then counts the answer alone)."""
        stoi = {c: i for i, c in enumerate(VOCAB)}
        ids = torch.tensor([[stoi[c] for c in p.line] for p in problems], dtype=torch.long)
        X, Y = ids[:, :-1], ids[:, 1:].clone()
        Y[:, :len(problems[0].prompt) - 1] = IGNORE
        return X, Y

    @staticmethod
    def verify(problem: Problem, completion: str) -> bool:
        """Right only if the completion is exactly the answer, then the end of the line."""
        return completion.startswith(problem.answer + END)

    def corpus(self, train: list[Problem], test: list[Problem], seed: int = 0, repeats: int = 4) -> Corpus:
        """The problems as lines of characters: the training ones `repeats` times in shuffled orders, the held-out
        ones as validation text."""
        rng = random.Random(seed)
        lines = []
        for _ in range(repeats):
            order = list(train)
            rng.shuffle(order)
            lines += [p.line for p in order]
        stoi = {c: i for i, c in enumerate(VOCAB)}
        ids = lambda text: torch.tensor([stoi[c] for c in text], dtype=torch.long)[None]  # noqa: E731
        return Corpus(name=f"addition, {self.digits} digits", train_data=ids("".join(lines)),
                      val_data=ids("".join(p.line for p in test)), itos=list(VOCAB))


@dataclass(frozen=True)
class Graded:
    """Exact match over a set of problems: the share right with its interval, and each completion."""
    score: Interval
    completions: list[str]
    right: list[bool]


@torch.no_grad()
def complete(model, corpus: Corpus, prompts: list[str], max_new: int) -> list[str]:
    """Greedy completions of prompts (batched; prompts of one length at a time)."""
    was_training = model.training
    model.eval()
    out = [""] * len(prompts)
    by_len: dict[int, list[int]] = {}
    for i, p in enumerate(prompts):
        by_len.setdefault(len(p), []).append(i)
    device = next(model.parameters()).device
    for length, idx in by_len.items():
        x = torch.tensor([corpus.encode(prompts[i]) for i in idx], device=device)
        for _ in range(max_new):
            logits, _ = model(x[:, -model.config.block_size:])
            x = torch.cat([x, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
        for row, i in enumerate(idx):
            out[i] = corpus.decode(x[row, length:].tolist())
    model.train(was_training)
    return out


def exact_match(model, corpus: Corpus, problems: list[Problem], confidence: float = 0.95) -> Graded:
    """The share of problems the model answers exactly (greedy), with Wilson's interval."""
    if not problems:
        raise ValueError("exact_match needs at least one problem")
    longest = max(len(p.answer) for p in problems) + 1
    completions = complete(model, corpus, [p.prompt for p in problems], longest)
    right = [Addition.verify(p, c) for p, c in zip(problems, completions)]
    return Graded(share(sum(right), len(right), confidence), completions, right)
