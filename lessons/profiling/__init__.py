"""Lesson 13 — where a step's time goes: a profiler trace, the roofline of this machine, attention's memory, and
torch.compile.

The settings of notebooks/13_profiling.ipynb. One module per section:

    trace.py               a training step traced with torch.profiler: time and FLOPs by kind of work
    roofline.py            this machine's two roofs, every op of the step placed by its arithmetic intensity
    intensity_exercise.py  your turn: a matrix product's arithmetic intensity
    attention.py           written-out attention against the fused kernel: saved bytes and time vs T
    compiled.py            torch.compile on an element-wise chain: kernels fused, time saved, compile time paid
"""

from dataclasses import dataclass

import torch

from labtools.config import LabConfig, build_gpt, resolve
from labtools.data import text
from labtools.device import pick_device
from labtools.memory import check_fits
from labtools.validate import check_range


@dataclass(frozen=True, kw_only=True)
class Settings(LabConfig):
    trace_steps: int        # training steps under the profiler (after one warm-up step)
    matmul_sizes: tuple     # n of the n×n products that measure the compute roof
    stream_elems: int       # elements of each fp32 array of the bandwidth measurement (far beyond the caches)
    attn_lengths: tuple     # sequence lengths T of the attention comparison
    attn_heads: int         # heads × head size of the attention comparison, batch 1
    attn_head_dim: int
    compile: bool           # run section 4 (torch.compile); False skips it
    chain_elems: int        # elements of the compiled element-wise chain's tensors
    compile_rounds: int     # alternating rounds of eager and compiled calls
    compile_calls: int      # calls per round

    RANGES = {"TRACE_STEPS": (1, 50), "COMPILE_ROUNDS": (1, 50)}

    def __post_init__(self):
        super().__post_init__()
        if self.n_embd % self.n_head:
            raise ValueError(f"N_EMBD ({self.n_embd}) must be a multiple of N_HEAD ({self.n_head})")
        lengths = self.attn_lengths
        if len(lengths) < 3 or list(lengths) != sorted(set(lengths)) or min(lengths) < 16:
            raise ValueError(f"ATTN_LENGTHS must be at least three increasing lengths ≥ 16, got {lengths!r}")
        check_range("MAX_LENGTH", max(lengths), 16, 1 << 14, int)
        if not isinstance(self.compile, bool):
            raise ValueError(f"COMPILE must be True or False, got {self.compile!r}")


PROFILES = {
    "smoke": Settings(profile="smoke", n_layer=2, n_embd=128, n_head=4, block_size=128, batch_size=8, trace_steps=2,
                      matmul_sizes=(512, 1024), stream_elems=1 << 24, attn_lengths=(128, 256, 512, 1024),
                      attn_heads=4, attn_head_dim=32, compile=True, chain_elems=1 << 21, compile_rounds=3,
                      compile_calls=10),
    "cpu": Settings(profile="cpu", n_layer=4, n_embd=256, n_head=8, block_size=256, batch_size=8, trace_steps=5,
                    matmul_sizes=(512, 1024, 2048), stream_elems=1 << 25, attn_lengths=(128, 256, 512, 1024, 2048),
                    attn_heads=4, attn_head_dim=64, compile=True, chain_elems=1 << 23, compile_rounds=5,
                    compile_calls=20),
    "gpu": Settings(profile="gpu", n_layer=12, n_embd=768, n_head=12, block_size=1024, batch_size=8, trace_steps=5,
                    matmul_sizes=(2048, 4096, 8192), stream_elems=1 << 28,
                    attn_lengths=(512, 1024, 2048, 4096, 8192), attn_heads=12, attn_head_dim=64, compile=True,
                    chain_elems=1 << 26, compile_rounds=5, compile_calls=50),
}


def settings(profile: str = "auto", max_length: int | None = None, **overrides) -> Settings:
    """Validated settings for a profile; None-valued overrides keep the profile's value. max_length: the longest
    attention length (the profile's lengths up to it, each doubling from the shortest)."""
    S = resolve(PROFILES, profile, **overrides)
    if max_length is not None:
        check_range("MAX_LENGTH", max_length, 4 * S.attn_lengths[0], 1 << 14, int)
        lengths, t = [], S.attn_lengths[0]
        while t <= max_length:
            lengths.append(t)
            t *= 2
        S = resolve(PROFILES, profile, **overrides, attn_lengths=tuple(lengths))
    T = max(S.attn_lengths)
    check_fits("MAX_LENGTH", T, written_out_peak(S.attn_heads, T), pick_device(),
               "the written-out attention's s × s scores, weights and their gradients")
    return S


def written_out_peak(heads: int, T: int) -> int:
    """Bytes the written-out attention holds at its peak, about: four fp32 s × s tensors per head (the scores, the
    weights it saves, and in backward their two gradients) and the boolean mask."""
    return 16 * heads * T * T + T * T


def corpus():
    return text()


def gpt(S: Settings):
    return build_gpt(S, corpus().vocab_size, device=pick_device())


def batch(S: Settings) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(S.seed)
    return corpus().batch("train", S.batch_size, S.block_size, g, pick_device())
