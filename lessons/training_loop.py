"""Lesson 00 — the training loop: one step taken apart, then real training to a known floor.

Experiments for notebooks/00_training_loop.ipynb. Per-profile settings live in PROFILES.
"""

import math
import statistics
import time
from dataclasses import dataclass, replace

import numpy as np
import plotly.graph_objects as go
import torch

from labtools import data, plots
from labtools.claims import Ledger, approx, at_least, at_most
from labtools.device import pick_device
from labtools.model import GPT, GPTConfig
from labtools.optim import param_groups
from labtools.profiles import check_range, resolve
from labtools.progress import progress
from labtools.schedules import bind, warmup_cosine
from labtools.train import History, TrainConfig, train
from labtools.widgets import Panel, RunCache, slider


@dataclass(frozen=True)
class Settings:
    profile: str
    steps: int            # optimizer steps on the synthetic corpus
    text_steps: int       # optimizer steps on the real-text corpus
    batch_size: int
    block_size: int
    n_layer: int
    n_embd: int
    n_head: int
    lr: float             # peak learning rate (warmup then cosine to 10%)
    timing_repeats: int   # repeats of the one-step phase timing
    floor_gap_max: float  # the claim this profile can support: val loss - entropy rate <= this
    seed: int = 0

    def __post_init__(self):
        check_range("STEPS", self.steps, 10, 100_000, int)
        check_range("TEXT_STEPS", self.text_steps, 10, 100_000, int)
        check_range("BATCH_SIZE", self.batch_size, 1, 1024, int)
        check_range("BLOCK_SIZE", self.block_size, 8, 1024, int)
        check_range("N_LAYER", self.n_layer, 1, 24, int)
        check_range("N_EMBD", self.n_embd, 16, 2048, int)
        check_range("LR", self.lr, 1e-6, 1.0)
        check_range("SEED", self.seed, 0, 2**31 - 1, int)
        if self.n_embd % self.n_head:
            raise ValueError(f"N_EMBD must be a multiple of n_head={self.n_head}, got {self.n_embd}")


PROFILES = {
    "smoke": Settings("smoke", steps=500, text_steps=150, batch_size=16, block_size=64, n_layer=2, n_embd=64,
                      n_head=4, lr=1e-2, timing_repeats=5, floor_gap_max=0.3),
    "cpu": Settings("cpu", steps=800, text_steps=600, batch_size=16, block_size=128, n_layer=4, n_embd=128,
                    n_head=4, lr=3e-3, timing_repeats=10, floor_gap_max=0.15),
    "gpu": Settings("gpu", steps=2000, text_steps=3000, batch_size=64, block_size=256, n_layer=6, n_embd=384,
                    n_head=6, lr=1e-3, timing_repeats=20, floor_gap_max=0.05),
}


def settings(profile: str = "auto", **overrides) -> Settings:
    """Validated settings for a profile; None-valued overrides keep the profile's value."""
    return resolve(PROFILES, profile, **overrides)


def model_config(S: Settings, vocab_size: int, **changes) -> GPTConfig:
    cfg = GPTConfig(vocab_size=vocab_size, block_size=S.block_size, n_layer=S.n_layer, n_head=S.n_head,
                    n_embd=S.n_embd)
    return replace(cfg, **changes)


def build_model(S: Settings, vocab_size: int, **changes) -> GPT:
    torch.manual_seed(S.seed)
    return GPT(model_config(S, vocab_size, **changes)).to(pick_device())


