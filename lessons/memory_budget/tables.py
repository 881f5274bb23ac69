"""Lesson 06, section 2: published memory tables, reproduced by the estimate."""

import plotly.graph_objects as go

from labtools import plots
from labtools.budget import estimate
from labtools.claims import Findings, Ledger, approx, at_most, is_true
from lessons.memory_budget import GB
from lessons.memory_budget.calculator import PART_ORDER


def _row(name, b) -> tuple:
    p = b.parts
    return (name, *(f"{p.get(k, 0) / GB:,.1f}" for k in PART_ORDER[:4]), f"{b.model_states / GB:,.1f}",
            f"{b.bytes_per_param():.1f}")


HEADER = ("", "weights", "gradients", "fp32 master", "Adam's moments", "model states (GB)", "bytes/param")


def table_7b() -> tuple[go.Figure, dict]:
    rows = {"fp32 + Adam": estimate(7_000_000_000, precision="fp32", optimizer="adam"),
            "bf16 mixed + AdamW": estimate(7_000_000_000, precision="bf16-mixed", optimizer="adamw")}
    same = round(rows["fp32 + Adam"].model_states / GB) == round(rows["bf16 mixed + AdamW"].model_states / GB)
    title = ("7B parameters, one GPU: mixed precision keeps as much model state as fp32" if same else
             "7B parameters, one GPU: the two recipes' model states")
    return plots.table(HEADER, [_row(k, v) for k, v in rows.items()], title=title), rows


def table_7b_findings(ledger: Ledger, rows: dict) -> Findings:
    fp32, mixed = rows["fp32 + Adam"].total / GB, rows["bf16 mixed + AdamW"].total / GB
    ledger.add("7b", "7B: fp32 + Adam and bf16 mixed + AdamW both keep 16 bytes/param = 112 GB (mixed precision "
               "saves activations and time, not model states; worst difference from 112 GB, computed)",
               max(abs(fp32 - 112), abs(mixed - 112)), at_most(1e-9), source="a widely repeated table",
               kind="computed")
    same = "Both come to" if round(fp32) == round(mixed) else "They differ:"
    return Findings([f"{same} **{mixed:.0f} GB** for 7B: mixed precision keeps an fp32 master copy, so it does not "
                     "shrink the model states; it shrinks activations and speeds up the arithmetic."],
                    [f"fp32 + Adam: {fp32:.0f} GB; bf16 mixed + AdamW: {mixed:.0f} GB (computed)."])


def table_70b() -> tuple[go.Figure, dict]:
    rows = {"DDP on 8 GPUs": estimate(70_000_000_000, dp=8),
            "FSDP, fully sharded, on 8 GPUs": estimate(70_000_000_000, zero_stage="FULL_SHARD", dp=8)}
    sharded = rows["FSDP, fully sharded, on 8 GPUs"].total / GB
    title = (f"70B, bf16 mixed + AdamW, per GPU: even fully sharded, {sharded:.0f} GB is "
             f"{'more' if sharded > 80 else 'less'} than an 80 GB GPU holds")
    return plots.table(HEADER, [_row(k, v) for k, v in rows.items()], title=title), rows


def table_70b_findings(ledger: Ledger, rows: dict) -> Findings:
    ddp, fsdp = rows["DDP on 8 GPUs"].total / GB, rows["FSDP, fully sharded, on 8 GPUs"].total / GB
    ledger.add("70b_fsdp", "70B, fully sharded on 8 GPUs: 140 GB per GPU of model states, more than an 80 GB GPU "
               "holds (computed)", fsdp, approx(140, abs=1e-9),
               source="widely repeated tables state 140 GB/GPU without saying it does not fit", kind="computed")
    ledger.note("70b_ddp_gb", ddp)
    fits = "less" if fsdp <= 80 else "more"
    return Findings([f"Full sharding's **{fsdp:,.0f} GB** per GPU is correct arithmetic, the model states ÷ $N$, and "
                     f"{fits} than an 80 GB GPU holds before a single activation."],
                    [f"DDP: {ddp:,.0f} GB per GPU; fully sharded: {fsdp:,.0f} GB per GPU (computed)."])


def table_zero(n_params: int = 7_500_000_000, dp: int = 64) -> tuple[go.Figure, dict]:
    """The ZeRO paper's Figure 1 example: P = 7.5B (the paper's Ψ), N = 64, mixed-precision Adam (K = 12)."""
    rows = {f"ZeRO-{z}": estimate(n_params, zero_stage=z, dp=dp) for z in range(4)}
    base = rows["ZeRO-0"].total
    body = [(k, f"{v.total / GB:.1f}", f"{base / v.total:.1f}×", f"{limit}") for (k, v), limit in
            zip(rows.items(), ("1×", "4× (N → ∞)", "8× (N → ∞)", f"N = {dp}×"))]
    fig = plots.table(("", f"per GPU (GB), N = {dp}", "reduction", "the '4× / 8× / N×' rule"), body,
                      title=f"ZeRO stages, P = {n_params / 1e9:g}B on {dp} GPUs: only stage 3 divides by N")
    return fig, rows


