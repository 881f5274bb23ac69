"""Lesson 06, section 1: the calculator — a model and a layout → bytes per GPU, with a panel."""

import ipywidgets as W
import plotly.graph_objects as go

from labtools import plots
from labtools.claims import Findings, Ledger, in_words
from labtools.shapes import MODELS
from labtools.widgets import Panel
from lessons.memory_budget import GB, budget

PART_ORDER = ("weights", "gradients", "master weights", "optimizer state", "activations")
LABELS = {"master weights": "fp32 master weights", "optimizer state": "optimizer's moments"}  # together: K bytes
START = {"preset": "7B", "precision": "bf16-mixed", "optimizer": "adamw", "zero_stage": 0, "dp": 8, "tp": 1, "pp": 1,
         "offload": "none", "micro_batch": 1, "seq": 4096, "checkpoint": "block", "gpu_gb": 80}  # the panel's start


def budget_figure(preset, precision, optimizer, zero_stage, dp, tp, pp, offload, micro_batch, seq, checkpoint,
                  gpu_gb) -> go.Figure:
    b = budget(preset, precision=precision, optimizer=optimizer, zero_stage=zero_stage, dp=dp, tp=tp, pp=pp,
               offload=None if offload == "none" else offload, micro_batch=micro_batch, seq=seq, checkpoint=checkpoint)
    fig = go.Figure()
    for i, part in enumerate(PART_ORDER):
        fig.add_trace(go.Bar(x=["per GPU", "host (offloaded)"],
                             y=[b.parts.get(part, 0) / GB, b.cpu_parts.get(part, 0) / GB],
                             name=LABELS.get(part, part), marker_color=plots.color(i),
                             texttemplate="%{y:.3g}", textposition="inside"))
    fits = b.total <= gpu_gb * GB
    fig.add_hline(y=gpu_gb, line=dict(color="red" if not fits else "green", dash="dash"),
                  annotation_text=f"{gpu_gb:g} GB GPU")
    plots.style(fig, f"{preset}: {b.total / GB:,.1f} GB per GPU — {'fits' if fits else 'does NOT fit'} "
                       f"({b.bytes_per_param():.2f} bytes per parameter of model states)", "", "GB (10⁹ bytes)",
                barmode="stack")
    return fig


def panel() -> Panel:
    style = {"description_width": "initial"}
    controls = {
        "preset": W.Dropdown(options=list(MODELS), value=START["preset"], description="model", style=style),
        "precision": W.Dropdown(options=["bf16-mixed", "fp32", "bf16"], value=START["precision"],
                                description="precision"),
        "optimizer": W.Dropdown(options=["adamw", "sgd", "momentum", "lion", "adafactor", "adam8bit"],
                                value=START["optimizer"], description="optimizer"),
        "zero_stage": W.IntSlider(value=START["zero_stage"], min=0, max=3, description="ZeRO stage", style=style),
        "dp": W.SelectionSlider(options=[1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048], value=START["dp"],
                                description="data parallel", style=style),
        "tp": W.SelectionSlider(options=[1, 2, 4, 8], value=START["tp"], description="tensor parallel", style=style),
        "pp": W.SelectionSlider(options=[1, 2, 4, 8, 16, 32], value=START["pp"], description="pipeline", style=style),
        "offload": W.Dropdown(options=["none", "optimizer", "params", "all"], value=START["offload"],
                              description="offload"),
        "micro_batch": W.IntSlider(value=START["micro_batch"], min=1, max=32, description="micro-batch", style=style),
        "seq": W.SelectionSlider(options=[512, 1024, 2048, 4096, 8192, 16384, 32768], value=START["seq"],
                                 description="sequence", style=style),
        "checkpoint": W.Dropdown(options=["none", "attn", "mlp", "block"], value=START["checkpoint"],
                                 description="checkpointing"),
        "gpu_gb": W.Dropdown(options=[24, 40, 80, 141], value=START["gpu_gb"], description="GPU GB"),
    }
    return Panel(budget_figure, controls, debounce_ms=0, title="Memory budget per GPU")


def findings(ledger: Ledger) -> Findings:
    """The panel's starting model and layout under each ZeRO stage: what it needs per GPU, and the first stage that
    fits the GPU."""
    kw = {k: v for k, v in START.items() if k not in ("preset", "zero_stage", "offload", "gpu_gb")}
    total = {z: budget(START["preset"], zero_stage=z, **kw).total / GB for z in range(4)}
    ledger.note("start_gb_per_gpu_by_zero_stage", total)
    fits = next((z for z in range(4) if total[z] <= START["gpu_gb"]), None)
    return Findings([
        f"As the panel starts, the {START['preset']} model in mixed precision on {in_words(START['dp'])} GPUs needs "
        f"**{total[0]:.0f} GB** per GPU without ZeRO, its activations included"
        + (f", more than an {START['gpu_gb']} GB GPU holds." if total[0] > START["gpu_gb"] else ", which fits."),
        (f"Sharding its states with ZeRO-{fits} brings that to **{total[fits]:.0f} GB**, which fits."
         if fits else "No ZeRO stage makes it fit on this many GPUs." if fits is None else ""),
    ])