def train_config(S: Settings, steps: int, desc: str) -> TrainConfig:
    schedule = bind(warmup_cosine, warmup=max(1, steps // 10), total=steps, min_ratio=0.1)
    return TrainConfig(steps=steps, batch_size=S.batch_size, block_size=S.block_size, lr=S.lr, lr_schedule=schedule,
                       eval_every=max(1, steps // 10), seed=S.seed, desc=desc)  # the claims read the final one


# --- one step, taken apart ---------------------------------------------------------------------

def time_phases(S: Settings, corpus: data.Corpus) -> dict[str, list[float]]:
    """Wall time (ms) of each phase of a training step, repeated S.timing_repeats times."""
    model = build_model(S, corpus.vocab_size)
    optimizer = torch.optim.AdamW(param_groups(model, 0.1), lr=S.lr, betas=(0.9, 0.95))
    g = torch.Generator().manual_seed(S.seed)
    dev = pick_device()
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    times: dict[str, list[float]] = {k: [] for k in ("batch", "forward", "backward", "clip", "step", "zero_grad")}

    def timed(name, fn):
        sync()
        t0 = time.perf_counter()
        out = fn()
        sync()
        times[name].append((time.perf_counter() - t0) * 1e3)
        return out

    for i in progress(range(S.timing_repeats + 2), desc="timing one step"):
        X, Y = timed("batch", lambda: corpus.batch("train", S.batch_size, S.block_size, g, dev))
        _, loss = timed("forward", lambda: model(X, Y))
        timed("backward", loss.backward)
        timed("clip", lambda: torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0))
        timed("step", optimizer.step)
        timed("zero_grad", lambda: optimizer.zero_grad(set_to_none=True))
        if i < 2:  # warm-up iterations (allocator, lazy init) are not counted
            for v in times.values():
                v.pop()
    return times


def phase_summary(times: dict[str, list[float]]) -> str:
    med = {k: statistics.median(v) for k, v in times.items()}
    f, b = med["forward"], med["backward"]
    share = 100 * (med["step"] + med["clip"]) / sum(med.values())
    return (f"Measured here: forward {f:.2f} ms, backward {b:.2f} ms — backward took **{b / f:.2f}×** the forward "
            "(the FLOP count says about 2×: per forward matmul, one matmul for the input gradient and one for the "
            f"weight gradient). Clipping and the optimizer step: {share:.0f}% of the step.")


def phase_figure(times: dict[str, list[float]]) -> go.Figure:
    names = list(times)
    med = [statistics.median(times[k]) for k in names]
    lo = [m - min(times[k]) for m, k in zip(med, names)]
    hi = [max(times[k]) - m for m, k in zip(med, names)]
    fig = go.Figure(go.Bar(x=names, y=med, marker_color=plots.color(0), texttemplate="%{y:.2f} ms",
                           error_y=dict(type="data", symmetric=False, array=hi, arrayminus=lo)))
    plots.style(fig, title="Where one training step spends its time (median, min–max)",
                      yaxis_title="ms", height=340)
    return fig


# --- training on the synthetic corpus and on real text -----------------------------------------

def synthetic_corpus(S: Settings) -> data.Corpus:
    return data.synthetic(vocab_size=16, order=2, branching=4, seed=S.seed)


def train_run(S: Settings, corpus: data.Corpus, steps: int, desc: str, model: GPT | None = None,
              **model_changes) -> tuple[GPT, History]:
    """Train `model` (default: a fresh one from S) with warmup + cosine to 10% of S.lr."""
    model = model if model is not None else build_model(S, corpus.vocab_size, **model_changes)
    return model, train(model, corpus, train_config(S, steps, desc))


def unigram_entropy(corpus: data.Corpus) -> float:
    """Entropy (nats) of the training split's token frequencies: the loss of a model that ignores context."""
    counts = np.bincount(corpus.train_data.ravel().numpy(), minlength=corpus.vocab_size)
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())


def sample(model: GPT, corpus: data.Corpus, prompt: str, n: int, seed: int = 0) -> str:
    g = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    idx = torch.tensor([corpus.encode(prompt)], device=next(model.parameters()).device)
    out = model.generate(idx, n, temperature=0.8, top_k=20, generator=g)
    return corpus.decode(out[0].tolist())


# --- the size panel ----------------------------------------------------------------------------

def size_panel(S: Settings, corpus: data.Corpus, baseline: History) -> tuple[Panel, RunCache]:
    """Sliders for depth, width and steps; each new setting trains once (cached) and is drawn
    against the baseline run and the entropy floor."""

    def run(n_layer, n_embd, steps):
        n_head = 4 if n_embd % 4 == 0 else 1
        changed = replace(S, n_layer=n_layer, n_embd=n_embd, n_head=n_head)
        return train_run(changed, corpus, steps, f"L={n_layer} C={n_embd}", n_head=n_head)[1]

    cache = RunCache(run)
    cache.store[cache.key(dict(n_layer=S.n_layer, n_embd=S.n_embd, steps=S.steps))] = baseline

    def draw(n_layer, n_embd, steps):
        h = cache(n_layer=n_layer, n_embd=n_embd, steps=steps)
        runs = {f"baseline L={S.n_layer} C={S.n_embd}, {S.steps} steps": baseline}
        if h is not baseline:
            runs[f"L={n_layer} C={n_embd}, {steps} steps"] = h
        return plots.loss_curves(runs, floor=corpus.entropy_rate, title="Depth, width and steps vs the floor")

    controls = {
        "n_layer": slider(S.n_layer, 1, 8, description="layers", continuous=False),
        "n_embd": slider(S.n_embd, 32, 256, 32, description="width", continuous=False),
        "steps": slider(S.steps, 50, 4 * S.steps, 50, description="steps", continuous=False),
    }
    return Panel(draw, controls, title="Train a model of your choice (each new setting trains once)"), cache


# --- findings: statistics computed once, claims and summaries built from them ------------------------

def first_step_findings(ledger: Ledger, vocab_size: int, *, init_loss: float, sigma: float, update_ratio: float) -> str:
    """The written-out step's numbers (measured in the notebook cell) against what theory predicts."""
    ln_v = math.log(vocab_size)
    predicted = ln_v + sigma**2 / 2
    ledger.add("init_ln_v", f"Loss at initialisation ≈ ln V = ln {vocab_size} (within 5%)", init_loss,
               approx(ln_v, rel=0.05), kind="measured")
    ledger.add("init_sigma", "…and more precisely ≈ ln V + σ²/2, σ = std of the initial logits (within 1%)",
               init_loss, approx(predicted, rel=0.01), kind="measured")
    ledger.add("adam_first_step", "Adam's first step moves every parameter by ≈ lr, so ‖Δθ‖ ≈ lr·√N (ratio within 5% "
               "of 1)", update_ratio, approx(1.0, abs=0.05), kind="measured")
    return (f"Loss at initialisation **{init_loss:.4f}** against ln V = {ln_v:.4f} and ln V + σ²/2 = {predicted:.4f} "
            f"(σ = {sigma:.4f}, the spread of the initial logits); Adam's first step moved the parameters by "
            f"{update_ratio:.4f} × lr·√N.")


def floor_findings(ledger: Ledger, S: Settings, corpus: data.Corpus, h: History) -> str:
    gap = h.final_val_loss - corpus.entropy_rate
    window = corpus.loss_floor(S.block_size)
    tokens_per_s = statistics.median(h.tokens_per_s)
    ledger.add("floor_gap", f"After {S.steps} steps, val loss is within {S.floor_gap_max} nats of the entropy rate "
               f"{corpus.entropy_rate:.4f}", gap, at_most(S.floor_gap_max), kind="measured")
    ledger.add("above_floor", f"No model beats the {S.block_size}-token window floor {window:.4f} "
               "(val loss − floor ≥ −0.02, the val estimate's sampling error)", h.final_val_loss - window,
               at_least(-0.02), kind="measured")
    ledger.note("floor_gap_nats", gap)
    ledger.note("window_floor_gap_nats", h.final_val_loss - window)
    ledger.note("synthetic_seconds", h.seconds)
    ledger.note("tokens_per_s_median", tokens_per_s)
    return (f"After {S.steps} steps ({h.seconds:.0f} s, median {tokens_per_s:,.0f} tokens/s) "
            f"the validation loss is **{h.final_val_loss:.4f}** nats/token: **{gap:.3f}** above the entropy rate "
            f"{corpus.entropy_rate:.4f}, and {h.final_val_loss - window:.3f} above the floor for {S.block_size}-token "
            f"windows ({window:.4f}), which counts the first tokens of each window that have fewer than two tokens of "
            "context.")


def text_findings(ledger: Ledger, h1: float, h: History) -> str:
    """h1: the corpus's unigram entropy (unigram_entropy), the loss of a model that ignores context."""
    ledger.add("uses_context", f"On text, val loss falls below the unigram entropy {h1:.3f} "
               "(the model uses context, not just character frequencies)", h.final_val_loss, at_most(h1),
               kind="measured")
    ledger.note("text_seconds", h.seconds)
    return (f"Validation loss on text after {len(h.step)} steps: **{h.final_val_loss:.3f}** nats/character, against "
            f"{h1:.3f} for a model that only knows character frequencies (the unigram entropy).")
