"""Lesson 06, section 1: the calculator — a model and a layout → bytes per GPU, with a panel."""

import ipywidgets as W
import plotly.graph_objects as go

from labtools import plots
from labtools.shapes import MODELS
from labtools.widgets import Panel
from lessons.memory_budget import GB, budget

PART_ORDER = ("weights", "gradients", "master weights", "optimizer state", "activations")


def budget_figure(preset, precision, optimizer, zero_stage, dp, tp, pp, offload, micro_batch, seq, checkpoint,
                  gpu_gb) -> go.Figure:
    b = budget(preset, precision=precision, optimizer=optimizer, zero_stage=zero_stage, dp=dp, tp=tp, pp=pp,
               offload=None if offload == "none" else offload, micro_batch=micro_batch, seq=seq, checkpoint=checkpoint)
    fig = go.Figure()
    for i, part in enumerate(PART_ORDER):
        fig.add_trace(go.Bar(x=["per GPU", "host (offloaded)"],
                             y=[b.parts.get(part, 0) / GB, b.cpu_parts.get(part, 0) / GB],
                             name=part, marker_color=plots.color(i),
                             texttemplate="%{y:.3g}", textposition="inside"))
    fits = b.total <= gpu_gb * GB
    fig.add_hline(y=gpu_gb, line=dict(color="red" if not fits else "green", dash="dash"),
                  annotation_text=f"{gpu_gb:g} GB GPU")
    plots.style(fig, f"{preset}: {b.total / GB:,.1f} GB per GPU — {'fits' if fits else 'does NOT fit'} "
                       f"({b.bytes_per_param():.2f} B/param of model states)", "", "GB (10⁹ bytes)", barmode="stack")
    return fig


def panel() -> Panel:
    style = {"description_width": "initial"}
    controls = {
        "preset": W.Dropdown(options=list(MODELS), value="7B", description="model", style=style),
        "precision": W.Dropdown(options=["bf16-mixed", "fp32", "bf16"], value="bf16-mixed", description="precision"),
        "optimizer": W.Dropdown(options=["adamw", "sgd", "momentum", "lion", "adafactor", "adam8bit"], value="adamw",
                                description="optimizer"),
        "zero_stage": W.IntSlider(value=0, min=0, max=3, description="ZeRO stage", style=style),
        "dp": W.SelectionSlider(options=[1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048], value=8,
                                description="data parallel", style=style),
        "tp": W.SelectionSlider(options=[1, 2, 4, 8], value=1, description="tensor parallel", style=style),
        "pp": W.SelectionSlider(options=[1, 2, 4, 8, 16, 32], value=1, description="pipeline", style=style),
        "offload": W.Dropdown(options=["none", "optimizer", "params", "all"], value="none", description="offload"),
        "micro_batch": W.IntSlider(value=1, min=1, max=32, description="micro-batch", style=style),
        "seq": W.SelectionSlider(options=[512, 1024, 2048, 4096, 8192, 16384, 32768], value=4096,
                                 description="sequence", style=style),
        "checkpoint": W.Dropdown(options=["none", "attn", "mlp", "block"], value="block", description="checkpointing"),
        "gpu_gb": W.Dropdown(options=[24, 40, 80, 141], value=80, description="GPU GB"),
    }
    return Panel(budget_figure, controls, debounce_ms=0, title="Memory budget per GPU")
