"""Lesson 01, section 5: β2 = 0.999 against 0.95 when the gradient scale surges."""

import math

import numpy as np
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from labtools import plots
from labtools.claims import Findings, Ledger, at_least
from labtools.train import History, StepInfo, branches
from lessons.adamw_vs_adam_l2 import Settings
from lessons.adamw_vs_adam_l2.groups import train_run

BETA2S = (0.999, 0.95)


def update_rms_probe(info: StepInfo):
    """Log the RMS of Adam's normalised update m̂/(√v̂+ε) over all parameters (1.0 = a full lr step)."""
    squares, n = [], 0
    opt = info.optimizer
    for group in opt.param_groups:
        beta1, beta2 = group["betas"]
        for p in group["params"]:
            s = opt.state[p]
            u = (s["exp_avg"] / (1 - beta1 ** s["step"])) / ((s["exp_avg_sq"] / (1 - beta2 ** s["step"])).sqrt()
                                                          + group["eps"])
            squares.append((u**2).sum())
            n += u.numel()
    info.log["update_rms"] = math.sqrt(torch.stack(squares).sum().item() / n)  # one sync per step, not per tensor


def run(S: Settings) -> tuple[dict[float, History], dict[float, History]]:
    """AdamW at a high constant lr (50-step warmup), clipping off, for each β2: natural and surged runs, the surged
    one's every gradient multiplied by S.surge_factor (a gradient hook) from the middle step on.

    The two are the same run up to the middle step, so it is trained once and saved there (lesson 11's checkpoint:
    weights, optimizer state, data position, history), then continued twice from that checkpoint, once as it was
    and once with the surge: each continues bit for bit as a run from scratch would."""
    natural, surged = {}, {}
    for beta2 in BETA2S:
        scale = [1.0]

        def hooks(model, scale=scale):
            for p in model.parameters():
                p.register_hook(lambda g: g * scale[0])

        def part(desc, kw, evals=10, callback=update_rms_probe, beta2=beta2):
            return train_run(S, "AdamW", S.beta2_lr, 0.1, S.beta2_steps, betas=(0.9, beta2), callback=callback,
                             grad_clip=None, warmup=50, hooks=hooks, evals=evals, desc=f"β2={beta2}{desc}", **kw)

        def surge(kw, scale=scale):
            scale[0] = S.surge_factor
            return part(" surge", kw)

        natural[beta2], surged[beta2] = branches(
            S.beta2_steps // 2, lambda kw: part(" to the surge", kw),
            lambda kw: part("", kw, evals=2, callback=None),  # the natural second half: loss and final val only
            surge)
    return natural, surged


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


def figure(natural: dict[float, History], surged: dict[float, History], steps: int) -> go.Figure:
    fig = make_subplots(rows=1, cols=3, subplot_titles=("high learning rate: training loss", "gradient ×surge: update RMS",
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
    plots.style(fig, "How β₂ shapes Adam's steps: at a high learning rate, and after a gradient surge", height=400)
    return fig


def findings(ledger: Ledger, S: Settings, natural: dict[float, History], surged: dict[float, History]) -> Findings:
    n = {b: spike_stats(natural[b]) for b in BETA2S}
    st = {b: surge_stats(surged[b], S.beta2_steps) for b in BETA2S}
    ratio = st[0.999]["overshoot"] / st[0.95]["overshoot"]
    rise = st[0.999]["val_rise"] - st[0.95]["val_rise"]
    ledger.add("surge_overshoot", f"After a ×{S.surge_factor:g} gradient surge, β2 = 0.999's update overshoots "
               "more than β2 = 0.95's (ratio of their update-RMS overshoots)", ratio, at_least(1.25), kind="measured")
    ledger.add("surge_val", "After the surge, β2 = 0.999's validation loss also rises more than β2 = 0.95's (val rise "
               "of 0.999 − val rise of 0.95)", rise, at_least(0.02), kind="measured")
    for b in BETA2S:
        ledger.note(f"natural_beta2_{b}", n[b])
        ledger.note(f"surge_beta2_{b}", st[b])
    table = ("| | $\\beta_2 = 0.999$ | $\\beta_2 = 0.95$ |\n|---|---|---|\n"
             f"| no surge: loss jumps above 0.3 nats | {n[0.999]['jumps']} | {n[0.95]['jumps']} |\n"
             f"| no surge: final validation loss | {n[0.999]['final_val']:.3f} | {n[0.95]['final_val']:.3f} |\n"
             f"| surge: update RMS before → largest after | {st[0.999]['update_before']:.2f} → "
             f"{st[0.999]['update_max_after']:.2f} | {st[0.95]['update_before']:.2f} → "
             f"{st[0.95]['update_max_after']:.2f} |\n"
             f"| surge: overshoot | {st[0.999]['overshoot']:.1f}× | {st[0.95]['overshoot']:.1f}× |\n"
             f"| surge: validation loss rise | {st[0.999]['val_rise']:.3f} | {st[0.95]['val_rise']:.3f} |")
    d = n[0.95]["final_val"] - n[0.999]["final_val"]  # > 0: β2 = 0.95 ended higher
    j95, j999 = n[0.95]["jumps"], n[0.999]["jumps"]
    # one seed: what a high learning rate alone shows is stated, not generalised
    if j95 < j999 and d < -0.05:
        calm = (f"At a high learning rate alone, $\\beta_2 = 0.95$ was the steadier here: fewer loss jumps, and it "
                f"ended **{-d:.2f}** nats lower, on one seed.")
    else:
        than = "fewer loss jumps than" if j95 < j999 else "as many loss jumps as" if j95 == j999 else \
            "more loss jumps than"
        calm = (f"A high learning rate alone did not clearly favour $\\beta_2 = 0.95$: it had {than} 0.999 and ended "
                f"**{abs(d):.2f}** nats {'higher' if d > 0 else 'lower'}, on one seed.")
    return Findings([
        calm,
        f"Where it does show is a change of scale: after a ×{S.surge_factor:g} surge, $\\beta_2 = 0.999$'s update "
        f"overshot **{ratio:.1f}×** as far as $\\beta_2 = 0.95$'s and its validation loss rose more. A slow v̂ lags "
        "behind a gradient that suddenly grows.",
    ], [table, f"Learning rate {S.beta2_lr:g}, clipping off; the surge starts at step {S.beta2_steps // 2}."])
