"""Lesson 01, section 3: the final loss over a grid of learning rates and weight decays."""

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from labtools import plots
from labtools.claims import Findings, Ledger, at_least
from labtools.progress import progress
from labtools.train import History
from labtools.widgets import Panel
from lessons.adamw_vs_adam_l2 import OPTIMIZERS, Settings
from lessons.adamw_vs_adam_l2.groups import train_run


def run(S: Settings) -> dict[tuple, History]:
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


def figure(S: Settings, runs: dict[tuple, History]) -> go.Figure:
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
                                 title=f"η = {lr:g}, λ = {wd:g}")

    return Panel(draw, controls, title="One cell of the landscape: both optimizers' curves")


def findings(ledger: Ledger, S: Settings, grid: dict[tuple, History]) -> Findings:
    b = {name: best_cell(S, grid, name) for name in OPTIMIZERS}
    spread = {name: wd_spread(S, grid, name) for name in OPTIMIZERS}
    gain = {name: grid[(name, b[name][0], S.grid_wds[0])].final_val_loss - b[name][2] for name in OPTIMIZERS}
    ratio = spread["AdamL2"] / max(spread["AdamW"], 1e-4)
    ledger.add("landscape", "Landscape: λ matters far more to Adam + L2 (val-loss spread across the λ grid at the "
               "best η, Adam + L2 ÷ AdamW)", ratio, at_least(3), kind="measured")
    ledger.note("best_cells", b)
    ledger.note("wd_spread", spread)
    answer = (f"Yes: across the λ grid, Adam + L2's final loss moved **{ratio:.0f}×** as much as AdamW's, so its λ "
              "must be tuned with care.")
    apart = b["AdamL2"][2] - b["AdamW"][2]
    lower = "Adam + L2's" if apart < 0 else "AdamW's"
    # one seed, one short run per cell: which form reaches the lower loss is a comparison of recipes, not settled here
    which = (f"Which form trains better, one seed at {S.grid_steps} steps a cell cannot settle: their best cells ended "
             f"**{abs(apart):.3f}** nats apart, {lower} the lower.")
    best_wd, largest = b["AdamW"][1], b["AdamW"][1] == max(S.grid_wds)
    where = "the grid's largest λ" if largest else f"λ = {best_wd:g}"
    why = ("since a model trained this briefly hardly overfits. Loshchilov & Hutter's gain for AdamW came from long "
           "runs, where decay has time to act.")
    if best_wd == min(S.grid_wds):
        verdict = "Nor which λ suits AdamW: the grid's smallest λ did best, " + why
    elif gain["AdamW"] < 0.02:  # AdamW's best λ hardly beats the smallest: the runs are too short to overfit
        verdict = (f"Nor which λ suits AdamW: its best, {where}, beat the smallest by only **{gain['AdamW']:.3f}** "
                   "nats, " + why)
    else:
        verdict = (f"For AdamW, weight decay helped: its best, {where}, beat the smallest by **{gain['AdamW']:.2f}** "
                   "nats" + (", so a λ beyond the grid may help more." if largest else "."))
    table = ("| | best η | best λ | its validation loss | spread over λ at that η |\n|---|---|---|---|---|\n"
             + "\n".join(f"| {'Adam + L2' if n == 'AdamL2' else n} | {b[n][0]:g} | {b[n][1]:g} | {b[n][2]:.3f} | "
                         f"{spread[n]:.3f} |" for n in OPTIMIZERS))
    return Findings([answer, which, verdict], [
        table,
        f"At the grid's corner η·λ·steps ≈ {max(S.grid_lrs) * max(S.grid_wds) * S.grid_steps:.2g}: only there does "
        "AdamW's decay bite.",
    ])
