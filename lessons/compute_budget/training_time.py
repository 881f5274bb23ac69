"""Lesson 12, section 4: training time — published runs, the calculator, and DDP's weak scaling."""

import statistics
from dataclasses import asdict, dataclass

import ipywidgets as W
import numpy as np
import plotly.graph_objects as go

from labtools import plots
from labtools.claims import Findings, Ledger, approx
from labtools.compute import training_cost, training_days, training_flops, training_seconds
from labtools.config import derive
from labtools.parallel import launch
from labtools.plan import CLUSTER_LABELS, CLUSTERS, GPU
from labtools.runs import GPT3, LLAMA3, PUBLISHED, PublishedRun
from labtools.controls import choice_slider, number_box, parse_number, slider
from labtools.quiz import Question, answer_check
from labtools.widgets import Panel
from lessons.compute_budget import CHINCHILLA_TOKENS_PER_PARAM, TIMEOUT_S, Settings, ranks
from lessons.compute_budget.ranks import ScalingJob, WeakScaling


@dataclass(frozen=True)
class Recomputed:
    """A published run's FLOPs recomputed from its parameters and tokens; for a run with a published throughput, the
    days it implies (Narayanan et al.'s 8·T·P/(n·X)) and its utilisation."""
    run: PublishedRun
    flops: float                      # 6·P·D
    days: float | None = None         # at the published throughput, recomputation counted
    hfu: float | None = None          # the published throughput ÷ the peak
    mfu: float | None = None          # … counting 6 of the 8 FLOPs per parameter (the recomputed forward is not model)
    days_at_mfu: float | None = None  # 6·P·D at that MFU: the same days, algebraically

    @property
    def flops_ratio(self) -> float:
        return self.flops / self.run.flops


def published() -> dict[PublishedRun, Recomputed]:
    """The published runs recomputed: 6·P·D against the published FLOPs; GPT-3's time from Narayanan et al.'s
    8·D·P/(N·X) (their 140 teraFLOP/s per A100, recomputation included) and the same run as 6PD at the MFU it
    implies."""
    out = {}
    for run in PUBLISHED:
        flops = training_flops(run.n_params, run.tokens)
        if not run.layouts:
            out[run] = Recomputed(run, flops)
            continue
        at = run.layouts[0]
        hfu = at.tflops * 1e12 / run.peak_flops
        mfu = hfu * 6 / 8
        out[run] = Recomputed(run, flops, days=training_days(run.n_params, run.tokens, at.gpus, at.tflops * 1e12,
                                                               recompute=True), hfu=hfu, mfu=mfu,
                               days_at_mfu=training_seconds(flops, at.gpus, run.peak_flops, mfu) / 86400)
    return out


def published_findings(ledger: Ledger, rows: dict[PublishedRun, Recomputed]) -> Findings:
    g, ll = rows[GPT3], rows[LLAMA3]
    ledger.add("gpt3_flops", "GPT-3 175B on 300B tokens: 6·P·D = the published 3.14e23 FLOPs (computed ÷ published)",
               g.flops_ratio, approx(1, rel=0.02), source=g.run.source, kind="computed")
    ledger.add("gpt3_days", "GPT-3 175B on 1,024 A100s at 140 teraFLOP/s each: Narayanan et al.'s about 34 days "
               "(their 8PD ÷ the cluster's FLOP/s, computed)",
               g.days, approx(34, rel=0.02), source="Narayanan et al. 2021", kind="computed")
    # 6PD at HFU × 6/8 is 8PD at HFU, algebraically: a note, not a claim that could fail
    ledger.note("gpt3_days_at_implied_mfu", {"mfu": g.mfu, "days": g.days_at_mfu})
    ledger.add("llama3_flops", "Llama 3 405B on 15.6T tokens: 6·P·D = the published 3.8e25 FLOPs (computed ÷ "
               "published)", ll.flops_ratio, approx(1, rel=0.02), source=ll.run.source, kind="computed")
    return Findings([
        "The published FLOPs come back from $6PD$: within a percent for GPT-3 175B and Llama 3 405B.",
        f"For GPT-3 on the A100 cluster Narayanan et al. benchmarked, their own formula gives **{g.days:.1f} "
        "days**, the \"about 34\" they quote: an estimate, not a duration OpenAI published.",
    ], [
        f"GPT-3: $6 \\times 175 \\cdot 10^9 \\times 300 \\cdot 10^9$ = {g.flops:.3g} FLOPs (published "
        f"{g.run.flops:.3g}).",
        f"Llama 3 405B: $6 \\times 405 \\cdot 10^9 \\times 15.6 \\cdot 10^{{12}}$ = {ll.flops:.3g} FLOPs (published "
        f"{ll.run.flops:.2g}).",
        "Their formula divides $8PD$ by the cluster's FLOP/s, 1,024 GPUs at 140 teraFLOP/s each: 8 FLOPs per "
        "parameter per token, since with recomputation the forward runs twice.",
        f"140 teraFLOP/s is {g.hfu:.0%} of the A100's peak: the *hardware* utilisation, recomputation included.",
        f"Without the recomputed forward, 6 of those 8 FLOPs: {g.mfu:.0%} *model* utilisation.",
    ])


