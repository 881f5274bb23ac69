"""Lesson 16, section 5: plan your own run — a model, a cluster, a layout; memory, step, days and dollars."""

import dataclasses

import ipywidgets as W

from labtools.controls import choice_slider, slider
from labtools.layout import Layout, check_layout
from labtools.plan import CLUSTER_LABELS, CLUSTERS, GPU, rank_layouts, run_plan, step_time
from labtools.shapes import MODELS
from labtools.widgets import Panel
from lessons.plan_a_run.example import EXAMPLE, figure

CPS = (1, 2, 4, 8, 16, 32)


def draw(model: str, seq: int, gpus: int, batch: int, tokens_t: float, tp: int, pp: int, cp: int, v: int,
         checkpoint: str, efficiency: float, cluster: GPU, top: int = 8):
    shape, gpu = dataclasses.replace(MODELS[model], seq=seq), CLUSTERS[cluster]
    kw = dict(v=v, efficiency=efficiency, checkpoint=checkpoint)
    ranked = rank_layouts(shape, gpu, gpus, batch, cp=CPS, **kw)
    world = tp * pp * cp
    chosen, msg = None, ""
    if world > gpus or gpus % world:
        msg = f"your tp {tp} × pp {pp} × cp {cp} uses {world:,} GPUs per model copy, which {gpus:,} GPUs do not divide"
    else:
        layout = Layout(gpus // world, tp, pp, cp)
        try:
            check_layout(shape, layout, gpus, gpu.gpus_per_node)
            chosen = step_time(shape, gpu, layout, batch, **kw)
            run = run_plan(shape, gpu, layout, batch, tokens_t * 1e12, **kw)
            msg = (f"yours, {layout}: {run.days_with_failures:,.0f} days, ${run.cost / 1e6:,.1f} M"
                   + ("" if chosen.fits else " — does not fit"))
        except ValueError as e:
            msg = f"yours: {e}"
    shown = ranked[:top]
    if chosen is not None:
        same = next((e for e in ranked if e.layout == chosen.layout), None)
        chosen = same or chosen
        if chosen not in shown:
            shown = shown + [chosen]
    title = f"Layouts ranked by step time<br><sub>{msg}</sub>"
    return figure(shown, chosen, gpu.gpu_memory, title)


def panel() -> Panel:
    style = {"description_width": "initial"}
    pick = lambda options, value, name: W.SelectionSlider(options=options, value=value, description=name,  # noqa: E731
                                                           style=style)
    controls = {
        "model": W.Dropdown(options=["7B", "70B", "GPT-3 175B", "405B"], value=EXAMPLE.model, description="model"),
        "seq": pick([2048, 4096, 8192, 16384, 32768, 65536, 131072], MODELS[EXAMPLE.model].seq,
                    "tokens per sequence"),
        "gpus": pick([64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384], EXAMPLE.gpus, "GPUs"),
        "batch": pick([64, 128, 256, 512, 1024, 1536, 2048, 4096], EXAMPLE.batch, "sequences per step"),
        "tokens_t": choice_slider(EXAMPLE.tokens / 1e12, 0.1, 30.0, "training tokens (T)", include=(0.3, 15.6)),
        "tp": pick([1, 2, 4, 8], 4, "your tp"),
        "pp": pick([1, 2, 4, 8, 16, 32], 1, "your pp"),
        "cp": pick(list(CPS), 1, "your cp"),
        "v": pick([1, 2, 4, 8], 4, "virtual stages v"),
        "checkpoint": W.Dropdown(options=[("every layer", "block"), ("none", "none")], value="block",
                                 description="recompute", style=style),
        "efficiency": slider(0.75, 0.2, 1.0, 0.01, description="kernel efficiency"),
        "cluster": W.Dropdown(options=[(CLUSTER_LABELS[g], g) for g in CLUSTERS], value=GPU.H100, description="cluster",
                              style=style),
    }
    return Panel(draw, controls, debounce_ms=0, title="Plan your own run")
