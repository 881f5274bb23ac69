"""Lesson 02 — learning-rate schedules: design one, compare them on equal budgets, see why warmup
exists, and extend a WSD run to a longer budget without starting over.

Experiments for notebooks/02_lr_schedules.ipynb. Per-profile settings live in PROFILES.
"""

import io
import math
from dataclasses import dataclass

import numpy as np
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from labtools import data, plots
from labtools.claims import Ledger, approx, at_least, at_most, between, is_true
from labtools.device import pick_device
from labtools.model import GPT, GPTConfig
from labtools.optim import param_groups
from labtools.profiles import check_range, resolve
from labtools.schedules import SHAPES, bind, linear_warmup, warmup_cosine, warmup_linear, wsd
from labtools.train import History, StepInfo, TrainConfig, load_checkpoint, save_checkpoint, train
from labtools.widgets import Panel, slider


@dataclass(frozen=True)
class Settings:
    profile: str
    n_layer: int
    n_embd: int
    block_size: int
    batch_size: int
    budget: int             # steps of the equal-budget comparison
    peak_lr: float          # its peak learning rate
    warmup_lr: float        # the high peak lr of the warmup ablation
    warmup_steps: int       # length of the warmup ablation runs
    horizon: int            # the WSD experiment's long horizon; the short one is half of it
    decay_margin: float | None  # what this profile's runs can show: decaying beats constant by at least this;
                                # None: runs too short to say (the sign changes with the seed)
    warmup_margin: float | None  # ... and warmup beats none by at least this (nats); None: runs too short to say
    seed: int = 0

    def __post_init__(self):
        check_range("BUDGET", self.budget, 50, 1_000_000, int)
        check_range("PEAK_LR", self.peak_lr, 1e-6, 1.0)
        check_range("WARMUP_LR", self.warmup_lr, 1e-6, 1.0)
        check_range("WARMUP_STEPS", self.warmup_steps, 50, 1_000_000, int)
        check_range("HORIZON", self.horizon, 50, 1_000_000, int)
        check_range("SEED", self.seed, 0, 2**31 - 1, int)


PROFILES = {
    "smoke": Settings("smoke", n_layer=2, n_embd=64, block_size=64, batch_size=16, budget=180, peak_lr=1e-2,
                      warmup_lr=3e-2, warmup_steps=150, horizon=180, decay_margin=None, warmup_margin=None),
    "cpu": Settings("cpu", n_layer=2, n_embd=64, block_size=64, batch_size=16, budget=600, peak_lr=1e-2,
                    warmup_lr=3e-2, warmup_steps=400, horizon=600, decay_margin=0.05, warmup_margin=None),
    "gpu": Settings("gpu", n_layer=6, n_embd=384, block_size=256, batch_size=64, budget=3000, peak_lr=3e-3,
                    warmup_lr=1e-2, warmup_steps=2000, horizon=4000, decay_margin=0.02, warmup_margin=0.05),
}


def settings(profile: str = "auto", **overrides) -> Settings:
    """Validated settings for a profile; None-valued overrides keep the profile's value."""
    return resolve(PROFILES, profile, **overrides)


# --- 1. the schedule designer ---------------------------------------------------------------------

def schedule_set(total: int, warmup_frac: float, min_ratio: float, stable_frac: float, shape: str) -> dict:
    """The four schedules of this lesson over `total` steps, with shared warmup and floor."""
    warmup = int(round(warmup_frac * total))
    stable = int(round(stable_frac * (total - warmup)))
    decay = max(1, total - warmup - stable)
    return {
        "constant (after warmup)": bind(linear_warmup, warmup=warmup),
        "cosine": bind(warmup_cosine, warmup=warmup, total=total, min_ratio=min_ratio),
        "linear": bind(warmup_linear, warmup=warmup, total=total, min_ratio=min_ratio),
        f"WSD ({shape} decay)": bind(wsd, warmup=warmup, stable=stable, decay=decay, min_ratio=min_ratio, shape=shape),
    }


