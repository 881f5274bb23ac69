"""Lesson 08, the picture of who holds what: ranks × (parameters, gradients, optimizer state) for DDP and ZeRO 1-3,
each cell the share of the whole model's bytes that rank measured from its own tensors (section 1's launch), beside
what labtools.budget predicts. Drawn from the run, so it cannot disagree with it."""

import plotly.graph_objects as go

from labtools import plots
from lessons.fsdp_zero import Strategy, predicted

PARTS = (("params", "parameters"), ("grads", "gradients"), ("optimizer", "optimizer state"))
SHOWN = (Strategy.DDP, Strategy.ZERO1, Strategy.ZERO2, Strategy.ZERO3)


def shares(res: list[dict], strategy: Strategy) -> list[list[float]]:
    """[rank][part]: this rank's measured bytes ÷ the whole model's (DDP's) bytes of that part. ZeRO-2's parameters
    are counted between forward and backward, when it holds them whole."""
    whole = res[0][Strategy.DDP]
    out = []
    for r in res:
        m = r[strategy]
        row = []
        for key, _ in PARTS:
            held = m["held_after_forward"] if key == "params" and strategy is Strategy.ZERO2 else m[key]
            row.append(held / whole[key])
        out.append(row)
    return out


def figure(shard: dict[int, list[dict]]) -> go.Figure:
    """One grid per strategy at the largest world size: a cell's colour and number are the share it holds."""
    world = max(shard)
    res = shard[world]
    n = res[0][Strategy.DDP]["n_params"]
    fig = plots.subplots(1, len(SHOWN), [s.short for s in SHOWN], height=330, legend="below", shared_yaxes=True,
                         horizontal_spacing=0.03)
    for col, s in enumerate(SHOWN, 1):
        z = shares(res, s)
        p = predicted(n, s, world)
        whole = predicted(n, Strategy.DDP, world)
        text = [[f"{v:.0%}" if v > 0.995 else f"{v:.3f}" for v in row] for row in z]
        hover = [[f"rank {r}, {label}: share {z[r][i]:.4f} measured, {p[key] / whole[key]:.4f} predicted"
                  for i, (key, label) in enumerate(PARTS)] for r in range(world)]
        fig.add_trace(go.Heatmap(z=z, x=[label for _, label in PARTS], y=[f"rank {r}" for r in range(world)],
                                 zmin=0, zmax=1, colorscale="Blues", showscale=col == len(SHOWN), text=text,
                                 texttemplate="%{text}", hovertext=hover, hoverinfo="text",
                                 colorbar=dict(title="share of<br>the model")), row=1, col=col)
    fig.update_yaxes(autorange="reversed")
    fig.update_layout(title=f"Who holds what: each rank's share of the model's bytes, measured ({world} ranks; "
                            "ZeRO-2's parameters between forward and backward)")
    return fig
