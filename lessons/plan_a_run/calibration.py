"""Lesson 16, section 4: the planner on this machine — measure what it needs (matmul peak, a step's compute, the
all-reduce's latency and bandwidth), predict a 2-rank data-parallel step, and run that step."""

import statistics

import plotly.graph_objects as go

from labtools import plots
from labtools.claims import Findings, Ledger, approx, at_least
from labtools.compute import flops_per_token
from labtools.config import derive
from labtools.parallel import launch
from labtools.plan import Cluster, Layout, ModelShape, collective_bytes, step_time
from lessons.plan_a_run import Settings, ranks
from lessons.plan_a_run.ranks import CalibrationJob

WORLD = 2
TOLERANCE = 0.25  # the prediction must land within ±25% of the measured step


def run(S: Settings) -> dict:
    """Launch the calibration on WORLD ranks (gloo on the CPU, NCCL where every rank has a GPU)."""
    job = derive(CalibrationJob, S, rounds=S.rounds, matmul_sizes=S.matmul_sizes)
    return launch(ranks.calibrate, WORLD, job, desc=f"calibration × {WORLD}", timeout_s=300)[0]


def machine(r: dict) -> dict:
    """The planner's inputs, measured: peak FLOP/s, α per ring step and β in bytes/s from the all-reduces."""
    m = r["median"]
    steps = 2 * (r["world"] - 1)  # ring steps of an all-reduce
    alpha = m["latency_s"] / steps
    sent = collective_bytes("all_reduce", 4 * r["n_params"], r["world"])
    beta = sent / max(m["all_reduce_s"] - steps * alpha, 1e-9)
    return {"peak": r["peak"], "alpha": alpha, "beta": beta}


def predict(S: Settings, r: dict) -> dict:
    """The planner's step for DDP on WORLD ranks, from the machine's measured numbers.

    The compute term: the ranks' steps with nothing communicated, every step ending when the slowest rank is done
    (as a synchronous step does), fixes the efficiency (FLOPs per step ÷ seconds ÷ peak), which the planner
    applies. The gradient all-reduce: α and β measured. DDP runs with one bucket, so the all-reduce starts after
    backward: dp_overlap = 0."""
    mc = machine(r)
    shape = ModelShape(S.n_layer, S.n_embd, S.n_head, vocab=r["vocab"], seq=S.block_size, n_params=r["n_params"])
    kw = dict(micro_batch=S.batch_size, checkpoint="none", precision="fp32", zero_stage=0)
    achieved = flops_per_token(shape) * S.batch_size * S.block_size / r["median"]["together_s"]  # per rank
    peak = max(mc["peak"], achieved)  # a step faster than the matmul benchmark: its own rate is the peak
    cluster = Cluster(gpus_per_node=WORLD, gpu_memory=1e12, peak_flops=peak, intra_bw=mc["beta"],
                      inter_bw=mc["beta"], latency=mc["alpha"])
    efficiency = achieved / peak
    est = step_time(shape, cluster, Layout(WORLD, 1, 1), WORLD * S.batch_size, efficiency=efficiency,
                    dp_overlap=0.0, **kw)
    return {"estimate": est, "efficiency": efficiency, "machine": mc, "shape": shape}


def figure(r: dict, p: dict) -> go.Figure:
    """Predicted step (compute + exposed all-reduce) beside the measured one, every round's measurement marked."""
    est, ms = p["estimate"], 1e3
    fig = go.Figure()
    fig.add_trace(go.Bar(x=["predicted"], y=[est.compute_s * ms], name="compute (both ranks, nothing sent)",
                         marker_color=plots.color(0)))
    fig.add_trace(go.Bar(x=["predicted"], y=[est.dp_exposed_s * ms], name="gradient all-reduce (α, β)",
                         marker_color=plots.color(1)))
    fig.add_trace(go.Bar(x=["measured"], y=[r["median"]["ddp_s"] * ms], name="2 ranks with DDP (median)",
                         marker_color=plots.color(2)))
    fig.add_trace(go.Scatter(x=["measured"] * len(r["rounds"]["ddp_s"]), y=[t * ms for t in r["rounds"]["ddp_s"]],
                             mode="markers", name="each round", marker=dict(color="black", size=7)))
    plots.style(fig, "One data-parallel step on this machine: the planner's prediction and the run", None,
                "ms per step", barmode="stack")
    return fig


def findings(ledger: Ledger, r: dict, p: dict) -> Findings:
    est, mc, m = p["estimate"], p["machine"], r["median"]
    measured = m["ddp_s"]
    error = est.step_s / measured - 1
    compute_only = est.compute_s / measured - 1
    ledger.add("calibrated_step", f"The planner, fed this machine's measured peak, compute and the all-reduce's α "
               f"and β, predicts a {WORLD}-rank DDP step within ±{TOLERANCE:.0%} (predicted ÷ measured − 1)", error,
               approx(0.0, abs=TOLERANCE), kind="measured")
    ledger.add("calibrated_needs_comm", "… closer than the same planner without the all-reduce: the gradients' "
               "all-reduce is exposed, not hidden (|compute-only error| − |error|)", abs(compute_only) - abs(error),
               at_least(0.0), kind="measured")
    ledger.note("calibration", {"median": m, "rounds": r["rounds"], "machine": mc, "n_params": r["n_params"],
                                "efficiency": p["efficiency"], "predicted_s": est.step_s, "error": error,
                                "compute_only_error": compute_only,
                                "spread": statistics.pstdev(r["rounds"]["ddp_s"]) / measured})
    return Findings([
        f"This machine, measured: **{mc['peak'] / 1e9:.1f}** GFLOP/s matrix-product peak per rank, an all-reduce "
        f"latency α of **{mc['alpha'] * 1e6:.0f} µs** per ring step, a bandwidth β of **{mc['beta'] / 1e9:.2f}** "
        "GB/s.",
        f"One rank alone took {m['solo_s'] * 1e3:.1f} ms per step; both ranks at once, each step waiting for the "
        f"slower, {m['together_s'] * 1e3:.1f} ms: {p['efficiency']:.0%} of the peak, the efficiency the planner "
        "assumes.",
        f"Predicted {WORLD}-rank DDP step: **{est.step_s * 1e3:.1f} ms** ({est.compute_s * 1e3:.1f} compute + "
        f"{est.dp_exposed_s * 1e3:.1f} all-reduce); measured **{measured * 1e3:.1f} ms**: {error:+.0%}.",
        f"Without the all-reduce the planner would have said {est.compute_s * 1e3:.1f} ms, {compute_only:+.0%}.",
    ])
