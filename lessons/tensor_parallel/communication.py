"""Lesson 10, section 3: the collectives tensor parallelism adds, counted and on the wire."""

import plotly.graph_objects as go

from labtools import plots
from labtools.claims import Findings, Ledger, approx, is_true
from labtools.layout import tensor_parallel_bytes
from lessons.tensor_parallel import Settings
from lessons.tensor_parallel.launches import LessonRuns
from lessons.tensor_parallel.ranks import Version


def ring_bytes(S: Settings, tp: int, sequence_parallel: bool) -> float:
    """Predicted bytes on the wire for one forward + backward of the lesson's model, all ranks together."""
    return tp * tensor_parallel_bytes(S.n_layer, S.batch_size, S.block_size, S.n_embd, tp, sequence_parallel)


def comm_table(res: LessonRuns, S: Settings) -> go.Figure:
    rows = []
    for t, r in res.tp.items():
        c = r[0].comm
        for variant in Version:
            sp = variant == Version.DTENSOR_SP  # sequence parallel
            calls = ", ".join(f"{n} × {k}" for n, k in sorted(c.versions[variant].calls.items()))
            wire = c.versions[variant].wire
            rows.append((f"tp = {t}", variant, calls, f"{ring_bytes(S, t, sp):,.0f}",
                         "—" if wire is None else f"{wire:,}"))
    return plots.table(("", "version", "collectives counted (one forward + backward)", "predicted bytes (ring)",
                        "bytes on the wire (loopback)"), rows, row_height=34,
                       title=f"What tensor parallelism sends: {S.n_layer} layers, b·s·h = "
                             f"{S.batch_size}·{S.block_size}·{S.n_embd}")


def module_table(res: LessonRuns) -> go.Figure:
    """Which module of block 0 issues which collective (DTensor's CommDebugMode), TP and TP + SP, at the smallest tp."""
    t = min(res.tp)
    c = res.tp[t][0].comm
    rows = []
    for variant in (Version.DTENSOR, Version.DTENSOR_SP):
        for fqn, d in c.versions[variant].per_module.items():
            if ".h.0." in fqn or fqn.endswith(".h.0") or fqn.endswith("ln_f"):
                fmt = lambda x: ", ".join(f"{k} × {n}" for k, n in x.items()) or "—"  # noqa: E731
                if d.forward or d.backward:
                    rows.append((variant, fqn.split("transformer.")[-1], fmt(d.forward), fmt(d.backward)))
    return plots.table(("version", "module", "forward", "backward"), rows, row_height=30,
                       title=f"Collectives by module, block 0 (tp = {t}; a parent counts its children's too)")


def findings(ledger: Ledger, res: LessonRuns, S: Settings) -> Findings:
    """One claim per quantity over every tensor-parallel size: calls counted, bytes on the wire against the ring's
    prediction, and gloo's reduce-scatter cost."""
    L, sizes = S.n_layer, " and ".join(str(tp) for tp in res.tp)
    calls = {tp: r[0].comm.versions for tp, r in res.tp.items()}
    tp_calls = [c[Version.DTENSOR].calls.get("all_reduce", 0) / (4 * L) for c in calls.values()]
    ledger.add("tp_calls", f"tp = {sizes}: TP all-reduces 4 times per layer per forward + backward (counted ÷ 4L, the "
               "size farthest from 1)", max(tp_calls, key=lambda x: abs(x - 1)), approx(1.0, abs=1e-9),
               kind="counted")
    ledger.add("sp_calls", f"tp = {sizes}: TP + SP swaps each for a reduce-scatter and an all-gather (4L of each, "
               "plus two all-gathers: before the final LayerNorm, and in backward for the sequence split before "
               "block 0)", all(c[Version.DTENSOR_SP].calls.get("reduce_scatter_tensor", 0) == 4 * L
                               and c[Version.DTENSOR_SP].calls.get("all_gather_into_tensor", 0) == 4 * L + 2
                               for c in calls.values()), is_true(), kind="counted")
    measured = {tp: r[0].comm for tp, r in res.tp.items() if r[0].comm.versions[Version.DTENSOR].wire is not None}
    if not measured:
        return Findings(["Four all-reduces per layer, as counted; bytes on the wire are measured only for gloo ranks "
                         "on one machine."])
    tp_wire, sp_ring, sp_gloo, rs, rows, alone_rows = [], [], [], [], [], []
    for tp, c in measured.items():
        alone = c.collective_wire  # one collective of b·s·h bytes, alone, on the wire
        wire, sp_wire = c.versions[Version.DTENSOR].wire, c.versions[Version.DTENSOR_SP].wire
        gloo_sp = ring_bytes(S, tp, True) + 4 * L * (alone.reduce_scatter - alone.all_gather)  # RS = AR on gloo
        tp_wire.append(wire / ring_bytes(S, tp, False))
        sp_ring.append(sp_wire / ring_bytes(S, tp, True))
        sp_gloo.append(sp_wire / gloo_sp)
        rs.append(alone.reduce_scatter / alone.all_gather)
        rows.append(f"| {tp} | {wire:,} | {tp_wire[-1]:.2f} | {sp_wire:,} | {sp_ring[-1]:.2f} | {sp_gloo[-1]:.2f} |")
        alone_rows.append(f"| {tp} | {c.bsh_bytes:,} | {alone.all_reduce:,.0f} | {alone.all_gather:,.0f} | "
                          f"{alone.reduce_scatter:,.0f} |")
    far = lambda xs, x0: max(xs, key=lambda x: abs(x - x0))  # noqa: E731 - the size farthest from the claim
    ledger.add("tp_wire", f"tp = {sizes}: TP's bytes on the wire ÷ the ring prediction 8(tp−1)·L·b·s·h, the size "
               "farthest from 1 (gloo's own all-reduce and headers add a little)", far(tp_wire, 1.0),
               approx(1.0, rel=0.15), kind="measured")
    ledger.add("gloo_rs", f"tp = {sizes}: gloo's reduce-scatter puts about twice an all-gather's bytes on the wire — "
               "as much as its all-reduce (a collective of b·s·h alone, mean of 10, the size farthest from 2; the "
               "ring's would be equal)", far(rs, 2.0), approx(2.0, rel=0.15), kind="measured")
    ledger.add("sp_wire", f"tp = {sizes}: TP + SP on the wire ÷ the ring prediction with gloo's measured "
               "reduce-scatter cost, the size farthest from 1", far(sp_gloo, 1.0), approx(1.0, rel=0.15),
               kind="measured")
    return Findings([
        f"Four all-reduces of $bsh$ per layer, two forward and two backward: TP's bytes on the wire came within "
        f"**{max(abs(x - 1) for x in tp_wire):.0%}** of the ring's prediction.",
        f"Sequence parallelism swaps each for a reduce-scatter and an all-gather. On a ring that sends the same bytes; "
        f"on gloo, whose reduce-scatter costs an all-reduce, it sent up to **{max(sp_ring):.1f}×** as many.",
    ], ["| tp | TP, bytes on the wire | ÷ ring | TP + SP, bytes on the wire | ÷ ring | ÷ ring with gloo's "
        "reduce-scatter |\n|---|---|---|---|---|---|\n" + "\n".join(rows),
        "Below, one collective of b·s·h alone: its bytes on the wire, the mean of ten.",
        "| tp | b·s·h bytes | all-reduce | all-gather | reduce-scatter |\n|---|---|---|---|---|\n"
        + "\n".join(alone_rows)])
