"""Lesson 01 — AdamW vs Adam + L2: the optimizers written from scratch, measured on a transformer.

Experiments for notebooks/01_adamw_vs_adam_l2.ipynb. Per-profile settings live in PROFILES.
"""

import math
from dataclasses import dataclass

import numpy as np
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from labtools import data, plots
from labtools.claims import Ledger, approx, at_least, at_most
from labtools.device import pick_device
from labtools.model import GPT, GPTConfig
from labtools.optim import SGD, Adafactor, Adam, AdamL2, AdamW, Lion, max_divergence, state_bytes
from labtools.profiles import check_range, resolve
from labtools.progress import progress
from labtools.schedules import bind, warmup_cosine
from labtools.train import History, StepInfo, TrainConfig, train
from labtools.widgets import Panel

OPTIMIZERS = {"AdamL2": AdamL2, "AdamW": AdamW}


@dataclass(frozen=True)
class Settings:
    profile: str
    toy_n: int                # weights per noise level in the toy
    toy_steps: int
    n_layer: int              # the GPT used for every training experiment
    n_embd: int
    block_size: int
    batch_size: int
    text_chars: int           # size of the stdlib-text corpus (small, so the model can overfit it)
    compare_steps: int        # AdamL2 vs AdamW at the same lr and λ
    compare_lr: float
    weight_decay: float       # the λ of that comparison
    grid_lrs: tuple           # the landscape's learning rates ...
    grid_wds: tuple           # ... and weight decays
    grid_steps: int
    beta2_steps: int          # β2 = 0.999 vs 0.95
    beta2_lr: float
    surge_factor: float       # gradient scale multiplied by this from half-way through the surge run
    seed: int = 0

    def __post_init__(self):
        check_range("TOY_STEPS", self.toy_steps, 50, 100_000, int)
        check_range("COMPARE_STEPS", self.compare_steps, 20, 100_000, int)
        check_range("GRID_STEPS", self.grid_steps, 20, 100_000, int)
        check_range("BETA2_STEPS", self.beta2_steps, 40, 100_000, int)
        check_range("WEIGHT_DECAY", self.weight_decay, 0.0, 10.0)
        check_range("COMPARE_LR", self.compare_lr, 1e-6, 1.0)
        check_range("BETA2_LR", self.beta2_lr, 1e-6, 1.0)
        check_range("SURGE_FACTOR", self.surge_factor, 1.0, 1e4)
        check_range("SEED", self.seed, 0, 2**31 - 1, int)
        if len(self.grid_lrs) < 2 or len(self.grid_wds) < 2:
            raise ValueError("the landscape needs at least 2 learning rates and 2 weight decays")


PROFILES = {
    "smoke": Settings("smoke", toy_n=4000, toy_steps=400, n_layer=2, n_embd=64, block_size=64, batch_size=16,
                      text_chars=100_000, compare_steps=150, compare_lr=3e-3, weight_decay=0.1,
                      grid_lrs=(3e-3, 1e-2), grid_wds=(1e-3, 1.0), grid_steps=80,
                      beta2_steps=200, beta2_lr=1e-2, surge_factor=10.0),
    "cpu": Settings("cpu", toy_n=20_000, toy_steps=1000, n_layer=2, n_embd=64, block_size=64, batch_size=16,
                    text_chars=100_000, compare_steps=600, compare_lr=3e-3, weight_decay=0.1,
                    grid_lrs=(1e-3, 3e-3, 1e-2, 3e-2), grid_wds=(1e-3, 1e-2, 1e-1, 1.0), grid_steps=400,
                    beta2_steps=400, beta2_lr=1e-2, surge_factor=10.0),
    "gpu": Settings("gpu", toy_n=100_000, toy_steps=3000, n_layer=4, n_embd=128, block_size=128, batch_size=32,
                    text_chars=300_000, compare_steps=2000, compare_lr=3e-3, weight_decay=0.1,
                    grid_lrs=(3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1), grid_wds=(1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0),
                    grid_steps=1500, beta2_steps=1500, beta2_lr=1e-2, surge_factor=10.0),
}


def settings(profile: str = "auto", **overrides) -> Settings:
    """Validated settings for a profile; None-valued overrides keep the profile's value."""
    return resolve(PROFILES, profile, **overrides)


# --- 0. parity with torch.optim ------------------------------------------------------------------

def parity() -> dict[str, float]:
    """max |θ_ours − θ_torch| after 25 steps on random parameters and gradients, per optimizer."""
    kw = dict(lr=3e-3, betas=(0.9, 0.95), eps=1e-8)
    pairs = {
        "SGD + momentum": (lambda p: SGD(p, lr=0.05, momentum=0.9),
                           lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9)),
        "Adam": (lambda p: Adam(p, **kw), lambda p: torch.optim.Adam(p, **kw)),
        "AdamL2 vs Adam(weight_decay)": (lambda p: AdamL2(p, weight_decay=0.1, **kw),
                                         lambda p: torch.optim.Adam(p, weight_decay=0.1, **kw)),
        "AdamW": (lambda p: AdamW(p, weight_decay=0.1, **kw), lambda p: torch.optim.AdamW(p, weight_decay=0.1, **kw)),
        "Adafactor": (lambda p: Adafactor(p), lambda p: torch.optim.Adafactor(p)),
    }
    return {name: max_divergence(a, b) for name, (a, b) in pairs.items()}