def zero_reductions(dp: int) -> list[float]:
    base = estimate(10**9, zero_stage=0, dp=dp).total
    return [base / estimate(10**9, zero_stage=z, dp=dp).total for z in (1, 2, 3)]


ZERO_PAPER = (120.0, 31.4, 16.6, 1.9)  # Rajbhandari et al. 2020, Fig. 1: GB per GPU at stages 0-3


def table_zero_findings(ledger: Ledger, rows: dict) -> Findings:
    at8, at4096 = zero_reductions(8), zero_reductions(4096)
    ours = [round(rows[f"ZeRO-{z}"].total / GB, 1) for z in range(4)]
    at64 = zero_reductions(64)
    ledger.add("zero_paper", "The ZeRO paper's example (7.5B parameters on 64 GPUs): every stage's GB per GPU "
               "reproduced to 0.1 GB (worst difference, GB; computed)",
               max(abs(a - b) for a, b in zip(ours, ZERO_PAPER)), at_most(1e-9),
               source="Rajbhandari et al. 2020, Fig. 1", kind="computed", detail=True)
    ledger.add("zero_4x_at_8", "'ZeRO-1 gives 4×' is the N → ∞ limit: at N = 8 it is 16/(4 + 12/8) (computed)",
               at8[0], approx(16 / 5.5, rel=1e-9), source="widely repeated: 4× / 8× / N×", kind="computed")
    ledger.add("zero_limits", "ZeRO stages 1 and 2 approach 4× and 8× as N grows (N = 4096; computed)",
               max(abs(at4096[0] - 4) / 4, abs(at4096[1] - 8) / 8), at_most(0.01), kind="computed", detail=True)
    ledger.note("zero_reductions", {8: at8, 64: at64, 4096: at4096})
    table = "| reduction | N = 8 | N = 64 | N = 4096 | quoted |\n|---|---|---|---|---|\n" + "\n".join(
        f"| stage {z} | {a:.2f}× | {m:.2f}× | {b:.2f}× | {q} |"
        for z, a, m, b, q in zip((1, 2, 3), at8, at64, at4096, ("4×", "8×", "N×")))
    return Findings([f"At the paper's $N = 64$ stage 1 saves **{at64[0]:.1f}×**: close to the quoted 4×, which is its "
                     "limit as $N$ grows. Stage 3 alone saves $N\\times$ at any $N$.",
                     f"On 8 GPUs stage 1 saves only **{at8[0]:.1f}×**."],
                    [table, "The ZeRO paper's own example, the first table of this section, comes out to the paper's GB at every "
                     "stage."])


def table_conventions() -> tuple[go.Figure, dict]:
    rows, budgets = [], {}
    for name, grads, kept in (("16", "param", "in bf16"), ("18", "fp32", "in fp32"),
                              ("20", "param+fp32", "in bf16, plus an fp32 copy for the optimizer")):
        b = budgets[name] = estimate(7_000_000_000, grads=grads)
        rows.append((f"{b.bytes_per_param():.0f}", kept, f"{b.total / GB:.0f} GB", f"{b.total / 2**30:.1f} GiB"))
    fig = plots.table(("bytes per parameter", "gradients kept", "7B in GB", "7B in GiB"), rows,
                      title="Bytes per parameter: three numbers, three ways to keep the gradients")
    return fig, budgets


def conventions_findings(ledger: Ledger, budgets: dict) -> Findings:
    per_param = [budgets[k].bytes_per_param() for k in ("16", "18", "20")]
    gib = budgets["16"].total / 2**30
    ledger.add("conventions", "16 / 18 / 20 bytes per parameter are three gradient conventions of the same "
               "mixed-precision Adam (computed)", per_param == [16, 18, 20], is_true(),
               source="widely repeated figures disagree", kind="computed")
    ledger.add("gib", "112 GB is 104.3 GiB (some tables mix the two; computed)", gib, approx(104.3, abs=0.05),
               kind="computed", detail=True)
    return Findings([
        "From how the gradients are kept: in bf16, in fp32, or in both; the rest of mixed-precision Adam is the same.",
        f"Units differ too: the same {budgets['16'].total / GB:.0f} GB reads **{gib:.1f}** in GiB.",
    ], ["Bytes per parameter: " + ", ".join(f"{b:.0f} ({c})" for b, c in zip(per_param, ("bf16 gradients",
                                                                                      "fp32 gradients", "both")))
        + " (computed)."])
