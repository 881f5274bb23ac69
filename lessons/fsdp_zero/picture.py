"""Lesson 08, the picture of who holds what: ranks × (parameters, gradients, optimizer state) for DDP and ZeRO 1-3,
each cell the share of the whole model's bytes that rank measured from its own tensors (section 1's launch), beside
what labtools.budget predicts. Drawn from the run, so it cannot disagree with it."""

import plotly.graph_objects as go

from labtools import plots
from labtools.claims import Findings, Ledger, is_true
from lessons.fsdp_zero import StateBytes, Strategy, predicted
from lessons.fsdp_zero.ranks import ShardingResult, StrategyResult

PARTS = ("parameters", "gradients", "optimizer state")
SHOWN = (Strategy.DDP, Strategy.ZERO1, Strategy.ZERO2, Strategy.ZERO3)


def parts(b: StateBytes | StrategyResult, held: bool = False) -> tuple[int, int, int]:
    """The bytes of PARTS, in order; held: the parameters as held between forward and backward."""
    return (b.held_after_forward if held else b.params), b.grads, b.optimizer


def shares(res: list[ShardingResult], strategy: Strategy) -> list[list[float]]:
    """[rank][part]: this rank's measured bytes ÷ the whole model's (DDP's) bytes of that part. ZeRO-2's parameters
    are counted between forward and backward, when it holds them whole."""
    whole = parts(res[0].strategies[Strategy.DDP])
    return [[held / w for held, w in zip(parts(r.strategies[strategy], held=strategy is Strategy.ZERO2), whole)]
            for r in res]


def figure(shard: dict[int, list[ShardingResult]]) -> go.Figure:
    """One grid per strategy at the largest world size: a cell's colour and number are the share it holds."""
    world = max(shard)
    res = shard[world]
    n = res[0].n_params
    fig = plots.subplots(1, len(SHOWN), [s.short for s in SHOWN], height=330, legend="below", shared_yaxes=True,
                         horizontal_spacing=0.03, title=f"Who holds what: each rank's share of the model's bytes, "
                         f"measured ({world} ranks; ZeRO-2's parameters between forward and backward)")
    for col, s in enumerate(SHOWN, 1):
        z = shares(res, s)
        p = [a / b for a, b in zip(parts(predicted(n, s, world)), parts(predicted(n, Strategy.DDP, world)))]
        text = [[f"{v:.0%}" if v > 0.995 else f"{v:.3f}" for v in row] for row in z]
        hover = [[f"rank {r}, {label}: share {z[r][i]:.4f} measured, {p[i]:.4f} predicted"
                  for i, label in enumerate(PARTS)] for r in range(world)]
        fig.add_trace(go.Heatmap(z=z, x=list(PARTS), y=[f"rank {r}" for r in range(world)],
                                 zmin=0, zmax=1, colorscale="Blues", showscale=col == len(SHOWN), text=text,
                                 texttemplate="%{text}", hovertext=hover, hoverinfo="text",
                                 colorbar=dict(title="share of<br>the model")), row=1, col=col)
    fig.update_yaxes(autorange="reversed")
    return fig


KINDS = (("all_gather", "all-gather", 1), ("reduce_scatter", "reduce-scatter", 2), ("all_reduce", "all-reduce", 3),
         ("broadcast", "broadcast", 4))
ORDERED = (Strategy.ZERO2, Strategy.ZERO3)


def kind(name: str) -> str | None:
    return next((label for key, label, _ in KINDS if name.startswith(key)), None)


def phases(events: list[tuple[str, int]]) -> dict[str, list[tuple[str, int]]]:
    """Rank 0's collectives of one step in call order, grouped by the phase they were called in."""
    out, phase = {}, None
    for name, nbytes in events:
        if kind(name) is None:  # a mark: the phase that starts here
            phase = name
            out[phase] = []
        elif phase is not None:
            out[phase].append((kind(name), nbytes))
    return out


