"""Lesson 06, section 3: the estimate against states and activations measured on real small models."""

import plotly.graph_objects as go
import torch

from labtools import optim as O
from labtools import plots
from labtools.budget import architecture, estimate
from labtools.claims import Findings, Ledger, at_most, is_true
from labtools.config import LabConfig, build_gpt
from labtools.device import pick_device
from labtools.memory import cuda_peak_bytes, model_state_bytes, saved_activation_bytes
from labtools.model import GPT
from lessons.memory_budget import Settings

VALIDATION_OPTIMIZERS = {"sgd": lambda p: O.SGD(p, lr=0.1), "momentum": lambda p: O.SGD(p, lr=0.1, momentum=0.9),
                         "adam": lambda p: O.Adam(p), "adamw": lambda p: O.AdamW(p, weight_decay=0.1),
                         "lion": lambda p: O.Lion(p), "adafactor": lambda p: O.Adafactor(p)}


def _model(shape, seed: int) -> tuple[GPT, torch.Tensor, torch.Tensor]:
    L, C, H, V, T, B = shape
    model = build_gpt(LabConfig(n_layer=L, n_embd=C, n_head=H, block_size=T, seed=seed), V, device=pick_device())
    g = torch.Generator().manual_seed(seed)
    X, Y = (torch.randint(V, (B, T), generator=g).to(pick_device()) for _ in range(2))
    return model, X, Y


def validate_states(S: Settings) -> list[dict]:
    """Per shape × optimizer: measured parameter, gradient and optimizer bytes after a step vs predicted."""
    out = []
    for shape in S.validation_shapes:
        arch = architecture(*shape)
        for name, make in VALIDATION_OPTIMIZERS.items():
            model, X, Y = _model(shape, S.seed)
            opt = make(model.parameters())
            model(X, Y)[1].backward()
            opt.step()
            m = model_state_bytes(model, opt)
            b = estimate(arch.n_params, precision="fp32", optimizer=name, param_shapes=arch.param_shapes)
            p = {"params": b.parts.get("weights", 0), "grads": b.parts.get("gradients", 0),
                 "optimizer": b.parts.get("optimizer state", 0)}
            out.append({"shape": shape, "optimizer": name, "measured": m, "predicted": p})
    return out


def validate_activations(S: Settings) -> list[dict]:
    """Per shape: saved-activation bytes measured (and, on CUDA, the allocator's peak of a forward) vs predicted."""
    out = []
    for shape in S.validation_shapes:
        model, X, Y = _model(shape, S.seed)
        row = {"shape": shape, "measured": saved_activation_bytes(model, X, Y),
               "predicted": architecture(*shape, bytes_per_element=4).activations["total"]}
        if X.is_cuda:
            row["cuda_forward_peak"] = cuda_peak_bytes(lambda: model(X, Y))
        out.append(row)
    return out


def figure(states: list[dict], acts: list[dict]) -> go.Figure:
    """Measured against predicted bytes, one point per model and optimizer (model states) and per model
    (activations): on the diagonal, the prediction is exact."""
    MiB = 2**20
    shape = lambda s: f"L = {s[0]}, h = {s[1]}, s = {s[4]}, b = {s[5]}"
    groups = {}
    for r in states:
        groups.setdefault(f"model states, {r['optimizer']}", []).append(
            (sum(r["predicted"].values()), sum(r["measured"].values()), shape(r["shape"])))
    groups["activations"] = [(r["predicted"], r["measured"], shape(r["shape"])) for r in acts]
    fig = go.Figure()
    for i, (name, pts) in enumerate(groups.items()):
        fig.add_trace(go.Scatter(x=[p / MiB for p, _, _ in pts], y=[m / MiB for _, m, _ in pts], mode="markers",
                                 name=name, text=[t for _, _, t in pts], marker=dict(size=9, color=plots.color(i))))
    every = [v / MiB for pts in groups.values() for p, m, _ in pts for v in (p, m)]
    lo, hi = min(every) / 1.5, max(every) * 1.5
    fig.add_trace(go.Scatter(x=[lo, hi], y=[lo, hi], mode="lines", name="measured = predicted",
                             line=dict(color="gray", dash="dot")))
    exact = all(p == m for pts in groups.values() for p, m, _ in pts)
    plots.style(fig, "Small GPTs in fp32, measured against predicted: "
                + ("every point on the line" if exact else "points off the line are misses"),
                "predicted (MiB)", "measured (MiB)")
    fig.update_xaxes(type="log")
    fig.update_yaxes(type="log")
    return fig


def findings(ledger: Ledger, states: list[dict], acts: list[dict]) -> Findings:
    exact = sum(r["measured"] == r["predicted"] for r in states)
    worst = max(abs(r["predicted"] - r["measured"]) / r["measured"] for r in acts)
    ledger.add("states_exact", f"Predicted parameter, gradient and optimizer bytes equal measured, exactly "
               f"({len(states)} model × optimizer pairs; measured from the tensors)", exact == len(states), is_true(),
               kind="measured")
    cpu = pick_device().type == "cpu"
    if cpu:  # fp32 on the CPU: the saved tensors are exactly the ones the formula lists
        ledger.add("acts_exact", "Predicted activation bytes equal measured, exactly (CPU, fp32; saved tensors "
                   "measured; worst gap)", worst, at_most(0.0), kind="measured")
    else:  # GPU attention kernels keep their own extra statistics
        ledger.add("acts_10pct", "Predicted activation bytes within 10% of measured (GPU kernels; worst)", worst,
                   at_most(0.10), kind="measured")
    acts_words = "to the byte" if worst == 0 else f"within **{worst:.1%}**"
    states_words = (f"all **{exact}** model × optimizer pairs' model states to the byte" if exact == len(states) else
                    f"the model states of only **{exact} of {len(states)}** model × optimizer pairs to the byte")
    return Findings([f"{'Yes' if exact == len(states) else 'Not quite'}: it predicts {states_words}, and the "
                     f"activations of every shape {acts_words}."],
                    [f"Model states: {exact} of {len(states)} model × optimizer pairs predicted to the byte.",
                     f"Activations: the worst gap between predicted and measured is {worst:.2%} over {len(acts)} "
                     "shapes."])
