"""Lesson 16, section 4: the planner on this machine. Calibrate its communication on collectives of other sizes than
the runs send (an all-reduce, an all-gather and a reduce-scatter, each timed at several message sizes: α and β),
measure the compute it cannot predict at this scale (every rank at once, nothing sent), predict a data-parallel step
(one all-reduce) and a ZeRO-2 step (a reduce-scatter and an all-gather) on two ranks, then run both."""

import numpy as np
import plotly.graph_objects as go

from labtools import plots
from labtools.claims import Findings, Ledger, approx, at_least
from labtools.compute import flops_per_token
from labtools.config import derive
from labtools.parallel import launch
from labtools.plan import Cluster, CollectiveCosts, Layout, LinkCost, ModelShape, collective_bytes, collective_steps, \
    step_time
from lessons.plan_a_run import Settings, ranks
from lessons.plan_a_run.ranks import KINDS, CalibrationJob

WORLD = 2
RUNS = ("DDP", "ZeRO-2")
ZERO = {"DDP": 0, "ZeRO-2": 2}
MEASURED = {"DDP": "ddp_s", "ZeRO-2": "sharded_s"}
COMPUTE = {"DDP": "together_s", "ZeRO-2": "sharded_alone_s"}  # each run's step with nothing sent
# The prediction must land within ±TOLERANCE of the run, and a planner that leaves communication out must miss a run
# by more: wide enough for what the α-β model leaves out (the wait for the slower rank before a collective, copying
# gradients into a bucket or out of a flat buffer), narrow enough that the compute-only planner fails it.
TOLERANCE = 0.25


def run(S: Settings) -> dict:
    """Launch the calibration and the predicted runs on WORLD ranks (gloo on the CPU, NCCL where every rank has a
    GPU)."""
    job = derive(CalibrationJob, S, rounds=S.rounds, matmul_sizes=S.matmul_sizes)
    return launch(ranks.calibrate, WORLD, job, desc=f"calibration × {WORLD}", timeout_s=300)[0]


def fit(r: dict) -> dict[str, LinkCost]:
    """Each collective's α (seconds per ring step) and β (bytes/s) from its times at several message sizes: the
    least-squares line through seconds against the bytes each rank sends."""
    out = {}
    for kind in KINDS:
        sizes = sorted(int(b) for b in r["collectives"][kind])
        sent = [collective_bytes(kind, b, r["world"]) for b in sizes]
        slope, intercept = np.polyfit(sent, [r["collectives"][kind][str(b)] for b in sizes], 1)
        out[kind] = LinkCost(latency=max(float(intercept), 0.0) / collective_steps(kind, r["world"]),
                             bandwidth=1 / max(float(slope), 1e-15))
    return out


def shape(S: Settings, r: dict) -> ModelShape:
    return ModelShape(S.n_layer, S.n_embd, S.n_head, vocab=r["vocab"], seq=S.block_size, n_params=r["n_params"])


def predict(S: Settings, r: dict, one_rank_alone: bool = False) -> dict:
    """The planner's steps for DDP and ZeRO-2 on WORLD ranks, from what the calibration measured.

    The efficiency: each run's step with nothing sent (every rank at once), its FLOPs ÷ seconds ÷ the matmul peak;
    with one_rank_alone, one rank's DDP step alone instead, as a planner that counts FLOPs would calibrate. The
    collectives: their fitted α and β. DDP runs with one bucket and the sharded step sends after backward, so
    nothing hides: dp_overlap = 0."""
    m, costs = r["median"], fit(r)
    model = shape(S, r)
    tokens = S.batch_size * S.block_size  # per rank
    cluster = lambda peak: Cluster(gpus_per_node=WORLD, gpu_memory=1e12, peak_flops=peak,  # noqa: E731
                                   intra_bw=costs["all_reduce"].bandwidth, inter_bw=costs["all_reduce"].bandwidth,
                                   latency=costs["all_reduce"].latency, collectives=CollectiveCosts(**costs))
    est, efficiency = {}, {}
    for name in RUNS:
        achieved = flops_per_token(model) * tokens / m["solo_s" if one_rank_alone else COMPUTE[name]]
        peak = max(m["peak"], achieved)  # a step faster than the matmul benchmark: its own rate is the peak
        efficiency[name] = achieved / peak
        est[name] = step_time(model, cluster(peak), Layout(WORLD, 1, 1), WORLD * S.batch_size, zero_stage=ZERO[name],
                              micro_batch=S.batch_size, checkpoint="none", precision="fp32",
                              efficiency=efficiency[name], dp_overlap=0.0)
    return {"estimates": est, "efficiency": efficiency, "costs": costs, "peak": m["peak"]}


def errors(r: dict, p: dict) -> dict[str, dict[str, float]]:
    """Per run: the prediction's error and the compute-only planner's, each predicted ÷ measured − 1."""
    out = {}
    for name in RUNS:
        measured, est = r["median"][MEASURED[name]], p["estimates"][name]
        out[name] = {"error": est.step_s / measured - 1, "compute_only": est.compute_s / measured - 1}
    return out


