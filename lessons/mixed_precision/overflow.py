"""Lesson 04, section 2: overflow — the residual stream scaled past 65504, in fp16 storage and under autocast."""

import copy
import math
import re

import ipywidgets as W
import numpy as np
import plotly.graph_objects as go
import torch
import torch.nn as nn

from labtools import plots
from labtools.claims import Findings, Ledger, between, is_true
from labtools.precision import FORMATS
from labtools.progress import progress
from labtools.widgets import Panel
from lessons.mixed_precision import Settings, build, corpus

OVERFLOW_SCALES = tuple(float(10**e) for e in np.arange(0, 7.01, 0.5))
PARTS = {"wte": "token embedding", "wpe": "position embedding", "drop": "dropout", "ln_1": "LayerNorm 1",
         "attn.c_attn": "attention in", "attn.c_proj": "attention out", "attn.resid_dropout": "attention dropout",
         "ln_2": "LayerNorm 2", "mlp.c_fc": "MLP in", "mlp.gelu": "GELU", "mlp.c_proj": "MLP out",
         "mlp.dropout": "MLP dropout", "ln_f": "final LayerNorm", "lm_head": "output head"}


def part(name: str) -> str:
    """A leaf module's name as a reader says it: "transformer.h.0.mlp.c_fc" -> "block 0 · MLP in"."""
    name = name.removeprefix("transformer.")
    m = re.match(r"h\.(\d+)\.(.*)", name)
    return f"block {m.group(1)} · {PARTS.get(m.group(2), m.group(2))}" if m else PARTS.get(name, name)


def _forward_probe(model: nn.Module, X, Y, k: float, autocast_fp16: bool = False) -> dict:
    """Forward pass with the embedding output — the start of the residual stream — multiplied by k, in the
    model's own dtype (fp16/bf16 *storage*: every weight and activation cast) or, with autocast_fp16, with fp32
    weights under torch.autocast(float16) as mixed-precision training runs. Records each leaf module's largest
    |output| and the first one that is not finite."""
    acts, first = {}, []
    handles = [model.transformer.wte.register_forward_hook(lambda mod, i, o: o * k)]
    for name, mod in model.named_modules():
        if name and not list(mod.children()):
            def hook(mod, i, o, name=name):
                acts[name] = o.detach().float().abs().max().item()
                if not math.isfinite(acts[name]) and not first:
                    first.append(name)
            handles.append(mod.register_forward_hook(hook))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.float16, enabled=autocast_fp16):
        _, loss = model(X, Y)
    for h in handles:
        h.remove()
    return {"loss": loss.item(), "first_nonfinite": first[0] if first else None, "acts": acts}


def overflow_sweep(S: Settings) -> dict[float, dict]:
    """For each residual-stream scale k: the model's activations and loss with weights stored in fp32, fp16 and
    bf16, and with fp32 weights under fp16 autocast ("fp16 autocast")."""
    base = build(S).cpu().eval()
    models = {"fp32": base, "fp16": copy.deepcopy(base).half(), "bf16": copy.deepcopy(base).bfloat16()}
    X, Y = corpus().batch("val", 4, S.block_size, torch.Generator().manual_seed(S.seed))
    out = {}
    for k in progress(OVERFLOW_SCALES, desc="overflow sweep"):
        out[k] = {name: _forward_probe(m, X, Y, k) for name, m in models.items()}
        out[k]["fp16 autocast"] = _forward_probe(base, X, Y, k, autocast_fp16=True)
    return out


AUTOCAST_SCALES = tuple(float(10**e) for e in np.arange(0, 5.01, 0.5))


def autocast_overflow_sweep(S: Settings) -> dict:
    """Where fp16 autocast does overflow: a matrix product whose output passes 65504. Block 0's first MLP weights
    are multiplied by k (LayerNorm in front of it cannot help), the model run under fp16 autocast."""
    model = build(S).cpu().eval()
    X, Y = corpus().batch("val", 4, S.block_size, torch.Generator().manual_seed(S.seed))
    w = model.transformer.h[0].mlp.c_fc.weight
    original = w.detach().clone()
    out = {"fp32_max": _forward_probe(model, X, Y, 1.0)["acts"]["transformer.h.0.mlp.c_fc"], "runs": {}}
    try:
        for k in AUTOCAST_SCALES:
            with torch.no_grad():
                w.copy_(original * k)
            out["runs"][k] = _forward_probe(model, X, Y, 1.0, autocast_fp16=True)
    finally:
        with torch.no_grad():
            w.copy_(original)
    return out


def overflow_threshold(sweep: dict[float, dict]) -> tuple[float, float | None]:
    """(predicted k, first k of the grid where fp16's loss is not finite). LayerNorm rescales every sub-layer's
    input, so only the residual stream grows with k; at large k it is dominated by k × the token embedding,
    which overflows when k · max|embedding| > 65504."""
    predicted = FORMATS["fp16"].max / sweep[1.0]["fp32"]["acts"]["transformer.wte"]
    return predicted, first_overflow({k: sweep[k]["fp16"] for k in OVERFLOW_SCALES})


def first_overflow(probes: dict[float, dict]) -> float | None:
    """The smallest k whose forward probe gave a non-finite loss (None: finite everywhere)."""
    return next((k for k in sorted(probes) if not math.isfinite(probes[k]["loss"])), None)


