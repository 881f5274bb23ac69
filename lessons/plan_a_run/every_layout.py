"""Lesson 16, section 6: one model under every layout. The 2-D layouts of four ranks train the same small GPT one
after another in one launch, each beside one process's run of the same steps; a panel shows any of them, and
launches a layout the section did not run."""

import ipywidgets as W
import plotly.graph_objects as go

from labtools import plots
from labtools.claims import Findings, Ledger, at_most, between
from labtools.parallel import launch
from labtools.parallel.nd import (DIMS, LayoutJob, LayoutRun, Layouts, ParallelDims, predicted_bytes,
                                  predicted_state_bytes, train, train_each)
from labtools.runcache import RunCache
from labtools.widgets import Panel
from lessons.plan_a_run import Settings

# The same small GPT at every profile: what is checked is exactness, which does not need size.
MODEL = dict(n_layer=2, n_embd=64, n_head=4, block_size=32, batch_size=8, steps=3)
FOUR_RANKS = (dict(dp=2, tp=2), dict(fsdp=2, tp=2), dict(tp=2, cp=2), dict(dp=2, cp=2), dict(dp=2, pp=2),
              dict(fsdp=2, pp=2), dict(tp=2, pp=2), dict(dp=2, ep=2, n_experts=4))  # ep: with 4 experts
PANEL_ONLY = (dict(cp=2),)  # in the panel's list but not run by the section: choosing it launches two ranks
TOL = 1e-5                  # relative, for the losses and for every weight
# Bytes on the wire ÷ the planner's arithmetic: headers, barriers and the pipeline's first messages add to what the
# arithmetic counts. Measured here over the 16 layouts of the tests: 0.95 to 1.15 (the band was set after seeing it).
WIRE_BAND = (0.9, 1.25)
# The fullest rank's model states ÷ the planner's (counted, the same on every machine): exactly 1 where every
# parameter is split or sharded alike; above it where tensor parallelism leaves the embeddings and LayerNorms whole
# (1.13 here) or a pipeline's stages are uneven (1.02; 1.17 with both).
STATE_BAND = (1.0, 1.2)
TIMEOUT_S = 240


def name(layout: dict) -> str:
    return str(ParallelDims(**{k: v for k, v in layout.items() if k in DIMS}))


def job(S: Settings, layout: dict) -> LayoutJob:
    return LayoutJob(**MODEL, seed=S.seed, **layout)


def _job_of(S: Settings, layout: str) -> LayoutJob:
    return job(S, next(lay for lay in (*FOUR_RANKS, *PANEL_ONLY) if name(lay) == layout))


def predicted(S: Settings, layout: str) -> float:
    """The planner's bytes each rank sends per step for a layout of the section (computed)."""
    return sum(predicted_bytes(_job_of(S, layout)).values())


def predicted_states(S: Settings, layout: str) -> float:
    """The planner's model states per rank for a layout of the section (computed)."""
    return predicted_state_bytes(_job_of(S, layout))


def run(S: Settings) -> list[LayoutRun]:
    """The eight 2-D layouts of four ranks, one after another in one launch; rank 0's rows (it holds the
    comparisons with one process)."""
    jobs = Layouts(tuple(job(S, layout) for layout in FOUR_RANKS))
    return launch(train_each, 4, jobs, desc=f"{len(FOUR_RANKS)} layouts on 4 ranks", timeout_s=TIMEOUT_S)[0].runs


def table(S: Settings, runs: list[LayoutRun]) -> go.Figure:
    same = all(r.loss_rel <= TOL and r.param_rel <= TOL for r in runs)
    rows = [[r.layout, f"{r.loss_rel:.0e}", f"{r.param_rel:.0e}",
             ("–" if r.wire_bytes is None else f"{r.wire_bytes / 1e3:,.0f}")
             + f" / {predicted(S, r.layout) / 1e3:,.0f}",
             f"{r.state_bytes / 1e3:,.0f} / {predicted_states(S, r.layout) / 1e3:,.0f}"] for r in runs]
    title = ("Every layout trains the weights one process trains, to rounding" if same else
             "Not every layout trains the weights one process trains")
    return plots.table(["layout", "loss: largest difference (relative)", "weights: largest difference (relative)",
                        "kB each rank sent per step: measured / planner", "kB of model states on the fullest rank: "
                        "counted / planner"], rows, title=title, row_height=32)


def findings(ledger: Ledger, S: Settings, runs: list[LayoutRun]) -> Findings:
    worst = max(max(r.loss_rel, r.param_rel) for r in runs)
    ledger.add("every_layout_equal", f"Each of {len(runs)} layouts of four ranks (data, sharded, tensor, pipeline, "
               "context and expert parallelism two at a time) trains the losses and every weight of one process, "
               f"after {len(runs[0].losses)} steps (largest relative difference over layouts, losses and weights)",
               worst, at_most(TOL), kind="measured")
    answer = ["Yes: under every one of these layouts the losses and all the weights equal one process's, but for "
              "rounding from adding in another order." if worst <= TOL else
              "No: some layout's losses or weights left one process's; its row names it."]
    details = [f"The largest difference, over every layout, every step's loss and every weight: {worst:.0e} "
               "(relative)."]
    sent = {r.layout: r.wire_bytes / predicted(S, r.layout) for r in runs if r.wire_bytes is not None}
    if sent:
        lo, hi = min(sent.values()), max(sent.values())
        far = max(sent, key=lambda k: abs(sent[k] - 1))
        ledger.add("bytes_as_planned", "What each rank put on the wire per step is close to the planner's arithmetic "
                   "for its layout (measured ÷ computed, the layout farthest from 1)", sent[far],
                   between(*WIRE_BAND), kind="measured")
        inside = WIRE_BAND[0] <= lo and hi <= WIRE_BAND[1]
        answer.append("What differs is what they send, and the planner's arithmetic "
                      + ("predicts it: every layout sent close to what it computes." if inside else
                         f"missed `{far}` this time (the counter also counts other traffic on this machine)."))
        details.append(f"Measured ÷ computed bytes: {lo:.2f} to {hi:.2f} over the layouts. The computed bytes count "
                       "each collective's ring arithmetic: message headers and barriers add to what is measured"
                       + (f"; `{min(sent, key=sent.get)}` sent a little less than it counts." if lo < 1 else "."))
    held = {r.layout: r.state_bytes / predicted_states(S, r.layout) for r in runs}
    top = max(held, key=held.get)
    ledger.add("states_as_planned", "Each layout's fullest rank holds the planner's model states, more only by what "
               "the planner leaves out: layers tensor parallelism does not split, an uneven pipeline cut (counted ÷ "
               "computed, the largest)", held[top], between(*STATE_BAND), kind="counted")
    planned = STATE_BAND[0] <= min(held.values()) and held[top] <= STATE_BAND[1]
    answer.append("What each rank holds is the planner's count too, a little more where tensor parallelism keeps the "
                  "embeddings whole." if planned else f"What `{top}`'s ranks hold is not what the planner counts.")
    details.append(f"Model states counted ÷ the planner's: {min(held.values()):.2f} to {held[top]:.2f} (`{top}`); "
                   "the planner divides every weight by $tp$ and $pp$.")
    return Findings(answer, details)


def panel(S: Settings, runs: list[LayoutRun]) -> tuple[Panel, RunCache]:
    """A layout of your choice against one process: the section's eight are drawn from its run; any other launches
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
