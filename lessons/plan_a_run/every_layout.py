"""Lesson 16, section 6: one model under every layout. The 2-D layouts of four ranks train the same small GPT one
after another in one launch, each beside one process's run of the same steps; a panel shows any of them, and
launches a layout the section did not run."""

import ipywidgets as W
import plotly.graph_objects as go

from labtools import plots
from labtools.claims import Findings, Ledger, at_most
from labtools.parallel import launch
from labtools.parallel.nd import LayoutJob, LayoutRun, Layouts, ParallelDims, train, train_each
from labtools.runcache import RunCache
from labtools.widgets import Panel
from lessons.plan_a_run import Settings

# The same small GPT at every profile: what is checked is exactness, which does not need size.
MODEL = dict(n_layer=2, n_embd=64, n_head=4, block_size=32, batch_size=8, steps=3)
FOUR_RANKS = (dict(dp=2, tp=2), dict(fsdp=2, tp=2), dict(tp=2, cp=2), dict(dp=2, cp=2), dict(dp=2, pp=2),
              dict(fsdp=2, pp=2), dict(tp=2, pp=2))
PANEL_ONLY = (dict(cp=2),)  # in the panel's list but not run by the section: choosing it launches two ranks
TOL = 1e-5                  # relative, for the losses and for every weight
TIMEOUT_S = 240


def name(layout: dict) -> str:
    return str(ParallelDims(**layout))


def job(S: Settings, layout: dict) -> LayoutJob:
    return LayoutJob(**MODEL, seed=S.seed, **layout)


def run(S: Settings) -> list[LayoutRun]:
    """The seven 2-D layouts of four ranks, one after another in one launch; rank 0's rows (it holds the
    comparisons with one process)."""
    jobs = Layouts(tuple(job(S, layout) for layout in FOUR_RANKS))
    return launch(train_each, 4, jobs, desc=f"{len(FOUR_RANKS)} layouts on 4 ranks", timeout_s=TIMEOUT_S)[0].runs


def table(runs: list[LayoutRun]) -> go.Figure:
    same = all(r.loss_rel <= TOL and r.param_rel <= TOL for r in runs)
    rows = [[r.layout, f"{r.loss_rel:.0e}", f"{r.param_rel:.0e}",
             "" if r.wire_bytes is None else f"{r.wire_bytes / 1e3:,.0f}"] for r in runs]
    title = ("Every layout trains the weights one process trains, to rounding" if same else
             "Not every layout trains the weights one process trains")
    return plots.table(["layout", "loss: largest difference (relative)", "weights: largest difference (relative)",
                        "kB each rank sent per step"], rows, title=title)


def findings(ledger: Ledger, runs: list[LayoutRun]) -> Findings:
    worst = max(max(r.loss_rel, r.param_rel) for r in runs)
    ledger.add("every_layout_equal", f"Each of {len(runs)} layouts of four ranks (data, sharded, tensor, pipeline and "
               f"context parallelism two at a time) trains the losses and every weight of one process, after "
               f"{len(runs[0].losses)} steps (largest relative difference over layouts, losses and weights)", worst,
               at_most(TOL), kind="measured")
    sent = [r for r in runs if r.wire_bytes is not None]
    most = max(sent, key=lambda r: r.wire_bytes) if sent else None
    least = min(sent, key=lambda r: r.wire_bytes) if sent else None
    answer = ("Yes: under every one of these layouts the losses and all the weights equal one process's, but for "
              "rounding from adding in another order." if worst <= TOL else
              "No: some layout's losses or weights left one process's; its row names it.")
    details = [f"The largest difference, over every layout, every step's loss and every weight: {worst:.0e} "
               "(relative)."]
    if most is not None:
        details.append(f"What they send differs: `{most.layout}` sent {most.wire_bytes / least.wire_bytes:.0f}× what "
                       f"`{least.layout}` sent per step, each rank.")
    return Findings([answer], details)


def panel(S: Settings, runs: list[LayoutRun]) -> tuple[Panel, RunCache]:
    """A layout of your choice against one process: the section's seven are drawn from its run; any other launches
    (each once)."""
    def launch_one(layout: str) -> LayoutRun:
        chosen = next(lay for lay in (*FOUR_RANKS, *PANEL_ONLY) if name(lay) == layout)
        j = job(S, chosen)
        return launch(train, j.dims.world, j, desc=layout, timeout_s=TIMEOUT_S)[0]

    cache = RunCache(launch_one)
    for r in runs:
        cache.put(r, layout=r.layout)

    def draw(layout):
        r = cache(layout=layout)
        steps = list(range(1, len(r.losses) + 1))
        fig = go.Figure()
        fig.add_trace(go.Scatter(x=steps, y=r.reference, mode="lines+markers", name="one process",
                                 line=dict(color=plots.color(0), width=6)))
        fig.add_trace(go.Scatter(x=steps, y=r.losses, mode="lines+markers", name=layout,
                                 line=dict(color=plots.color(1), dash="dot")))
        same = r.loss_rel <= TOL and r.param_rel <= TOL
        return plots.style(fig, f"{layout}: " + ("the same losses and weights as one process" if same else
                                                 "not the run one process makes"), "step", "training loss",
                           height=340)

    names = [name(lay) for lay in (*FOUR_RANKS, *PANEL_ONLY)]
    controls = {"layout": W.Dropdown(options=names, value=names[0], description="layout")}
    return Panel(draw, controls, title="One layout against one process (a layout not yet run launches once)",
                 cancellable=True), cache
