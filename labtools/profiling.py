"""Where a step's time goes: the machine's two roofs, each operation timed with its FLOPs and bytes, and a
profiler trace sorted into kinds of work. Introduced in notebooks/13_profiling.ipynb.

    peak = matmul_peak([256, 512])["fp32"]["peak"]        # FLOP/s: the compute roof
    bw = bandwidth(2**24)["triad"]                         # bytes/s: the memory roof
    ops = OpTimer.run(lambda: model(X, Y)[1].backward())  # each aten op: name, kind, FLOPs, bytes, seconds

An operation's *arithmetic intensity* is its FLOPs per byte moved. Below the ridge point (peak ÷ bandwidth) the
memory roof bounds it: it is memory-bound; above, the compute roof does. FLOPs of matrix products and attention
come from torch's own FlopCounterMode formulas (the CPU's fused attention kernel, which has none, is given the CUDA
flash kernel's: same arguments, same arithmetic); any other op is given one FLOP per element of its largest tensor
(a convention: the counter gives it none), and its bytes are its tensors' sizes, read once and written once.
"""

import math
import os
import sys
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import flop_registry

from labtools.progress import progress
from labtools.validate import check_range

aten = torch.ops.aten
# Kernels FlopCounterMode has no formula for, and the kernel whose formula fits them (same leading arguments)
FORMULA_OF = {aten._scaled_dot_product_flash_attention_for_cpu: aten._scaled_dot_product_flash_attention,
              aten._scaled_dot_product_flash_attention_for_cpu_backward:
                  aten._scaled_dot_product_flash_attention_backward}

KINDS = ("matrix products", "attention", "normalisation", "element-wise", "optimizer", "other")