def figure(r: dict, p: dict) -> go.Figure:
    """Left: the collectives' times against the bytes each rank sends, with the fitted lines. Right: each predicted
    step (compute + communication) beside the run's, every round marked."""
    fig = plots.subplots(1, 2, ["collectives: seconds against bytes sent (measured, fitted)",
                                "two runs predicted, then made"], height=400,
                         title="Calibrated on this machine, the planner predicts two runs it has not seen")
    for i, kind in enumerate(KINDS):
        sizes = sorted(int(b) for b in r["collectives"][kind])
        sent = [collective_bytes(kind, b, r["world"]) for b in sizes]
        fig.add_trace(go.Scatter(x=[x / 1e6 for x in sent], y=[r["collectives"][kind][str(b)] * 1e3 for b in sizes],
                                 mode="markers", name=kind.replace("_", "-"), marker=dict(color=plots.color(i))),
                      row=1, col=1)
        c = p["costs"][kind]
        xs = np.linspace(0, max(sent), 20)
        fig.add_trace(go.Scatter(x=xs / 1e6, y=[(collective_steps(kind, r["world"]) * c.latency + x / c.bandwidth) * 1e3
                                                for x in xs], mode="lines", showlegend=False,
                                 line=dict(color=plots.color(i), dash="dot")), row=1, col=1)
    ms = 1e3
    for name in RUNS:
        est = p["estimates"][name]
        fig.add_trace(go.Bar(x=[f"{name}: predicted"], y=[est.compute_s * ms], marker_color=plots.color(3),
                             name="compute (measured: all ranks, nothing sent)", showlegend=name == RUNS[0]),
                      row=1, col=2)
        fig.add_trace(go.Bar(x=[f"{name}: predicted"], y=[est.dp_exposed_s * ms], marker_color=plots.color(4),
                             name="communication (α, β)", showlegend=name == RUNS[0]), row=1, col=2)
        fig.add_trace(go.Bar(x=[f"{name}: run"], y=[r["median"][MEASURED[name]] * ms], marker_color="#444444",
                             name="the run (median)", showlegend=name == RUNS[0]), row=1, col=2)
        rounds = r["rounds"][MEASURED[name]]
        fig.add_trace(go.Scatter(x=[f"{name}: run"] * len(rounds), y=[t * ms for t in rounds], mode="markers",
                                 marker=dict(color="black", size=6), name="each round",
                                 showlegend=name == RUNS[0]), row=1, col=2)
    fig.update_xaxes(title_text="MB each rank sends", row=1, col=1)
    fig.update_yaxes(title_text="ms", row=1, col=1)
    fig.update_yaxes(title_text="ms per step", row=1, col=2)
    fig.update_layout(barmode="stack", legend=dict(orientation="h", y=-0.25))
    return fig


def findings(ledger: Ledger, S: Settings, r: dict, p: dict) -> Findings:
    m, err = r["median"], errors(r, p)
    for name in RUNS:
        key = name.lower().replace("-", "")
        ledger.add(f"predicted_{key}", f"With its collectives calibrated at other message sizes, the planner predicts "
                   f"a {WORLD}-rank {name} step within ±{TOLERANCE:.0%} (predicted ÷ measured − 1)",
                   err[name]["error"], approx(0.0, abs=TOLERANCE), kind="measured")
    ledger.add("compute_only_refuted", f"The same planner without communication fails that test: it misses a run by "
               f"more than ±{TOLERANCE:.0%} (its larger miss, |predicted ÷ measured − 1|)",
               max(abs(e["compute_only"]) for e in err.values()), at_least(TOLERANCE), kind="measured")
    contention = m["together_s"] / m["solo_s"] - 1
    solo = errors(r, predict(S, r, one_rank_alone=True))
    ledger.note("calibration", {"median": m, "rounds": r["rounds"], "efficiency": p["efficiency"],
                                "costs": {k: {"latency": c.latency, "bandwidth": c.bandwidth}
                                          for k, c in p["costs"].items()},
                                "predicted_s": {n: p["estimates"][n].step_s for n in RUNS}, "errors": err,
                                "contention": contention, "errors_from_one_rank_alone": solo})
    worst = max((e["error"] for e in err.values()), key=abs)
    c = p["costs"]
    slow_scatter = c["reduce_scatter"].bandwidth < 0.75 * c["all_gather"].bandwidth
    sharding = ("Sharding the optimizer state cost more time than DDP here: this backend's reduce-scatter moves its "
                "bytes slower than its all-gather." if m["sharded_s"] > m["ddp_s"] and slow_scatter else "")
    return Findings([
        f"For the communication, yes: from collectives timed at other sizes, it predicted both runs within "
        f"**{abs(worst):.0%}**, where leaving communication out misses by far more. " + sharding,
        f"The compute it cannot predict at this scale, so it is measured. A step this small is mostly per-operation "
        f"overhead, and two ranks on one machine slowed each other by **{contention:.0%}**: a planner that counted "
        "FLOPs on one rank alone would miss both.",
    ], [
        "| run | predicted, ms | measured, ms | error | without communication | from one rank alone |\n"
        "|---|---|---|---|---|---|\n" + "\n".join(
            f"| {n} | {p['estimates'][n].step_s * 1e3:.1f} | {m[MEASURED[n]] * 1e3:.1f} | {err[n]['error']:+.0%} | "
            f"{err[n]['compute_only']:+.0%} | {solo[n]['error']:+.0%} |" for n in RUNS),
        f"Compute, every rank at once with nothing sent: {m['together_s'] * 1e3:.1f} ms per DDP step, "
        f"{m['sharded_alone_s'] * 1e3:.1f} ms per ZeRO-2 step; one rank's DDP step alone: {m['solo_s'] * 1e3:.1f} ms.",
        f"The matrix-product peak, {p['peak'] / 1e9:.1f} GFLOP/s: a DDP step reaches {p['efficiency']['DDP']:.0%} of "
        "it.",
        "| collective | α, µs per ring step | β, GB/s |\n|---|---|---|\n" + "\n".join(
            f"| {k.replace('_', '-')} | {c[k].latency * 1e6:.0f} | {c[k].bandwidth / 1e9:.2f} |" for k in KINDS),
    ])
