"""Lesson 16, sections 1-2: the running example — a 70B model on 15T tokens with 2,048 H100s: its layouts ranked,
why the best one wins, and the whole run in days, dollars and failures."""

from dataclasses import dataclass

import plotly.graph_objects as go

from labtools import plots
from labtools.claims import Findings, Ledger
from labtools.plan import PART_LABELS, Part, RunPlan, StepEstimate, rank_layouts, run_plan
from labtools.runs import LLAMA3
from labtools.shapes import MODELS
from lessons.plan_a_run import GB, H100
from lessons.plan_a_run.predicted import V, calibrate


@dataclass(frozen=True)
class Example:
    """The running example: a model of labtools.shapes.MODELS on a number of H100s."""
    model: str = "70B"
    gpus: int = 2048
    batch: int = 1024              # sequences per step
    tokens: float = 15e12
    dollars_per_gpu_hour: float = 2.0


@dataclass(frozen=True)
class Plan:
    ranked: list[StepEstimate]     # every layout the batch allows, fastest fitting first
    best: StepEstimate
    run: RunPlan
    efficiency: float
    example: Example


EXAMPLE = Example()


def efficiency() -> float:
    """The H100 kernel efficiency calibrated on Llama 3 405B's 8,192-GPU layout (section 3)."""
    return calibrate(LLAMA3.layouts[0], V)


def plan(ex: Example = EXAMPLE) -> Plan:
    """Every layout of the example ranked (interleaved v = 4 where the micro-batches allow it, else 1F1B), and the
    whole run for the fastest one that fits."""
    eff, model = efficiency(), MODELS[ex.model]
    ranked = rank_layouts(model, H100, ex.gpus, ex.batch, v=V, efficiency=eff)
    best = next(e for e in ranked if e.fits)
    run = run_plan(model, H100, best.layout, ex.batch, ex.tokens, v=V, efficiency=eff,
                   dollars_per_gpu_hour=ex.dollars_per_gpu_hour)
    return Plan(ranked, best, run, eff, ex)


def figure(shown: list[StepEstimate], chosen: StepEstimate | None, gpu_memory: float, title: str) -> go.Figure:
    """Memory per GPU (red: does not fit) and the step split into its parts, one row per layout, fastest first."""
    names = [f"{'→ ' if e is chosen else ''}{e.layout}{'' if e.fits else ' (does not fit)'}" for e in shown]
    fig = plots.subplots(1, 2, ("memory per GPU (GB)", "time per step (s)"), title=title, height=440, legend="below")
    fig.add_trace(go.Bar(y=names, x=[e.memory.total / GB for e in shown], orientation="h", showlegend=False,
                         marker_color=[plots.color(0) if e.fits else "#cf222e" for e in shown]), row=1, col=1)
    plots.marked_line(fig, x=gpu_memory / GB, text=f"{gpu_memory / GB:.0f} GB", row=1, col=1)
    for i, part in enumerate(Part):
        fig.add_trace(go.Bar(y=names, x=[e.breakdown[part] for e in shown], orientation="h", name=PART_LABELS[part],
                             marker_color=plots.color(i + 1)), row=1, col=2)
    fig.update_layout(barmode="stack", margin_l=200, legend_traceorder="normal")
    if "<br>" in title:  # a second line under the title: room above the subplots' titles
        fig.update_layout(margin_t=120, height=480)
    fig.update_yaxes(autorange="reversed")
    fig.update_yaxes(showticklabels=False, row=1, col=2)
    return fig


def ranked_figure(p: Plan, top: int = 8) -> go.Figure:
    ex = p.example
    return figure(p.ranked[:top], p.best, H100.gpu_memory,
                  f"{ex.model} on {ex.gpus:,} H100s: the fastest layout that fits is {p.best.layout}")


