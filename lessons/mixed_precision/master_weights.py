"""Lesson 04, section 5: why fp32 master weights — the updates bf16 weights cannot hold."""

from dataclasses import replace

import numpy as np
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from labtools import evidence, plots
from labtools.claims import Findings, Ledger, above, at_least, at_most, in_words
from labtools.schedules import bind, warmup_cosine
from labtools.train import History, StepInfo, TrainConfig, train
from lessons.mixed_precision import Settings, build, corpus


def _unchanged_probe():
    """Log the fraction of weights a step left exactly unchanged (all, and LayerNorm gains)."""
    snap = {}

    def probe(info: StepInfo):
        same = n = 0
        ln = []
        for name, p in info.model.named_parameters():
            prev = snap.get(name)
            if prev is not None:
                eq = p.detach() == prev
                same += eq.sum().item()
                n += eq.numel()
                if "ln_" in name and name.endswith("weight"):
                    ln.append(eq.float().mean().item())
            snap[name] = p.detach().clone()
        info.log["unchanged"] = same / n if n else 0.0
        info.log["ln_unchanged"] = float(np.mean(ln)) if ln else 0.0

    return probe


MASTER, PURE = "fp32 master + bf16 compute", "pure bf16 weights"


def over_seeds(S: Settings, runs: dict[str, History]) -> tuple[list[float], list[float]] | None:
    """(pure bf16's final validation losses, the master's) over S.seeds seeds, this run's first; None for one."""
    if S.seeds < 2:
        return None
    pure, master = [runs[PURE].final_val_loss], [runs[MASTER].final_val_loss]
    for k in range(1, S.seeds):
        more = run(replace(S, seed=S.seed + k), probe=False)
        pure.append(more[PURE].final_val_loss)
        master.append(more[MASTER].final_val_loss)
    return pure, master


def run(S: Settings, probe: bool = True) -> dict[str, History]:
    """Same run twice: fp32 weights with bf16 autocast (mixed precision), and weights stored in bf16 (pure)."""
    out = {}
    for name in (MASTER, PURE):
        model = build(S)
        if name.startswith("pure"):
            model = model.to(torch.bfloat16)
        opt = torch.optim.AdamW(model.parameters(), lr=S.master_lr, betas=(0.9, 0.95), weight_decay=0.1)
        cfg = TrainConfig(steps=S.master_steps, batch_size=S.batch_size, block_size=S.block_size, lr=S.master_lr,
                          precision="bf16" if name.startswith("fp32") else "fp32",
                          lr_schedule=bind(warmup_cosine, warmup=S.master_steps // 10, total=S.master_steps,
                                           min_ratio=0.1), eval_every=max(1, S.master_steps // 5),
                          eval_batches=S.eval_batches, seed=S.seed,
                          desc=name if S.seeds < 2 or probe else f"{name}, seed {S.seed}")
        out[name] = train(model, corpus(), cfg, optimizer=opt, callback=_unchanged_probe() if probe else None)
    return out


def master_stats(runs: dict[str, History]) -> dict:
    out = {}
    for name, h in runs.items():
        u, ln = np.array(h.extra["unchanged"]), np.array(h.extra["ln_unchanged"])
        late = slice(len(u) * 3 // 4, None)
        out[name] = {"unchanged_late": float(u[late].mean()), "ln_unchanged_late": float(ln[late].mean()),
                     "final_val": h.final_val_loss}
    return out


def figure(runs: dict[str, History]) -> go.Figure:
    fig = make_subplots(rows=1, cols=2, subplot_titles=("validation loss", "fraction of weights a step left unchanged"))
    for i, (name, h) in enumerate(runs.items()):
        c = plots.color(i)
        fig.add_trace(go.Scatter(x=h.val_step, y=h.val_loss, mode="lines+markers", name=name, line=dict(color=c),
                                 legendgroup=name), row=1, col=1)
        fig.add_trace(go.Scatter(x=h.step, y=h.extra["unchanged"], mode="lines", line=dict(color=c), showlegend=False,
                                 legendgroup=name), row=1, col=2)
        fig.add_trace(go.Scatter(x=h.step, y=h.extra["ln_unchanged"], mode="lines", line=dict(color=c, dash="dot"),
                                 name=f"{name}: LayerNorm gains", legendgroup=name), row=1, col=2)
    fig.update_xaxes(title_text="step")
    plots.style(fig, "bf16 weights against an fp32 master copy: the loss, and the weights a step leaves "
                     "unchanged", height=420)
    return fig


def findings(ledger: Ledger, runs: dict[str, History],
             seeds: tuple[list[float], list[float]] | None = None) -> Findings:
    st = master_stats(runs)
    a, b = st[MASTER], st[PURE]
    paired = evidence.paired(*seeds) if seeds else None  # pure − master, seed by seed (lesson 18)
    if paired is not None:
        ledger.add("master_lower_loss", f"The fp32 master copy ends with a lower validation loss than pure bf16 "
                   f"weights (pure − master, paired over {paired.n} seeds, nats)", paired, above(0.0),
                   kind="measured")
    else:
        ledger.note("pure_minus_master", b["final_val"] - a["final_val"])
    ledger.add("bf16_stagnates", "Pure bf16 weights: late in training a step leaves most weights unchanged "
               "(fraction unchanged)", b["unchanged_late"], at_least(0.3), kind="measured")
    ledger.add("ln_frozen", "Pure bf16 weights: late in training the LayerNorm gains are frozen (fraction unchanged)",
               b["ln_unchanged_late"], at_least(0.9), kind="measured", detail=True)
    ledger.add("master_moves", "With fp32 master weights, almost every weight moves (fraction unchanged)",
               a["unchanged_late"], at_most(0.01), kind="measured", detail=True)
    ledger.note("master", st)
    return Findings([
        f"Because bf16 weights stop moving: late in training a step left **{b['unchanged_late']:.0%}** of them exactly "
        f"unchanged, and {b['ln_unchanged_late']:.0%} of the LayerNorm gains.",
        f"With an fp32 master copy almost every weight moves at every step ({a['unchanged_late']:.1%} unchanged)"
        + (f", and over {in_words(paired.n)} seeds the run ends **{paired.estimate:.3f}** nats lower, an interval "
           "clear of zero." if paired is not None and paired.low > 0 else
           ". Whether that lowers the final loss, one short run cannot tell; the `cpu` profile compares them over "
           "seeds." if paired is None else
           f"; over {in_words(paired.n)} seeds the final losses' interval reaches zero."),
    ], [
        f"Final validation loss: {b['final_val']:.3f} with pure bf16 weights, {a['final_val']:.3f} with the master.",
        *([evidence.table([("pure bf16 − fp32 master, paired by seed", paired)])] if paired else []),
        f"A bf16 weight near 1.0 moves in steps of 2⁻⁷: an Adam update of about the learning rate, "
        f"{runs['pure bf16 weights'].lr[-1]:.1e} at the end, rounds back to where it was.",
    ])
