"""Lesson 09, section 4: activations each stage holds, and the bytes stages send."""

import plotly.graph_objects as go

from labtools import plots
from labtools.claims import Findings, Ledger, approx, at_most
from labtools.layout import collective_bytes
from labtools.pipeline import Schedule, in_flight, schedule_order
from lessons.pipeline_parallel import Settings
from lessons.pipeline_parallel.launches import DepthRun


def figure(results: dict[int, DepthRun], m: int) -> go.Figure:
    fig = plots.subplots(1, len(results), [f"p = {p}, m = {m}" for p in results], height=380)
    for col, (p, r) in enumerate(results.items(), 1):
        predicted = {Schedule.GPIPE: [m] * p,
                     Schedule.ONE_F_ONE_B: in_flight(schedule_order(Schedule.ONE_F_ONE_B, p, m))}
        for i, schedule in enumerate(predicted):
            held = [rk.memory.held(schedule) for rk in r.ranks]
            x = [f"rank {k}" for k in range(p)]
            fig.add_trace(go.Bar(x=x, y=held, name=f"{schedule}, measured", marker_color=plots.color(i),
                                 showlegend=col == 1), row=1, col=col)
            fig.add_trace(go.Scatter(x=x, y=predicted[schedule], mode="markers", name=f"{schedule}, predicted",
                                     marker=dict(color="black", symbol="line-ew-open", size=30, line=dict(width=3)),
                                     showlegend=col == 1 and i == 0), row=1, col=col)
    fig.update_yaxes(title_text="peak saved activations ÷ one micro-batch's", row=1, col=1)
    fig.update_layout(title="GPipe holds all m micro-batches on every rank; 1F1B fewer")
    fig.update_layout(barmode="group")
    return fig


def findings(ledger: Ledger, results: dict[int, DepthRun], m: int) -> Findings:
    """One claim per schedule over every depth: GPipe holds m micro-batches on every rank, 1F1B min(p − r, m)."""
    rows, worst = [], {Schedule.GPIPE: 0.0, Schedule.ONE_F_ONE_B: 0.0}
    for p, r in results.items():
        held = {s: [rk.memory.held(s) for rk in r.ranks] for s in (Schedule.GPIPE, Schedule.ONE_F_ONE_B)}
        pred = in_flight(schedule_order(Schedule.ONE_F_ONE_B, p, m))
        worst[Schedule.GPIPE] = max(worst[Schedule.GPIPE], *(abs(h - m) for h in held[Schedule.GPIPE]))
        worst[Schedule.ONE_F_ONE_B] = max(worst[Schedule.ONE_F_ONE_B],
                                          *(abs(h - q) for h, q in zip(held[Schedule.ONE_F_ONE_B], pred)))
        rows += [f"| {p} | {k} | {g:.2f} | {o:.2f} | {q} |"
                 for k, (g, o, q) in enumerate(zip(held[Schedule.GPIPE], held[Schedule.ONE_F_ONE_B], pred))]
    depths = " and ".join(str(p) for p in results)
    ledger.add("mem_gpipe", f"p = {depths}: GPipe holds all m = {m} micro-batches' activations on every rank (worst "
               "|measured peak ÷ one micro-batch − m|)", worst[Schedule.GPIPE], at_most(0.05), kind="measured")
    ledger.add("mem_1f1b", f"p = {depths}: 1F1B holds min(p − r, m) micro-batches' activations on rank r (worst "
               "|measured − predicted|)", worst[Schedule.ONE_F_ONE_B], at_most(0.05), kind="measured")
    off = max(worst.values())
    return Findings([
        "As predicted: GPipe held all $m$ micro-batches' activations on every rank, 1F1B only $\\min(p - r, m)$ on "
        "rank $r$, down to one on the last.",
        f"Measured and predicted counts agree to **{off:.3f}** of a micro-batch.",
    ], ["| p | rank | GPipe, held | 1F1B, held | 1F1B, predicted |\n|---|---|---|---|---|\n" + "\n".join(rows),
        f"Each run had m = {m} micro-batches."])


