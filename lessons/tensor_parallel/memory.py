"""Lesson 10, section 4: activation memory per rank, with and without sequence parallelism."""

import plotly.graph_objects as go

from labtools import plots
from labtools.budget import activation_bytes
from labtools.claims import Findings, Ledger, is_true
from lessons.tensor_parallel import Settings


def memory_rows(res: dict, S: Settings) -> list[tuple]:
    from labtools import data
    V = data.text().vocab_size
    rows = []
    for t, r in res["tp"].items():
        measured = r[0]["memory"]
        for variant, tp, sp in (("none", 1, False), ("tp", t, False), ("tp+sp", t, True)):
            pred = activation_bytes(S.n_layer, S.n_embd, S.n_head, V, S.block_size, S.batch_size, tp=tp,
                                    sequence_parallel=sp)["total"]
            rows.append((t, variant, measured[variant], pred))
    return rows


def figure(rows: list[tuple]) -> go.Figure:
    fig = go.Figure()
    for i, variant in enumerate(("none", "tp", "tp+sp")):
        sel = [r for r in rows if r[1] == variant]
        x = [f"tp = {r[0]}" for r in sel]
        fig.add_trace(go.Bar(x=x, y=[r[2] / 2**20 for r in sel], name=f"{variant}, measured", offsetgroup=variant,
                             marker_color=plots.color(i)))
        # the prediction as an outline over its own bar: the same offsetgroup puts it exactly there
        outline = dict(color="rgba(0,0,0,0)", line=dict(color="black", width=2))
        fig.add_trace(go.Bar(x=x, y=[r[3] / 2**20 for r in sel], name="predicted (outline)", offsetgroup=variant,
                             showlegend=i == 0, legendgroup="predicted", marker=outline))
    return plots.style(fig, "Activations saved for backward, per rank (one forward of the whole GPT)", "",
                       "MiB", barmode="group")


def findings(ledger: Ledger, rows: list[tuple], S: Settings) -> Findings:
    exact = all(measured == pred for _, _, measured, pred in rows)
    ledger.add("mem_exact", f"Activation bytes per rank equal labtools.budget's prediction exactly: none, TP, TP + SP "
               f"at tp = {', '.join(str(t) for t in S.worlds)} (measured vs predicted, fp32)", exact, is_true(),
               kind="measured")
    t = max(S.worlds)
    # bytes per b·s·h per layer in fp16 (2 bytes an element), Korthikanti et al.'s units, their s×s scores left out
    ours = {sp: 2 * (2 + 14 / t if sp else 4 + 12 / t) for sp in (False, True)}
    theirs = {False: 10 + 24 / t, True: 34 / t}
    ledger.note("fp16_bytes_per_bsh_layer", {"ours": ours, "korthikanti_without_scores": theirs, "t": t})
    worst = max(abs(m - p) / p for _, _, m, p in rows)
    return Findings([
        f"Measured equals predicted in every case: the worst gap is **{worst:.1%}**.",
        f"In fp16 bytes per b·s·h per layer at t = {t}, the lab's block keeps 8 + 24/t = **{ours[False]:.1f}** with "
        f"TP; Korthikanti et al.'s 10 + 24/t = {theirs[False]:.1f} (their s×s scores left out) adds two dropout masks.",
        f"With SP, the lab's block keeps 4 + 28/t = **{ours[True]:.1f}**, theirs 34/t = {theirs[True]:.1f}: DTensor "
        "keeps the all-gathered inputs of c_attn and c_fc for backward; Megatron-LM gathers them again.",
    ])
