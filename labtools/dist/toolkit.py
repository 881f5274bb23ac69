"""What every rank function needs: who am I, the lab's GPT and its data, my rows, a logged mean, one step.

    @dataclass(frozen=True)
    class MyJob(GPTJob):
        accum_k: int = 4

    def my_rank_fn(job: MyJob) -> dict:               # launch(my_rank_fn, 2, MyJob(steps=20))
        model = DDP(build_gpt(job))
        opt = torch.optim.AdamW(model.parameters(), lr=job.lr)
        g = torch.Generator().manual_seed(job.seed)
        for step in range(job.steps):
            X, Y = global_batch(job, g, world_size() * job.batch_size)
            loss = train_step(model, opt, [(rank_rows(X), rank_rows(Y))])
            report_progress(step + 1, job.steps)

Everything here also runs in one process without a process group (rank 0 of 1), so the same code computes
the single-process reference a distributed run is compared with. Imports torch and core labtools only:
rank processes must not pay for plotly or ipywidgets.
"""

import json
import os
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import torch.distributed as dist

from labtools import data
from labtools.model import GPT, GPTConfig

RUN_DIR_ENV = "LABTOOLS_DIST_RUN_DIR"

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


# --- the lab's GPT and its data ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class GPTJob:
    """The config every lesson's rank functions share; lessons subclass it for their own fields."""
    n_layer: int = 2
    n_embd: int = 64
    n_head: int = 4
    block_size: int = 64
    batch_size: int = 8      # rows per rank per micro-batch
    steps: int = 10
    lr: float = 3e-3
    seed: int = 0

    def __post_init__(self):
        for name in ("n_layer", "n_embd", "n_head", "block_size", "batch_size", "steps"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr!r}")


def corpus() -> data.Corpus:
    """The corpus of the multi-process lessons: the standard library's source, characters."""
    return data.text()


def gpt_config(job: GPTJob, **changes) -> GPTConfig:
    cfg = GPTConfig(vocab_size=corpus().vocab_size, block_size=job.block_size, n_layer=job.n_layer,
                    n_head=job.n_head, n_embd=job.n_embd)
    return replace(cfg, **changes)


def build_gpt(job: GPTJob, **changes) -> GPT:
    """The lesson GPT on this rank's device, initialised from job.seed: the same weights on every rank."""
    torch.manual_seed(job.seed)
    return GPT(gpt_config(job, **changes)).to(device())


def global_batch(job: GPTJob, g: torch.Generator, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`rows` training windows, the same on every rank (each rank draws from an identically seeded g)."""
    X, Y = corpus().batch("train", rows, job.block_size, g)
    return X.to(device()), Y.to(device())


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
