"""Lesson 09, section 4: activations each stage holds, and the bytes stages send."""

import plotly.graph_objects as go

from labtools import plots
from labtools.claims import Findings, Ledger, approx, at_most
from labtools.pipeline import Schedule, in_flight, schedule_order
from labtools.plan import collective_bytes
from lessons.pipeline_parallel import Settings


def figure(results: dict[int, dict], m: int) -> go.Figure:
    fig = plots.subplots(1, len(results), [f"p = {p}, m = {m}" for p in results], height=380)
    for col, (p, r) in enumerate(results.items(), 1):
        predicted = {Schedule.GPIPE: [m] * p,
                     Schedule.ONE_F_ONE_B: in_flight(schedule_order(Schedule.ONE_F_ONE_B, p, m))}
        for i, schedule in enumerate(predicted):
            held = [rk["memory"][schedule] / rk["memory"]["per_micro_batch"] for rk in r["ranks"]]
            x = [f"rank {k}" for k in range(p)]
            fig.add_trace(go.Bar(x=x, y=held, name=f"{schedule}, measured", marker_color=plots.color(i),
                                 showlegend=col == 1), row=1, col=col)
            fig.add_trace(go.Scatter(x=x, y=predicted[schedule], mode="markers", name=f"{schedule}, predicted",
                                     marker=dict(color="black", symbol="line-ew-open", size=30, line=dict(width=3)),
                                     showlegend=col == 1 and i == 0), row=1, col=col)
    fig.update_yaxes(title_text="peak saved activations ÷ one micro-batch's", row=1, col=1)
    fig.update_layout(barmode="group")
    return fig


def findings(ledger: Ledger, results: dict[int, dict], m: int) -> Findings:
    parts = []
    for p, r in results.items():
        held = {s: [rk["memory"][s] / rk["memory"]["per_micro_batch"] for rk in r["ranks"]]
                for s in (Schedule.GPIPE, Schedule.ONE_F_ONE_B)}
        pred = in_flight(schedule_order(Schedule.ONE_F_ONE_B, p, m))
        ledger.add(f"mem_gpipe_{p}", f"p = {p}: GPipe holds all m = {m} micro-batches' activations on every rank "
                   "(worst |measured peak ÷ one micro-batch − m|)", max(abs(h - m) for h in held[Schedule.GPIPE]),
                   at_most(0.05), kind="measured")
        ledger.add(f"mem_1f1b_{p}", f"p = {p}: 1F1B holds min(p − r, m) on rank r (worst |measured − predicted|)",
                   max(abs(h - q) for h, q in zip(held[Schedule.ONE_F_ONE_B], pred)), at_most(0.05), kind="measured")
        parts.append(f"**p = {p}**: GPipe held {', '.join(f'{h:.2f}' for h in held[Schedule.GPIPE])} micro-batches' "
                     f"activations per rank; 1F1B held {', '.join(f'{h:.2f}' for h in held[Schedule.ONE_F_ONE_B])} "
                     f"(predicted {pred}).")
    return Findings(parts)


def traffic_table(results: dict[int, dict], S: Settings) -> go.Figure:
    rows = []
    for p, r in results.items():
        t = r["ranks"][0]["traffic"]
        pipe_pred = 2 * (p - 1) * S.m * t["activation_bytes"]
        ddp_pred = p * collective_bytes("all_reduce", t["param_bytes"], p)
        rows.append((f"p = {p}", f"{t['activation_bytes']:,}", f"{pipe_pred:,}", _fmt(t["pipeline_wire"]),
                     f"{ddp_pred:,.0f}", _fmt(t["ddp_wire"])))
    return plots.table(("", "b·s·h·4 bytes", "pipeline, predicted", "pipeline, on the wire", "DDP, predicted (ring)",
                        "DDP, on the wire"), rows, title=f"Bytes per training step, all ranks together (m = {S.m})",
                       row_height=32)


def _fmt(x) -> str:
    return "not measurable here" if x is None else f"{x:,}"


def traffic_findings(ledger: Ledger, results: dict[int, dict], S: Settings) -> Findings:
    parts = []
    for p, r in results.items():
        t = [rk["traffic"] for rk in r["ranks"]]
        act = t[0]["activation_bytes"]
        pipe_pred = 2 * (p - 1) * S.m * act
        counted = sum(x["pipeline_sent_counted"] for x in t)
        ledger.add(f"p2p_counted_{p}", f"p = {p}: the schedule sends one b·s·h activation forward and one gradient "
                   "backward per micro-batch per boundary (bytes torch's stages handed to gloo ÷ 2(p−1)·m·b·s·h·4)",
                   counted / pipe_pred, approx(1.0, abs=1e-9), kind="counted")
        wire, ddp_wire = t[0]["pipeline_wire"], t[0]["ddp_wire"]
        ddp_pred = p * collective_bytes("all_reduce", t[0]["param_bytes"], p)
        if wire is not None:
            ledger.add(f"p2p_wire_{p}", f"p = {p}: … and that is what crossed the loopback interface (wire ÷ "
                       "predicted; headers and local traffic add a little)", wire / pipe_pred, approx(1.0, rel=0.1),
                       kind="measured")
            ledger.add(f"ddp_wire_{p}", f"p = {p}: DDP on the same ranks sends 2(N−1)/N × the gradient bytes from each "
                       "rank (wire ÷ ring prediction)", ddp_wire / ddp_pred, approx(1.0, rel=0.1), kind="measured")
            parts.append(f"**p = {p}**: {wire:,} bytes on the wire per pipeline step ({wire / pipe_pred:.3f}× the "
                         f"prediction), against {ddp_wire:,} for a DDP step of the same model: "
                         f"**{ddp_wire / wire:.1f}×** more.")
    act = results[min(results)]["ranks"][0]["traffic"]["activation_bytes"]
    return Findings(parts + [f"A pipeline moves activations, b·s·h = {act:,} bytes per micro-batch here, only between "
                             "neighbours; data parallelism moves every gradient."])