def run_rows(run: RunPlan) -> list[tuple[str, str]]:
    e = run.step  # its layout, step time and MFU are section 1's
    return [("steps", f"{run.steps:,} of {e.step_s:.2f} s"),
            ("days without failures", f"{run.days:.1f}"),
            ("the job fails every", f"{run.job_mtbf_h:.1f} h"),
            ("save every (Young)", f"{run.interval_s / 60:.0f} min"),
            ("time lost to failures", f"{run.waste:.1%}"),
            ("days with failures", f"{run.days_with_failures:.1f}"),
            ("GPU-hours", f"{run.gpu_hours / 1e6:.2f} M"), ("cost", f"${run.cost / 1e6:.1f} M")]


def run_table(p: Plan) -> go.Figure:
    ex = p.example
    return plots.table(("the whole run (computed)", "value"), run_rows(p.run), row_height=28,
                       title=f"The whole run, {ex.tokens / 1e12:g}T tokens: months and millions, failures "
                             f"included (${ex.dollars_per_gpu_hour:g} per GPU-hour)")


def why(p: Plan) -> tuple[StepEstimate, Part]:
    """The runner-up among fitting layouts, and what costs it more than the best (the part that differs most)."""
    fitting = [e for e in p.ranked if e.fits]
    best, second = fitting[0], fitting[1]
    diff = {k: second.breakdown[k] - best.breakdown[k] for k in Part}
    return second, max(diff, key=diff.get)


def findings(ledger: Ledger, p: Plan) -> Findings:
    best, run, ex = p.best, p.run, p.example
    m = MODELS[ex.model]
    second, part = why(p)
    unfit = [e for e in p.ranked if not e.fits]
    ledger.note("example", {"layout": str(best.layout), "step_s": best.step_s, "days": run.days,
                            "days_with_failures": run.days_with_failures, "cost": run.cost, "mfu": best.mfu})
    return Findings([
        f"Compute, plus whatever cannot hide behind it. The fastest layout that fits, `{best.layout}`, spends "
        f"**{best.compute_s / best.step_s:.0%}** of its step computing; the runner-up loses time to "
        f"{PART_LABELS[part]}.",
        "Too little model parallelism does not fit at all: each GPU would hold too much of the model.",
    ], [
        "| the example | |\n|---|---|\n"
        f"| model | {ex.model} parameters: {m.n_layer} layers of width {m.n_embd}, {m.n_head} heads |\n"
        f"| batch | {ex.batch:,} sequences of {m.seq:,} tokens per step |\n"
        f"| run | {ex.tokens / 1e12:.0f}T tokens on {ex.gpus:,} H100s of 80 GB |\n"
        f"| kernel efficiency | {p.efficiency:.0%}, calibrated on Llama 3's run (section 3) |",
        f"`{best.layout}`: {best.step_s:.2f} s per step at {best.mfu:.0%} MFU (model FLOPs utilisation, lesson 12; "
        "predicted).",
        f"Each layer's forward runs again in backward (activation checkpointing, lesson 05), so the GPUs compute "
        f"{best.hardware_flops / best.model_flops:.2f}× the model's FLOPs; MFU counts only the model's, so it sits "
        "below the share of the step spent computing.",
        f"The runner-up, `{second.layout}`: {second.step_s - best.step_s:.2f} s per step slower.",
        f"{len(unfit)} of {len(p.ranked)} layouts do not fit 80 GB.",
    ])


def run_findings(p: Plan) -> Findings:
    """Section 2's answer: the whole run's days and cost, and what failures take."""
    run = p.run
    return Findings([
        f"About **{run.days_with_failures:.0f} days**, failures included, for about **{run.cost / 1e6:.1f}** million "
        "dollars of GPU time.",
        ("Failures take only a small share of it, though the job fails often: saving often keeps what each one "
         "loses small." if run.waste < 0.1 else "Failures take a large share of it: save more often, or cheaper."),
    ], [
        f"Failures take {run.waste:.1%} of the run; the job fails every {run.job_mtbf_h:.0f} h.",
        f"A save every {run.interval_s / 60:.0f} minutes, $\\sqrt{{2\\delta \\cdot \\text{{MTBF}}}}$ for a save that "
        f"stalls training $\\delta = {run.save_s:g}$ s.",
        f"Without failures the run would take {run.days:.1f} days.",
    ])
