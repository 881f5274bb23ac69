"""Lesson 04, section 6: matrix products and training steps per precision on this machine."""

import time
from contextlib import contextmanager

import numpy as np
import torch

from labtools.claims import Findings, Ledger, at_most
from labtools.device import NATIVE_16BIT, cpu_flags, pick_device
from labtools.precision import FORMATS
from labtools.progress import progress
from labtools.train import autocast
from lessons.mixed_precision import Settings, build, corpus


@contextmanager
def one_thread(device: torch.device):
    """On a CPU, time on one thread: with two, a busy machine that deschedules one of them stalls the other at every
    parallel region, and the slowdown hits whichever precision ran at that moment (fp32 steps measured 30x slower)."""
    before = torch.get_num_threads()
    if device.type == "cpu":
        torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def run(S: Settings) -> dict[str, dict[str, float]]:
    """Median ms per training step (forward, backward, AdamW) under each autocast precision, and per n×n
    (S.matmul_size) matrix product in each dtype: the step shows the overheads, the product the arithmetic units.
    The precisions take turns, round after round, so a slow moment of the machine hits all three alike; on a CPU,
    on one thread."""
    text = corpus()
    dev = pick_device()
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    X, Y = text.batch("train", S.batch_size, S.block_size, torch.Generator().manual_seed(0), dev)
    precisions = ("fp32", "bf16", "fp16")
    models = {p: build(S) for p in precisions}
    opts = {p: torch.optim.AdamW(models[p].parameters(), lr=1e-4) for p in precisions}
    mats = {p: torch.randn(S.matmul_size, S.matmul_size, device=dev).to(FORMATS[p].dtype) for p in precisions}
    step = {p: [] for p in precisions}
    matmul = {p: [] for p in precisions}
    with one_thread(dev):
        for i in progress(range(S.speed_steps + 1), desc="timing (rounds)"):
            for p in precisions:
                sync()
                t0 = time.perf_counter()
                with autocast(dev, p):
                    _, loss = models[p](X, Y)
                loss.backward()
                opts[p].step()
                opts[p].zero_grad(set_to_none=True)
                sync()
                t1 = time.perf_counter()
                mats[p] @ mats[p]
                sync()
                if i:  # the first round warms up
                    step[p].append((t1 - t0) * 1e3)
                    matmul[p].append((time.perf_counter() - t1) * 1e3)
    return {"step": {p: float(np.median(v)) for p, v in step.items()},
            "matmul": {p: float(np.median(v)) for p, v in matmul.items()}, "matmul_size": S.matmul_size,
            "device": dev.type}


NATIVE = NATIVE_16BIT  # CPU flags of 16-bit units
FEATURES = {"f16c": "fp16 ↔ fp32 conversion", "avx512_bf16": "bf16 dot products",
            "amx_bf16": "a bf16 matrix-product unit", "avx512_fp16": "fp16 arithmetic",
            "amx_fp16": "an fp16 matrix-product unit", "amx_tile": "matrix-product units (AMX)",
            "avx_vnni": "int8 dot products"}  # what each flag of cpu_flags() means, in words


def findings(ledger: Ledger, ms: dict[str, dict[str, float]]) -> Findings:
    st, mm, n = ms["step"], ms["matmul"], ms["matmul_size"]
    flags = cpu_flags()
    native = {p: any(f in flags for f in fl) for p, fl in NATIVE.items()}
    speedup = st["fp32"] / st["bf16"]
    ledger.note("ms_per_step", ms)
    ledger.note("cpu_flags", flags)
    ledger.note("bf16_speedup", speedup)
    if ms.get("device") == "cpu" and not native["bf16"]:
        ledger.add("no_doubling_here", "\"Mixed precision doubles throughput\" is a fact of hardware with 16-bit "
                   "units: on this CPU, which has no bf16 units, bf16 autocast does not speed training up at all "
                   "(steps per second, bf16 ÷ fp32, medians of alternating rounds on one thread)", speedup,
                   at_most(1.0), source="a widely repeated statement", kind="measured")
    slow = {p: mm[p] / mm["fp32"] for p in ("bf16", "fp16")}
    emulated = [p for p in ("bf16", "fp16") if slow[p] > 4]
    missing = [p for p in ("bf16", "fp16") if not native[p]]
    if ms.get("device") != "cpu":
        units = "On this GPU"
    elif missing:
        units = f"This CPU has no {' or '.join(missing)} arithmetic units"
    else:
        units = "This CPU has bf16 and fp16 arithmetic units"
    table = ("| precision | ms per training step | ms per matrix product | × fp32's time (product) |\n"
             "|---|---|---|---|\n"
             + "\n".join(f"| {p} | {st[p]:.1f} | {mm[p]:.2f} | {mm[p] / mm['fp32']:.3g} |" for p in st))
    product = mm["fp32"] / mm["bf16"]
    contrast = (f", though a large matrix product alone ran **{product:.1f}×** as fast in bf16: this small step is "
                "mostly other work" if speedup <= 1.1 and product > 1.5 else "")
    return Findings([
        f"{'Yes' if speedup > 1.1 else 'No'}: a training step under bf16 autocast ran at **{speedup:.2f}×** fp32's "
        f"speed here{contrast}.",
        units + (f": its {' and '.join(emulated)} matrix products took up to **{max(slow.values()):.0f}×** fp32's "
                 "time, converted and computed in software." if emulated else
                 ": no 16-bit product was much slower than fp32's."),
    ], [table, f"The matrix products are {n} × {n}; each time is the median of alternating rounds"
        + (", on one thread." if ms.get("device") == "cpu" else "."),
        "What the processor reports for small number formats: "
        + (", ".join(FEATURES[f] for f in flags) if flags else "nothing") + "."
        if ms.get("device") == "cpu" else ""])
