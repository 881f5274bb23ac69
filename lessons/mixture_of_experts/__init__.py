"""Lesson 15 — mixture of experts: routing, balance, expert parallelism on real ranks, FLOPs and memory at scale.

The settings of notebooks/15_mixture_of_experts.ipynb. One module per section:

    router_exercise.py  your turn: top-k routing with a capacity
    training.py         an MoE GPT beside dense GPTs of the same active and the same total parameters; balance
    experts.py          expert parallelism on real ranks: all-to-all, parity with one process, bytes
    scale.py            Mixtral 8x7B and DeepSeek-V3: parameters total and active, memory per GPU
    ranks.py            what runs inside the ranks (torch and core labtools only)
"""

from dataclasses import dataclass

from labtools.config import LabConfig, resolve
from labtools.validate import check_range


@dataclass(frozen=True, kw_only=True)
class Settings(LabConfig):
    n_experts: int          # E, experts per MoE layer
    top_k: int              # k, experts per token
    capacity_factor: float  # slots per expert = ⌈factor · tokens · k / E⌉
    balance_weight: float   # α, the balancing loss's weight in the training loss
    ep: int                 # ranks the experts are spread over
    dp: int                 # data-parallel replicas of that expert-parallel group (dp × ep ranks in all)
    ep_tokens: int          # tokens per rank in the expert-parallel check
    beats_margin: float | None = None  # what this profile's runs can show: the MoE ends at least this many nats below
                                       # the dense model of its active size; None: one short run cannot say
    seeds: int = 1          # seeds the MoE and the dense model of its active size are compared over (1: this run)

    RANGES = {"N_EXPERTS": (2, 64), "CAPACITY_FACTOR": (0.1, 16.0), "BALANCE_WEIGHT": (0.0, 1.0),
              "EP_TOKENS": (8, 1 << 16), "DP": (1, 4), "SEEDS": (1, 100)}

    def __post_init__(self):
        super().__post_init__()
        check_range("TOP_K", self.top_k, 1, self.n_experts, int)      # k of the E experts
        check_range("EP", self.ep, 2, min(8 // self.dp, self.n_experts), int)  # an expert per rank, ≤ 8 ranks
        if self.n_experts % self.ep:
            raise ValueError(f"N_EXPERTS ({self.n_experts}) must divide evenly over EP = {self.ep} ranks")


PROFILES = {
    "smoke": Settings(profile="smoke", n_layer=2, n_embd=64, n_head=4, block_size=32, batch_size=16, steps=150,
                      lr=3e-3, n_experts=4, top_k=2, capacity_factor=1.25, balance_weight=0.1, ep=2,
                      dp=2, ep_tokens=64),
    "cpu": Settings(profile="cpu", n_layer=4, n_embd=96, n_head=4, block_size=64, batch_size=16, steps=400,
                    lr=3e-3, n_experts=8, top_k=2, capacity_factor=1.25, balance_weight=0.1, ep=2, dp=2,
                    ep_tokens=256, seeds=3),
    "gpu": Settings(profile="gpu", n_layer=6, n_embd=384, n_head=6, block_size=256, batch_size=32, steps=1000,
                    lr=1e-3, n_experts=8, top_k=2, capacity_factor=1.25, balance_weight=0.01, ep=2, dp=1,
                    ep_tokens=4096),
}


def settings(profile: str = "auto", **overrides) -> Settings:
    """Validated settings for a profile; None-valued overrides keep the profile's value."""
    return resolve(PROFILES, profile, **overrides)
