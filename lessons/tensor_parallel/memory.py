"""Lesson 10, section 4: activation memory per rank, with and without sequence parallelism."""

from dataclasses import dataclass

import plotly.graph_objects as go

from labtools import plots
from labtools.budget import activation_bytes
from labtools.claims import Findings, Ledger, is_true
from lessons.tensor_parallel import Settings
from lessons.tensor_parallel.launches import LessonRuns
from lessons.tensor_parallel.ranks import Split


@dataclass(frozen=True)
class MemoryRow:
    """Activation bytes per rank of one split at one tensor-parallel size, measured and predicted."""
    tp: int          # the launch's tensor-parallel size
    split: Split
    measured: int    # rank 0's saved activations
    predicted: int   # labtools.budget.activation_bytes


def memory_rows(res: LessonRuns, S: Settings) -> list[MemoryRow]:
    from labtools import data
    V = data.text().vocab_size
    rows = []
    for t, r in res.tp.items():
        measured = r[0].memory.saved
        for split, tp, sp in ((Split.NONE, 1, False), (Split.TP, t, False), (Split.TP_SP, t, True)):
            pred = activation_bytes(S.n_layer, S.n_embd, S.n_head, V, S.block_size, S.batch_size, tp=tp,
                                    sequence_parallel=sp)["total"]
            rows.append(MemoryRow(t, split, measured[split], pred))
    return rows


def figure(rows: list[MemoryRow]) -> go.Figure:
    fig = go.Figure()
    for i, split in enumerate(Split):
        sel = [r for r in rows if r.split == split]
        x = [f"tp = {r.tp}" for r in sel]
        fig.add_trace(go.Bar(x=x, y=[r.measured / 2**20 for r in sel], name=f"{split}, measured",
                             offsetgroup=split.value, marker_color=plots.color(i)))
        # the prediction as an outline over its own bar: the same offsetgroup puts it exactly there
        outline = dict(color="rgba(0,0,0,0)", line=dict(color="black", width=2))
        fig.add_trace(go.Bar(x=x, y=[r.predicted / 2**20 for r in sel], name="predicted (outline)",
                             offsetgroup=split.value, showlegend=i == 0, legendgroup="predicted", marker=outline))
    return plots.style(fig, "Activations saved for backward, per rank (one forward of the whole GPT)", "",
                       "MiB", barmode="group")


def findings(ledger: Ledger, rows: list[MemoryRow], S: Settings) -> Findings:
    exact = all(r.measured == r.predicted for r in rows)
    ledger.add("mem_exact", "Activation bytes per rank equal the lab's calculator's prediction exactly (lesson 06): "
               f"none, TP, TP + SP at tp = {', '.join(str(tp) for tp in S.worlds)} (measured vs predicted, fp32)",
               exact, is_true(), kind="measured")
    tp = max(S.worlds)
    # bytes per b·s·h per layer in fp16 (2 bytes an element), Korthikanti et al.'s units, their s×s scores left out
    ours = {sp: 2 * (2 + 14 / tp if sp else 4 + 12 / tp) for sp in (False, True)}
    theirs = {False: 10 + 24 / tp, True: 34 / tp}
    ledger.note("fp16_bytes_per_bsh_layer", {"ours": ours, "korthikanti_without_scores": theirs, "tp": tp})
    worst = max(abs(r.measured - r.predicted) / r.predicted for r in rows)
    at = {r.split: r.measured for r in rows if r.tp == tp}
    table = ("| tp | split | measured, MiB | predicted, MiB |\n|---|---|---|---|\n"
             + "\n".join(f"| {r.tp} | {r.split} | {r.measured / 2**20:.2f} | {r.predicted / 2**20:.2f} |"
                          for r in rows))
    return Findings([
        ("What the lab's calculator predicts, to the byte" if exact else
         f"Close to the lab's calculator's prediction (worst gap **{worst:.1%}**)")
        + ": with TP, $4 + 12/tp$ of lesson 05's 16 tensors per block; with sequence parallelism, $2 + 14/tp$.",
        f"With four ranks, TP cut each rank's activations to **{at[Split.TP] / at[Split.NONE]:.0%}** of one rank's, "
        f"and TP + SP to **{at[Split.TP_SP] / at[Split.NONE]:.0%}**: more than the blocks' own shares, since what "
        "lies outside the blocks (the embeddings, the final LayerNorm, the logits) is not split." if tp == 4 else
        f"At the largest size, TP cut each rank's activations to **{at[Split.TP] / at[Split.NONE]:.0%}** of one "
        f"rank's, and TP + SP to **{at[Split.TP_SP] / at[Split.NONE]:.0%}**.",
    ], [table,
        "In Korthikanti et al.'s units, fp16 bytes per $bsh$ per layer, the lab's block keeps $8 + 24/tp$ with TP and "
        "$4 + 28/tp$ with SP; theirs, its $s \\times s$ scores left out, $10 + 24/tp$ and $34/tp$.",
        "The differences: their block keeps two dropout masks the lab's lacks, and with SP, DTensor keeps the "
        "all-gathered inputs of `c_attn` and `c_fc` for backward, where Megatron-LM gathers them again."])
