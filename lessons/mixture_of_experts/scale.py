"""Lesson 15, section 5: mixtures of experts at scale — Mixtral 8x7B's and DeepSeek-V3's parameters, total and
active, counted from their published shapes; the memory each GPU holds with and without expert parallelism."""

import plotly.graph_objects as go

from labtools import plots
from labtools.claims import Findings, Ledger, approx, at_least
from labtools.layout import moe_model_states
from labtools.runs import DEEPSEEK_V3_LAYOUT
from labtools.shapes import DEEPSEEK_V3, MOE_MODELS

GB = 1e9


MODELS = MOE_MODELS


def table(rows: list[dict]) -> go.Figure:
    body = [(r["name"], f"{r['total'] / 1e9:.1f} B", f"{r['published_total'] / 1e9:g} B",
             f"{r['active'] / 1e9:.1f} B", f"{r['published_active'] / 1e9:g} B",
             f"{r['active'] / r['total']:.1%}") for r in rows]
    return plots.table(("model", "total (computed)", "published", "active (computed)", "published",
                        "active ÷ total"), body, title="Parameters counted from the published shapes", row_height=30)


def rows() -> list[dict]:
    return [{"name": m.name, **m.params(), "published_total": m.published_total,
             "published_active": m.published_active, "source": m.source} for m in MODELS]


def memory_figure() -> go.Figure:
    """DeepSeek-V3's model states per GPU on 2,048 GPUs with 16 pipeline stages (dp = 128), as the expert-parallel
    size grows; DeepSeek-AI trained with ep = 64."""
    eps = [1, 2, 4, 8, 16, 32, 64, 128]
    at = DEEPSEEK_V3_LAYOUT
    gb = [moe_model_states(DEEPSEEK_V3, at.pp, ep, at.gpus // at.pp) / GB for ep in eps]
    fig = go.Figure(go.Bar(x=[str(e) for e in eps], y=gb, marker_color=[plots.color(0) if g <= 80 else "#cf222e"
                                                                         for g in gb],
                           text=[f"{g:.0f}" for g in gb], textposition="outside"))
    plots.marked_line(fig, y=80, text="80 GB")
    plots.style(fig, "DeepSeek-V3 on 2,048 GPUs, 16 pipeline stages: model states per GPU", "expert-parallel size ep",
                "GB (computed)")
    return fig


def findings(ledger: Ledger, r: list[dict]) -> Findings:
    for row, key in zip(r, ("mixtral", "deepseek_v3")):
        ledger.add(f"{key}_total", f"{row['name']}'s {row['published_total'] / 1e9:g}B parameters, counted from its "
                   "published shape (computed ÷ published)", row["total"] / row["published_total"],
                   approx(1.0, rel=0.02), source=row["source"], kind="computed")
        ledger.add(f"{key}_active", f"… and its {row['published_active'] / 1e9:g}B active per token (computed ÷ "
                   "published)", row["active"] / row["published_active"], approx(1.0, rel=0.02),
                   source=row["source"], kind="computed")
    at = DEEPSEEK_V3_LAYOUT
    no_ep, ep64 = (moe_model_states(DEEPSEEK_V3, at.pp, ep, at.gpus // at.pp) for ep in (1, at.ep))
    ledger.add("deepseek_needs_ep", "DeepSeek-V3's model states per GPU on 2,048 GPUs with 16 stages: without expert "
               "parallelism ÷ with ep = 64 (computed)", no_ep / ep64, at_least(10), kind="computed")
    mx, ds = r
    return Findings([
        f"Memory for all, FLOPs for a few: DeepSeek-V3 uses **{ds['active'] / ds['total']:.1%}** of its parameters "
        f"per token, yet without expert parallelism each GPU of its run would hold **{no_ep / GB:.0f} GB** of model "
        "states, more than any GPU has.",
        f"Spreading its experts over 64 ranks, as DeepSeek-AI did, brings that to **{ep64 / GB:.0f} GB**.",
    ], [
        "| model | parameters, counted | published | active per token, counted | published |\n|---|---|---|---|---|\n"
        + "\n".join(f"| {row['name']} | {row['total'] / 1e9:.1f}B | {row['published_total'] / 1e9:g}B | "
                     f"{row['active'] / 1e9:.1f}B | {row['published_active'] / 1e9:g}B |" for row in r),
        "Model states in bf16 mixed precision with AdamW and ZeRO-1, on DeepSeek-V3's 2,048 GPUs in 16 pipeline "
        "stages.",
    ])
