"""Lesson 12, section 3: an isoFLOP sweep — at each budget, which model size reaches the lowest loss."""

import ipywidgets as W
import numpy as np
import plotly.graph_objects as go

from labtools import plots
from labtools.claims import Findings, Ledger, at_most
from labtools.compute import Convention, flops_by_convention
from labtools.progress import progress
from labtools.schedules import bind, warmup_cosine
from labtools.train import TrainConfig, train
from labtools.runcache import RunCache
from labtools.widgets import Panel
from lessons.compute_budget import Settings, corpus, gpt


def _sweep_run(width: int, budget: float, layers: int, batch: int, block: int, lr: float, seed: int) -> dict:
    """Train a `layers`-deep GPT of width `width` (16-wide heads) for `budget` FLOPs: steps = budget ÷ the FLOPs
    of a step (6P + 12Lsh per token, P the matrix weights — exact, section 1), cosine to 10% after a 10% warm-up."""
    model = gpt(layers, width, max(1, width // 16), block, seed)
    fpt = flops_by_convention(model, block)[Convention.MATMUL]
    steps = max(1, round(budget / (fpt * batch * block)))
    schedule = bind(warmup_cosine, warmup=max(1, steps // 10), total=steps, min_ratio=0.1)
    cfg = TrainConfig(steps=steps, batch_size=batch, block_size=block, lr=lr, eval_every=steps, eval_batches=8,
                      lr_schedule=schedule, seed=seed, progress=False)
    hist = train(model, corpus(), cfg)
    return {"width": width, "budget": budget, "n_params": model.num_params(), "steps": steps,
            "tokens": steps * batch * block, "flops": steps * batch * block * fpt, "val_loss": hist.final_val_loss}


SWEEP = RunCache(_sweep_run)  # one training run per configuration: the panel redraws from here


def run(S: Settings) -> list[dict]:
    """Every width at every budget, each model trained on its budget's FLOPs."""
    configs = [dict(width=w, budget=b, layers=S.sweep_layers, batch=S.sweep_batch, block=S.sweep_block,
                    lr=S.sweep_lr, seed=S.seed) for b in S.budgets for w in S.widths]
    return [SWEEP(**c) for c in progress(configs, desc="isoFLOP sweep")]


def fit(runs: list[dict]) -> dict[float, dict]:
    """Per budget: a parabola of val loss in log P through its runs, and its minimum — the loss-optimal size —
    with the tokens that budget then buys and D/P. A minimum outside the
    sizes tried (or a parabola that opens downward) is reported as such, with the best run instead. P counts every
    parameter and D = C ÷ 6P, as Chinchilla counts them (Chinchilla writes N)."""
    out = {}
    for budget in sorted({r["budget"] for r in runs}):
        rs = sorted((r for r in runs if r["budget"] == budget), key=lambda r: r["n_params"])
        x = np.log([r["n_params"] for r in rs])
        y = np.array([r["val_loss"] for r in rs])
        a, b, c = np.polyfit(x, y, 2)
        best = rs[int(np.argmin(y))]
        interior = a > 0 and x[0] < -b / (2 * a) < x[-1]
        n_opt = float(np.exp(-b / (2 * a))) if interior else float(best["n_params"])
        tokens = budget / (6 * n_opt)  # Chinchilla's accounting, C = 6·N·D
        out[budget] = {"coef": (float(a), float(b), float(c)), "interior": bool(interior), "n_opt": n_opt,
                       "tokens": tokens, "tokens_per_param": tokens / n_opt, "best": best}
    return out


def figure(runs: list[dict], fits: dict[float, dict], highlight: float | None = None) -> go.Figure:
    fig = go.Figure()
    for i, (budget, f) in enumerate(fits.items()):
        rs = sorted((r for r in runs if r["budget"] == budget), key=lambda r: r["n_params"])
        on = highlight is None or budget == highlight
        c = plots.color(i)
        fig.add_trace(go.Scatter(x=[r["n_params"] for r in rs], y=[r["val_loss"] for r in rs], mode="markers",
                                 marker=dict(color=c, size=9), opacity=1 if on else 0.3, name=f"{budget:.0e} FLOPs"))
        xs = np.linspace(np.log(rs[0]["n_params"]), np.log(rs[-1]["n_params"]), 60)
        fig.add_trace(go.Scatter(x=np.exp(xs), y=np.polyval(f["coef"], xs), mode="lines", showlegend=False,
                                 line=dict(color=c, dash="dot", width=2 if on else 1), opacity=1 if on else 0.3))
        if f["interior"]:
            fig.add_trace(go.Scatter(x=[f["n_opt"]], y=[float(np.polyval(f["coef"], np.log(f["n_opt"])))],
                                     mode="markers", marker=dict(color=c, symbol="star", size=15), showlegend=False,
                                     opacity=1 if on else 0.3, hovertext=f"best P ≈ {f['n_opt']:,.0f}, D/P ≈ "
                                     f"{f['tokens_per_param']:.1f}"))
    plots.style(fig, title="isoFLOP curves: val loss after a fixed compute budget (★ the fitted optimum)",
                xaxis="parameters P", yaxis="val loss (nats/char)", height=420)
    fig.update_xaxes(type="log")
    return fig


def panel(runs: list[dict], fits: dict[float, dict]) -> Panel:
    """Pick a budget: its isoFLOP curve stands out (from the cached runs: no training)."""
    budgets = list(fits)
    choice = W.Dropdown(options=[(f"{b:.0e} FLOPs", b) for b in budgets], value=budgets[-1],
                        description="budget")
    return Panel(lambda budget: figure(runs, fits, budget), {"budget": choice}, title="isoFLOP curves")


def findings(ledger: Ledger, S: Settings, runs: list[dict], fits: dict[float, dict]) -> Findings:
    # steps = round(budget ÷ FLOPs per step): within half a step by construction, so a note (the exactness of the
    # FLOPs per step itself is section 1's claim, against the counter)
    ledger.note("budget_spent", max(abs(r["flops"] / r["budget"] - 1) for r in runs))
    best = [fits[b]["best"]["val_loss"] for b in S.budgets]
    ledger.add("more_compute_lower_loss", "More compute, lower loss: each budget's best run beats the smaller "
               "budget's best (largest difference best(C_i+1) − best(C_i), measured)",
               max(b - a for a, b in zip(best, best[1:])), at_most(0), kind="measured")
    largest = {b: max((r for r in runs if r["budget"] == b), key=lambda r: r["n_params"]) for b in S.budgets}
    small = S.budgets[0]
    # whether the largest model loses at the smallest budget depends on which sizes the profile sweeps: a note
    ledger.note("largest_minus_best_at_smallest_budget", largest[small]["val_loss"] - fits[small]["best"]["val_loss"])
    ledger.note("isoflop_runs", runs)
    ledger.note("isoflop_fits", {f"{b:.0e}": {k: v for k, v in f.items() if k != "best"} for b, f in fits.items()})
    inside = [(b, f["n_opt"]) for b, f in fits.items() if f["interior"]]
    def edge(b: float) -> str:
        sizes = sorted(r["n_params"] for r in runs if r["budget"] == b)
        return "smallest tried: the minimum lies below" if fits[b]["best"]["n_params"] == sizes[0] else \
            "largest tried: the minimum lies above" if fits[b]["best"]["n_params"] == sizes[-1] else "best run"

    rows = "\n".join(
        f"| {b:.0e} | " + (f"{f['n_opt']:,.0f} (fitted) | {f['tokens_per_param']:.0f} |" if f["interior"] else
                            f"{f['best']['n_params']:,} ({edge(b)}) | "
                            f"{f['best']['tokens'] / f['best']['n_params']:.0f} |") for b, f in fits.items())
    table = "| budget, FLOPs | best size P | tokens per parameter |\n|---|---|---|\n" + rows
    if len(inside) >= 2:  # how the optimum moves with compute: P_opt ∝ C^a
        a = float(np.polyfit(np.log([b for b, _ in inside]), np.log([n for _, n in inside]), 1)[0])
        ledger.note("n_opt_exponent", a)
        answer = [f"Neither the smallest nor the largest: at each of the {len(inside)} budgets with a minimum inside "
                  "the sizes tried, a middle size won, and the best size grew with the budget.",
                  f"Fitted, the best size grew as C^{a:.2f} (Chinchilla: about C^0.50). From so few points so close "
                  "together the exponent is uncertain by tenths, and a laptop sweep cannot check the 20 tokens per "
                  "parameter."]
    elif inside:
        answer = ["A middle size won at one budget; the others had their best size at the edge of the sizes tried, "
                  "so this sweep cannot say how the best size moves with compute. The `cpu` profile's larger "
                  "budgets can."]
    elif all(edge(b).startswith("smallest") for b in fits):
        answer = ["At budgets this small, the smallest model tried won: a bigger one cannot see enough tokens.",
                  "The best size lies below the sizes tried, so this sweep cannot say how it moves with the budget; "
                  "the `cpu` profile's larger budgets can."]
    else:
        answer = ["No budget had its best size inside the sizes tried, so this sweep cannot place the optimum; the "
                  "`cpu` profile sweeps larger budgets."]
    return Findings(answer, [table])
