"""Lesson 21 — Learning from a verifier: reinforcement learning with GRPO. A fine-tune made from noisy
demonstrations samples groups of answers, a verifier rewards the right ones, and the model is trained on each
answer's reward relative to its group's; three ways such a run learns nothing without an error, each caught by a
claim.

The settings of notebooks/21_rl_with_a_verifier.ipynb. One module per section:

    start.py          the start: lesson 20's noisy fine-tune, and what its sampled groups earn
    adv_exercise.py   your turn: group-relative advantages, checked against the lab's
    grpo.py           GRPO: reward and exact match over the steps, over seeds where the profile has several, the
                      KL to the start and the clipped share; your advantages in the same run; what a KV cache saves
    failures.py       three silent failures: answers cut short, a prompt without the tag, a temperature too low

The model (n_layer, n_embd, n_head) is the base's; steps, lr and batch_size are the supervised fine-tune's.
"""

from dataclasses import dataclass

from labtools import chat
from labtools.chat import BaseRecipe, Template
from labtools.config import LabConfig, resolve
from labtools.tasks import Problem
from labtools.validate import check_range

TEMPLATE = Template()


@dataclass(frozen=True, kw_only=True)
class Settings(LabConfig):
    digits: int            # the task: sums of two numbers of this many digits
    base_steps: int        # the base model's pre-training steps (kept on disk once made)
    demos: int             # the noisy fine-tune's demonstrations
    noise: float           # chance that a demonstration's answer drops its carries
    test: int              # held-out problems every exact match is measured on
    seeds: int             # the whole recipe (noisy fine-tune, then GRPO) over this many seeds
    grpo_steps: int
    prompts: int           # problems per GRPO step
    group: int             # answers sampled to each problem: the group each reward is compared within
    temperature: float     # sampling temperature of the groups
    clip: float            # PPO's clip range ε: a ratio π/π_old is held within [1 − ε, 1 + ε]
    kl_weight: float       # the KL penalty's weight
    grpo_lr: float
    epochs: int            # updates made on each step's samples
    max_new: int | None = None  # characters sampled per answer (None: the answer's length and its end tag)
    probe_steps: int       # steps of section 3's short runs
    panel_steps: int       # steps of the panel's runs
    confidence: float = 0.95

    RANGES = {"DIGITS": (2, 3), "BASE_STEPS": (1, 100_000), "SEEDS": (1, 100), "GRPO_STEPS": (1, 100_000),
              "PROMPTS": (1, 1024), "GROUP": (2, 1024), "EPOCHS": (1, 16), "PROBE_STEPS": (1, 100_000),
              "PANEL_STEPS": (1, 100_000)}

    def __post_init__(self):
        super().__post_init__()
        check_range("NOISE", self.noise, 0.0, 1.0)
        check_range("TEMPERATURE", self.temperature, 0.0, 10.0, open_lo=True)
        check_range("CLIP", self.clip, 0.0, 1.0, open_lo=True)
        check_range("KL_WEIGHT", self.kl_weight, 0.0, 10.0)
        check_range("GRPO_LR", self.grpo_lr, 1e-9, 1.0)
        check_range("CONFIDENCE", self.confidence, 0.0, 1.0, open_lo=True, open_hi=True)
        check_range("TEST", self.test, 10, self.held_out, int)
        check_range("DEMOS", self.demos, 8, self.trainable // 2, int)
        if self.max_new is not None:  # an answer and its end tag must fit, or every answer is cut short
            check_range("MAX_NEW", self.max_new, self.answer_len, self.answer_len + 4, int)

    @property
    def held_out(self) -> int:
        return chat.held_out(self.digits)

    @property
    def trainable(self) -> int:
        return (10 ** self.digits) ** 2 - self.held_out

    @property
    def answer_len(self) -> int:
        """Characters of an answer: the sum's digits and the end tag."""
        return self.digits + 2

    @property
    def recipe(self) -> BaseRecipe:
        return BaseRecipe(digits=self.digits, n_layer=self.n_layer, n_embd=self.n_embd, n_head=self.n_head,
                          steps=self.base_steps)


@dataclass(frozen=True)
class Problems:
    demos: list[Problem]   # the noisy fine-tune's demonstrations
    pool: list[Problem]    # GRPO's prompts (none of them a demonstration)
    test: list[Problem]    # held out from everything


def problems(S: Settings, seed: int = 0) -> Problems:
    """Demonstrations from one half of the training problems (drawn by seed), GRPO's prompts from the other."""
    demos, other, test = chat.halves(S.recipe, seed)
    return Problems(demos[:S.demos], other, test[:S.test])


_COMMON = dict(n_layer=2, n_embd=48, n_head=4, block_size=16, batch_size=64, steps=100, lr=1e-3, digits=2,
               base_steps=500, demos=256, noise=0.5, prompts=16, group=8, temperature=1.0, clip=0.2, kl_weight=0.04,
               grpo_lr=1e-4, epochs=2, probe_steps=15, panel_steps=30)
PROFILES = {
    "smoke": Settings(profile="smoke", test=400, seeds=1, grpo_steps=60, **_COMMON),
    "cpu": Settings(profile="cpu", test=2000, seeds=5, grpo_steps=100, **_COMMON),
    "gpu": Settings(profile="gpu", test=2000, seeds=10, grpo_steps=200, **_COMMON),
}


def settings(profile: str = "auto", **overrides) -> Settings:
    """Validated settings for a profile; None-valued overrides keep the profile's value."""
    return resolve(PROFILES, profile, **overrides)
