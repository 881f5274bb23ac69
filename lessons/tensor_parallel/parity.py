"""Lesson 10, sections 1–2: column/row-parallel layers and the whole model against one process."""

from labtools.claims import Findings, Ledger, at_most
from lessons.tensor_parallel.launches import LessonRuns


def findings(ledger: Ledger, res: LessonRuns) -> Findings:
    """One claim over every tensor-parallel size: the worst difference of any module, version and rank."""
    rows, worst = [], 0.0
    for tp, r in res.tp.items():
        worst_tp = max(x.parity.worst() for x in r)
        worst = max(worst, worst_tp)
        rows.append(f"| {tp} | {r.dist[0].backend} | {worst_tp:.1e} |")
    sizes = " and ".join(str(tp) for tp in res.tp)
    ledger.add("parity", f"tp = {sizes}: MLP, attention and the whole GPT — written out, DTensor, DTensor + SP — give "
               "one rank's outputs and gradients (worst |Δ| over sizes and ranks, fp32)", worst, at_most(1e-5),
               kind="measured")
    return Findings([
        f"Yes: written out, with DTensor, and with DTensor and sequence parallelism, every split module gives one "
        f"rank's outputs and gradients to **{worst:.0e}**, fp32's rounding.",
    ], ["| tp | backend | worst difference from one rank |\n|---|---|---|\n" + "\n".join(rows)])
