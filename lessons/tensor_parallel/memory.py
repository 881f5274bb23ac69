"""Lesson 10, section 4: activation memory per rank, with and without sequence parallelism."""

import plotly.graph_objects as go

from labtools import plots
from labtools.budget import activation_bytes, korthikanti_tp_bytes_per_layer
from labtools.claims import Ledger, is_true
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
        fig.add_trace(go.Bar(x=[f"tp = {r[0]}" for r in sel], y=[r[2] / 2**20 for r in sel],
                             name=f"{variant}, measured", marker_color=plots.color(i)))
        fig.add_trace(go.Scatter(x=[f"tp = {r[0]}" for r in sel], y=[r[3] / 2**20 for r in sel], mode="markers",
                                 name="predicted", showlegend=i == 0,
                                 marker=dict(color="black", symbol="line-ew-open", size=28, line=dict(width=3))))
    return plots.style(fig, "Activations saved for backward, per rank (one forward of the whole GPT)", "",
                       "MiB", barmode="group")


def findings(ledger: Ledger, rows: list[tuple], S: Settings) -> str:
    exact = all(measured == pred for _, _, measured, pred in rows)
    ledger.add("mem_exact", f"Activation bytes per rank equal labtools.budget's prediction exactly: none, TP, TP + SP "
               f"at tp = {', '.join(str(t) for t in S.worlds)} (measured vs predicted, fp32)", exact, is_true(),
               kind="measured")
    s, b, h, a = S.block_size, S.batch_size, S.n_embd, S.n_head
    k = {sp: {t: korthikanti_tp_bytes_per_layer(s, b, h, a, t, sp) / (s * b * h) for t in S.worlds}
         for sp in (False, True)}
    t = max(S.worlds)
    ours = {sp: (2 + 14 / t if sp else 4 + 12 / t) for sp in (False, True)}
    return (f"Measured equals predicted for every case. Per layer, in units of b·s·h: our block keeps 16 without "
            f"tensor parallelism, 4 + 12/t with it (the LayerNorms' and the column-parallel linears' inputs stay "
            f"whole: {ours[False]:.1f} at t = {t}), and 2 + 14/t with sequence parallelism ({ours[True]:.1f}): "
            f"DTensor keeps the all-gathered inputs of c_attn and c_fc for their backward. Korthikanti et al.'s "
            f"formulas (fp16, dropout masks, the s×s scores kept) give {k[False][t]:.1f} and {k[True][t]:.1f} at "
            f"t = {t}: Megatron-LM gathers those inputs again in backward instead of keeping them, which is how "
            "it reaches 34/t — everything divided by t.")
