"""Lesson 10, section 6: published tensor-parallel layouts and a planner."""

import dataclasses

import ipywidgets as W
import plotly.graph_objects as go

from labtools import plots
from labtools.claims import Findings, Ledger, at_least, at_most, is_true
from labtools.plan import CLUSTERS, MODELS, Layout, bubble_fraction, rank_layouts, step_time
from labtools.widgets import Exercise, Panel, answer_check
from lessons.tensor_parallel import A100, GB, H100


def published_cases() -> dict:
    gpt3, llama = MODELS["GPT-3 175B"], MODELS["405B"]
    art = {z: step_time(gpt3, A100, Layout(8, 8, 16), 1536, zero_stage=z) for z in (0, 1)}
    ll = step_time(llama, H100, Layout(128, 8, 16), 2048, zero_stage=1)
    ll_v = {v: bubble_fraction(16, 16, v) for v in (1, 2, 4)}
    inter = step_time(gpt3, dataclasses.replace(A100, intra_bw=A100.inter_bw), Layout(8, 8, 16), 1536)
    return {"article": art, "llama": ll, "llama_v": ll_v, "nvlink": art[1], "network": inter}


def cases_table(c: dict) -> go.Figure:
    a0, a1, ll = c["article"][0], c["article"][1], c["llama"]
    rows = [
        ("GPT-3 175B, 1024 A100s, TP 8 × PP 16 × DP 8, batch 1536", f"{a0.memory.total / GB:.1f} GB (no ZeRO), "
         f"{a1.memory.total / GB:.1f} GB (ZeRO-1)", f"m = {a1.micro_batches}: {a1.bubble:.1%}",
         f"{a1.step_s:.1f} s/step"),
        ("Llama 3 405B, 16,384 H100s, TP 8 × PP 16 × DP 128, 16 micro-batches", f"{ll.memory.total / GB:.1f} GB "
         "(ZeRO-1)", f"1F1B {c['llama_v'][1]:.1%}; interleaved v = 2: {c['llama_v'][2]:.1%}, v = 4: "
         f"{c['llama_v'][4]:.1%}", f"{ll.step_s:.1f} s/step"),
    ]
    return plots.table(("published case", "memory per GPU (predicted)", "pipeline bubble", "time (predicted)"), rows,
                       row_height=44, title="Three published configurations, through the planner")


def cases_findings(ledger: Ledger, c: dict) -> Findings:
    a1, ll = c["article"][1], c["llama"]
    ledger.add("gpt3_fits", "GPT-3 175B as TP 8 × PP 16 × DP 8 fits 80 GB A100s (predicted memory per GPU, ZeRO-1, "
               "every layer recomputed)", a1.fits and c["article"][0].fits, is_true(),
               source="a widely repeated statement", kind="computed")
    ledger.note("gpt3_bubble", a1.bubble)  # 15/207: a formula, noted rather than claimed
    ledger.note("plain_1f1b_pp16_m16_bubble", ll.bubble)  # 15/31, if Llama 3 405B's pp 16 ran plain 1F1B
    ledger.note("llama3_step_s", {"planner": ll.step_s, "published_mfu_implies": published_llama_step_s()})
    ratio = {k: c[k].tp_comm_s / c[k].compute_s for k in ("nvlink", "network")}
    ledger.add("tp_nvlink", "\"TP requires fast interconnect\": over NVLink, GPT-3's TP 8 all-reduces cost under "
               "10% of the compute time (predicted, TP comm ÷ compute)", ratio["nvlink"], at_most(0.10),
               source="a widely repeated statement", kind="computed")
    ledger.add("tp_network", "… across nodes (HDR, 25 GB/s per GPU) at least half of it (predicted)", ratio["network"],
               at_least(0.5), kind="computed")
    return Findings([
        f"Over NVLink, GPT-3's tensor-parallel all-reduces cost **{ratio['nvlink']:.1%}** of the compute time; the "
        f"same TP 8 across nodes would cost **{ratio['network']:.0%}** (predicted). Tensor parallelism stays inside a "
        "node.",
        f"A pp 16 pipeline with 16 micro-batches would idle {ll.bubble:.1%} under plain 1F1B, {c['llama_v'][2]:.1%} "
        f"interleaved with v = 2, {c['llama_v'][4]:.1%} with v = 4 (lesson 09's formula): why Llama 3 405B "
        "interleaved.",
        "How long that GPT-3 layout would train, the often-quoted 34 days, is lesson 12's: it recomputes Narayanan "
        "et al.'s estimate.",
        f"Llama 3 405B's reported 38–43% MFU on 16,384 H100s means about **{published_llama_step_s():.1f} s** per "
        f"16M-token step (computed); the planner says {ll.step_s:.1f} s: it runs plain 1F1B and recomputes every "
        "layer, which Llama 3 did not.",
    ])


def published_llama_step_s(mfu: float = 0.41, tokens: float = 16e6, gpus: int = 16_384) -> float:
    """Seconds per step implied by Llama 3 405B's reported MFU (38–43%, §3.3.4): 6·N·tokens / (gpus · MFU · peak)."""
    return 6 * 405e9 * tokens / (gpus * mfu * H100.peak_flops)


