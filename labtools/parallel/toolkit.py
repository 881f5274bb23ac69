"""What every rank function needs: who am I, the lab's GPT and its data, my rows, a logged mean, one step.

    def my_rank_fn(S: Settings) -> dict:             # launch(my_rank_fn, 2, settings("smoke"))
        model = DDP(build_gpt(S))                    # Settings: a lesson's labtools.config.LabConfig
        opt = torch.optim.AdamW(model.parameters(), lr=S.lr)
        g = torch.Generator().manual_seed(S.seed)
        for step in range(S.steps):
            X, Y = global_batch(S, g, world_size() * S.batch_size)
            loss = train_step(model, opt, [(rank_rows(X), rank_rows(Y))])
            report_progress(step + 1, S.steps)

Everything here also runs in one process without a process group (rank 0 of 1), so the same code computes
the single-process reference a distributed run is compared with. Imports torch and core labtools only:
rank processes must not pay for plotly or ipywidgets.
"""

import json
import os
import time
from collections.abc import Sequence
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.distributed as dist

from labtools import config
from labtools.config import LabConfig
from labtools.model import GPT
from labtools.parallel.processes import RUN_DIR_ENV

# --- who am I --------------------------------------------------------------------------------------------------


def distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def rank() -> int:
    return dist.get_rank() if distributed() else 0


def world_size() -> int:
    return dist.get_world_size() if distributed() else 1


def restart_count() -> int:
    """How many times torchrun restarted this run's ranks (launch(..., max_restarts=k)); 0 on the first attempt."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def device() -> torch.device:
    """This rank's device: its own GPU under NCCL, the CPU under gloo (and cuda if present without a group)."""
    if distributed():
        if dist.get_backend() == "nccl":
            return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        return torch.device("cpu")
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def report_progress(done: int, total: int, desc: str = "") -> None:
    """From rank 0: tell the launcher's progress bar how far the run is (cheap; call once per step)."""
    run_dir = os.environ.get(RUN_DIR_ENV)
    if not run_dir or rank() != 0:
        return
    tmp = Path(run_dir) / "progress.json.tmp"
    tmp.write_text(json.dumps({"done": done, "total": total, "desc": desc}))
    tmp.replace(Path(run_dir) / "progress.json")


# --- the lab's GPT and its data, on this rank's device ----------------------------------------------------------


def build_gpt(cfg: LabConfig, **changes) -> GPT:
    """The lesson GPT on this rank's device, initialised from cfg.seed: the same weights on every rank."""
    return config.build_gpt(cfg, device=device(), **changes)


def global_batch(cfg: LabConfig, g: torch.Generator, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`rows` training windows of the text corpus, the same on every rank (each draws from an identically seeded g)."""
    return config.global_batch(cfg, g, rows, device=device())


def rank_rows(t: torch.Tensor, micro: int = 0, micro_batches: int = 1) -> torch.Tensor:
    """This rank's rows of a global batch laid out as micro_batches × world_size equal blocks: block
    (micro · N + rank). With one micro-batch, rank r gets rows [r·B, (r+1)·B)."""
    N = world_size()
    blocks = micro_batches * N
    if t.size(0) % blocks:
        raise ValueError(f"{t.size(0)} rows do not split into {micro_batches} micro-batches × {N} ranks")
    B = t.size(0) // blocks
    i = micro * N + rank()
    return t[i * B:(i + 1) * B]


# --- reductions and a training step ---------------------------------------------------------------------------


def mean_over_ranks(x: float | torch.Tensor) -> float:
    """The mean of a scalar over all ranks (for logging a loss); the value itself without a process group."""
    if not distributed():
        return float(x)
    t = torch.tensor([float(x)], dtype=torch.float64 if device().type == "cpu" else torch.float32, device=device())
    dist.all_reduce(t)
    return t.item() / world_size()


def _no_sync(model: torch.nn.Module, last: bool):
    """Skip gradient synchronisation on all but the last micro-batch: DDP's no_sync(), FSDP2's
    set_requires_gradient_sync(False); nothing for a plain module."""
    if last:
        if hasattr(model, "set_requires_gradient_sync"):
            model.set_requires_gradient_sync(True)
        return nullcontext()
    if hasattr(model, "no_sync"):
        return model.no_sync()
    if hasattr(model, "set_requires_gradient_sync"):
        model.set_requires_gradient_sync(False)
    return nullcontext()


def accumulate(model: torch.nn.Module, micro_batches: Sequence[tuple[torch.Tensor, torch.Tensor]], *,
               normalize: bool = True, no_sync: bool = True) -> float:
    """Forward and backward over k micro-batches, gradients accumulating in .grad; returns the mean loss.

    Each micro-batch's loss is divided by k (normalize=False is the classic bug: k× gradients). With no_sync
    (the default) gradients are synchronised across ranks once, after the last micro-batch; without it, after
    every one (the same gradients, k× the communication).
    """
    k = len(micro_batches)
    total = 0.0
    for i, (X, Y) in enumerate(micro_batches):
        with _no_sync(model, last=i == k - 1 or not no_sync):
            _, loss = model(X, Y)
            (loss / k if normalize else loss).backward()
        total += loss.item() / k
    return total


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
               micro_batches: Sequence[tuple[torch.Tensor, torch.Tensor]], *, grad_clip: float | None = None) -> float:
    """One optimizer step over k micro-batches for a plain, DDP- or FSDP-wrapped model: accumulate, clip
    (global norm), step, zero_grad. Returns the step's loss averaged over micro-batches and ranks."""
    loss = accumulate(model, micro_batches)
    if grad_clip is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return mean_over_ranks(loss)


def timed_steps(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                batches: Sequence[tuple[torch.Tensor, torch.Tensor]], *, wait: bool = False) -> float:
    """Seconds per step of forward, backward and the optimizer over batches already drawn (no loss averaged over
    ranks: nothing but the step is timed). wait=True ends every step at a barrier, as a synchronous step ends: each
    step then takes the slowest rank's time."""
    sync = torch.cuda.synchronize if batches[0][0].is_cuda else (lambda: None)
    sync()
    t0 = time.perf_counter()
    for X, Y in batches:
        _, loss = model(X, Y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if wait:
            sync()
            dist.barrier()
    sync()
    return (time.perf_counter() - t0) / len(batches)


def shard_gpt(model: GPT, mesh, reshard: bool, mp: bool) -> GPT:
    """FSDP2: each block is a unit (its parameters gathered together), then the root (embeddings, head)."""
    # imported here: FSDP2 loads DTensor's operator table, 0.7 s of a rank's start on a 2-core CPU, which ranks that
    # neither shard nor wrap a model in DDP (which loads it too) need not pay
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    kw = dict(mesh=mesh, reshard_after_forward=reshard)
    if mp:
        kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in model.transformer.h:
        fully_shard(block, **kw)
    fully_shard(model, **kw)
    return model
