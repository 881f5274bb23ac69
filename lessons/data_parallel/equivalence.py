"""Section 1 of lesson 07: DDP on N ranks against one process on the N-times batch, the ring all-reduce written
out, and what gloo really sends.
"""

import plotly.graph_objects as go

from labtools import plots
from labtools.claims import Findings, Ledger, approx, at_most, is_true
from labtools.parallel import launch
from labtools.plan import collective_bytes
from lessons.data_parallel import TIMEOUT_S, Settings, ranks


def run(S: Settings, world: int) -> dict:
    """world ranks (gradients, ring, a DDP run), then the same run in this process on the world-times batch."""
    res = launch(ranks.equivalence, world, S, desc=f"equivalence × {world}", timeout_s=TIMEOUT_S)
    return {"ranks": res, "single_losses": ranks.single_process_losses(S, world),
            "reordered_losses": ranks.single_process_losses(S, world, micro_batches=world)}


def table(eq: dict[int, dict]) -> go.Figure:
    rows = []
    for world, e in eq.items():
        res = e["ranks"]
        worst = lambda key: max(r[key] for r in res)  # noqa: E731 - the worst rank
        curve = max(abs(a - b) for a, b in zip(res[0]["ddp_run"]["losses"], e["single_losses"]))
        rows.append((f"{world} ranks ({res[0]['dist']['backend']}, {res[0]['dist']['device']})",
                     f"{worst('naive_max_diff'):.1e}", f"{worst('ddp_max_diff'):.1e}", f"{worst('ring_max_diff'):.1e}",
                     f"{curve:.1e}"))
    return plots.table(("run", "naive all-reduce: max |Δg|", "DDP: max |Δg|", "ring vs dist.all_reduce",
                        "loss curves: max |Δ|"), rows, title="Against one process on the whole batch")


def figure(eq: dict[int, dict]) -> go.Figure:
    fig = go.Figure()
    for i, (world, e) in enumerate(eq.items()):
        fig.add_trace(go.Scatter(y=e["single_losses"], mode="lines", name=f"one process, batch {world}·B",
                                 line=dict(color=plots.color(i), width=4), opacity=0.35))
        fig.add_trace(go.Scatter(y=e["ranks"][0]["ddp_run"]["losses"], mode="lines+markers",
                                 name=f"DDP, {world} ranks × B",
                                 line=dict(color=plots.color(i), dash="dot"), marker=dict(size=5)))
    return plots.style(fig, "Training loss: DDP on N ranks vs one process on the N-times batch", "step", "loss")


def wire_ratios(r0: dict, world: int) -> dict[str, float] | None:
    """Bytes on the wire per rank ÷ 2(N−1)/N × the gradient bytes, for the ring written out, dist.all_reduce
    and a DDP backward; None under NCCL (nothing crosses the loopback interface)."""
    if any(v is None for v in r0["wire"].values()):
        return None
    formula = collective_bytes("all_reduce", r0["grad_bytes"], world)
    return {k: v / world / formula for k, v in r0["wire"].items()}


def findings(ledger: Ledger, eq: dict[int, dict]) -> Findings:
    """Statistics of the equivalence runs, computed once: ledger entries and the summary."""
    parts = []
    for world, e in eq.items():
        res, r0 = e["ranks"], e["ranks"][0]
        ddp = max(r["ddp_max_diff"] for r in res)
        naive = max(r["naive_max_diff"] for r in res)
        ring = max(r["ring_max_diff"] for r in res)
        diffs = [abs(a - b) for a, b in zip(r0["ddp_run"]["losses"], e["single_losses"])]
        reordered = [abs(a - b) for a, b in zip(e["reordered_losses"], e["single_losses"])]
        along = max(d for r in res for d in r["ddp_run"]["grad_diffs"].values())
        checked = sorted(int(k) + 1 for k in r0["ddp_run"]["grad_diffs"])  # 1-based, as the figure counts
        ledger.add(f"trajectory_{world}", f"… and along the DDP run: at steps {', '.join(map(str, checked))}, DDP's "
                   "gradients equal one process's on the whole batch at the same weights (max |Δ| ÷ the largest "
                   "gradient entry, worst over ranks and checks; summing instead of averaging would give N − 1)",
                   along, at_most(1e-4), kind="measured")
        ledger.note(f"curve_{world}", {"ddp_vs_one_process": max(diffs), "reordered_vs_one_process": max(reordered)})
        ledger.add(f"ring_{world}", f"The ring all-reduce written out equals dist.all_reduce ({world} ranks, max |Δ|)",
                   ring, at_most(1e-5), kind="measured")
        ledger.add(f"ring_bytes_{world}", f"The written-out ring hands 2(N−1)/N × the gradient bytes to send (N = "
                   f"{world}; counted ÷ formula — equal by construction: it is what the code sends)",
                   r0["ring_bytes_sent"] / r0["ring_bytes_formula"], approx(1.0, rel=0.01), kind="counted",
                   detail=True)
        wire = wire_ratios(r0, world)
        if wire is None:
            ledger.note(f"wire_{world}", "not measurable: NCCL traffic does not cross the loopback interface")
        else:
            for key, what in (("ring", "the written-out ring"), ("all_reduce", "dist.all_reduce"),
                              ("ddp_step", "a DDP backward (its bucketed all-reduces)")):
                ledger.add(f"wire_{key}_{world}", f"On the wire, {what} sends 2(N−1)/N × the gradient bytes per rank "
                           f"(N = {world}; measured on the loopback interface ÷ formula, headers included)",
                           wire[key], approx(1.0, rel=0.05), kind="measured")
        ledger.add(f"backend_{world}", "The launch says which backend and devices it used",
                   all("backend" in r["dist"] and "device" in r["dist"] for r in res), is_true(), kind="measured",
                   detail=True)
        parts += [
            f"**{world} ranks** ({r0['dist']['backend']} on {r0['dist']['device']}): DDP's gradients match one "
            f"process's to **{ddp:.1e}**, the naive all-reduce's to {naive:.1e}.",
            f"Each rank handed the ring {r0['ring_bytes_sent']:,} bytes for {r0['grad_bytes']:,} bytes of gradients: "
            f"2(N−1)/N × that = {r0['ring_bytes_formula']:,.0f} (counted).",
            None if wire is None else
            f"On the wire (loopback, all ranks ÷ N): the ring **{wire['ring']:.3f}×**, `dist.all_reduce` "
            f"{wire['all_reduce']:.3f}×, a DDP backward {wire['ddp_step']:.3f}× the formula (measured).",
            f"Along the run, at steps {', '.join(map(str, checked))}, DDP's gradients equal one process's at the same "
            f"weights to **{along:.1e}**.",
            f"The two loss curves, trained separately, agree to {diffs[0]:.0e} at step 1 and drift to {max(diffs):.1e} "
            f"by step {len(diffs)}; one process accumulating the same {world} blocks drifts as far: "
            f"{max(reordered):.1e} (measured).",
        ]
    return Findings(parts)
