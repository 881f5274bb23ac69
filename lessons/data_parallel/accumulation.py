"""Section 3 of lesson 07: gradient accumulation under DDP (no_sync, the loss-normalisation bug) and DDP's buckets."""

import plotly.graph_objects as go

from labtools import plots
from labtools.claims import Findings, Ledger, approx, at_least, at_most
from labtools.parallel import launch
from lessons.data_parallel import TIMEOUT_S, Settings, ranks


def run(S: Settings, world: int = 2) -> list[dict]:
    return launch(ranks.accumulation, world, S, desc=f"accumulation × {world}", timeout_s=TIMEOUT_S)


ACCUM_NAMES = {"no_sync": "no_sync() on G − 1", "sync_every_micro_batch": "no no_sync()",
               "no_sync_sum_bug": "loss not ÷ G"}


def figure(acc: list[dict], G: int) -> go.Figure:
    a = acc[0]
    fig = plots.subplots(1, 2, (f"all-reduce calls per step (G = {G} micro-batches)",
                                "‖gradient‖ ÷ ‖one-process gradient‖"))
    fig.add_trace(go.Bar(x=list(ACCUM_NAMES.values()), y=[a[n]["allreduce_calls"] for n in ACCUM_NAMES],
                         marker_color=plots.color(0), texttemplate="%{y}", showlegend=False), row=1, col=1)
    fig.add_trace(go.Bar(x=list(ACCUM_NAMES.values()), y=[a[n]["norm_ratio"] for n in ACCUM_NAMES],
                         marker_color=plots.color(1), texttemplate="%{y:.2f}", showlegend=False), row=1, col=2)
    return fig


def buckets_figure(acc: list[dict]) -> go.Figure:
    b = acc[0]["buckets"]
    caps = list(b)
    return plots.bars([f"{c} MB" for c in caps], {"buckets all-reduced per step": [b[c]["buckets"] for c in caps]},
                      title=f"DDP buckets vs bucket_cap_mb (gradients: {acc[0]['grad_bytes'] / 2**20:.2f} MiB)",
                      yaxis="buckets")


def findings(ledger: Ledger, acc: list[dict]) -> Findings:
    a, b = acc[0], acc[0]["buckets"]
    calls_with, calls_without = a["no_sync"]["allreduce_calls"], a["sync_every_micro_batch"]["allreduce_calls"]
    G = calls_without // calls_with
    caps = list(b)
    ledger.add("accum_equal", f"G = {G} micro-batches with no_sync() ≡ one batch {G}× as large (max |Δg|)",
               a["no_sync"]["max_diff"], at_most(1e-6), kind="measured")
    ledger.add("no_sync_saves", f"Without no_sync() DDP all-reduces {G}× as often (calls without ÷ with)",
               calls_without / calls_with, approx(G, abs=1e-9), kind="measured")
    ledger.add("sum_bug", f"Not dividing the micro-batch loss by G makes the gradient G = {G}× too large",
               a["no_sync_sum_bug"]["norm_ratio"], approx(G, rel=1e-4), kind="measured")
    ledger.add("buckets", "Smaller bucket_cap_mb → more buckets per step (smallest cap ÷ largest cap)",
               b[caps[0]]["buckets"] / b[caps[-1]]["buckets"], at_least(2), kind="measured")
    small, large = b[caps[0]]["buckets"], b[caps[-1]]["buckets"]
    buckets = "| bucket_cap_mb | buckets all-reduced per step |\n|---|---|\n" + "\n".join(
        f"| {c} | {v['buckets']} |" for c, v in b.items())
    return Findings([
        f"Once per step: with `no_sync()` on all but the last micro-batch, DDP all-reduced "
        + ("**once** per step" if calls_with == 1 else f"**{calls_with}** times per step")
        + f" instead of {calls_without} times, with the same gradients.",
        f"Forgetting to divide each micro-batch's loss by G made the gradients "
        f"**{a['no_sync_sum_bug']['norm_ratio']:.2f}×** too large. "
        + ("Smaller buckets meant more all-reduces per step, each started as soon as its bucket filled during "
           "backward." if small > large else "Smaller buckets did not mean more all-reduces here."),
    ], [
        f"G = {G} micro-batches per step.",
        f"Largest gradient difference with and without `no_sync()`: {a['sync_every_micro_batch']['max_diff']:.1e}.",
        buckets,
    ])
