"""Lesson 02, section 3: why warm-up — the size of Adam's first steps, and an ablation at a high lr."""

import math

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from labtools import plots
from labtools.claims import Findings, Ledger, approx, at_least, between
from labtools.schedules import bind, warmup_cosine, warmup_linear
from labtools.train import History, StepInfo
from lessons.lr_schedules import BETAS, Settings, train_run


def step_probe(info: StepInfo):
    """Log Adam's normalised update RMS (m̂/(√v̂+ε), 1.0 = every weight moves by lr) and the relative step ‖Δθ‖/‖θ‖;
    at the first step also that RMS over the entries that had a gradient, with and without bias correction."""
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
            if t == 1:  # the first step's update is all the lesson reads of these two
                had = v > 0
                seen += (u[had] ** 2).sum().item()
                raw += ((m / (v.sqrt() + group["eps"]))[had] ** 2).sum().item()
                k += int(had.sum())
    rms = math.sqrt(num / n)
    info.log["update_rms"] = rms
    if k:
        info.log["update_rms_seen"] = math.sqrt(seen / k)
        info.log["update_rms_uncorrected"] = math.sqrt(raw / k)
    info.log["relative_step"] = info.lr * rms * math.sqrt(n) / math.sqrt(sq)


def run(S: Settings) -> dict[str, History]:
    """High peak lr, cosine to 10%, clipping off (so warmup alone is tested): none vs 10% warmup."""
    out = {}
    for warmup in (0, S.warmup_steps // 10):
        name = f"warmup {warmup} steps" if warmup else "no warmup"
        schedule = bind(warmup_cosine, warmup=warmup, total=S.warmup_steps, min_ratio=0.1)
        out[name] = train_run(S, schedule, S.warmup_steps, S.warmup_lr, desc=name, callback=step_probe, grad_clip=None)
    return out


def figure(runs: dict[str, History], first: int = 60) -> go.Figure:
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
    plots.style(fig, "Adam's first steps with and without a warm-up", height=400)
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


def findings(ledger: Ledger, S: Settings, runs: dict[str, History]) -> Findings:
    w = warmup_stats(runs)
    ledger.add("early_steps_large", "Without warmup, Adam's first steps are full-size: update RMS over steps 1–5 ÷ at "
               "step 50", w["early_update_rms"] / w["update_rms_at_50"], at_least(2.0), kind="measured")
    ledger.add("first_step", "Without warmup the first step changes the weights by several times more (relative to "
               "‖θ‖) than any step with warmup (ratio)",
               w["first_relative_step_no_warmup"] / w["max_relative_step_warmup"], at_least(3.0), kind="measured")
    ledger.add("bias_corrected_full", "With bias correction, Adam's first update is exactly full-size, not inflated: "
               "RMS of m̂/(√v̂+ε) over the entries with a gradient at step 1 (= |g|/(|g|+ε))",
               w["first_update_rms"], between(0.99, 1.0),
               source="'√v̂ is artificially small early' (a common explanation of warmup)", kind="measured")
    beta2 = BETAS[1]
    ledger.add("uncorrected_small", f"… without it, at the runs' β2 = {beta2} it would be smaller, not larger: "
               "m/(√v+ε) at step 1 ÷ (1 − β1)/√(1 − β2)",
               w["first_update_rms_uncorrected"] / uncorrected_first_step(beta2),
               approx(1.0, rel=0.01), kind="measured")
    gain = w["final_val_no_warmup"] - w["final_val_warmup"]
    if S.warmup_margin is not None:
        ledger.add("warmup_helps", f"At peak lr {S.warmup_lr:g}, warmup ends at least {S.warmup_margin:g} nats lower "
                   "(val without − with)", gain, at_least(S.warmup_margin), kind="measured")
    else:  # in the smoke profile's 120 steps the sign of this difference changes from seed to seed
        ledger.note("warmup_final_val_gain", gain)
    ledger.note("warmup", w)
    settled = "" if S.warmup_margin is None else f" At this length warm-up also ends at least {S.warmup_margin:g} " \
                                                  "nats lower."
    return Findings([
        f"Because Adam's first steps are full-size: without warm-up the first step changed the weights by "
        f"**{w['first_relative_step_no_warmup']:.0%}** of their norm, {w['first_relative_step_no_warmup'] / w['max_relative_step_warmup']:.0f}× "
        "any step with warm-up.",
        ("What warm-up buys is that gentle start. Whether it also ends lower, runs this short cannot say: the "
         "final losses swap places from seed to seed." if S.warmup_margin is None else
         "What warm-up buys is that gentle start." + settled),
    ], [
        f"Adam's normalised update, without warm-up: RMS {w['early_update_rms']:.2f} over the first 5 steps, "
        f"{w['update_rms_at_50']:.2f} at step 50.",
        f"Final validation loss: {w['final_val_no_warmup']:.3f} without warm-up, {w['final_val_warmup']:.3f} with.",
        f"Largest training loss after step 10: {w['max_loss_after_10_no_warmup']:.2f} without warm-up, "
        f"{w['max_loss_after_10_warmup']:.2f} with it, once its rate neared the peak: warm-up does not make a "
        "too-high peak safe.",
        f"At step 1, m̂/√v̂ = g/|g|: measured RMS {w['first_update_rms']:.4f}. Without bias correction it would be "
        f"{w['first_update_rms_uncorrected']:.3f} at β2 = {beta2} (measured): smaller, not larger.",
    ])