def calculator_figure(n_params_b: float, tokens_b: float, gpus: int, gpu: GPU, mfu: float,
                      dollars_per_gpu_hour: float) -> go.Figure:
    """Days against the number of GPUs for this run (6·P·D at the given MFU), the chosen point marked. (No dollar
    signs in a plotly title: two of them make it a LaTeX string, which JupyterLab's plotly drew as nothing.)"""
    gpus = parse_number(gpus, "GPUs", integer=True, lo=1)
    cluster = CLUSTERS[gpu]
    flops = training_flops(n_params_b * 1e9, tokens_b * 1e9)
    seconds = training_seconds(flops, gpus, cluster.peak_flops, mfu)
    cost = training_cost(seconds, gpus, dollars_per_gpu_hour)
    counts = np.unique(np.round(np.logspace(0, 5, 60)).astype(int))
    days = [training_seconds(flops, int(n), cluster.peak_flops, mfu) / 86400 for n in counts]
    fig = go.Figure(go.Scatter(x=counts, y=days, mode="lines", name="days (perfect scaling)",
                               line=dict(color=plots.color(0))))
    fig.add_trace(go.Scatter(x=[gpus], y=[seconds / 86400], mode="markers", marker=dict(size=14, color=plots.color(1)),
                             name=f"{gpus:,} GPUs"))
    plots.style(fig, title=f"{flops:.3g} FLOPs: {seconds / 86400:,.1f} days, {cost / 1e6:,.2f} million USD<br>"
                "<sup>at the GPUs, MFU and price you chose; twice the GPUs, half the days</sup>", xaxis="GPUs", yaxis="days", height=400)
    fig.update_xaxes(type="log")
    fig.update_yaxes(type="log")
    return fig


def calculator_panel() -> Panel:
    controls = {
        "n_params_b": choice_slider(175.0, 0.1, 2000.0, "parameters (B)", include=(7, 8, 70, 405)),
        "tokens_b": choice_slider(300.0, 1.0, 100_000.0, "tokens (B)", include=(1400, 15_600)),
        "gpus": number_box(1024, "GPUs"),
        "gpu": W.Dropdown(options=[(CLUSTER_LABELS[g], g) for g in CLUSTERS], value=GPU.A100, description="GPU"),
        "mfu": slider(0.4, 0.05, 1.0, 0.01, description="MFU"),
        "dollars_per_gpu_hour": slider(2.0, 0.5, 10.0, 0.1, description="USD / GPU-hour"),
    }
    return Panel(calculator_figure, controls, title="Training time and cost")


@dataclass(frozen=True)
class Scaling:
    """Weak scaling on this machine: rank 0 alone against every rank under DDP (medians over rounds)."""
    world: int            # ranks under DDP
    backend: str          # gloo or nccl
    solo: float           # tokens/s of rank 0 alone
    ddp: float            # tokens/s of the whole group
    efficiency: float     # ddp ÷ (world × solo)
    rounds: WeakScaling   # rank 0's rounds