# --- 1. the mechanism on a toy -----------------------------------------------------------------

TOY_SIGMAS = (1e-4, 1e-3, 1e-2, 1e-1, 1.0)
TOY_LR, TOY_WD = 1e-2, 1e-2


def toy(opt_name: str, S: Settings, sigmas=TOY_SIGMAS, lr: float = TOY_LR, wd: float = TOY_WD,
        independent_decay: bool = False) -> np.ndarray:
    """Weights start at 1 and get pure-noise gradients N(0, σ²): no signal, only decay pulls them.

    Each noise draw is used twice, with opposite signs (antithetic pairs), so the random walk the
    noise causes cancels in the mean weight and what remains is the decay. Returns the mean weight
    per noise level after each step, shape (steps + 1, len(sigmas)).
    """
    g = torch.Generator().manual_seed(S.seed)
    half = S.toy_n // 2
    params = [torch.ones(2 * half, requires_grad=True) for _ in sigmas]
    extra = dict(independent_decay=True) if independent_decay else {}
    opt = OPTIMIZERS[opt_name](params, lr=lr, betas=(0.9, 0.999), weight_decay=wd, **extra)
    means = np.ones((S.toy_steps + 1, len(sigmas)))
    for t in range(S.toy_steps):
        for p, s in zip(params, sigmas):
            noise = torch.randn(half, generator=g) * s
            p.grad = torch.cat([noise, -noise])
        opt.step()
        means[t + 1] = [p.mean().item() for p in params]
    return means


def decoupling_toy(S: Settings, factor: float = 4.0) -> dict[str, float]:
    """Decay per step of the toy's noisiest weights at lr and factor × lr: torch's AdamW (decay lr·λ) against
    Loshchilov & Hutter's form (decay η_t·λ, λ' = lr·λ so both agree at the lesson's lr)."""
    out = {}
    for form, wd, independent in (("torch", TOY_WD, False), ("L&H", TOY_LR * TOY_WD, True)):
        for lr in (TOY_LR, factor * TOY_LR):
            means = toy("AdamW", S, sigmas=(1.0,), lr=lr, wd=wd, independent_decay=independent)
            out[f"{form} lr={lr:g}"] = float(effective_decay(means)[0])
    return out


def effective_decay(means: np.ndarray) -> np.ndarray:
    """Per-step decay rate d of each column, from a log-linear fit while the mean is above 0.5."""
    rates = []
    for y in means.T:
        below = np.nonzero(y < 0.5)[0]
        k = max(int(below[0]) if below.size else len(y), 10)
        slope = np.polyfit(np.arange(k), np.log(np.clip(y[:k], 1e-12, None)), 1)[0]
        rates.append(-slope)
    return np.array(rates)


def predicted_l2_decay(sigma: float, lr: float = TOY_LR, wd: float = TOY_WD, theta: float = 1.0) -> float:
    """Adam + L2 at θ ≈ 1: the decay term λθ is divided by √v̂ ≈ √(σ² + (λθ)²); at most lr/θ per step."""
    return min(lr * wd / math.sqrt(sigma**2 + (wd * theta) ** 2), lr / theta)


def toy_figure(means: dict[str, np.ndarray], rates: dict[str, np.ndarray], sigmas=TOY_SIGMAS) -> go.Figure:
    fig = make_subplots(rows=1, cols=3, subplot_titles=("Adam + L2: mean weight", "AdamW: mean weight",
                                                        "effective decay per step vs gradient noise"))
    for col, name in ((1, "AdamL2"), (2, "AdamW")):
        for j, s in enumerate(sigmas):
            fig.add_trace(go.Scatter(y=means[name][:, j], mode="lines", name=f"σ = {s:g}", legendgroup=f"s{j}",
                                     line=dict(color=plots.color(j)), showlegend=col == 1), row=1, col=col)
    for k, name in enumerate(("AdamL2", "AdamW")):
        fig.add_trace(go.Scatter(x=list(sigmas), y=rates[name], mode="markers+lines", name=f"{name} (measured)",
                                 marker=dict(size=9, symbol="circle" if k == 0 else "square"),
                                 line=dict(color="black" if k == 0 else "#1a7f37", dash="solid")), row=1, col=3)
    grid = np.logspace(math.log10(sigmas[0]), math.log10(sigmas[-1]), 60)
    fig.add_trace(go.Scatter(x=grid, y=[predicted_l2_decay(s) for s in grid], mode="lines",
                             name="Adam + L2 predicted: lr·λ/√(σ²+λ²)", line=dict(color="gray", dash="dot")),
                  row=1, col=3)
    fig.add_trace(go.Scatter(x=[grid[0], grid[-1]], y=[TOY_LR * TOY_WD] * 2, mode="lines",
                             name="AdamW predicted: lr·λ", line=dict(color="#1a7f37", dash="dot")), row=1, col=3)
    fig.update_xaxes(title_text="step", row=1, col=1)
    fig.update_xaxes(title_text="step", row=1, col=2)
    fig.update_xaxes(type="log", title_text="gradient noise σ", row=1, col=3)
    fig.update_yaxes(type="log", title_text="decay per step", row=1, col=3)
    plots.style(fig, height=420)
    return fig


