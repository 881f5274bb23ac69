"""Lesson 10, section 3: the collectives tensor parallelism adds, counted and on the wire."""

import plotly.graph_objects as go

from labtools import plots
from labtools.claims import Findings, Ledger, approx, is_true
from labtools.plan import tensor_parallel_bytes
from lessons.tensor_parallel import Settings
from lessons.tensor_parallel.ranks import VARIANTS


def ring_bytes(S: Settings, t: int, sequence_parallel: bool) -> float:
    """Predicted bytes on the wire for one forward + backward of the lesson's model, all ranks together."""
    return t * tensor_parallel_bytes(S.n_layer, S.batch_size, S.block_size, S.n_embd, t, sequence_parallel)


def comm_table(res: dict, S: Settings) -> go.Figure:
    rows = []
    for t, r in res["tp"].items():
        c = r[0]["comm"]
        for variant in VARIANTS:
            sp = variant.endswith("+sp")  # sequence parallel
            calls = ", ".join(f"{n} × {k}" for n, k in sorted(c[variant]["calls"].items()))
            wire = c[variant]["wire"]
            rows.append((f"tp = {t}", variant, calls, f"{ring_bytes(S, t, sp):,.0f}",
                         "—" if wire is None else f"{wire:,}"))
    return plots.table(("", "version", "collectives counted (one forward + backward)", "predicted bytes (ring)",
                        "bytes on the wire (loopback)"), rows, row_height=34,
                       title=f"What tensor parallelism sends: {S.n_layer} layers, b·s·h = "
                             f"{S.batch_size}·{S.block_size}·{S.n_embd}")


def module_table(res: dict) -> go.Figure:
    """Which module of block 0 issues which collective (DTensor's CommDebugMode), TP and TP + SP, at the smallest tp."""
    t = min(res["tp"])
    c = res["tp"][t][0]["comm"]
    rows = []
    for variant in ("dtensor", "dtensor+sp"):
        for fqn, d in c[variant]["per_module"].items():
            if ".h.0." in fqn or fqn.endswith(".h.0") or fqn.endswith("ln_f"):
                fmt = lambda x: ", ".join(f"{k} × {n}" for k, n in x.items()) or "—"  # noqa: E731
                if d["forward"] or d["backward"]:
                    rows.append((variant, fqn.split("transformer.")[-1], fmt(d["forward"]), fmt(d["backward"])))
    return plots.table(("version", "module", "forward", "backward"), rows, row_height=30,
                       title=f"Collectives by module, block 0 (tp = {t}; a parent counts its children's too)")


def findings(ledger: Ledger, res: dict, S: Settings) -> Findings:
    parts = []
    for t, r in res["tp"].items():
        c = r[0]["comm"]
        L = S.n_layer
        ledger.add(f"tp_calls_{t}", f"tp = {t}: TP all-reduces 4 times per layer per forward + backward (counted ÷ 4L)",
                   c["dtensor"]["calls"].get("all_reduce", 0) / (4 * L), approx(1.0, abs=1e-9), kind="counted")
        ledger.add(f"sp_calls_{t}", f"tp = {t}: TP + SP swaps each for a reduce-scatter and an all-gather (4L of each, "
                   "plus two all-gathers: before the final LayerNorm, and in backward for the sequence split before "
                   "block 0)",
                   c["dtensor+sp"]["calls"].get("reduce_scatter_tensor", 0) == 4 * L
                   and c["dtensor+sp"]["calls"].get("all_gather_into_tensor", 0) == 4 * L + 2, is_true(),
                   kind="counted")
        wire = c["dtensor"]["wire"]
        if wire is None:
            continue
        M = c["bsh_bytes"]
        rs_factor = c["collective_wire"]["reduce_scatter"] / c["collective_wire"]["all_gather"]
        ledger.add(f"tp_wire_{t}", f"tp = {t}: TP's bytes on the wire ÷ the ring prediction 8(t−1)·L·b·s·h (measured; "
                   "gloo's own all-reduce and headers add a little)", wire / ring_bytes(S, t, False),
                   approx(1.0, rel=0.15), kind="measured")
        ledger.add(f"gloo_rs_{t}", f"tp = {t}: gloo's reduce-scatter puts about twice an all-gather's bytes on the "
                   "wire — as much as its all-reduce (measured, a collective of b·s·h alone, mean of 10; the ring's "
                   "would be equal)",
                   rs_factor, approx(2.0, rel=0.15), kind="measured")
        sp_wire = c["dtensor+sp"]["wire"]
        ring_sp = ring_bytes(S, t, True)
        alone = c["collective_wire"]  # one collective of M bytes, alone, on the wire
        gloo_sp = ring_sp + 4 * L * (alone["reduce_scatter"] - alone["all_gather"])  # each RS costs an AR on gloo
        ledger.add(f"sp_wire_{t}", f"tp = {t}: TP + SP on the wire ÷ the ring prediction with gloo's measured "
                   "reduce-scatter cost", sp_wire / gloo_sp, approx(1.0, rel=0.15), kind="measured")
        parts.append(f"**tp = {t}**: TP sent **{wire:,}** bytes on the wire ({wire / ring_bytes(S, t, False):.2f}× the "
                     f"ring prediction); TP + SP sent {sp_wire:,} ({sp_wire / ring_sp:.2f}× its ring prediction).")
        parts.append(f"**tp = {t}**: one collective of {M:,} bytes alone put {alone['all_reduce']:,.0f} bytes on the "
                     f"wire as an all-reduce, {alone['all_gather']:,.0f} as an all-gather, "
                     f"{alone['reduce_scatter']:,.0f} as a reduce-scatter.")
    return Findings(parts or ["Bytes on the wire are measured only for gloo ranks on one machine."])
