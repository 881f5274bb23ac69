"""Lesson 20 — Fine-tuning: a chat format, then preferences. A small GPT that has read addition as plain text is
taught to answer in a chat template (supervised fine-tuning, the loss on the answer only), and a fine-tune made
from noisy demonstrations is then improved by preferences its own samples and a verifier provide (DPO).

The settings of notebooks/20_sft_and_dpo.ipynb. One module per section:

    base.py           the base model: it adds in plain text, and answers nothing in the chat template
    sft_exercise.py   your turn: the loss on the answer only, checked against cross-entropy's ignore_index
    sft.py            supervised fine-tuning: from the base or from scratch, masked or not, and a prompt that
                      lacks the assistant tag
    dpo_exercise.py   your turn: DPO's loss, checked against the formula on fixed log-probabilities
    dpo.py            preferences: a fine-tune on noisy demonstrations, pairs from its own samples, DPO by β

The model (n_layer, n_embd, n_head) is the base's; steps, lr and batch_size are fine-tuning's.
"""

import dataclasses
from dataclasses import dataclass

from labtools import chat
from labtools.chat import BaseRecipe, Template
from labtools.config import LabConfig, resolve
from labtools.tasks import Problem
from labtools.validate import check_range


@dataclass(frozen=True, kw_only=True)
class Settings(LabConfig):
    digits: int            # the task: sums of two numbers of this many digits
    base_steps: int        # the base model's pre-training steps on plain addition lines (kept on disk once made)
    demos: int             # demonstrations fine-tuning learns from
    test: int              # held-out problems every exact match is measured on
    seeds: int             # fine-tuning with and without the mask, compared over this many seeds (section 3)
    noise: float           # share of section 4's demonstrations whose answer drops every carry
    pool: int              # problems whose sampled answers make section 4's preference pairs
    answers: int           # answers sampled to each of them
    dpo_steps: int
    dpo_lr: float
    betas: tuple           # DPO's β: the lesson's run is the first, the others are the panel's
    confidence: float = 0.95

    RANGES = {"DIGITS": (2, 3), "BASE_STEPS": (1, 100_000), "SEEDS": (1, 100), "ANSWERS": (2, 64),
              "DPO_STEPS": (1, 100_000)}

    def __post_init__(self):
        super().__post_init__()
        check_range("NOISE", self.noise, 0.0, 1.0)
        check_range("DPO_LR", self.dpo_lr, 1e-9, 1.0)
        check_range("CONFIDENCE", self.confidence, 0.0, 1.0, open_lo=True, open_hi=True)
        if not self.betas or any(isinstance(b, bool) or not isinstance(b, (int, float)) or not 0 < b <= 100
                                 for b in self.betas):
            raise ValueError(f"BETAS must be one or more numbers in (0, 100], got {self.betas!r}")
        check_range("TEST", self.test, 10, self.held_out, int)  # the held-out share of the task's problems
        check_range("DEMOS", self.demos, 8, self.trainable // 2, int)  # from one half of the training problems
        check_range("POOL", self.pool, 8, self.trainable // 2, int)    # from the other half

    @property
    def held_out(self) -> int:
        return chat.held_out(self.digits)

    @property
    def trainable(self) -> int:
        """Problems the base read, that demonstrations and preference pairs are drawn from."""
        return (10 ** self.digits) ** 2 - self.held_out

    @property
    def recipe(self) -> BaseRecipe:
        return BaseRecipe(digits=self.digits, n_layer=self.n_layer, n_embd=self.n_embd, n_head=self.n_head,
                          steps=self.base_steps)

    @property
    def beta(self) -> float:
        return self.betas[0]


TEMPLATE = Template()  # the user's question, the assistant tag where plain text has "=", the answer, the end tag


@dataclass(frozen=True)
class Problems:
    demos: list[Problem]   # fine-tuning's demonstrations
    pool: list[Problem]    # preference pairs are sampled on these (none of them a demonstration)
    test: list[Problem]    # held out from everything


def problems(S: Settings, seed: int = 0) -> Problems:
    """The training problems (those the base read), shuffled: demonstrations from the first half, the pool from the
    second; the test problems are held out. seed draws another set of demonstrations (section 3's seeds)."""
    demos, other, test = chat.halves(S.recipe, seed)
    return Problems(demos[:S.demos], other[:S.pool], test[:S.test])


PROFILES = {
    "smoke": Settings(profile="smoke", n_layer=2, n_embd=48, n_head=4, block_size=16, batch_size=64, steps=100,
                      lr=1e-3, digits=2, base_steps=500, demos=256, test=400, seeds=1, noise=0.5, pool=1024,
                      answers=4, dpo_steps=60, dpo_lr=1e-4, betas=(1.0, 0.1)),
    "cpu": Settings(profile="cpu", n_layer=2, n_embd=48, n_head=4, block_size=16, batch_size=64, steps=100,
                    lr=1e-3, digits=2, base_steps=500, demos=256, test=2000, seeds=5, noise=0.5, pool=2048,
                    answers=4, dpo_steps=60, dpo_lr=1e-4, betas=(1.0, 0.1, 0.25, 0.5, 2.0)),
    "gpu": Settings(profile="gpu", n_layer=2, n_embd=48, n_head=4, block_size=16, batch_size=64, steps=100,
                    lr=1e-3, digits=2, base_steps=500, demos=256, test=2000, seeds=10, noise=0.5, pool=2048,
                    answers=4, dpo_steps=60, dpo_lr=1e-4, betas=(1.0, 0.1, 0.25, 0.5, 2.0)),
}


def settings(profile: str = "auto", **overrides) -> Settings:
    """Validated settings for a profile; None-valued overrides keep the profile's value."""
    return resolve(PROFILES, profile, **overrides)