def designer_figure(total: int, warmup_frac: float, peak_lr: float, min_ratio: float, stable_frac: float,
                    shape: str) -> go.Figure:
    steps = np.unique(np.linspace(0, total, min(total + 1, 500)).round().astype(int))  # ≤ 500 points draw it exactly
    curves = {name: [peak_lr * f(int(s)) for s in steps]
              for name, f in schedule_set(total, warmup_frac, min_ratio, stable_frac, shape).items()}
    fig = plots.lines(steps, curves, title="Learning rate over training", xaxis="step", yaxis="learning rate")
    fig.update_yaxes(range=[0, peak_lr * 1.05])
    return fig


def designer_panel(total: int = 1000) -> Panel:
    import ipywidgets as W
    controls = {
        "total": slider(total, 100, 5000, 100, description="total steps"),
        "warmup_frac": slider(0.05, 0.0, 0.3, 0.01, description="warmup fraction"),
        "peak_lr": slider(3e-3, 1e-5, 1e-1, 0.1, description="peak lr", log=True),
        "min_ratio": slider(0.1, 0.0, 1.0, 0.05, description="min ratio"),
        "stable_frac": slider(0.8, 0.0, 0.95, 0.05, description="WSD stable fraction"),
        "shape": W.Dropdown(options=list(SHAPES), value="cosine", description="WSD decay"),
    }
    return Panel(designer_figure, controls, debounce_ms=0, title="Schedule designer")


# --- shared training helper -------------------------------------------------------------------------

def corpus() -> data.Corpus:
    return data.text()


BETAS = (0.9, 0.95)  # every run of this lesson


def build(S: Settings, lr: float) -> tuple[GPT, torch.optim.Optimizer]:
    text = corpus()
    torch.manual_seed(S.seed)
    model = GPT(GPTConfig(vocab_size=text.vocab_size, block_size=S.block_size, n_layer=S.n_layer, n_head=4,
                          n_embd=S.n_embd)).to(pick_device())
    return model, torch.optim.AdamW(param_groups(model, 0.1), lr=lr, betas=BETAS)