def timeline_figure(shard: dict[int, list[ShardingResult]]) -> go.Figure:
    """ZeRO-2 and ZeRO-3, one step on rank 0: each collective in the order it was called, its height the bytes this
    rank handed it, the step's phases shaded: when parameters are gathered and gradients scattered."""
    world = max(shard)
    r0 = shard[world][0]
    fig = plots.subplots(len(ORDERED), 1, [f"{s.short}: rank 0's collectives in call order" for s in ORDERED],
                         height=440, legend="below", shared_xaxes=False, vertical_spacing=0.18)
    shown = set()
    for row, s in enumerate(ORDERED, 1):
        i = 0
        for j, (phase, calls) in enumerate(phases(r0.strategies[s].events).items()):
            if calls:
                fig.add_vrect(x0=i - 0.5, x1=i + len(calls) - 0.5, fillcolor=["#dde8f7", "#f7e1e1", "#e1f2e1"][j % 3],
                              line_width=0, layer="below", row=row, col=1, annotation_text=phase,
                              annotation_position="top left")
            for k, nbytes in calls:
                color = plots.color(next(c for _, label, c in KINDS if label == k))
                fig.add_trace(go.Bar(x=[i], y=[nbytes / 1e3], marker_color=color, name=k, legendgroup=k,
                                     showlegend=k not in shown,
                                     hovertemplate=f"{k}, {phase}: %{{y:.1f}} kB<extra></extra>"), row=row, col=1)
                shown.add(k)
                i += 1
        fig.update_yaxes(title_text="kB handed over", row=row, col=1)
    fig.update_xaxes(title_text="collective, in call order", row=len(ORDERED), col=1)
    fig.update_layout(title=f"When sharding communicates ({world} ranks, one training step)", bargap=0.15)
    return fig


def timeline_findings(ledger: Ledger, shard: dict[int, list[ShardingResult]]) -> Findings:
    world = max(shard)
    r0 = shard[world][0]
    count = {s: {phase: {label: sum(1 for k, _ in calls if k == label) for _, label, _ in KINDS}
                 for phase, calls in phases(r0.strategies[s].events).items()} for s in ORDERED}
    z3, z2 = count[Strategy.ZERO3], count[Strategy.ZERO2]
    again = z3["backward"]["all-gather"] == z3["forward"]["all-gather"] > 0
    kept = z2["backward"]["all-gather"] == 0 and z2["forward"]["all-gather"] > 0
    ledger.add("gathers", "ZeRO-3 gathers every unit's parameters again in backward (as many all-gathers as in "
               "forward); ZeRO-2 keeps them from forward (none in backward). Rank 0's calls, in order", again and kept,
               is_true(), kind="counted")
    ledger.add("scatter_in_backward", "ZeRO-2 and ZeRO-3 reduce-scatter every gradient during backward, none in "
               "forward", all(c["forward"]["reduce-scatter"] == 0 and c["backward"]["reduce-scatter"] > 0
                              for c in count.values()), is_true(), kind="counted", detail=True)
    first = (f"ZeRO-3 gathers each of its **{z3['forward']['all-gather']}** units in forward, frees them, and gathers "
             "them again in backward" if again else "ZeRO-3 did not gather every unit again in backward")
    table = "| rank 0's calls | forward all-gathers | backward all-gathers | backward reduce-scatters |\n" \
            "|---|---|---|---|\n" + "\n".join(
                f"| {s.short} | {c['forward']['all-gather']} | {c['backward']['all-gather']} | "
                f"{c['backward']['reduce-scatter']} |" for s, c in count.items())
    return Findings([
        first + ("; ZeRO-2 gathers only in forward and keeps them." if kept else "; ZeRO-2 gathered in backward too."),
        "Both reduce-scatter the gradients during backward, each call handed the unit's whole gradient, keeping a "
        "$1/N$ share: only the all-gathers carry shards.",
    ], [table, f"{world} ranks, one training step."])
