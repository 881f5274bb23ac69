"""Lesson 05 — activation checkpointing: memory against depth, the step's peak, and what recomputation costs.

The settings of notebooks/05_activation_checkpointing.ipynb and the measurement its sections share:

    memory.py      saved activations against depth, sequence length and batch, per policy
    peak.py        the step's peak: what recomputation needs at once
    cost.py        the price: recomputed FLOPs and time
    playground.py  the panel: a shape and a policy → memory
"""

import math
from dataclasses import dataclass

import torch

from labtools.budget import activation_bytes
from labtools.config import LabConfig, build_gpt, resolve
from labtools.device import pick_device
from labtools.memory import saved_activation_bytes
from labtools.model import GPT

VOCAB = 96  # the size of the stdlib-text vocabulary; tokens here are random, memory does not depend on them


MiB = 2**20


@dataclass(frozen=True, kw_only=True)
class Settings(LabConfig):
    seq_len: int          # T for the depth sweep
    layers: tuple         # depths of the sweep
    seq_lens: tuple       # T sweep (at depth 8)
    batch_sizes: tuple    # B sweep (at depth 8)
    time_layers: int      # the timing config (its own shape: at tiny shapes Python overhead, not
    time_embd: int        # recomputation, dominates the time)
    time_seq: int
    time_batch: int
    time_rounds: int      # interleaved timing rounds (median and spread over rounds)

    RANGES = {"N_EMBD": (8, 8192), "SEQ_LEN": (8, 8192), "BATCH_SIZE": (1, 1024), "TIME_LAYERS": (1, 128),
              "TIME_ROUNDS": (2, 1000)}

    def __post_init__(self):
        super().__post_init__()
        if self.time_embd % self.n_head:
            raise ValueError(f"time_embd must be a multiple of n_head={self.n_head}, got {self.time_embd}")
        if self.n_embd % self.n_head:
            raise ValueError(f"N_EMBD must be a multiple of n_head={self.n_head}, got {self.n_embd}")
        if 8 not in self.layers:
            raise ValueError("the depth sweep must include 8 layers (the lesson's reference depth)")


PROFILES = {
    "smoke": Settings(profile="smoke", n_embd=64, n_head=4, seq_len=64, batch_size=4, layers=(1, 2, 4, 8),
                      seq_lens=(16, 32, 64), batch_sizes=(1, 2, 4), time_layers=4, time_embd=128, time_seq=128,
                      time_batch=8, time_rounds=3),
    "cpu": Settings(profile="cpu", n_embd=128, n_head=4, seq_len=128, batch_size=8, layers=(1, 2, 4, 8, 12, 16),
                    seq_lens=(32, 64, 128, 256), batch_sizes=(2, 4, 8, 16), time_layers=8, time_embd=128, time_seq=128,
                    time_batch=8, time_rounds=7),
    "gpu": Settings(profile="gpu", n_embd=768, n_head=12, seq_len=1024, batch_size=8, layers=(1, 2, 4, 8, 12, 16, 24),
                    seq_lens=(128, 256, 512, 1024), batch_sizes=(2, 4, 8, 16), time_layers=12, time_embd=768,
                    time_seq=1024, time_batch=8, time_rounds=10),
}


def settings(profile: str = "auto", **overrides) -> Settings:
    """Validated settings for a profile; None-valued overrides keep the profile's value."""
    return resolve(PROFILES, profile, **overrides)


def policies(n_layer: int) -> list[tuple[str, int]]:
    """(policy, checkpoint_every) pairs compared: every_k uses √L segments."""
    return [("none", 1), ("attn", 1), ("mlp", 1), ("block", 1), ("every_k", max(1, round(math.sqrt(n_layer))))]


def label(policy: str, k: int, n_layer: int) -> str:
    if policy != "every_k":
        return policy
    return f"every {k} blocks" + (f" (√L, L = {n_layer})" if k == max(1, round(math.sqrt(n_layer))) else "")


def build(S: Settings, n_layer: int, seq_len: int, policy: str = "none", k: int = 1, n_embd: int | None = None) -> GPT:
    shape = LabConfig(n_layer=n_layer, n_embd=n_embd or S.n_embd, n_head=S.n_head, block_size=seq_len, seed=S.seed)
    return build_gpt(shape, VOCAB, device=pick_device(), checkpoint=policy, checkpoint_every=k)


def batch(S: Settings, seq_len: int, batch_size: int):
    g = torch.Generator().manual_seed(S.seed)
    X, Y = (torch.randint(VOCAB, (batch_size, seq_len), generator=g) for _ in range(2))
    return X.to(pick_device()), Y.to(pick_device())


def measure(S: Settings, n_layer: int, seq_len: int, batch_size: int, policy: str, k: int = 1) -> dict:
    """Measured saved-activation bytes of one forward pass, and the prediction for the same shape."""
    model = build(S, n_layer, seq_len, policy, k)
    X, Y = batch(S, seq_len, batch_size)
    measured = saved_activation_bytes(model, X, Y)
    predicted = activation_bytes(n_layer, S.n_embd, S.n_head, VOCAB, seq_len, batch_size, policy=policy,
                                 checkpoint_every=k)
    return {"measured": measured, "predicted": predicted["total"], "predicted_blocks": predicted["blocks"],
            "predicted_outside": predicted["outside"]}