_MATMUL = {"mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "mv", "addmv", "dot"}
_NORM = {"layer_norm", "native_layer_norm", "native_layer_norm_backward", "rms_norm", "_fused_rms_norm",
         "_fused_rms_norm_backward", "group_norm", "native_group_norm"}
_ELEMENTWISE = {"add", "add_", "sub", "sub_", "mul", "mul_", "div", "div_", "neg", "pow", "sqrt", "rsqrt", "exp",
                "log", "tanh", "tanh_backward", "gelu", "gelu_backward", "relu", "threshold_backward", "silu",
                "silu_backward", "sigmoid", "where", "masked_fill", "masked_fill_", "_softmax", "softmax",
                "_softmax_backward_data", "native_dropout", "native_dropout_backward", "dropout", "addcmul_",
                "addcdiv_", "lerp_", "clamp", "clamp_", "sum", "mean", "maximum", "minimum", "abs", "sign",
                "fill_", "zero_", "copy_", "clone", "_to_copy", "ones_like", "zeros_like"}
# Ops that move no data: views and metadata. They are timed by OpTimer but never placed on the roofline.
FREE = {"view", "_unsafe_view", "reshape", "t", "transpose", "permute", "expand", "as_strided", "detach", "alias",
        "unsqueeze", "squeeze", "split", "split_with_sizes", "slice", "select", "unbind", "chunk", "empty",
        "empty_like", "empty_strided", "_reshape_alias", "lift_fresh", "lift_fresh_copy", "new_empty",
        "new_empty_strided", "set_", "resize_", "is_same_size", "_has_compatible_shallow_copy_type"}


@contextmanager
def native_stderr_silenced():
    """Send what native code writes to the process's stderr (file descriptor 2) to /dev/null within the block.

    torch.profiler's tracer prints a line to it at every start and stop ("USDT: ... profiler_start"), which a
    Jupyter kernel forwards into the notebook. Python's own warnings and exceptions are not affected."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def op_name(name: str) -> str:
    """'aten::mm' or 'aten.mm.default' → 'mm'."""
    name = name.split("::", 1)[-1]
    if name.startswith("aten."):
        name = name[5:].split(".", 1)[0]
    return name


def kind_of(name: str) -> str:
    """The kind of work an aten op does (one of KINDS, 'optimizer' aside: that is where an op runs, not what)."""
    n = op_name(name)
    if n in _MATMUL:
        return "matrix products"
    if "scaled_dot_product" in n or "flash_attention" in n or "efficient_attention" in n or "cudnn_attention" in n:
        return "attention"
    if n in _NORM:
        return "normalisation"
    if n in _ELEMENTWISE or n.startswith("_foreach_"):
        return "element-wise"
    return "other"


def _sync(device: torch.device) -> Callable[[], None]:
    return torch.cuda.synchronize if device.type == "cuda" else (lambda: None)


def matmul_peak(sizes, device: torch.device, dtypes=(("fp32", torch.float32),), repeats: int = 3) -> dict:
    """Achieved FLOP/s of n×n matrix products, best over sizes and repeats, per dtype: {name: {by_size, peak}}.
    On a GPU a vendor publishes a peak; a CPU has no honest one, so the best rate reached here stands for it."""
    check_range("repeats", repeats, 1, None, int)
    sync, out = _sync(device), {}
    for name, dtype in progress(dtypes, desc="matmul peak"):
        rates = {}
        for n in sizes:
            a = torch.randn(n, n, device=device).to(dtype)
            b = torch.randn(n, n, device=device).to(dtype)
            a @ b
            best = math.inf
            for _ in range(repeats):
                sync()
                t0 = time.perf_counter()
                a @ b
                sync()
                best = min(best, time.perf_counter() - t0)
            rates[n] = 2 * n**3 / best
        out[name] = {"by_size": rates, "peak": max(rates.values())}
    return out


def bandwidth(n: int, device: torch.device, repeats: int = 5) -> dict[str, float]:
    """Memory bandwidth in bytes/s, best of `repeats`, on fp32 arrays of n elements (make them far larger than the
    caches): copy (b → a: 8n bytes) and triad (a = b + s·c: 12n bytes), as in McCalpin's STREAM."""
    check_range("n", n, 1, None, int)
    check_range("repeats", repeats, 1, None, int)
    a, b, c = (torch.rand(n, device=device) for _ in range(3))
    sync, best = _sync(device), {"copy": math.inf, "triad": math.inf}
    for _ in range(repeats):
        for name, fn in (("copy", lambda: a.copy_(b)), ("triad", lambda: torch.add(b, c, alpha=3.0, out=a))):
            sync()
            t0 = time.perf_counter()
            fn()
            sync()
            best[name] = min(best[name], time.perf_counter() - t0)
    return {"copy": 8 * n / best["copy"], "triad": 12 * n / best["triad"]}


@dataclass
class Op:
    """One aten op as it ran: FLOPs (the counter's formula, or one per output element), bytes of its tensors
    (inputs read, outputs written), and the seconds it took. counted: the FLOPs come from a formula, not the
    one-per-element convention."""
    name: str
    kind: str
    shapes: str
    flops: float
    bytes: int
    seconds: float
    counted: bool = False


class OpTimer(TorchDispatchMode):
    """Times every aten op that runs under it (synchronising a GPU around each), with its FLOPs and bytes.
    Timing each op alone adds a little overhead per op; the totals are for placing ops, not for the step time."""

    def __init__(self, device: torch.device):
        super().__init__()
        self.sync = _sync(device)
        self.ops: list[Op] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.sync()
        t0 = time.perf_counter()
        out = func(*args, **kwargs)
        self.sync()
        seconds = time.perf_counter() - t0
        name = op_name(str(func))
        if name not in FREE:
            ins = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
            outs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
            moved = sum(t.numel() * t.element_size() for t in ins + outs)
            packet = FORMULA_OF.get(func.overloadpacket, func.overloadpacket)
            counted = packet in flop_registry
            if counted:
                flops = float(flop_registry[packet](*args, **kwargs, out_val=out))
            else:  # one FLOP per element of its largest tensor: a reduction's input, an element-wise op's output
                flops = float(max((t.numel() for t in ins + outs), default=0))
            shapes = " · ".join("×".join(map(str, t.shape)) for t in ins if t.dim())
            self.ops.append(Op(name, kind_of(name), shapes, flops, moved, seconds, counted))
        return out

    @classmethod
    def run(cls, fn: Callable[[], object], device: torch.device) -> list[Op]:
        with cls(device) as timer:
            fn()
        return timer.ops


def group(ops: list[Op]) -> list[dict]:
    """Ops with the same name and shapes summed (calls, FLOPs, bytes, seconds), largest total time first."""
    out: dict[tuple, dict] = {}
    for op in ops:
        g = out.setdefault((op.name, op.shapes), {"name": op.name, "kind": op.kind, "shapes": op.shapes, "calls": 0,
                                                  "flops": 0.0, "bytes": 0, "seconds": 0.0})
        g["calls"] += 1
        g["flops"] += op.flops
        g["bytes"] += op.bytes
        g["seconds"] += op.seconds
    for g in out.values():
        g["intensity"] = g["flops"] / g["bytes"] if g["bytes"] else math.nan
        g["flop_rate"] = g["flops"] / g["seconds"] if g["seconds"] > 0 else math.nan
        g["byte_rate"] = g["bytes"] / g["seconds"] if g["seconds"] > 0 else math.nan
    return sorted(out.values(), key=lambda g: -g["seconds"])


def roof(intensity: float, peak: float, bytes_per_s: float) -> float:
    """The roofline: the most FLOP/s an op of this intensity can reach, min(peak, bandwidth × intensity)."""
    return min(peak, bytes_per_s * intensity)


def ridge(peak: float, bytes_per_s: float) -> float:
    """The intensity (FLOPs per byte) where the two roofs meet: below it an op is memory-bound."""
    return peak / bytes_per_s
