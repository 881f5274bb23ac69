"""Section 3 of lesson 07: gradient accumulation under DDP (no_sync, the loss-normalisation bug) and DDP's buckets."""

import plotly.graph_objects as go

from labtools import plots
from labtools.claims import Findings, Ledger, approx, at_least, at_most
from labtools.parallel import launch
from lessons.data_parallel import TIMEOUT_S, Settings, ranks
from lessons.data_parallel.ranks import Accumulate, AccumulationResult


def run(S: Settings, world: int = 2) -> list[AccumulationResult]:
    return launch(ranks.accumulation, world, S, desc=f"accumulation × {world}", timeout_s=TIMEOUT_S)


ACCUM_NAMES = {Accumulate.NO_SYNC: "no_sync() on G − 1", Accumulate.SYNC_EVERY_MICRO_BATCH: "no no_sync()",
               Accumulate.SUM_BUG: "loss not ÷ G"}


def figure(acc: list[AccumulationResult], G: int) -> go.Figure:
    a = acc[0].accumulated
    fig = plots.subplots(1, 2, (f"all-reduce calls per step (G = {G} micro-batches)",
                                "‖gradient‖ ÷ ‖one-process gradient‖"))
    fig.add_trace(go.Bar(x=list(ACCUM_NAMES.values()), y=[a[n].allreduce_calls for n in ACCUM_NAMES],
                         marker_color=plots.color(0), texttemplate="%{y}", showlegend=False), row=1, col=1)
    fig.add_trace(go.Bar(x=list(ACCUM_NAMES.values()), y=[a[n].norm_ratio for n in ACCUM_NAMES],
                         marker_color=plots.color(1), texttemplate="%{y:.2f}", showlegend=False), row=1, col=2)
    return fig


def buckets_figure(acc: list[AccumulationResult]) -> go.Figure:
    b = acc[0].buckets
    return plots.bars([f"{c.cap_mb} MB" for c in b], {"buckets all-reduced per step": [c.buckets for c in b]},
                      title="Smaller buckets, more all-reduces per step",
                      yaxis="buckets")


def findings(ledger: Ledger, acc: list[AccumulationResult]) -> Findings:
    a, b = acc[0].accumulated, acc[0].buckets
    no_sync, every, bug = a[Accumulate.NO_SYNC], a[Accumulate.SYNC_EVERY_MICRO_BATCH], a[Accumulate.SUM_BUG]
    calls_with, calls_without = no_sync.allreduce_calls, every.allreduce_calls
    G = calls_without // calls_with
    ledger.add("accum_equal", f"G = {G} micro-batches with no_sync() ≡ one batch {G}× as large (max |Δg|)",
               no_sync.max_diff, at_most(1e-6), kind="measured")
    ledger.add("no_sync_saves", f"Without no_sync() DDP all-reduces {G}× as often (calls without ÷ with)",
               calls_without / calls_with, approx(G, abs=1e-9), kind="measured")
    ledger.add("sum_bug", f"Not dividing the micro-batch loss by G makes the gradient G = {G}× too large",
               bug.norm_ratio, approx(G, rel=1e-4), kind="measured")
    small, large = b[0].buckets, b[-1].buckets  # the first and last of S.bucket_caps_mb, smallest first
    ledger.add("buckets", "Smaller bucket_cap_mb → more buckets per step (smallest cap ÷ largest cap)",
               small / large, at_least(2), kind="measured")
    buckets = "| bucket_cap_mb | buckets all-reduced per step |\n|---|---|\n" + "\n".join(
        f"| {c.cap_mb} | {c.buckets} |" for c in b)
    return Findings([
        "Once per step: with `no_sync()` on all but the last micro-batch, DDP all-reduced "
        + ("**once** per step" if calls_with == 1 else f"**{calls_with}** times per step")
        + f" instead of {calls_without} times, with the same gradients.",
        f"Forgetting to divide each micro-batch's loss by G made the gradients "
        f"**{bug.norm_ratio:.2f}×** too large. "
        + ("Smaller buckets meant more all-reduces per step, each started as soon as its bucket filled during "
           "backward." if small > large else "Smaller buckets did not mean more all-reduces here."),
    ], [
        f"G = {G} micro-batches per step.",
        f"Largest gradient difference with and without `no_sync()`: {every.max_diff:.1e}.",
        buckets,
    ])