def figure(model: str, gpus: int, batch: int, tp: int, pp: int, zero: int, cluster: str, top: int = 8):
    ranked = rank_layouts(MODELS[model], CLUSTERS[cluster], gpus, batch, zero_stage=zero)
    chosen = next((e for e in ranked if e.layout.tp == tp and e.layout.pp == pp), None)
    shown = ranked[:top] + ([chosen] if chosen is not None and chosen not in ranked[:top] else [])
    names = [f"{'→ ' if e is chosen else ''}{e.layout}{'' if e.fits else ' (does not fit)'}" for e in shown]
    fig = plots.subplots(1, 2, ("memory per GPU (GB)", "time per step (s)"), height=420, legend="top")
    fig.add_trace(go.Bar(y=names, x=[e.memory.total / GB for e in shown], orientation="h", showlegend=False,
                         marker_color=[plots.color(0) if e.fits else "#cf222e" for e in shown]), row=1, col=1)
    fig.add_vline(x=CLUSTERS[cluster].gpu_memory / GB, line=dict(dash="dash"), row=1, col=1)
    for i, part in enumerate(("compute", "bubble", "TP comm", "DP comm (exposed)", "PP comm")):
        fig.add_trace(go.Bar(y=names, x=[e.breakdown[part] for e in shown], orientation="h", name=part,
                             marker_color=plots.color(i + 1)), row=1, col=2)
    fig.update_layout(barmode="stack")
    fig.update_yaxes(autorange="reversed")
    if tp * pp > gpus:  # not "dp 0": say what the layout needs
        msg = f"your tp {tp} × pp {pp} needs {tp * pp:,} GPUs per model copy, more than {gpus:,}"
    else:
        msg = (f"your layout dp {gpus // (tp * pp)} × tp {tp} × pp {pp}: "
               + (f"{chosen.step_s:.1f} s/step, {chosen.memory.total / GB:.1f} GB" if chosen else "not possible here"))
    fig.update_layout(title=f"{model} on {gpus:,} GPUs, batch {batch}: fastest layouts first — {msg}")
    return fig


def panel() -> Panel:
    style = {"description_width": "initial"}
    controls = {
        "model": W.Dropdown(options=["GPT-3 175B", "405B", "70B", "7B"], value="GPT-3 175B", description="model"),
        "gpus": W.SelectionSlider(options=[64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384], value=1024,
                                  description="GPUs", style=style),
        "batch": W.SelectionSlider(options=[256, 512, 1024, 1536, 2048, 4096], value=1536,
                                   description="global batch (sequences)", style=style),
        "tp": W.SelectionSlider(options=[1, 2, 4, 8], value=8, description="your tp", style=style),
        "pp": W.SelectionSlider(options=[1, 2, 4, 8, 16, 32], value=16, description="your pp", style=style),
        "zero": W.IntSlider(value=1, min=0, max=3, description="ZeRO stage", style=style),
        "cluster": W.Dropdown(options=list(CLUSTERS), value=list(CLUSTERS)[0], description="cluster", style=style),
    }
    return Panel(figure, controls, debounce_ms=0, title="The 3-D planner: memory and step time, ranked")


def exercises(ledger: Ledger) -> list[Exercise]:
    per_layer = 8 * (8 - 1) / 8 * 4 * 2048 * 12288 * 2 / GB  # 8(t−1)/t · b·s·h elements, bf16

    fits = {tp: step_time(MODELS["405B"], H100, Layout(1024 // (tp * 16), tp, 16), 1024) for tp in (1, 2, 4, 8)}
    smallest = next(tp for tp in (1, 2, 4, 8) if fits[tp].fits)
    ledger.note("exercise_405b_smallest_tp", smallest)
    return [
        Exercise("Bytes per layer", "GPT-3: h = 12288, sequence 2048, micro-batch 4, bf16 activations (2 bytes). With "
                 "tp = 8 under ring all-reduces, how many GB does each GPU send per layer for one forward and "
                 "backward: 8·(t−1)/t·b·s·h elements?", {"gb": "GB per layer"}, answer_check({"gb": per_layer}),
                 f"8 × 7/8 × 4·2048·12288 × 2 bytes = **{per_layer:.2f} GB** per layer and micro-batch; 96 layers "
                 f"make that {96 * per_layer:.0f} GB per micro-batch, which only NVLink carries fast enough."),
        Exercise("The smallest tp", "405B on 1024 H100s with pp = 16 and a batch of 1024 sequences of 8192 tokens "
                 "(ZeRO-1, every layer recomputed): what is the smallest tensor-parallel size (1, 2, 4 or 8) that "
                 "fits 80 GB? Try it in the planner.", {"tp": "tp"}, answer_check({"tp": smallest}),
                 f"**tp = {smallest}**: " + ", ".join(f"tp {t}: {e.memory.total / GB:.0f} GB"
                                                     for t, e in fits.items())
                 + ". With tp = 1 each GPU holds 405B/16 parameters' bf16 weights and gradients whole (ZeRO-1 shards "
                 "only the optimizer state): about 100 GB before anything else."),
    ]