# --- 2. on the tiny GPT: the same λ, per parameter group ----------------------------------------

def corpus(S: Settings) -> data.Corpus:
    return data.text(max_chars=S.text_chars)


def build_model(S: Settings, vocab_size: int) -> GPT:
    torch.manual_seed(S.seed)
    cfg = GPTConfig(vocab_size=vocab_size, block_size=S.block_size, n_layer=S.n_layer, n_head=4, n_embd=S.n_embd)
    return GPT(cfg).to(pick_device())


def role(name: str) -> str:
    """Parameter group of a GPT parameter name: embeddings, attention, mlp or norms."""
    if ".attn." in name:
        return "attention"
    if ".mlp." in name:
        return "mlp"
    if "ln_" in name:
        return "norms"
    return "embeddings"  # wte (tied with the LM head) and wpe


ROLES = ("embeddings", "attention", "mlp", "norms")


def group_probe(every: int):
    """A train() callback logging, per parameter group, the weight norm and Adam's decay amplification
    A = Σθ²/(√v̂+ε) / Σθ²: the λθ term of Adam + L2 is divided by √v̂+ε, so its decay is A·lr·λ per
    step, where AdamW's is exactly lr·λ (A = 1). Also Σ(λθ)² / Σv̂: how much of Adam + L2's v̂ is the decay
    term's own square (near 1: v̂ ≈ (λθ)², so A ≈ 1/(λ|θ|), the toy's cap — not gradient history)."""

    def probe(info: StepInfo):
        if info.step % every and info.step != 0:
            return
        opt = info.optimizer
        names = {id(p): n for n, p in info.model.named_parameters()}
        sq, amp = {r: 0.0 for r in ROLES}, {r: 0.0 for r in ROLES}
        decay2, v_sum = {r: 0.0 for r in ROLES}, {r: 0.0 for r in ROLES}
        for group in opt.param_groups:
            beta2, eps, wd = group["betas"][1], group["eps"], group["weight_decay"]
            for p in group["params"]:
                r = role(names[id(p)])
                state = opt.state[p]
                v_hat = state["exp_avg_sq"] / (1 - beta2 ** state["step"])
                theta2 = p.detach() ** 2
                sq[r] += theta2.sum().item()
                amp[r] += (theta2 / (v_hat.sqrt() + eps)).sum().item()
                decay2[r] += (wd**2 * theta2).sum().item()
                v_sum[r] += v_hat.sum().item()
        info.log["probe_step"] = info.step
        for r in ROLES:
            info.log[f"norm/{r}"] = math.sqrt(sq[r])
            info.log[f"amplification/{r}"] = amp[r] / sq[r]
            info.log[f"decay_share/{r}"] = decay2[r] / v_sum[r]  # (λθ)² ÷ v̂, summed over the group

    return probe


