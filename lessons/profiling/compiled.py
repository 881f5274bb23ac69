"""Lesson 13, section 4: torch.compile on a chain of element-wise ops (a bias add, ReLU, a scale and a residual add,
the shape of an MLP's epilogue): kernels before and after, time per call in alternating rounds, and the compile time
it costs."""

import statistics
import time

import plotly.graph_objects as go
import torch
import torch.nn.functional as F

from labtools import plots, profiling
from labtools.claims import Findings, Ledger, at_least
from labtools.device import pick_device
from labtools.progress import progress
from lessons.profiling import Settings


def chain(x, bias, residual):
    """Four element-wise ops: in eager mode each reads its inputs from memory and writes its output back."""
    return residual + F.relu(x + bias) * 0.5


def _inputs(S: Settings):
    g = torch.Generator().manual_seed(S.seed)
    rows = S.chain_elems // 1024
    x, r = torch.randn(rows, 1024, generator=g), torch.randn(rows, 1024, generator=g)
    return [t.to(pick_device()) for t in (x, torch.randn(1024, generator=g), r)]


def run(S: Settings) -> dict:
    """Compile the chain (timed, from a reset), then S.compile_rounds alternating rounds of S.compile_calls eager and
    compiled calls. Where compilation fails (no C++ compiler, an unsupported platform), say why and go on."""
    if not S.compile:
        return {"skipped": "COMPILE = False"}
    from torch._dynamo.utils import counters
    from torch._inductor import metrics
    args = _inputs(S)
    dev = args[0].device
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    eager_ops = [op.name for op in profiling.OpTimer.run(lambda: chain(*args), dev)]
    torch._dynamo.reset()
    metrics.reset()
    hits = counters["inductor"]["fxgraph_cache_hit"]
    compiled = torch.compile(chain)
    t0 = time.perf_counter()
    try:
        out = compiled(*args)
        sync()
    except Exception as e:  # noqa: BLE001 - the lesson goes on without this section, saying why
        return {"skipped": f"torch.compile failed here (a {type(e).__name__}; on a CPU the usual cause is a missing "
                           "C++ compiler)", "error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"}
    compile_s = time.perf_counter() - t0
    per_call = {"eager": [], "compiled": []}
    fns = {"eager": chain, "compiled": compiled}
    for _ in progress(range(S.compile_rounds), desc="eager vs compiled"):
        for name, fn in fns.items():
            sync()
            t0 = time.perf_counter()
            for _ in range(S.compile_calls):
                fn(*args)
            sync()
            per_call[name].append((time.perf_counter() - t0) / S.compile_calls)
    return {"compile_s": compile_s, "cache_hit": counters["inductor"]["fxgraph_cache_hit"] > hits,
            "eager_ops": eager_ops, "kernels": metrics.generated_kernel_count,
            "max_diff": (out - chain(*args)).abs().max().item(), "per_call": per_call,
            "mib": args[0].numel() * args[0].element_size() / 2**20, "calls": S.compile_rounds * S.compile_calls}


def figure(c: dict) -> go.Figure | None:
    if "skipped" in c:
        return None
    fig = go.Figure()
    for i, (name, xs) in enumerate(c["per_call"].items()):
        fig.add_trace(go.Scatter(x=list(range(1, len(xs) + 1)), y=[x * 1e3 for x in xs], mode="lines+markers",
                                 name=name, line=dict(color=plots.color(i))))
    fig.update_yaxes(rangemode="tozero")
    return plots.style(fig, "The element-wise chain, eager vs compiled (alternating rounds)", "round",
                       "ms per call", height=320)


def show(c: dict) -> None:
    """The rounds' figure, or nothing where the section was skipped (its findings say why)."""
    fig = figure(c)
    if fig is not None:
        fig.show()


def findings(ledger: Ledger, c: dict) -> Findings:
    if "skipped" in c:
        ledger.note("compile_error", c.get("error"))
        return Findings([f"**Section skipped**: {c['skipped']}. The rest of the lesson does not depend on it."])
    eager, comp = (statistics.median(c["per_call"][k]) for k in ("eager", "compiled"))
    speedup = eager / comp
    saved = max(eager - comp, 1e-12)  # seconds per call
    ledger.add("compile_fuses", "Compiled, the chain's element-wise ops run as fewer kernels (eager ops ÷ kernels "
               "generated)", len(c["eager_ops"]) / max(c["kernels"], 1), at_least(2), kind="counted")
    ledger.add("compile_speedup", "The fused chain runs at least 1.5× faster per call (median over alternating "
               "rounds)", speedup, at_least(1.5), kind="measured")
    ledger.note("compile_s", c["compile_s"])
    cache = "from the disk cache: compiled before on this machine" if c["cache_hit"] else "the graph compiled afresh"
    same = "bit for bit" if c["max_diff"] == 0 else f"to {c['max_diff']:.0e}"
    return Findings([
        "It fused the chain of element-wise ops into "
        + ("one kernel, a single pass over memory," if c["kernels"] == 1 else f"{c['kernels']} kernels")
        + f" and ran **{speedup:.1f}×** faster per call; the compile itself is paid back only over many calls.",
    ], [
        f"Eager ran {', '.join(c['eager_ops'])}, each a pass over tensors of {c['mib']:.0f} MiB; the result is the "
        f"same {same}.",
        f"Per call: {eager * 1e3:.1f} ms eager, {comp * 1e3:.1f} ms compiled.",
        f"Compiling took {c['compile_s']:.1f} s ({cache}): it pays for itself after about "
        f"{c['compile_s'] / saved:,.0f} calls.",
    ])
