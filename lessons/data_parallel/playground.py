"""Section 4 of lesson 07: the panel — world size, accumulation and bucket size → a real DDP launch (cached)."""

import statistics

import ipywidgets as W
import plotly.graph_objects as go

from labtools import plots
from labtools.controls import options_with
from labtools.parallel import launch
from labtools.runcache import RunCache
from labtools.widgets import Panel
from lessons.data_parallel import TIMEOUT_S, Settings, ranks
from lessons.data_parallel.ranks import AccumulationResult, PanelRun


def ddp_panel(S: Settings, acc: list[AccumulationResult] | None = None) -> tuple[Panel, RunCache]:
    """World size, accumulation and bucket size → a DDP run (a real launch, cached). Starts at the notebook's
    own accumulation and bucket size, on the world size of its accumulation run; `acc`, that run's ranks, holds the
    panel's run of this first setting, so the panel opens without a launch of its own."""
    def run(world, accum_k, bucket_cap_mb) -> PanelRun:
        res = launch(ranks.panel_run, world, ranks.panel_job(S, accum_k, bucket_cap_mb),
                     desc=f"DDP × {world}, G={accum_k}", timeout_s=TIMEOUT_S)
        return res[0]

    cache = RunCache(run)
    if acc is not None:
        cache.put(acc[0].panel, world=len(acc), accum_k=S.accum_k, bucket_cap_mb=S.bucket_cap_mb)

    def draw(world, accum_k, bucket_cap_mb):
        r = cache(world=world, accum_k=accum_k, bucket_cap_mb=bucket_cap_mb)
        fig = plots.subplots(1, 2, (f"loss, {r.tokens_per_step:,} tokens per step", "all-reduce calls per step"),
                             title=f"median {statistics.median(r.seconds) * 1e3:.0f} ms per step")
        fig.add_trace(go.Scatter(y=r.losses, mode="lines+markers", showlegend=False), row=1, col=1)
        fig.add_trace(go.Bar(y=r.allreduce_calls, showlegend=False, marker_color=plots.color(1)), row=1, col=2)
        return fig

    controls = {
        "world": W.SelectionSlider(options=options_with([1, 2, 3, 4], min(S.world_sizes)), value=min(S.world_sizes),
                                   description="ranks", continuous_update=False),
        "accum_k": W.SelectionSlider(options=options_with([1, 2, 4, 8], S.accum_k), value=S.accum_k,
                                     description="accumulation", continuous_update=False),
        "bucket_cap_mb": W.SelectionSlider(options=options_with([0.01, 0.05, 1.0, 25.0], S.bucket_cap_mb),
                                           value=S.bucket_cap_mb, description="bucket MB",
                                           continuous_update=False),
    }
    return Panel(draw, controls, title="A DDP run of your choice (each new setting launches once)",
                 cancellable=True), cache