def run(S: Settings, schedule, steps: int, lr: float, *, desc: str, start_step: int = 0, model=None, optimizer=None,
        callback=None, grad_clip: float | None = 1.0) -> History:
    if model is None:
        model, optimizer = build(S, lr)
    # Every claim reads final validation losses (20 batches, the same each time); five estimates along a run
    # draw the curves: evaluation would otherwise cost as much as a third of the run.
    cfg = TrainConfig(steps=steps, batch_size=S.batch_size, block_size=S.block_size, lr=lr, lr_schedule=schedule,
                      eval_every=max(1, steps // 5), eval_batches=20, seed=S.seed, start_step=start_step,
                      grad_clip=grad_clip, desc=desc)
    return train(model, corpus(), cfg, optimizer=optimizer, callback=callback)


# --- 2. equal budgets --------------------------------------------------------------------------------

_COSINE_RUNS: dict[tuple, History] = {}


def cosine_run(S: Settings, total: int, warmup: int) -> History:
    """Warmup + cosine to 10% at the peak lr over `total` steps, trained once per (settings, total, warmup): section
    2's cosine run and section 4's cosine baseline at the same length are the same run (with the profiles' budget
    equal to the horizon), so the second asks for the first's history instead of training it again."""
    key = (S, total, warmup)
    if key not in _COSINE_RUNS:
        _COSINE_RUNS[key] = run(S, bind(warmup_cosine, warmup=warmup, total=total, min_ratio=0.1), total, S.peak_lr,
                                desc=f"cosine {total}")
    return _COSINE_RUNS[key]


def equal_budget(S: Settings) -> dict[str, History]:
    """The four schedules, same model, data, peak lr and number of steps (10% warmup, floor 10%, WSD 70% stable)."""
    schedules = schedule_set(S.budget, 0.1, 0.1, 0.7 / 0.9, "cosine")
    warmup = schedules["cosine"].keywords["warmup"]
    return {name: cosine_run(S, S.budget, warmup) if name == "cosine" else run(S, f, S.budget, S.peak_lr, desc=name)
            for name, f in schedules.items()}


def finals_figure(runs: dict[str, History], title: str) -> go.Figure:
    names = list(runs)
    fig = plots.bars(names, {"final val loss": [runs[n].final_val_loss for n in names]}, title=title,
                     yaxis="val loss")
    lo = min(runs[n].final_val_loss for n in names)
    fig.update_yaxes(range=[lo - 0.1, max(runs[n].final_val_loss for n in names) + 0.05])
    fig.update_traces(texttemplate="%{y:.3f}")
    return fig


# --- 3. why warmup --------------------------------------------------------------------------------

def step_probe(info: StepInfo):
    """Log Adam's normalised update RMS (m̂/(√v̂+ε), 1.0 = every weight moves by lr) and the relative step ‖Δθ‖/‖θ‖."""
    num, n, sq = 0.0, 0, 0.0
    seen, raw, k = 0.0, 0.0, 0  # over entries that have had a gradient: with and without bias correction
    opt = info.optimizer
    for group in opt.param_groups:
        beta1, beta2 = group["betas"]
        for p in group["params"]:
            s = opt.state[p]
            t = float(s["step"])
            m, v = s["exp_avg"], s["exp_avg_sq"]
            u = (m / (1 - beta1**t)) / ((v / (1 - beta2**t)).sqrt() + group["eps"])
            num += (u**2).sum().item()
            n += u.numel()
            sq += (p.detach() ** 2).sum().item()
            had = v > 0
            seen += (u[had] ** 2).sum().item()
            raw += ((m / (v.sqrt() + group["eps"]))[had] ** 2).sum().item()
            k += int(had.sum())
    rms = math.sqrt(num / n)
    info.log["update_rms"] = rms
    info.log["update_rms_seen"] = math.sqrt(seen / max(k, 1))
    info.log["update_rms_uncorrected"] = math.sqrt(raw / max(k, 1))
    info.log["relative_step"] = info.lr * rms * math.sqrt(n) / math.sqrt(sq)


def warmup_ablation(S: Settings) -> dict[str, History]:
    """High peak lr, cosine to 10%, clipping off (so warmup alone is tested): none vs 10% warmup."""
    out = {}
    for warmup in (0, S.warmup_steps // 10):
        name = f"warmup {warmup} steps" if warmup else "no warmup"
        schedule = bind(warmup_cosine, warmup=warmup, total=S.warmup_steps, min_ratio=0.1)
        out[name] = run(S, schedule, S.warmup_steps, S.warmup_lr, desc=name, callback=step_probe, grad_clip=None)
    return out


def warmup_figure(runs: dict[str, History], first: int = 60) -> go.Figure:
    fig = make_subplots(rows=1, cols=3, subplot_titles=("training loss", f"Adam's update RMS, first {first} steps",
                                                        "relative step ‖Δθ‖/‖θ‖ (log)"))
    for i, (name, h) in enumerate(runs.items()):
        c = plots.color(i)
        fig.add_trace(go.Scatter(x=h.step, y=h.loss, mode="lines", name=name, line=dict(color=c, width=1),
                                 legendgroup=name), row=1, col=1)
        fig.add_trace(go.Scatter(x=h.step[:first], y=h.extra["update_rms"][:first], mode="lines", showlegend=False,
                                 line=dict(color=c), legendgroup=name), row=1, col=2)
        fig.add_trace(go.Scatter(x=h.step[:first], y=h.extra["relative_step"][:first], mode="lines",
                                 showlegend=False, line=dict(color=c), legendgroup=name), row=1, col=3)
    fig.update_yaxes(type="log", row=1, col=3)
    fig.update_xaxes(title_text="step")
    plots.style(fig, height=400)
    return fig


def warmup_stats(runs: dict[str, History]) -> dict:
    none, warm = runs["no warmup"], next(h for n, h in runs.items() if n != "no warmup")
    u = np.array(none.extra["update_rms"])
    return {
        "early_update_rms": float(u[:5].mean()), "update_rms_at_50": float(u[50]),
        "first_relative_step_no_warmup": float(none.extra["relative_step"][0]),
        "max_relative_step_warmup": float(max(warm.extra["relative_step"])),
        "final_val_no_warmup": none.final_val_loss, "final_val_warmup": warm.final_val_loss,
        "max_loss_after_10_no_warmup": float(max(none.loss[10:])),
        "max_loss_after_10_warmup": float(max(warm.loss[10:])),
        "spike_step_no_warmup": int(none.step[10 + int(np.argmax(none.loss[10:]))]),
        "spike_step_warmup": int(warm.step[10 + int(np.argmax(warm.loss[10:]))]),
        "spike_lr_warmup": float(warm.lr[10 + int(np.argmax(warm.loss[10:]))]),
        "warmup_end": int(np.argmax(warm.lr)),
        "first_update_rms": float(none.extra["update_rms_seen"][0]),
        "first_update_rms_uncorrected": float(none.extra["update_rms_uncorrected"][0]),
    }


def uncorrected_first_step(beta2: float, beta1: float = BETAS[0]) -> float:
    """|m/√v| at step 1 without bias correction: (1 − β1)|g| / √((1 − β2) g²)."""
    return (1 - beta1) / math.sqrt(1 - beta2)


def moderate_share(shape: str, steps: int = 100_000) -> float:
    """Share of a decay's steps spent in the middle half of its range (lr between 25% and 75% of the way from the
    floor to the peak), computed from labtools.schedules' own functions (no warmup, floor 0)."""
    f = {"cosine": bind(warmup_cosine, warmup=0, total=steps),
         "linear": bind(warmup_linear, warmup=0, total=steps)}[shape]
    lr = np.array([f(s) for s in range(steps)])
    return float(((lr >= 0.25) & (lr <= 0.75)).mean())


# --- 4. WSD: extend the budget without starting over ----------------------------------------------------

def wsd_extension(S: Settings) -> dict:
    """One WSD trunk (warmup + stable), branched at the short horizon's decay start; the trunk goes on to the
    long horizon's decay. Cosine runs from scratch for each horizon are the baseline. Decay = 20% of a horizon."""
    long_h = S.horizon
    short_h = long_h // 2
    warmup = long_h // 10
    d_short, d_long = short_h // 5, long_h // 5
    sched = {h: bind(wsd, warmup=warmup, stable=h - d - warmup, decay=d, min_ratio=0.1)
             for h, d in ((short_h, d_short), (long_h, d_long))}
    branch_at = short_h - d_short
    model, opt = build(S, S.peak_lr)
    trunk = run(S, sched[long_h], branch_at, S.peak_lr, desc="WSD trunk", model=model, optimizer=opt)
    buffer = io.BytesIO()  # a real checkpoint, loaded back with weights_only=True
    save_checkpoint(buffer, model, opt, branch_at)
    buffer.seek(0)
    branch_model, branch_opt = build(S, S.peak_lr)
    start = load_checkpoint(buffer, branch_model, branch_opt)
    short = run(S, sched[short_h], short_h - start, S.peak_lr, desc="WSD decay @ short", start_step=start,
                model=branch_model, optimizer=branch_opt)
    long_ = run(S, sched[long_h], long_h - branch_at, S.peak_lr, desc="WSD on to long", start_step=branch_at,
                model=model, optimizer=opt)
    cosine = {h: cosine_run(S, h, warmup) for h in (short_h, long_h)}
    return {"short_h": short_h, "long_h": long_h, "trunk": trunk, "short": short, "long": long_, "cosine": cosine,
            "wsd_steps": long_h + d_short, "cosine_steps": short_h + long_h}


def wsd_figure(r: dict) -> go.Figure:
    fig = go.Figure()
    def val(h):
        return h.val_step, h.val_loss
    for name, h, color, dash in (("WSD trunk", r["trunk"], plots.color(0), "solid"),
                                 ("WSD → short horizon", r["short"], plots.color(0), "dot"),
                                 ("WSD → long horizon", r["long"], plots.color(0), "dash"),
                                 (f"cosine, {r['short_h']} steps", r["cosine"][r["short_h"]], plots.color(1), "dot"),
                                 (f"cosine, {r['long_h']} steps", r["cosine"][r["long_h"]], plots.color(1), "dash")):
        x, y = val(h)
        fig.add_trace(go.Scatter(x=x, y=y, mode="lines+markers", name=name, line=dict(color=color, dash=dash),
                                 marker=dict(size=4)))
    plots.style(fig, "WSD branches from one trunk vs a cosine run per horizon", "step", "val loss")
    return fig


def wsd_stats(r: dict) -> dict:
    return {"wsd_short": r["short"].final_val_loss, "cosine_short": r["cosine"][r["short_h"]].final_val_loss,
            "wsd_long": r["long"].final_val_loss, "cosine_long": r["cosine"][r["long_h"]].final_val_loss,
            "wsd_steps": r["wsd_steps"], "cosine_steps": r["cosine_steps"]}


# --- what was measured, in words ----------------------------------------------------------------------

def budget_findings(ledger: Ledger, S: Settings, runs: dict[str, History]) -> str:
    f = {n: h.final_val_loss for n, h in runs.items()}
    best = min(f, key=f.get)
    const = f["constant (after warmup)"]
    decaying = {n: v for n, v in f.items() if n != "constant (after warmup)"}
    if S.decay_margin is not None:
        ledger.add("decay_beats_constant", f"Equal budget ({S.budget} steps): every decaying schedule ends at least "
                   f"{S.decay_margin:g} nats below constant (constant − worst decaying)",
                   const - max(decaying.values()), at_least(S.decay_margin), kind="measured")
    else:  # at the smoke profile's 250 steps the sign of this difference changes from seed to seed
        ledger.note("decay_gain_over_constant", const - max(decaying.values()))
    ledger.add("decays_agree", "… and cosine, linear and WSD end within 0.05 nats of each other (max − min)",
               max(decaying.values()) - min(decaying.values()), at_most(0.05), kind="measured")
    ledger.note("budget_final_val", f)
    mid = {shape: moderate_share(shape) for shape in ("cosine", "linear")}
    ledger.add("cosine_moderate", "\"Cosine spends more time at moderate learning rates than linear\" is backwards: "
               "cosine spends 1/3 of its decay in the middle half of the range, linear 1/2 (cosine's share ÷ "
               "linear's)", mid["cosine"] / mid["linear"], approx(2 / 3, rel=0.01), source="a source article",
               kind="computed")
    others = ", ".join(f"{n} {v:.3f}" for n, v in decaying.items())
    return (f"Same {S.budget} steps and peak lr {S.peak_lr:g}: constant ends at {const:.3f}; {others}. "
            f"Best: **{best}**. "
            + ("At this length the differences are within run-to-run noise (their sign changes with the seed), so "
               "this profile makes no claim about them; the `cpu` profile's longer runs separate them. "
               if S.decay_margin is None else "")
            + "Decaying the learning rate at the end lowers the loss because a smaller step averages out more of the "
            "gradient noise; the schedule decides *when* that happens. Cosine lingers near the peak and near the "
            f"floor, not in the middle: {mid['cosine']:.1%} of its decay steps have an lr between 25% and 75% of the "
            f"way from floor to peak, against {mid['linear']:.1%} for linear (computed) — the opposite of what one "
            "source article says.")


def warmup_findings(ledger: Ledger, S: Settings, runs: dict[str, History]) -> str:
    w = warmup_stats(runs)
    ledger.add("early_steps_large", "Without warmup, Adam's first steps are full-size: update RMS over steps 1–5 ÷ at "
               "step 50", w["early_update_rms"] / w["update_rms_at_50"], at_least(2.0), kind="measured")
    ledger.add("first_step", "Without warmup the first step changes the weights by several times more (relative to "
               "‖θ‖) than any step with warmup (ratio)",
               w["first_relative_step_no_warmup"] / w["max_relative_step_warmup"], at_least(3.0), kind="measured")
    ledger.add("bias_corrected_full", "With bias correction, Adam's first update is exactly full-size, not inflated: "
               "RMS of m̂/(√v̂+ε) over the entries with a gradient at step 1 (= |g|/(|g|+ε))",
               w["first_update_rms"], between(0.99, 1.0), source="'√v̂ is artificially small early' (a source article)",
               kind="measured")
    beta2 = BETAS[1]
    ledger.add("uncorrected_small", f"… without it, at the runs' β2 = {beta2} it would be smaller, not larger: "
               "m/(√v+ε) at step 1 ÷ (1 − β1)/√(1 − β2)",
               w["first_update_rms_uncorrected"] / uncorrected_first_step(beta2),
               approx(1.0, rel=0.01), kind="measured")
    gain = w["final_val_no_warmup"] - w["final_val_warmup"]
    if S.warmup_margin is not None:
        ledger.add("warmup_helps", f"At peak lr {S.warmup_lr:g}, warmup ends at least {S.warmup_margin:g} nats lower "
                   "(val without − with)", gain, at_least(S.warmup_margin), kind="measured")
    else:  # at the smoke profile's 200 steps the sign of this difference changes from seed to seed
        ledger.note("warmup_final_val_gain", gain)
    ledger.note("warmup", w)
    return (f"At peak lr {S.warmup_lr:g} without warmup, Adam's normalised update had RMS "
            f"{w['early_update_rms']:.2f} over "
            f"the first 5 steps and {w['update_rms_at_50']:.2f} at step 50: the first steps move every weight by "
            f"nearly the full lr. The very first step changed the weights by {w['first_relative_step_no_warmup']:.0%} "
            f"of their norm; with warmup the largest relative step was {w['max_relative_step_warmup']:.0%}. Final val "
            f"loss: {w['final_val_no_warmup']:.3f} without warmup, {w['final_val_warmup']:.3f} with"
            + (" (runs this short do not settle which ends lower: the sign of the difference changes with the seed, "
               "so this profile makes no claim about it)" if S.warmup_margin is None else "")
            + f". The largest training loss after step 10: {w['max_loss_after_10_no_warmup']:.2f} without warmup "
            f"(step {w['spike_step_no_warmup']}), {w['max_loss_after_10_warmup']:.2f} with (step "
            f"{w['spike_step_warmup']}, lr {w['spike_lr_warmup']:.2g}; warmup ends at step {w['warmup_end']}). "
            "Warmup does not make a too-high peak lr safe, it only spares the first steps: the warmed-up run still "
            "meets large steps as its lr climbs, after the loss has already fallen — here its spike was the "
            + ("larger" if w["max_loss_after_10_warmup"] > w["max_loss_after_10_no_warmup"] else "smaller")
            + " one.\n\n"
            "**Why the first steps are full-size.** One source says warmup exists because Adam's √v̂ is "
            "\"artificially small early\". With bias correction it is not: v̂ is the running mean of g², so at step "
            f"1 m̂/√v̂ = g/|g| — measured RMS {w['first_update_rms']:.4f} over the entries that had a gradient. Every "
            "weight moves by the full lr whatever its gradient's size, which is the reason to warm up. Without bias "
            f"correction the first update would be (1 − β1)/√(1 − β2) = {w['first_update_rms_uncorrected']:.3f} "
            f"(measured) at β2 = {beta2} — *smaller*; only at β2 = 0.999 would it be larger "
            f"({uncorrected_first_step(0.999):.2f}, "
            "computed). The "
            "artificially small √v is the uncorrected one, which no modern optimizer uses.")


def wsd_findings(ledger: Ledger, r: dict) -> str:
    s = wsd_stats(r)
    ledger.add("wsd_short", "WSD branched at the short horizon matches a cosine run of that length (|Δ val| ≤ 0.05)",
               abs(s["wsd_short"] - s["cosine_short"]), at_most(0.05), kind="measured")
    ledger.add("wsd_long", "… and at the long horizon (|Δ val| ≤ 0.05)", abs(s["wsd_long"] - s["cosine_long"]),
               at_most(0.05), kind="measured")
    ledger.add("wsd_cheaper", "WSD needs fewer steps for both horizons than two cosine runs (computed from the "
               "schedules' lengths)", s["wsd_steps"] < s["cosine_steps"], is_true(), kind="computed")
    ledger.note("wsd", s)
    return (f"Short horizon ({r['short_h']} steps): WSD {s['wsd_short']:.3f} vs cosine {s['cosine_short']:.3f}. Long "
            f"horizon ({r['long_h']} steps): WSD {s['wsd_long']:.3f} vs cosine {s['cosine_long']:.3f}. Getting both "
            f"models cost WSD {s['wsd_steps']} steps (one trunk plus the short branch's decay) and cosine "
            f"{s['cosine_steps']} steps (two runs from scratch: a cosine run must know its length in advance).")