def traffic_figure(results: dict[int, DepthRun], S: Settings) -> go.Figure:
    """Bytes per training step, all ranks together: the pipeline's and DDP's, predicted and (gloo) on the wire."""
    series = {"pipeline, predicted": [], "pipeline, on the wire": [], "DDP, predicted (ring)": [],
              "DDP, on the wire": []}
    for p, r in results.items():
        t = r.ranks[0].traffic
        series["pipeline, predicted"].append(2 * (p - 1) * S.m * t.activation_bytes / 1e6)
        series["pipeline, on the wire"].append(None if t.pipeline_wire is None else t.pipeline_wire / 1e6)
        series["DDP, predicted (ring)"].append(p * collective_bytes("all_reduce", t.param_bytes, p) / 1e6)
        series["DDP, on the wire"].append(None if t.ddp_wire is None else t.ddp_wire / 1e6)
    series = {k: v for k, v in series.items() if all(x is not None for x in v)}
    return plots.bars([f"p = {p}" for p in results], series, yaxis="MB per training step, all ranks",
                      title="A pipeline sends far less than data parallelism on the same ranks")


def traffic_findings(ledger: Ledger, results: dict[int, DepthRun], S: Settings) -> Findings:
    """One claim per quantity over every depth: bytes handed to gloo, on the wire, and DDP's on the wire."""
    rows, counted_off, wire, ddp, ratios = [], 0.0, [], [], []
    for p, r in results.items():
        t = [rk.traffic for rk in r.ranks]
        pipe_pred = 2 * (p - 1) * S.m * t[0].activation_bytes
        counted_off = max(counted_off, abs(sum(x.pipeline_sent_counted for x in t) / pipe_pred - 1))
        pipe_wire, ddp_wire = t[0].pipeline_wire, t[0].ddp_wire
        ddp_pred = p * collective_bytes("all_reduce", t[0].param_bytes, p)
        if pipe_wire is not None:
            wire.append(pipe_wire / pipe_pred)
            ddp.append(ddp_wire / ddp_pred)
            ratios.append(ddp_wire / pipe_wire)
            rows.append(f"| {p} | {wire[-1]:.3f} | {ddp[-1]:.3f} | {ratios[-1]:.0f}× |")
    depths = " and ".join(str(p) for p in results)
    ledger.add("p2p_counted", f"p = {depths}: the schedule hands the backend one b·s·h activation forward and one "
               "gradient backward per micro-batch per boundary (worst |counted ÷ 2(p−1)·m·b·s·h·4 − 1|)", counted_off,
               at_most(1e-9), kind="counted", detail=True)
    act = results[min(results)].ranks[0].traffic.activation_bytes
    if not wire:
        return Findings(["Nothing was measured on the wire here (no loopback counter, or the ranks ran on NCCL); "
                         "what the schedule handed to the backend is the prediction exactly."],
                        [f"One micro-batch's activation, b·s·h·4 bytes: {act:,}."])
    ledger.add("p2p_wire", f"p = {depths}: the bytes of a pipeline step that crossed the loopback interface are "
               "2(p−1)·m·b·s·h·4, one activation forward and one gradient back per micro-batch per boundary (wire "
               "÷ predicted, the depth farthest from 1; headers and local traffic add a little)",
               max(wire, key=lambda x: abs(x - 1)), approx(1.0, rel=0.1), kind="measured")
    ledger.add("ddp_wire", f"p = {depths}: DDP on the same ranks sends 2(p−1)/p × the gradient bytes from each rank "
               "(wire ÷ ring prediction, the depth farthest from 1)", max(ddp, key=lambda x: abs(x - 1)),
               approx(1.0, rel=0.1), kind="measured")
    clean = all(abs(x - 1) <= 0.1 for x in wire + ddp)  # the loopback counter also counts other processes' traffic
    answer = [
        f"Far less than data parallelism: only activations between neighbours, while DDP's all-reduce of every "
        f"gradient put at least **{int(min(ratios))}×** as many bytes on the wire.",
        f"The pipeline's bytes on the wire matched $2(p-1)\\,m\\,bsh \\cdot 4$ within "
        f"**{max(abs(x - 1) for x in wire):.0%}**.",
    ] if clean else [
        "Only activations between neighbours" + (", handed to the backend exactly as predicted" if counted_off <= 1e-9
                                                  else "") + ". How much less than data parallelism this run cannot "
        "say: other traffic on this machine's loopback interface reached its byte counts (rerun when it is quiet).",
    ]
    return Findings(answer, ["| p | pipeline: on the wire ÷ predicted | DDP: on the wire ÷ predicted | DDP ÷ pipeline, "
                             "on the wire |\n|---|---|---|---|\n" + "\n".join(rows),
                             f"Each micro-batch sends one activation of $b \\cdot s \\cdot h$ numbers, {act:,} bytes, "
                             "forward across each boundary, and one gradient back."])
