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


LABELS = {Version.WRITTEN_OUT: "written out", Version.DTENSOR: "DTensor TP", Version.DTENSOR_SP: "DTensor TP + SP"}


def figure(res: LessonRuns, S: Settings) -> go.Figure:
    """Bytes of one forward + backward of the whole GPT, all ranks together: the ring's prediction beside what
    crossed the loopback interface, for each version at each tensor-parallel size."""
    x = [f"{LABELS[v]}, tp = {t}" for t in res.tp for v in Version]
    series = {"predicted (ring)": [ring_bytes(S, t, v == Version.DTENSOR_SP) / 1e6 for t in res.tp for v in Version]}
    wire = [r[0].comm.versions[v].wire for r in res.tp.values() for v in Version]
    if all(w is not None for w in wire):
        series["on the wire (gloo)"] = [w / 1e6 for w in wire]
    return plots.bars(x, series, yaxis="MB, all ranks", title="What tensor parallelism sends in one forward and "
                      "backward: sequence parallelism costs more only on gloo")


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
    tp_wire, sp_ring, sp_gloo, rs, rows = [], [], [], [], []
    for tp, c in measured.items():
        alone = c.collective_wire  # one collective of b·s·h bytes, alone, on the wire
        wire, sp_wire = c.versions[Version.DTENSOR].wire, c.versions[Version.DTENSOR_SP].wire
        gloo_sp = ring_bytes(S, tp, True) + 4 * L * (alone.reduce_scatter - alone.all_gather)  # RS = AR on gloo
        tp_wire.append(wire / ring_bytes(S, tp, False))
        sp_ring.append(sp_wire / ring_bytes(S, tp, True))
        sp_gloo.append(sp_wire / gloo_sp)
        rs.append(alone.reduce_scatter / alone.all_gather)
        rows.append(f"| {tp} | {tp_wire[-1]:.2f} | {sp_ring[-1]:.2f} | {sp_gloo[-1]:.2f} | {rs[-1]:.2f} |")
    far = lambda xs, x0: max(xs, key=lambda x: abs(x - x0))  # noqa: E731 - the size farthest from the claim
    ledger.add("tp_wire", f"tp = {sizes}: TP's bytes on the wire, all ranks together, ÷ the ring prediction "
               "tp · L · 8(tp−1)/tp · b·s·h · 4 bytes, the size farthest from 1 (gloo's own all-reduce and headers add "
               "a little)", far(tp_wire, 1.0), approx(1.0, rel=0.15), kind="measured")
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
    ], ["| tp | TP: wire ÷ ring | TP + SP: wire ÷ ring | TP + SP: wire ÷ ring, gloo's reduce-scatter costed | gloo's "
        "reduce-scatter ÷ its all-gather |\n|---|---|---|---|---|\n" + "\n".join(rows),
        "Counted per forward and backward: TP called four all-reduces per layer; TP + SP four reduce-scatters and "
        "four all-gathers per layer, plus two all-gathers at the ends of the sequence-split stretch.",
        "The last column measures one collective of $bsh$ alone, the mean of ten runs."])