def figure(sweep: dict[float, dict], k: float) -> go.Figure:
    r = sweep[k]
    names = list(r["fp32"]["acts"])
    fig = go.Figure(go.Bar(x=[part(n) for n in names], y=[r["fp32"]["acts"][n] for n in names],
                           name="largest |activation| (fp32)",
                           marker_color=plots.color(0)))
    plots.marked_line(fig, y=FORMATS["fp16"].max, text="fp16 max 65504", log=True, line=dict(color="red"))
    fails = [p for p in ("fp16", "bf16", "fp16 autocast") if not math.isfinite(r[p]["loss"])]
    holds = [p for p in ("fp16", "bf16", "fp16 autocast") if p not in fails]
    verdict = (f"{' and '.join(fails)} overflow{'s' * (len(fails) == 1)}" if fails else "nothing overflows") + (
        f"; {' and '.join(holds)} stay{'s' * (len(holds) == 1)} finite" if fails and holds else "")
    plots.style(fig, f"Residual stream × γ = {k:.0e}: {verdict}", "", "largest |value| (fp32 run)")
    fig.update_yaxes(type="log")
    fig.update_xaxes(tickangle=45)
    return fig


def panel(sweep: dict[float, dict]) -> Panel:
    control = W.SelectionSlider(options=[(f"{k:.0e}", k) for k in OVERFLOW_SCALES], value=1e6,
                                description="scale γ", style={"description_width": "initial"})  # 1e6: fp16 fails
    return Panel(lambda gamma: figure(sweep, gamma), {"gamma": control}, debounce_ms=0,
                 title="Scale the residual stream: where does fp16 give up?")


def findings(ledger: Ledger, sweep: dict[float, dict]) -> Findings:
    predicted, observed = overflow_threshold(sweep)
    bf16_ok = all(math.isfinite(r["bf16"]["loss"]) for r in sweep.values())
    first = next((sweep[k]["fp16"]["first_nonfinite"] for k in OVERFLOW_SCALES if sweep[k]["fp16"]["first_nonfinite"]),
                 None)
    auto_ok = all(math.isfinite(r["fp16 autocast"]["loss"]) for r in sweep.values())
    ledger.note("fp16_at_largest_gamma_finite", math.isfinite(sweep[OVERFLOW_SCALES[-1]]["fp16"]["loss"]))
    ledger.note("fp16_vs_fp32_unscaled", abs(sweep[1.0]["fp16"]["loss"] / sweep[1.0]["fp32"]["loss"] - 1))
    ledger.add("overflow_where_predicted", "fp16 fails where 65504 ÷ the largest embedding value predicts (first "
               "failing γ on the grid ÷ predicted: within one grid step, a factor √10, above)",
               (observed or math.inf) / predicted, between(1.0, math.sqrt(10)), kind="measured")
    ledger.add("no_overflow", "bf16, and fp16 under autocast (fp32 weights, as section 4 trains), never overflow: "
               "the loss is finite at every γ (bf16 has fp32's exponent; autocast keeps the residual add and "
               "LayerNorm in fp32)", bf16_ok and auto_ok, is_true(), kind="measured")
    ledger.note("overflow_threshold", {"predicted": predicted, "observed": observed})
    top = OVERFLOW_SCALES[-1]
    emb = sweep[1.0]["fp32"]["acts"]["transformer.wte"]
    answer = ("fp16 gave up where predicted: its loss first became inf or NaN at "
              f"**γ = {observed:.0e}**, against {predicted:.2g} predicted." if observed else
              "fp16's loss stayed finite over the whole grid: no value passed 65504.")
    safe = [name for name, ok in (("bf16", bf16_ok), ("fp16 under autocast", auto_ok)) if ok]
    return Findings([
        answer,
        (f"{'Neither bf16 nor fp16 under autocast' if len(safe) == 2 else safe[0] + ' never'} overflowed, even at "
         f"γ = {top:.0e}: bf16 has fp32's exponent, and autocast keeps the residual stream and LayerNorm in fp32."
         if safe else "bf16 and fp16 under autocast overflowed too: see the ledger."),
    ], [
        f"The largest token-embedding value is {emb:.3g}, so 65504 ÷ it predicts γ ≈ {predicted:.2g}.",
        f"fp16's first output that was not finite: {part(first)}." if first else "fp16 had no output that was not "
        "finite.",
        f"bf16's largest number is {FORMATS['bf16'].max:.2g}, not {FORMATS['fp16'].max:g}.",
    ])


def autocast_findings(ledger: Ledger, r: dict) -> Findings:
    predicted = FORMATS["fp16"].max / r["fp32_max"]
    observed = first_overflow(r["runs"])
    where = next((run["first_nonfinite"] for run in r["runs"].values() if run["first_nonfinite"]), None)
    ledger.add("autocast_overflow", "fp16 autocast overflows where a matrix product's output passes 65504: with "
               "block 0's first MLP weights × γ, at the γ that 65504 ÷ the product's largest output predicts (first "
               "failing γ on the grid ÷ predicted: within one grid step, above)", (observed or math.inf) / predicted,
               between(1.0, math.sqrt(10)), kind="measured")
    ledger.note("autocast_overflow", {"predicted": predicted, "observed": observed, "first_nonfinite": where})
    return Findings([
        (f"In a matrix product whose output leaves fp16's range: with the first MLP's weights × γ, autocast first "
         f"failed at **γ = {observed:.0e}**, near the predicted {predicted:.2g}." if observed else
         "Not on this grid: no product's output passed 65504."),
        "So under autocast the danger is a product with large weights, or attention logits that grow during "
        "training.",
    ], [
        f"The first MLP product's largest output is {r['fp32_max']:.3g} in fp32, so 65504 ÷ it predicts "
        f"γ ≈ {predicted:.2g}.",
        f"The first output that was not finite: {part(where)}." if where else "No output was non-finite.",
    ])
