"""Lesson 13, section 1: a training step traced with torch.profiler, its time sorted by kind of work beside the
FLOPs each kind does."""

from collections import defaultdict

import plotly.graph_objects as go
import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, record_function

from labtools import plots, profiling
from labtools.claims import Findings, Ledger, at_least
from labtools.profiling import KINDS, kind_of
from lessons.profiling import Settings, batch, gpt

PHASES = ("forward", "backward", "optimizer")
FRAMEWORK = "Python and framework"  # the step's time that no aten op spent: dispatch, autograd, Python
ROWS = (*KINDS, FRAMEWORK)
COLORS = {"matrix products": plots.color(0), "attention": plots.color(1), "normalisation": plots.color(2),
          "element-wise": plots.color(3), "optimizer": plots.color(4), "other": plots.color(5), FRAMEWORK: "#bbbbbb"}


def _phase(e) -> tuple[str, int] | None:
    """The (phase, step) a profiler event ran in, from its enclosing record_function labels."""
    phase, p = None, e
    while p is not None:
        if p.name in PHASES and phase is None:
            phase = p.name
        if p.name.startswith("step "):
            return (phase, int(p.name[5:])) if phase else None
        p = p.cpu_parent
    return None


def run(S: Settings) -> dict:
    """S.trace_steps AdamW steps of the lesson's GPT under torch.profiler (after one untraced warm-up), each phase
    labelled; the FLOPs of one more step from FlopCounterMode's formulas, op by op (labtools.profiling)."""
    model = gpt(S)
    X, Y = batch(S)
    opt = torch.optim.AdamW(model.parameters(), lr=S.lr)
    cuda = X.is_cuda
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    def step():
        with record_function("forward"):
            loss = model(X, Y)[1]
        with record_function("backward"):
            loss.backward()
        with record_function("optimizer"):
            opt.step()
            opt.zero_grad(set_to_none=True)
        sync()

    step()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profiling.native_stderr_silenced(), profile(activities=activities) as prof:
        for i in range(S.trace_steps):
            with record_function(f"step {i}"):
                step()
    flops = defaultdict(float)
    for op in profiling.OpTimer.run(step, X.device):
        if op.counted:  # FlopCounterMode's formulas: matrix products and attention
            flops[op.kind] += op.flops

    events = prof.events()
    spans, ops, kernels = [], [], []
    for e in events:
        if e.device_type == DeviceType.CUDA:  # a kernel on the GPU: drawn on its own row
            kernels.append({"name": e.name, "start": e.time_range.start, "end": e.time_range.end})
        elif e.name.startswith("step ") or e.name in PHASES:
            where = _phase(e) if e.name in PHASES else None
            spans.append({"name": e.name, "step": where[1] if where else int(e.name[5:]),
                          "start": e.time_range.start, "end": e.time_range.end})
        elif e.name.startswith("aten::"):
            where = _phase(e)
            if where is None:
                continue
            self_us = e.self_device_time_total if cuda else e.self_cpu_time_total
            kind = "optimizer" if where[0] == "optimizer" else kind_of(e.name)
            top, p = True, e.cpu_parent
            while p is not None and top:
                top, p = not p.name.startswith("aten::"), p.cpu_parent
            ops.append({"name": e.name[6:], "kind": kind, "phase": where[0], "step": where[1], "self_us": self_us,
                        "start": e.time_range.start, "end": e.time_range.end, "top": top})
    wall = sum(s["end"] - s["start"] for s in spans if s["name"].startswith("step "))
    busy = defaultdict(float)
    for o in ops:
        busy[o["kind"]] += o["self_us"]
    busy[FRAMEWORK] = max(0.0, wall - sum(busy.values()))
    top = defaultdict(lambda: [0, 0.0])
    for o in ops:
        top[o["name"]][0] += 1
        top[o["name"]][1] += o["self_us"]
    return {"device": X.device.type, "steps": S.trace_steps, "wall_us": wall,
            "share": {k: busy[k] / wall for k in ROWS}, "flops": dict(flops), "spans": spans, "ops": ops,
            "kernels": kernels,
            "top": sorted(([n, c // S.trace_steps, us / S.trace_steps / 1e3, us / wall]
                           for n, (c, us) in top.items()), key=lambda r: -r[2])}


def figure(tr: dict) -> go.Figure:
    """The last traced step as a timeline: one row per kind of work, each aten op a bar (those no other aten op
    called, so nothing is drawn twice: a linear layer is one bar, its addmm inside it), the phases above; gaps are
    Python and the framework between ops."""
    last = tr["steps"] - 1
    step = next(s for s in tr["spans"] if s["name"] == f"step {last}")
    t0 = step["start"]
    fig = go.Figure()
    for s in tr["spans"]:
        if s["name"] in PHASES and s["step"] == last:
            fig.add_trace(go.Bar(y=["phase"], x=[(s["end"] - s["start"]) / 1e3], base=[(s["start"] - t0) / 1e3],
                                 orientation="h", name=s["name"], showlegend=False, text=[s["name"]],
                                 textposition="inside", insidetextanchor="middle", marker=dict(color="#dddddd"),
                                 hovertemplate=s["name"] + ": %{x:.2f} ms<extra></extra>"))
    for kind in KINDS:
        ops = [o for o in tr["ops"] if o["step"] == last and o["kind"] == kind and o["top"]]
        if ops:
            fig.add_trace(go.Bar(y=[kind] * len(ops), x=[(o["end"] - o["start"]) / 1e3 for o in ops],
                                 base=[(o["start"] - t0) / 1e3 for o in ops], orientation="h", name=kind,
                                 marker=dict(color=COLORS[kind], line=dict(width=0)),
                                 customdata=[o["name"] for o in ops],
                                 hovertemplate="%{customdata}: %{x:.3f} ms<extra>" + kind + "</extra>"))
    ks = [k for k in tr["kernels"] if step["start"] <= k["start"] <= step["end"]]
    if ks:  # on a GPU: the kernels the ops above launched, in device time
        fig.add_trace(go.Bar(y=["GPU kernels"] * len(ks), x=[(k["end"] - k["start"]) / 1e3 for k in ks],
                             base=[(k["start"] - t0) / 1e3 for k in ks], orientation="h", name="GPU kernels",
                             marker=dict(color="#444444", line=dict(width=0)), customdata=[k["name"] for k in ks],
                             hovertemplate="%{customdata}: %{x:.3f} ms<extra></extra>"))
    fig.update_yaxes(categoryorder="array", categoryarray=["GPU kernels", "other", "optimizer", "element-wise",
                                                           "normalisation", "attention", "matrix products", "phase"])
    plots.style(fig, f"One training step, traced (step {last + 1} of {tr['steps']}, {tr['device']}): ms from its start",
                None, None, height=380, barmode="overlay", legend="below")
    return fig


def shares_figure(tr: dict) -> go.Figure:
    """Share of the step's time beside share of its counted FLOPs, by kind of work."""
    total = sum(tr["flops"].values())
    fig = go.Figure()
    for kind in ROWS:
        fig.add_trace(go.Bar(y=["FLOPs (counted)", "time (measured)"],
                             x=[tr["flops"].get(kind, 0.0) / total, tr["share"][kind]], orientation="h", name=kind,
                             marker=dict(color=COLORS[kind]), hovertemplate="%{x:.1%}<extra>" + kind + "</extra>"))
    plots.style(fig, "Where the FLOPs are, and where the time goes: shares of one step", None, None, height=280,
                barmode="stack", legend=dict(orientation="h", y=-0.2, traceorder="normal"))
    fig.update_xaxes(tickformat=".0%", range=[0, 1])
    return fig


def table(tr: dict, n: int = 10) -> go.Figure:
    rows = [[name, kind_of(name), f"{share:.0%}"] for name, calls, ms, share in tr["top"][:n]]
    return plots.table(["op, as the profiler names it", "kind of work", "share of the step"], rows,
                       title=f"The {n} ops with the most time of their own, and the kind of work each does")


def findings(ledger: Ledger, tr: dict) -> Findings:
    total = sum(tr["flops"].values())
    mm = tr["flops"].get("matrix products", 0.0) / total
    s = tr["share"]
    ledger.add("matmul_flops", "Matrix products do most of a step's FLOPs (share, counted op by op)", mm,
               at_least(0.5), kind="counted")
    ledger.add("time_is_not_flops", "Matrix products' share of the step's time is at least 10 points below their "
               "share of its FLOPs: other work costs more time per FLOP (FLOP share − time share)",
               mm - s["matrix products"], at_least(0.1), kind="measured")
    step_ms = tr["wall_us"] / tr["steps"] / 1e3
    rows = "\n".join(f"| {kind} | {tr['flops'].get(kind, 0.0) / total:.0%} | {s[kind]:.0%} |" for kind in ROWS)
    return Findings([
        f"Matrix products do **{mm:.0%}** of the step's FLOPs but take only **{s['matrix products']:.0%}** of its "
        "time. The rest goes to attention's own products and to work that does almost no arithmetic: element-wise "
        "ops, normalisation, the optimizer, and Python between the ops.",
    ], [
        "| kind of work | share of the FLOPs (counted) | share of the time (measured) |\n|---|---|---|\n" + rows,
        f"A step took {step_ms:.0f} ms.",
    ])
