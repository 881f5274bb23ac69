"""Section 1 of lesson 07: DDP on N ranks against one process on the N-times batch, the ring all-reduce written
out, and what gloo really sends.
"""

from dataclasses import dataclass

import plotly.graph_objects as go

from labtools import plots
from labtools.claims import Findings, Ledger, approx, at_most, is_true
from labtools.layout import collective_bytes
from labtools.parallel import launch
from labtools.parallel.diagnose import Ranks
from lessons.data_parallel import TIMEOUT_S, Settings, ranks
from lessons.data_parallel.ranks import EquivalenceResult, Sent

SENT = {Sent.RING: "the written-out ring", Sent.ALL_REDUCE: "dist.all_reduce",
        Sent.DDP_STEP: "a DDP backward (its bucketed all-reduces)"}


@dataclass(frozen=True)
class Compared:
    """One world size: its ranks' results (each an EquivalenceResult; .dist says where they ran) and the same
    training in this process on the world-times batch, in the ranks' order of rows and accumulated in their blocks."""
    ranks: Ranks
    single_losses: list[float]
    reordered_losses: list[float]


def run(S: Settings, world: int) -> Compared:
    """world ranks (gradients, ring, a DDP run), then the same run in this process on the world-times batch."""
    res = launch(ranks.equivalence, world, S, desc=f"equivalence × {world}", timeout_s=TIMEOUT_S)
    return Compared(ranks=res, single_losses=ranks.single_process_losses(S, world),
                    reordered_losses=ranks.single_process_losses(S, world, micro_batches=world))


def table(eq: dict[int, Compared]) -> go.Figure:
    rows = []
    for world, e in eq.items():
        res = e.ranks
        curve = max(abs(a - b) for a, b in zip(res[0].ddp_run.losses, e.single_losses))
        rows.append((f"{world} ranks ({res.dist[0].backend}, {res.dist[0].device})",
                     f"{max(r.naive_max_diff for r in res):.1e}", f"{max(r.ddp_max_diff for r in res):.1e}",
                     f"{max(r.ring_max_diff for r in res):.1e}", f"{curve:.1e}"))
    return plots.table(("run", "naive all-reduce: max |Δg|", "DDP: max |Δg|", "ring vs dist.all_reduce",
                        "loss curves: max |Δ|"), rows, title="Against one process on the whole batch")


def figure(eq: dict[int, Compared]) -> go.Figure:
    fig = go.Figure()
    for i, (world, e) in enumerate(eq.items()):
        fig.add_trace(go.Scatter(y=e.single_losses, mode="lines", name=f"one process, batch {world}·b",
                                 line=dict(color=plots.color(i), width=4), opacity=0.35))
        fig.add_trace(go.Scatter(y=e.ranks[0].ddp_run.losses, mode="lines+markers",
                                 name=f"DDP, {world} ranks × b",
                                 line=dict(color=plots.color(i), dash="dot"), marker=dict(size=5)))
    return plots.style(fig, "Training loss: DDP on N ranks vs one process on the N-times batch", "step", "loss")


def wire_ratios(r0: EquivalenceResult, world: int) -> dict[Sent, float] | None:
    """Bytes on the wire per rank ÷ 2(N−1)/N × the gradient bytes, for the ring written out, dist.all_reduce
    and a DDP backward; None under NCCL (nothing crosses the loopback interface)."""
    if r0.wire is None:
        return None
    formula = collective_bytes("all_reduce", r0.grad_bytes, world)
    return {k: v / world / formula for k, v in r0.wire.items()}


@dataclass(frozen=True)
class _Worst:
    """One world size's gradient checks, the worst rank's."""
    ddp: float      # DDP vs one process, max |Δg|
    naive: float    # the written-out all-reduce vs one process
    ring: float     # the written-out ring vs dist.all_reduce
    along: float    # along the DDP run, ÷ the largest gradient entry
    backend: bool   # every rank said where it ran


@dataclass(frozen=True)
class _Drift:
    """One world size's loss curves against one process's, trained apart: max |Δ loss|."""
    ddp_vs_one_process: float
    reordered_vs_one_process: float  # one process adding the same rows in another order
    first: float                     # DDP's at step 1


def _farthest(ratios: list[float]) -> float:
    """The ratio farthest from 1: a merged claim over world sizes holds only if every world size's does."""
    return max(ratios, key=lambda r: abs(r - 1))


