"""Memory: measure what training holds (labtools.budget predicts it from the architecture).

Measurement (any device):
    saved_activation_bytes   bytes of tensors autograd saves for backward during a forward pass
    SavedTensorTracker       the same, live: bytes held at each moment and their peak, across many forwards
                             and backwards (a pipeline schedule's micro-batches in flight)
                             (torch.autograd.graph.saved_tensors_hooks, deduplicated by storage,
                             parameters excluded); agrees with torch's MemTracker to a few bytes
    model_state_bytes        parameters, gradients and optimizer state, from the tensors themselves
    peak_bytes               the peak of one training step split by kind (torch's MemTracker; CPU and CUDA)
    step_anatomy             what a training step holds at each of its moments, by kind (the same tracker)
    cuda_peak_bytes          the CUDA allocator's peak around a call
    check_fits               refuse a setting whose predicted memory this machine does not have, with the numbers

Introduced in notebooks/05_activation_checkpointing.ipynb and notebooks/06_memory_budget.ipynb.
"""

import os
import weakref
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn as nn

# --- measurement -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SavedTensor:
    shape: tuple
    dtype: torch.dtype
    nbytes: int  # bytes of the whole storage it lives in (counted once per storage)


def _storage(t: torch.Tensor):
    """The storage that holds t's memory on this process: a DTensor's is its local shard's."""
    if hasattr(t, "to_local"):
        with torch.no_grad():
            t = t.to_local()
    return t.untyped_storage()


def saved_activations(fn: Callable[[], object], exclude: list[torch.Tensor] = ()) -> tuple[list[SavedTensor], object]:
    """Run fn() and list the tensors autograd saved for backward, one per storage, skipping `exclude` (parameters)."""
    skip = {_storage(t).data_ptr() for t in exclude}
    seen: dict[int, SavedTensor] = {}

    def pack(t):
        storage = _storage(t)
        key = storage.data_ptr()
        if key not in skip and key not in seen:
            seen[key] = SavedTensor(tuple(t.shape), t.dtype, storage.nbytes())
        # detached: a saved output kept as itself would point back at its own grad_fn, a cycle through C++ that
        # Python's gc cannot see, so a graph that is never backwarded (fn's only use here) would never be freed.
        # Seen on an H100: lesson 05's sweeps ran out of 80 GB one model at a time.
        return t.detach()

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return list(seen.values()), out


class _Held:
    """What autograd keeps instead of a saved tensor while a SavedTensorTracker is active."""
    __slots__ = ("tensor", "__weakref__")

    def __init__(self, tensor: torch.Tensor):
        self.tensor = tensor


class SavedTensorTracker:
    """Bytes autograd holds for backward, live: while active, every tensor saved for backward is counted (once per
    storage, parameters excluded) until autograd releases its last saved reference to it — when backward has
    used it and freed the graph. .current and .peak are in bytes.

        with SavedTensorTracker(exclude=model.parameters()) as tracker:
            ... forwards and backwards of a pipeline schedule ...
        tracker.peak
    """

    def __init__(self, exclude=()):
        self.skip = {_storage(t).data_ptr() for t in exclude}
        self.live: dict[int, list[int]] = {}  # storage -> [saved references alive, bytes]
        self.current = self.peak = 0
        self._hooks = None

    def _pack(self, t: torch.Tensor):
        key = _storage(t).data_ptr()
        if key in self.skip:
            return t
        entry = self.live.get(key)
        if entry is None:
            entry = self.live[key] = [0, _storage(t).nbytes()]
            self.current += entry[1]
            self.peak = max(self.peak, self.current)
        entry[0] += 1
        held = _Held(t.detach())  # detached, as in saved_activations: no cycle back to the graph
        weakref.finalize(held, self._release, key)
        return held

    def _release(self, key: int) -> None:
        entry = self.live[key]
        entry[0] -= 1
        if entry[0] == 0:
            self.current -= entry[1]
            del self.live[key]

    @staticmethod
    def _unpack(held):
        return held.tensor if isinstance(held, _Held) else held

    def __enter__(self) -> "SavedTensorTracker":
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc) -> bool:
        self._hooks.__exit__(*exc)
        return False


def saved_activation_bytes(model: nn.Module, X: torch.Tensor, Y: torch.Tensor | None = None) -> int:
    """Bytes autograd keeps for the backward of model(X, Y): the activation memory of a training step."""
    saved, _ = saved_activations(lambda: model(X, Y), exclude=list(model.parameters()))
    return sum(s.nbytes for s in saved)