def weak_scaling(S: Settings) -> Scaling:
    """Launch S.scaling_world gloo/NCCL ranks: rank 0 alone vs all of them under DDP, the same rows per rank."""
    job = derive(ScalingJob, S, steps=S.scaling_steps)
    res = launch(ranks.weak_scaling, S.scaling_world, job, desc=f"weak scaling × {S.scaling_world}",
                 timeout_s=TIMEOUT_S)
    r0 = res[0]
    solo, ddp = statistics.median(r0.solo_tokens_per_s), statistics.median(r0.ddp_tokens_per_s)
    return Scaling(world=S.scaling_world, backend=res.dist[0].backend, solo=solo, ddp=ddp,
                   efficiency=ddp / (S.scaling_world * solo), rounds=r0)


def scaling_findings(ledger: Ledger, w: Scaling) -> Findings:
    # A band wide enough for any working machine would also accept the quoted 60-80%, so it would settle nothing: noted
    ledger.note("weak_scaling", asdict(w))
    where = ("gloo ranks sharing this machine's cores and memory bandwidth" if w.backend == "gloo" else
             "GPUs over NCCL")
    return Findings([
        f"Ranks that each keep their batch trained at **{w.efficiency:.0%}** of the ideal here. That measures "
        "ranks sharing this machine's cores and memory, not a cluster: it neither confirms nor refutes a cluster's "
        "quoted efficiency.",
    ], [
        "The quoted figure: 60–80%.",
        f"One rank alone: {w.solo:,.0f} tokens/s; {w.world} ranks together ({where}), each with the same batch: "
        f"{w.ddp:,.0f} tokens/s.",
    ])


def exercises(ledger: Ledger) -> list[Question]:
    h100 = CLUSTERS[GPU.H100]
    n, tokens = 70e9, CHINCHILLA_TOKENS_PER_PARAM * 70e9
    flops = training_flops(n, tokens)
    days = training_seconds(flops, 2048, h100.peak_flops, 0.4) / 86400
    ledger.note("exercise_answers", {"tokens": tokens, "flops": flops, "days": days})  # computed, as the panel does
    return [Question(
        "Chinchilla-optimal 70B", "A Chinchilla-optimal 70B model (20 tokens per parameter) on 2048 H100s "
        "(989 teraFLOP/s dense bf16) at 40% MFU: how many tokens (billions), how many FLOPs (in units of 1e23), "
        "how many days?",
        {"tokens_b": "tokens (B)", "flops_e23": "FLOPs (1e23)", "days": "days"},
        answer_check({"tokens_b": tokens / 1e9, "flops_e23": flops / 1e23, "days": days}, rel=0.02),
        f"D = 20 × 70e9 = 1.4e12 tokens; C = 6·P·D = 6 × 70e9 × 1.4e12 = {flops:.3g} FLOPs; time = C ÷ (2048 × "
        f"989e12 × 0.4) = {days * 86400:,.0f} s = **{days:.1f} days**. (Chinchilla itself, 70B on 1.4T tokens, "
        "was trained on TPUs.)")]


def calculator_findings(ledger: Ledger, redraw_ms: float) -> Findings:
    ledger.note("calculator_redraw_ms", redraw_ms)
    share = attention_share(32, 4096, 4096, 6.7e9)
    return Findings([
        f"The calculator is $6PD$ at the MFU you choose: attention's $12Lsh$ per token adds **{share:.0%}** more for "
        "a 7B model at 4k context, and recomputation shows up only as a lower MFU.",
    ], ["The 7B model: L = 32, h = 4096, s = 4096 (computed)."])


def attention_share(L: int, d: int, T: int, n_params: float) -> float:
    """Attention's 12·L·s·h as a share of 6P: what 6·P·D leaves out per token."""
    return 12 * L * T * d / (6 * n_params)