def findings(ledger: Ledger, eq: dict[int, Compared]) -> Findings:
    """Statistics of the equivalence runs, computed once: ledger entries (each merged over the world sizes: the
    worst of them) and the summary."""
    worlds = list(eq)
    ws = " and ".join(map(str, worlds))
    rows, curves = {}, {}
    for world, e in eq.items():
        res, r0 = e.ranks, e.ranks[0]
        diffs = [abs(a - b) for a, b in zip(r0.ddp_run.losses, e.single_losses)]
        reordered = [abs(a - b) for a, b in zip(e.reordered_losses, e.single_losses)]
        rows[world] = _Worst(ddp=max(r.ddp_max_diff for r in res), naive=max(r.naive_max_diff for r in res),
                             ring=max(r.ring_max_diff for r in res),
                             along=max(d for r in res for d in r.ddp_run.grad_diffs.values()),
                             backend=all(d.backend and d.device for d in res.dist))
        curves[world] = _Drift(ddp_vs_one_process=max(diffs), reordered_vs_one_process=max(reordered), first=diffs[0])
        ledger.note(f"curve_{world}", {"ddp_vs_one_process": max(diffs), "reordered_vs_one_process": max(reordered)})
    checked = sorted(step + 1 for step in eq[worlds[0]].ranks[0].ddp_run.grad_diffs)  # 1-based, as the figure counts
    along = max(r.along for r in rows.values())
    ledger.add("trajectory", f"Along a DDP run on {ws} ranks, at steps {', '.join(map(str, checked))}, DDP's "
               "gradients equal one process's on the whole batch at the same weights (max |Δ| ÷ the largest gradient "
               "entry, worst over world sizes, ranks and checks; summing instead of averaging would give N − 1)",
               along, at_most(1e-4), kind="measured")
    ledger.add("ring", f"The ring all-reduce written out equals dist.all_reduce ({ws} ranks, worst max |Δ|)",
               max(r.ring for r in rows.values()), at_most(1e-5), kind="measured")
    ledger.add("backend", "Each launch says which backend and devices it used",
               all(r.backend for r in rows.values()), is_true(), kind="measured", detail=True)

    grads = "| ranks N | backend | DDP: max \\|Δg\\| | naive all-reduce: max \\|Δg\\| | " \
            "along the run (÷ largest entry) | ring vs dist.all_reduce |\n|---|---|---|---|---|---|\n" + "\n".join(
                f"| {w} | {eq[w].ranks.dist[0].backend} on {eq[w].ranks.dist[0].device} | "
                f"{r.ddp:.1e} | {r.naive:.1e} | {r.along:.1e} | {r.ring:.1e} |" for w, r in rows.items())
    drift = "| ranks N | loss curves, trained apart: step 1 | … worst | " \
            "one process, same rows in another order: worst |\n|---|---|---|---|\n" + "\n".join(
                f"| {w} | {c.first:.0e} | {c.ddp_vs_one_process:.1e} | {c.reordered_vs_one_process:.1e} |"
                for w, c in curves.items())
    details = [grads, f"Gradients compared at steps {', '.join(map(str, checked))} of the run.", drift]
    answer = [f"Yes, up to rounding: at every checked step of the run, DDP's gradients equal one process's on the "
              f"whole batch to **{along:.0e}** of the largest gradient entry."]
    ddp_drift = max(c.ddp_vs_one_process for c in curves.values())
    re_drift = max(c.reordered_vs_one_process for c in curves.values())
    if re_drift >= ddp_drift / 2:
        answer.append(f"Trained apart, the two loss curves drift by up to **{ddp_drift:.0e}**, but so does one process "
                      "adding the same rows in another order: rounding, amplified by training, not DDP.")
    else:
        answer.append(f"Trained apart, the two loss curves drift by up to **{ddp_drift:.0e}**, more than one process "
                      "adding the same rows in another order; the gradient check above is what settles it.")
    return Findings(answer, details)


def wire_findings(ledger: Ledger, eq: dict[int, Compared]) -> Findings:
    """What the all-reduces of the equivalence runs sent: bytes handed to the ring (counted) and bytes on the wire
    (measured, gloo ranks only), each merged over the world sizes."""
    ws = " and ".join(map(str, eq))
    r0s = {w: e.ranks[0] for w, e in eq.items()}
    ledger.add("ring_bytes", f"The written-out ring hands 2(N−1)/N × the gradient bytes to send (N = {ws}; counted "
               "÷ formula, the farthest from 1 — equal by construction: it is what the code sends)",
               _farthest([r.ring_bytes_sent / r.ring_bytes_formula for r in r0s.values()]),
               approx(1.0, rel=0.01), kind="counted", detail=True)
    sent = {w: r.ring_bytes_sent / r.grad_bytes for w, r in r0s.items()}
    wires = {w: wire_ratios(r, w) for w, r in r0s.items()}
    for w, v in wires.items():
        if v is None:
            ledger.note(f"wire_{w}", "not measurable: NCCL traffic does not cross the loopback interface")
    most = max(sent)
    answer = [f"At $N = {most}$ each rank sent **{sent[most]:.1f}** $M$, as $2\\frac{{N-1}}{{N}}M$ says: never more "
              "than $2M$, however many ranks."]
    details = [", ".join(f"$N = {w}$: {v:.2f} $M$ sent per rank" for w, v in sent.items()) + "."]
    measured = {w: v for w, v in wires.items() if v is not None}
    if measured:
        on = " and ".join(map(str, measured))
        for key, what in SENT.items():
            ledger.add(f"wire_{key}", f"On the wire, {what} sends 2(N−1)/N × the gradient bytes per rank (N = {on}; "
                       "bytes counted on the network interface the ranks share, per rank, headers included ÷ formula, "
                       "the farthest from 1)", _farthest([v[key] for v in measured.values()]),
                       approx(1.0, rel=0.05), kind="measured")
        worst = max(abs(v[k] - 1) for v in measured.values() for k in v)
        answer.append(f"The wire agrees: the ring written out, PyTorch's all-reduce and a DDP backward each sent "
                      f"within **{worst:.1%}** of the formula.")
        bytes_table = "| ranks N | on the wire ÷ formula: ring | dist.all_reduce | DDP backward |\n" \
                      "|---|---|---|---|\n" + "\n".join(
                          f"| {w} | {v[Sent.RING]:.3f} | {v[Sent.ALL_REDUCE]:.3f} | {v[Sent.DDP_STEP]:.3f} |"
                          for w, v in measured.items())
        details += [bytes_table, "Bytes on the wire are counted on the network interface that all the ranks on this "
                    "machine share, then divided among them; message headers included."]
    else:
        answer.append("Under NCCL the bytes do not cross this machine's network interface, so the wire is not "
                      "measured here.")
    return Findings(answer, details)