def tensor_bytes(tensors) -> int:
    """Bytes of the tensors this process holds: a sharded DTensor counts its local shard only."""
    total = 0
    for t in tensors:
        if t is not None:
            t = t.to_local() if hasattr(t, "to_local") else t
            total += t.numel() * t.element_size()
    return total


def model_state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> dict[str, int]:
    """Bytes of parameters, of gradients (those present) and of optimizer state tensors, measured."""
    params = list(model.parameters())
    out = {"params": tensor_bytes(params), "grads": tensor_bytes(p.grad for p in params), "optimizer": 0}
    if optimizer is not None:
        out["optimizer"] = sum(tensor_bytes(v for v in s.values() if torch.is_tensor(v))
                               for s in optimizer.state.values())
    return out


def peak_bytes(step: Callable[[], None], model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> dict:
    """Peak memory of step() by kind (params, grads, activations, temporaries, optimizer state, total) on the
    model's device, from torch's MemTracker (torch.distributed._tools: a private API, present since torch 2.5)."""
    from torch.distributed._tools.mem_tracker import MemTracker
    tracker = MemTracker()
    tracker.track_external(*(m for m in (model, optimizer) if m is not None))
    with tracker:
        step()
    snapshot = tracker.get_tracker_snapshot("peak")
    device = next(model.parameters()).device
    stats = next(v for k, v in snapshot.items() if torch.device(k).type == device.type)
    names = {"PARAM": "params", "GRAD": "grads", "ACT": "activations", "TEMP": "temp", "OPT": "optimizer"}
    out = {names[str(k).split(".")[-1]]: v for k, v in stats.items() if str(k).split(".")[-1] in names}
    out["total"] = stats["Total"]
    return out


ANATOMY = ("params", "grads", "optimizer", "activations", "temp")
ANATOMY_LABELS = {"params": "parameters", "grads": "gradients", "optimizer": "optimizer state (Adam's two moments)",
                  "activations": "activations kept for backward", "temp": "temporaries"}
MOMENTS = ("start", "after forward", "after backward", "after optimizer step", "after zero_grad", "peak")


def step_anatomy(model: nn.Module, optimizer: torch.optim.Optimizer, X: torch.Tensor, Y: torch.Tensor) -> dict:
    """What one training step holds at each of its moments, by kind (torch's MemTracker, as peak_bytes): a warm-up
    step first, so the optimizer's state exists, then {moment: {kind: bytes}} over the second, and its peak."""
    from torch.distributed._tools.mem_tracker import MemTracker
    model(X, Y)[1].backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    tracker = MemTracker()
    tracker.track_external(model, optimizer)
    names = {"PARAM": "params", "GRAD": "grads", "ACT": "activations", "TEMP": "temp", "OPT": "optimizer"}

    def snap(which: str) -> dict:
        stats = next(v for k, v in tracker.get_tracker_snapshot(which).items()
                     if torch.device(k).type == X.device.type)
        out = {kind: 0 for kind in ANATOMY}
        out.update({names[str(k).split(".")[-1]]: v for k, v in stats.items() if str(k).split(".")[-1] in names})
        return out

    out = {}
    with tracker:
        out["start"] = snap("current")
        loss = model(X, Y)[1]
        out["after forward"] = snap("current")
        loss.backward()
        del loss
        out["after backward"] = snap("current")
        optimizer.step()
        out["after optimizer step"] = snap("current")
        optimizer.zero_grad(set_to_none=True)
        out["after zero_grad"] = snap("current")
    out["peak"] = snap("peak")
    return out


def cuda_peak_bytes(fn: Callable[[], None]) -> int:
    """The CUDA allocator's peak during fn(), above what was allocated before it."""
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before


# --- what this machine has ---------------------------------------------------------------------------------


def free_bytes(device: torch.device) -> int:
    """Memory a run can use now: a GPU's free memory, or on the CPU what Linux reports available (MemAvailable:
    free plus what the page cache gives back), or else the machine's total."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def check_fits(name: str, value, need: float, device: torch.device, what: str) -> None:
    """Raise ValueError naming the parameter where its predicted memory (`need` bytes, for `what`) is more than
    this machine has free: before any heavy work, instead of a machine that swaps or a process the OOM killer ends."""
    have = free_bytes(device)
    if need > have:
        raise ValueError(f"{name} = {value} would need about {need / 1e9:.1f} GB ({what}); this machine has "
                         f"{have / 1e9:.1f} GB free on the {device.type.upper()}: choose a smaller {name}")
