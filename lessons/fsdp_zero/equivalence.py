"""Lesson 08, section 4: FSDP's training curve against DDP's."""

import plotly.graph_objects as go

from labtools import plots
from labtools.claims import Findings, Ledger, at_most
from labtools.parallel import launch
from lessons.fsdp_zero import TIMEOUT_S, Settings, ranks
from lessons.fsdp_zero.ranks import EquivalenceResult


def run(S: Settings, world: int = 2) -> list[EquivalenceResult]:
    return launch(ranks.equivalence, world, S, desc=f"FSDP vs DDP × {world}", timeout_s=TIMEOUT_S)


def figure(eq: list[EquivalenceResult]) -> go.Figure:
    r0 = eq[0]
    fig = go.Figure([go.Scatter(y=r0.ddp.losses, mode="lines", name="DDP", line=dict(width=4), opacity=0.4),
                     go.Scatter(y=r0.fsdp.losses, mode="lines+markers", name="FSDP2 (ZeRO-3)",
                                line=dict(dash="dot"))])
    same = max(abs(a - b) for a, b in zip(r0.ddp.losses, r0.fsdp.losses)) <= 1e-4
    return plots.style(fig, "On the same data, FSDP " + ("trains the losses DDP trains" if same else
                                                          "and DDP part ways"), "step", "loss")


def findings(ledger: Ledger, eq: list[EquivalenceResult]) -> Findings:
    r0 = eq[0]
    ddp_grads, fsdp_grads = max(r.ddp.grad_max_diff for r in eq), max(r.fsdp.grad_max_diff for r in eq)
    curve = max(abs(a - b) for a, b in zip(r0.fsdp.losses, r0.ddp.losses))
    steps = len(r0.fsdp.losses)
    ledger.add("fsdp_grads", "FSDP's first-step gradients equal one process on the whole batch (max |Δ| over ranks)",
               fsdp_grads, at_most(1e-6), kind="measured")
    ledger.add("fsdp_curve", f"FSDP and DDP loss curves agree over {steps} steps (max |Δ loss|)", curve, at_most(0.01),
               kind="measured")
    follows = "matches DDP's exactly" if curve == 0 else f"follows DDP's to within **{curve:.0e}**"
    return Findings([f"No: FSDP's first-step gradients equal one process's on the whole batch to "
                     f"**{fsdp_grads:.1e}**, and over the run its loss curve {follows}."],
                    [f"First-step gradients against one process on the whole batch: DDP {ddp_grads:.1e}, FSDP "
                     f"{fsdp_grads:.1e}.", f"Loss curves compared over {steps} steps."])