def train_run(S: Settings, opt_name: str, lr: float, wd: float, steps: int, *, betas=(0.9, 0.95),
              decay_everything: bool = False, callback=None, desc: str = "", grad_clip: float | None = 1.0,
              warmup: int | None = None, hooks=None, evals: int = 10) -> History:
    """One training run on the small text corpus with warmup + cosine (or just warmup if warmup is given), with
    `evals` validation estimates after the one at step 0 (each costs ten forward passes)."""
    text = corpus(S)
    model = build_model(S, text.vocab_size)
    if hooks is not None:
        hooks(model)
    params = model.parameters() if decay_everything else [
        {"params": [p for p in model.parameters() if p.dim() >= 2], "weight_decay": wd},
        {"params": [p for p in model.parameters() if p.dim() < 2], "weight_decay": 0.0}]
    optimizer = OPTIMIZERS[opt_name](params, lr=lr, betas=betas, weight_decay=wd)
    if warmup is None:
        schedule = bind(warmup_cosine, warmup=max(1, steps // 10), total=steps, min_ratio=0.1)
    else:
        schedule = lambda s: min(1.0, (s + 1) / warmup)  # noqa: E731
    cfg = TrainConfig(steps=steps, batch_size=S.batch_size, block_size=S.block_size, lr=lr, lr_schedule=schedule,
                      eval_every=max(1, steps // evals), seed=S.seed, grad_clip=grad_clip, desc=desc or opt_name)
    return train(model, text, cfg, optimizer=optimizer, callback=callback)


def compare(S: Settings) -> dict[str, History]:
    """Adam + L2 and AdamW at the same lr and λ, decaying every parameter, with the group probe."""
    every = max(1, S.compare_steps // 30)
    return {name: train_run(S, name, S.compare_lr, S.weight_decay, S.compare_steps, decay_everything=True,
                            callback=group_probe(every), desc=f"{name} λ={S.weight_decay:g}", evals=5)
            for name in OPTIMIZERS}


def groups_figure(runs: dict[str, History]) -> go.Figure:
    fig = make_subplots(rows=1, cols=2, subplot_titles=("weight norm per group", "decay relative to AdamW's lr·λ"))
    for i, r in enumerate(ROLES):
        for name, dash in (("AdamW", "solid"), ("AdamL2", "dash")):
            h = runs[name]
            fig.add_trace(go.Scatter(x=h.extra["probe_step"], y=h.extra[f"norm/{r}"], mode="lines",
                                     name=f"{r} · {name}", legendgroup=r, line=dict(color=plots.color(i), dash=dash)),
                          row=1, col=1)
        h = runs["AdamL2"]
        fig.add_trace(go.Scatter(x=h.extra["probe_step"], y=h.extra[f"amplification/{r}"], mode="lines",
                                 name=f"{r} · AdamL2 A", legendgroup=r, showlegend=False,
                                 line=dict(color=plots.color(i), dash="dash")), row=1, col=2)
    fig.add_hline(y=1.0, line=dict(color="black", dash="dot"), annotation_text="AdamW (A = 1)", row=1, col=2)
    fig.update_yaxes(type="log", title_text="A = Σθ²/(√v̂+ε) / Σθ²", row=1, col=2)
    fig.update_yaxes(title_text="‖θ‖", row=1, col=1)
    fig.update_xaxes(title_text="step")
    plots.style(fig, height=430)
    return fig


def final_amplification(h: History) -> dict[str, float]:
    return {r: h.extra[f"amplification/{r}"][-1] for r in ROLES}


# --- 3. the landscape --------------------------------------------------------------------------

def landscape(S: Settings) -> dict[tuple, History]:
    """Every (optimizer, lr, λ) of the grid, trained once: the cache the heatmaps and the panel read."""
    cells = [(name, lr, wd) for name in OPTIMIZERS for lr in S.grid_lrs for wd in S.grid_wds]
    out = {}
    for name, lr, wd in progress(cells, desc="landscape"):
        h = train_run(S, name, lr, wd, S.grid_steps, desc=f"{name} lr={lr:g} λ={wd:g}", evals=4)  # final val is read
        h.extra = {}
        out[(name, lr, wd)] = h
    return out


def grid_matrix(S: Settings, runs: dict[tuple, History], name: str) -> np.ndarray:
    """Final val loss, rows = lr, columns = λ (NaN stays NaN: a diverged run)."""
    return np.array([[runs[(name, lr, wd)].final_val_loss for wd in S.grid_wds] for lr in S.grid_lrs])


def landscape_figure(S: Settings, runs: dict[tuple, History]) -> go.Figure:
    mats = {name: grid_matrix(S, runs, name) for name in OPTIMIZERS}
    finite = np.concatenate([m[np.isfinite(m)] for m in mats.values()])
    lo, hi = float(finite.min()), float(np.percentile(finite, 90))
    fig = make_subplots(rows=1, cols=2, subplot_titles=("Adam + L2", "AdamW"), horizontal_spacing=0.12)
    x = [f"{wd:g}" for wd in S.grid_wds]
    y = [f"{lr:g}" for lr in S.grid_lrs]
    for col, name in ((1, "AdamL2"), (2, "AdamW")):
        m = mats[name]
        fig.add_trace(go.Heatmap(z=m, x=x, y=y, zmin=lo, zmax=hi, colorscale="Viridis_r", showscale=col == 2,
                                 text=np.vectorize(lambda v: f"{v:.3f}")(m), texttemplate="%{text}",
                                 colorbar=dict(title="val loss")), row=1, col=col)
        i, j = np.unravel_index(np.nanargmin(m), m.shape)
        fig.add_trace(go.Scatter(x=[x[j]], y=[y[i]], mode="markers", showlegend=False, hoverinfo="skip",
                                 marker=dict(symbol="square-open", size=46, line=dict(color="red", width=3))),
                      row=1, col=col)
        fig.update_xaxes(title_text="weight decay λ", row=1, col=col)
    fig.update_yaxes(title_text="learning rate", row=1, col=1)
    plots.style(fig, height=420, title=f"Final validation loss after {S.grid_steps} steps "
                            "(red square: each optimizer's best cell)")
    return fig


def best_cell(S: Settings, runs: dict[tuple, History], name: str) -> tuple[float, float, float]:
    m = grid_matrix(S, runs, name)
    i, j = np.unravel_index(np.nanargmin(m), m.shape)
    return S.grid_lrs[i], S.grid_wds[j], float(m[i, j])


def wd_spread(S: Settings, runs: dict[tuple, History], name: str) -> float:
    """At the optimizer's best lr: worst minus best val loss across the λ grid (how much λ matters)."""
    lr, _, _ = best_cell(S, runs, name)
    row = [runs[(name, lr, wd)].final_val_loss for wd in S.grid_wds]
    return float(max(row) - min(row))


def cell_panel(S: Settings, runs: dict[tuple, History]) -> Panel:
    """Pick a cell of the grid: both optimizers' curves there, instantly (all runs are cached)."""
    import ipywidgets as W
    style = {"description_width": "initial"}
    controls = {
        "lr": W.SelectionSlider(options=list(S.grid_lrs), value=S.grid_lrs[len(S.grid_lrs) // 2],
                                description="learning rate", style=style),
        "wd": W.SelectionSlider(options=list(S.grid_wds), value=S.grid_wds[-1], description="weight decay λ",
                                style=style),
    }

    def draw(lr, wd):
        return plots.loss_curves({name: runs[(name, lr, wd)] for name in OPTIMIZERS},
                                 title=f"lr = {lr:g}, λ = {wd:g}")

    return Panel(draw, controls, title="One cell of the landscape: both optimizers' curves")


# --- 4. memory -----------------------------------------------------------------------------------

SEED_TABLE = {"SGD": 0, "SGD + momentum": 4, "Adam": 8, "AdamW": 8, "Lion": 4, "Adafactor": 4}


def memory_table(S: Settings) -> dict[str, dict]:
    """Optimizer state bytes per parameter, measured after one step on the lesson's GPT, ours and torch's."""
    makers = {
        "SGD": (lambda p: SGD(p, lr=0.1), lambda p: torch.optim.SGD(p, lr=0.1)),
        "SGD + momentum": (lambda p: SGD(p, lr=0.1, momentum=0.9), lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9)),
        "Adam": (lambda p: Adam(p), lambda p: torch.optim.Adam(p)),
        "AdamW": (lambda p: AdamW(p, weight_decay=0.1), lambda p: torch.optim.AdamW(p, weight_decay=0.1)),
        "Lion": (lambda p: Lion(p), None),
        "Adafactor": (lambda p: Adafactor(p), lambda p: torch.optim.Adafactor(p)),
    }
    text = corpus(S)
    X, Y = text.batch("train", 4, S.block_size, torch.Generator().manual_seed(0), pick_device())
    out = {}
    for name, (ours, theirs) in makers.items():
        row = {"seeds": SEED_TABLE[name]}
        for label, make in (("ours", ours), ("torch", theirs)):
            if make is None:
                row[label] = None
                continue
            model = build_model(S, text.vocab_size)
            opt = make(model.parameters())
            model(X, Y)[1].backward()
            opt.step()
            row[label] = state_bytes(opt) / model.num_params()
        out[name] = row
    return out


def memory_figure(table: dict[str, dict]) -> go.Figure:
    names = list(table)
    return plots.bars(names, {"seeds' table": [table[n]["seeds"] for n in names],
                              "measured (ours)": [table[n]["ours"] for n in names],
                              "measured (torch.optim)": [table[n]["torch"] or 0 for n in names]},
                      title="Optimizer state, bytes per parameter (fp32)", yaxis="bytes / parameter")


# --- 5. β2 = 0.999 vs 0.95 -----------------------------------------------------------------------

BETA2S = (0.999, 0.95)


def update_rms_probe(info: StepInfo):
    """Log the RMS of Adam's normalised update m̂/(√v̂+ε) over all parameters (1.0 = a full lr step)."""
    num, n = 0.0, 0
    opt = info.optimizer
    for group in opt.param_groups:
        beta1, beta2 = group["betas"]
        for p in group["params"]:
            s = opt.state[p]
            u = (s["exp_avg"] / (1 - beta1 ** s["step"])) / ((s["exp_avg_sq"] / (1 - beta2 ** s["step"])).sqrt()
                                                          + group["eps"])
            num += (u**2).sum().item()
            n += u.numel()
    info.log["update_rms"] = math.sqrt(num / n)


def beta2_runs(S: Settings, surge: bool) -> dict[float, History]:
    """AdamW at a high constant lr (50-step warmup), clipping off, for each β2. With surge=True, every
    gradient is multiplied by S.surge_factor from the middle step on (a gradient hook)."""
    runs = {}
    for beta2 in BETA2S:
        scale = [1.0]
        surge_at = S.beta2_steps // 2

        def hooks(model):
            for p in model.parameters():
                p.register_hook(lambda g: g * scale[0])

        def callback(info, scale=scale, surge_at=surge_at):
            update_rms_probe(info)
            if surge and info.step + 1 == surge_at:
                scale[0] = S.surge_factor

        runs[beta2] = train_run(S, "AdamW", S.beta2_lr, 0.1, S.beta2_steps, betas=(0.9, beta2), callback=callback,
                                grad_clip=None, warmup=50, hooks=hooks, evals=10 if surge else 2,  # (natural: final)
                                desc=f"β2={beta2}{' surge' if surge else ''}")
    return runs


def spike_stats(h: History) -> dict:
    """Loss jumps of more than 0.3 nats from one step to the next, after warmup."""
    L = np.array(h.loss)
    jumps = np.diff(L)[50:]
    return {"jumps": int((jumps > 0.3).sum()), "largest_jump": float(jumps.max()), "final_val": h.final_val_loss}


def surge_stats(h: History, steps: int) -> dict:
    at = steps // 2
    u = np.array(h.extra["update_rms"])
    vs, vl = np.array(h.val_step), np.array(h.val_loss)
    return {"update_before": float(u[at - 20:at].mean()), "update_max_after": float(u[at:].max()),
            "overshoot": float(u[at:].max() / u[at - 20:at].mean()),
            "val_before": float(vl[vs <= at][-1]), "val_max_after": float(vl[vs > at].max()),
            "val_rise": float(vl[vs > at].max() - vl[vs <= at][-1])}


def beta2_figure(natural: dict[float, History], surged: dict[float, History], steps: int) -> go.Figure:
    fig = make_subplots(rows=1, cols=3, subplot_titles=("high lr: training loss", "gradient ×surge: update RMS",
                                                        "gradient ×surge: val loss"))
    for i, b in enumerate(BETA2S):
        c = plots.color(i)
        fig.add_trace(go.Scatter(y=natural[b].loss, mode="lines", name=f"β2 = {b}", line=dict(color=c, width=1),
                                 legendgroup=str(b)), row=1, col=1)
        fig.add_trace(go.Scatter(y=surged[b].extra["update_rms"], mode="lines", showlegend=False,
                                 line=dict(color=c), legendgroup=str(b)), row=1, col=2)
        fig.add_trace(go.Scatter(x=surged[b].val_step, y=surged[b].val_loss, mode="lines+markers", showlegend=False,
                                 line=dict(color=c), legendgroup=str(b)), row=1, col=3)
    for col in (2, 3):
        fig.add_vline(x=steps // 2, line=dict(color="gray", dash="dot"), row=1, col=col)
    fig.update_xaxes(title_text="step")
    fig.update_yaxes(title_text="RMS of m̂/(√v̂+ε)", row=1, col=2)
    plots.style(fig, height=400)
    return fig


# --- what was measured, in words -----------------------------------------------------------------

def parity_findings(ledger: Ledger, parity_diffs: dict[str, float]) -> str:
    worst = max(parity_diffs.values())
    ledger.add("parity", "Each from-scratch optimizer matches torch.optim (max |Δθ| after 25 steps)", worst,
               at_most(1e-6), kind="measured")
    return "Max |Δθ| after 25 steps against torch.optim: " + ", ".join(
        f"{name} {d:.1e}" for name, d in parity_diffs.items()) + "."


def toy_findings(ledger: Ledger, rates: dict[str, np.ndarray], means: dict[str, np.ndarray],
                 decoupling: dict[str, float], factor: float = 4.0) -> str:
    l2, w = rates["AdamL2"], rates["AdamW"]
    predicted = np.array([predicted_l2_decay(s) for s in TOY_SIGMAS])
    ledger.add("toy_l2_falls", "Toy: under Adam + L2 the effective decay falls as gradient noise grows "
               f"(decay at σ = {TOY_SIGMAS[0]:g} ÷ decay at σ = {TOY_SIGMAS[-1]:g}; predicted "
               f"{predicted[0] / predicted[-1]:.0f})", l2[0] / l2[-1], at_least(30), source="Loshchilov & Hutter 2019",
               kind="measured")
    ledger.add("toy_l2_formula", "Toy: … following lr·λ/√(σ² + λ²θ²), capped at lr/θ (worst ratio measured ÷ "
               "predicted over σ, as max(r, 1/r))", float(np.exp(np.abs(np.log(l2 / predicted)).max())), at_most(1.5),
               kind="measured")
    ledger.add("toy_w_flat", "Toy: under AdamW it does not (max ÷ min decay across all σ)", w.max() / w.min(),
               at_most(1.05), kind="measured")
    steps = means["AdamW"].shape[0] - 1
    exact = (1 - TOY_LR * TOY_WD) ** steps
    worst = float(np.abs(means["AdamW"][-1] / exact - 1).max())
    ledger.add("toy_w_exact", "Toy: under AdamW the mean weight is exactly (1 − lr·λ)^t — the antithetic noise "
               "cancels in the mean, only the decay is left (worst relative gap after the last step, every σ; "
               "allowed: fp32's rounding, 2⁻²³ per step)", worst, at_most(steps * 2.0**-23), kind="measured")
    torch_ratio = decoupling[f"torch lr={factor * TOY_LR:g}"] / decoupling[f"torch lr={TOY_LR:g}"]
    lh_ratio = decoupling[f"L&H lr={factor * TOY_LR:g}"] / decoupling[f"L&H lr={TOY_LR:g}"]
    ledger.add("torch_couples", f"torch's AdamW couples decay to the learning rate: ×{factor:g} lr gives ×{factor:g} "
               "decay per step (ratio)", torch_ratio, approx(factor, rel=0.02), kind="measured")
    ledger.add("lh_decouples", f"Loshchilov & Hutter's form (decay η_t·λ) does not: ×{factor:g} lr, same decay "
               "(ratio)", lh_ratio, approx(1.0, rel=0.02), source="Loshchilov & Hutter 2019, claim (i)",
               kind="measured")
    ledger.note("toy_rates", {k: v.tolist() for k, v in rates.items()})
    ledger.note("decoupling", decoupling)
    return (f"Measured: AdamW's decay is {w.min():.5g}–{w.max():.5g} per step at every noise level (lr·λ = "
            f"{TOY_LR * TOY_WD:g}); its mean weight follows (1 − lr·λ)^t to {worst:.0e}. Adam + L2's falls from "
            f"{l2[0]:.3g} at σ = {TOY_SIGMAS[0]:g} to {l2[-1]:.3g} at σ = {TOY_SIGMAS[-1]:g}, a factor "
            f"{l2[0] / l2[-1]:.0f}. At small σ the decay term dominates the gradient, so Adam normalises it to a fixed "
            "step of ≈ lr: the weight falls by lr per step rather than by a fraction, which is why the smallest-σ "
            "points sit above the exponential prediction.\n\n"
            "**Decoupled from what?** Loshchilov & Hutter's update is θ ← θ − η_t(α·m̂/(√v̂+ε) + λθ): the decay is "
            "multiplied by the schedule's η_t, *not* by the learning rate α. That is their claim (i) — the best λ no "
            "longer moves when α does. torch's AdamW (and `labtools.optim.AdamW` by default) shrinks by lr·λ = "
            f"α·η_t·λ, which couples them again: ×{factor:g} lr made its decay ×{torch_ratio:.2f} here, against "
            f"×{lh_ratio:.2f} for their form (`AdamW(independent_decay=True)`, equal to torch's AdamW with "
            "weight_decay = λ/α — tested). With torch's form, lines of equal decay are diagonals of the lr × λ "
            "grid below.")


def groups_findings(ledger: Ledger, S: Settings, runs: dict[str, History]) -> str:
    amp = final_amplification(runs["AdamL2"])
    order = sorted(amp, key=amp.get)
    mlp_w, mlp_l2 = runs["AdamW"].extra["norm/mlp"][-1], runs["AdamL2"].extra["norm/mlp"][-1]
    ledger.add("gpt_uneven", "GPT: Adam + L2 decays parameter groups unevenly (max ÷ min of A over groups, end of "
               "training)", max(amp.values()) / min(amp.values()), at_least(3), kind="measured")
    ledger.add("gpt_stronger", f"GPT: at the same λ = {S.weight_decay:g}, Adam + L2 shrinks the weights more than "
               "AdamW (AdamW's final ‖θ‖ of the MLP ÷ Adam + L2's)", mlp_w / mlp_l2, at_least(1.2), kind="measured")
    share = {r: runs["AdamL2"].extra[f"decay_share/{r}"][-1] for r in ROLES}
    ledger.note("amplification", amp)
    ledger.note("decay_share_of_v", share)
    parts = ", ".join(f"{r} {amp[r]:.0f}×" for r in order)
    shares = ", ".join(f"{r} {share[r]:.2g}" for r in order)
    least = order[0]
    why = (f"That is not gradient history: Σ(λθ)² is {share[least]:.2g}× the {least} group's Σv̂ — the decay term fills "
           "its own denominator (v̂ ≈ (λθ)²), so A cannot exceed ≈ 1/(λ|θ|), the cap seen on the toy at small σ."
           if share[least] > 0.5 else
           f"Its gradients dominate v̂ there ((λθ)² is {share[least]:.0%} of it): a large gradient history shields "
           "it from the decay.")
    return (f"At the end of training, Adam + L2's decay per group was A times AdamW's: {parts}. With the same "
            f"λ = {S.weight_decay:g}, it shrank the weights far more (MLP ‖θ‖ {mlp_l2:.2f} vs {mlp_w:.2f} under AdamW) "
            f"and reached val loss {runs['AdamL2'].final_val_loss:.3f} vs AdamW's {runs['AdamW'].final_val_loss:.3f}. "
            f"The {least} group was decayed least and {order[-1]} most: one λ, very different regularisation per "
            "group. How "
            f"much of v̂ is the decay term's own square, Σ(λθ)²/Σv̂ at the end: {shares}. {why}")


def landscape_findings(ledger: Ledger, S: Settings, grid: dict[tuple, History]) -> str:
    b = {name: best_cell(S, grid, name) for name in OPTIMIZERS}
    spread = {name: wd_spread(S, grid, name) for name in OPTIMIZERS}
    gain = {name: grid[(name, b[name][0], S.grid_wds[0])].final_val_loss - b[name][2] for name in OPTIMIZERS}
    ledger.add("landscape", "Landscape: λ matters far more to Adam + L2 (val-loss spread across the λ grid at the "
               "best lr, Adam + L2 ÷ AdamW)", spread["AdamL2"] / max(spread["AdamW"], 1e-4), at_least(3),
               kind="measured")
    ledger.note("best_cells", b)
    ledger.note("wd_spread", spread)
    helped = max(gain.values())
    verdict = (f"Weight decay barely helped here (the best λ beat the smallest by at most {helped:.3f} nats): in runs "
               "this short the model hardly overfits, so what the landscape shows is how differently the same λ "
               "acts — and it cannot show Loshchilov & Hutter's claim (i), that the best λ stays put when the lr "
               "changes: with decay this unimportant, which λ is best is noise. Section 1 measures the mechanism "
               "instead." if helped < 0.02 else
               f"Weight decay helped: the best λ beat the smallest by {gain['AdamW']:.3f} nats for AdamW and "
               f"{gain['AdamL2']:.3f} for Adam + L2.")
    return (f"Best cells: Adam + L2 at lr = {b['AdamL2'][0]:g}, λ = {b['AdamL2'][1]:g} (val {b['AdamL2'][2]:.3f}); "
            f"AdamW at lr = {b['AdamW'][0]:g}, λ = {b['AdamW'][1]:g} (val {b['AdamW'][2]:.3f}). At its best lr, moving "
            f"λ across the grid changes AdamW's val loss by {spread['AdamW']:.3f} and Adam + L2's by "
            f"{spread['AdamL2']:.3f}. {verdict} The λ grid reaches lr·λ·steps ≈ "
            f"{max(S.grid_lrs) * max(S.grid_wds) * S.grid_steps:.2g} at its corner, where AdamW's decay does bite. "
            "torch's AdamW multiplies λ by the learning rate (θ ← θ(1 − lr·λ)), so its lines of equal decay are "
            "diagonals of this grid; Loshchilov & Hutter decouple λ from the gradient's scale *and*, with their η_t·λ, "
            "from the learning rate (section 1).")


def memory_findings(ledger: Ledger, memory: dict[str, dict]) -> str:
    for name, row in memory.items():
        if name == "Adafactor":
            ledger.add("mem_adafactor", "torch.optim.Adafactor (no momentum) keeps far less than the seeds' ≈4 "
                       "bytes/param: row and column factors only", row["torch"], at_most(1.0), source="seeds say ≈ 4",
                       kind="measured")
        else:
            who = "torch.optim" if row["torch"] is not None else "ours (torch has no Lion)"
            ledger.add(f"mem_{name}", f"{name}: {row['seeds']} bytes of state per parameter ({who})",
                       row["torch"] if row["torch"] is not None else row["ours"],
                       approx(row["seeds"], abs=0.01), source="seeds' table", kind="measured")
    ledger.add("mem_ours_as_torch", "Our optimizers keep what torch's keep (worst |ours − torch| bytes/param)",
               max(abs(r["ours"] - r["torch"]) for r in memory.values() if r["torch"] is not None), at_most(0.01),
               kind="measured")
    ledger.note("memory_bytes_per_param", memory)
    a = memory["Adafactor"]
    return (f"Every measured value matches the seeds' table except Adafactor: {a['ours']:.3f} bytes/param here "
            f"(torch.optim.Adafactor: {a['torch']:.3f}), not ≈ 4. Without momentum, Adafactor stores only a row and a "
            "column factor per matrix (n + m numbers for n·m weights) and a full second moment only for vectors "
            "(biases, norms). The seeds' ≈ 4 fits Adafactor *with* a first moment (β1 > 0), which costs the full 4 "
            "bytes/param again. torch's Adam and AdamW come out a hair above 8 because they keep the step count as a "
            "one-element tensor per parameter tensor.")


def beta2_findings(ledger: Ledger, S: Settings, natural: dict[float, History], surged: dict[float, History]) -> str:
    n = {b: spike_stats(natural[b]) for b in BETA2S}
    st = {b: surge_stats(surged[b], S.beta2_steps) for b in BETA2S}
    ledger.add("surge_overshoot", f"After a ×{S.surge_factor:g} gradient surge, β2 = 0.999's update overshoots "
               "more than β2 = 0.95's (ratio of their update-RMS overshoots)",
               st[0.999]["overshoot"] / st[0.95]["overshoot"], at_least(1.25), kind="measured")
    ledger.add("surge_val", "… and its validation loss rises more (val rise of 0.999 − val rise of 0.95)",
               st[0.999]["val_rise"] - st[0.95]["val_rise"], at_least(0.02), kind="measured")
    for b in BETA2S:
        ledger.note(f"natural_beta2_{b}", n[b])
        ledger.note(f"surge_beta2_{b}", st[b])
    return (f"At lr = {S.beta2_lr:g} with no surge, the two settings behaved alike at this scale: "
            f"{n[0.999]['jumps']} vs {n[0.95]['jumps']} step-to-step loss jumps above 0.3 nats (β2 = 0.999 vs 0.95), "
            f"final val {n[0.999]['final_val']:.3f} vs {n[0.95]['final_val']:.3f} — the instability larger models show "
            f"did not appear. After the ×{S.surge_factor:g} gradient surge, β2 = 0.999's update RMS rose "
            f"{st[0.999]['overshoot']:.1f}× (from {st[0.999]['update_before']:.2f} to "
            f"{st[0.999]['update_max_after']:.2f}) and β2 = 0.95's {st[0.95]['overshoot']:.1f}×; validation loss rose "
            f"by {st[0.999]['val_rise']:.3f} vs {st[0.95]['val_rise']:.3f}. A slow v̂ lags behind a gradient that "
            "suddenly grows, so m̂/√v̂ overshoots until v̂ catches up (≈ 1/(1 − β2) steps).")
