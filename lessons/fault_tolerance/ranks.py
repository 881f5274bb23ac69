"""Lesson 11's processes: sharded checkpoints (torch.distributed.checkpoint) saved at one world size and loaded
at another, an elastic DDP run that loses a rank and resumes, and a saver to be killed mid-save.

Imports torch and core labtools only (no notebook UI): these run inside torchrun ranks or forked children.
"""

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.nn.parallel import DistributedDataParallel as DDP

from labtools import checkpoint
from labtools.config import LabConfig
from labtools.parallel.toolkit import (build_gpt, device, global_batch, rank, rank_rows, report_progress, restart_count,
                                       shard_gpt, train_step, world_size)


def _check_directory(directory: str) -> None:
    if not directory or not Path(directory).is_dir():
        raise ValueError(f"directory must be an existing directory shared by the ranks, got {directory!r}")


# --- sharded checkpoints ------------------------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class ShardJob(LabConfig):
    directory: str = ""      # where the DCP checkpoints go (every rank writes its own shard file there)


def _fsdp(job: ShardJob):
    model = shard_gpt(build_gpt(job), init_device_mesh(device().type, (world_size(),)), reshard=True, mp=False)
    return model, torch.optim.AdamW(model.parameters(), lr=job.lr)


def _full_digest(model, opt) -> tuple[str, str]:
    """Digests of the whole (unsharded) model and optimizer state, the same on every rank: gathered from the
    shards, so two runs with different world sizes can be compared bit for bit."""
    full = StateDictOptions(full_state_dict=True)
    model_sd, optim_sd = get_state_dict(model, opt, options=full)
    return checkpoint.digest(model_sd), checkpoint.digest(optim_sd)


@dataclass(frozen=True)
class Saved:
    """One rank's sharded save: how long each way of saving took, and the whole state's digests."""
    blocking_s: float       # dcp.save, until it returned (written)
    async_return_s: float   # dcp.async_save, until the call returned (staged)
    async_done_s: float     # dcp.async_save, until its write finished
    model_digest: str       # sha256 of the whole (gathered) model, the same on every rank
    optim_digest: str       # ... and of the whole optimizer state
    local_param_bytes: int  # the bytes of parameters this rank holds
    files: list[str]        # what the blocking save wrote (rank 0; empty on the others)


def sharded_save(job: ShardJob) -> Saved:
    """FSDP2 training for job.steps steps, then the model + optimizer saved with dcp.save (blocking) and with
    dcp.async_save (the call returns once the state is staged; the write finishes in the background)."""
    _check_directory(job.directory)
    model, opt = _fsdp(job)
    g = torch.Generator().manual_seed(job.seed)
    for step in range(job.steps):
        X, Y = global_batch(job, g, world_size() * job.batch_size)
        train_step(model, opt, [(rank_rows(X), rank_rows(Y))])
        report_progress(step + 1, job.steps, "training")
    model_sd, optim_sd = get_state_dict(model, opt)  # this rank's shards, as DTensors
    state = {"model": model_sd, "optim": optim_sd}
    dist.barrier()
    t0 = time.perf_counter()
    dcp.save(state, checkpoint_id=str(Path(job.directory) / "blocking"))
    blocking_s = time.perf_counter() - t0
    dist.barrier()
    t0 = time.perf_counter()
    future = dcp.async_save(state, checkpoint_id=str(Path(job.directory) / "async"))
    async_return_s = time.perf_counter() - t0
    future.result()
    async_done_s = time.perf_counter() - t0
    dist.barrier()
    model_digest, optim_digest = _full_digest(model, opt)
    own = sum(t.to_local().numel() * t.element_size() for t in model.parameters())
    return Saved(blocking_s=blocking_s, async_return_s=async_return_s, async_done_s=async_done_s,
                 model_digest=model_digest, optim_digest=optim_digest, local_param_bytes=own,
                 files=sorted(p.name for p in (Path(job.directory) / "blocking").iterdir()) if rank() == 0 else [])


@dataclass(frozen=True)
class Loaded:
    """One rank's load of the sharded checkpoint at another world size, and the training step after it."""
    model_digest: str   # sha256 of the whole (gathered) model loaded, the same on every rank
    optim_digest: str   # ... and of the whole optimizer state
    load_s: float       # dcp.load and set_state_dict
    next_loss: float    # the loss of one more training step from the loaded state


def sharded_load(job: ShardJob) -> Loaded:
    """Load what sharded_save wrote (at any world size) into a fresh FSDP2 model + optimizer at this world size:
    DCP reads the slices of the saved shards each rank now owns. Then one more training step."""
    _check_directory(job.directory)
    model, opt = _fsdp(job)
    model_sd, optim_sd = get_state_dict(model, opt)  # the target layout (optimizer state initialised)
    state = {"model": model_sd, "optim": optim_sd}
    t0 = time.perf_counter()
    dcp.load(state, checkpoint_id=str(Path(job.directory) / "blocking"))
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    load_s = time.perf_counter() - t0
    model_digest, optim_digest = _full_digest(model, opt)
    X, Y = global_batch(job, torch.Generator().manual_seed(job.seed + 1), world_size() * job.batch_size)
    loss = train_step(model, opt, [(rank_rows(X), rank_rows(Y))])
    return Loaded(model_digest=model_digest, optim_digest=optim_digest, load_s=load_s, next_loss=loss)


# --- elastic restart ----------------------------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class ElasticJob(LabConfig):
    directory: str = ""      # the run's checkpoints (labtools.checkpoint, written by rank 0)
    every: int = 5           # steps between checkpoints
    kill_at: int = 0         # on the first attempt, rank kill_rank SIGKILLs itself before this step (0: never)
    kill_rank: int = 1

    def __post_init__(self):
        super().__post_init__()
        if not isinstance(self.every, int) or self.every < 1:
            raise ValueError(f"every must be an int >= 1, got {self.every!r}")
        if not 0 <= self.kill_at < self.steps:
            raise ValueError(f"kill_at must be in [0, steps), got {self.kill_at!r}")


@dataclass(frozen=True)
class ElasticRun:
    """One rank's elastic DDP run, from its last attempt."""
    digest: str          # sha256 of the final parameters
    losses: list[float]  # every step's loss, from step 1 (the steps before a resume come from the checkpoint)
    resumed_from: int    # the step this attempt resumed from (0: it started afresh)
    restarts: int        # torchrun's restarts before this attempt


def elastic(job: ElasticJob) -> ElasticRun:
    """DDP training that checkpoints every job.every steps and, started again by torchrun after a failure,
    resumes from the newest checkpoint that verifies. Returns the final parameters' digest and every loss."""
    _check_directory(job.directory)
    model = DDP(build_gpt(job))
    opt = torch.optim.AdamW(model.parameters(), lr=job.lr)
    g = torch.Generator().manual_seed(job.seed)
    losses, start = [], 0
    path = checkpoint.latest(job.directory)
    if path is not None:
        state = checkpoint.load(path)
        checkpoint.load_model_state(model.module, state["model"], where=str(path))
        opt.load_state_dict(state["optimizer"])
        checkpoint.set_rng_state(state["rng"], g)
        losses, start = state["losses"], state["step"]
    for step in range(start, job.steps):
        if job.kill_at and step == job.kill_at and rank() == job.kill_rank and restart_count() == 0:
            os.kill(os.getpid(), signal.SIGKILL)  # fault injection: no Python error, no goodbye
        X, Y = global_batch(job, g, world_size() * job.batch_size)
        losses.append(train_step(model, opt, [(rank_rows(X), rank_rows(Y))]))
        if (step + 1) % job.every == 0 or step + 1 == job.steps:
            if rank() == 0:
                checkpoint.save(job.directory, step + 1, model=model.module.state_dict(), optimizer=opt.state_dict(),
                                rng=checkpoint.rng_state(g), losses=losses)
            dist.barrier()  # nobody runs ahead of a checkpoint that is not yet on disk
        report_progress(step + 1, job.steps, f"attempt {restart_count()}")
    return ElasticRun(digest=checkpoint.digest(model.module.state_dict()), losses=losses, resumed_from=start,
                      restarts=restart_count())


# --- a saver to kill ----------------------------------------------------------------------------------------------

def save_forever(directory: str, numel: int, in_place: bool) -> None:
    """Save checkpoints of a numel-float state over and over until killed: with labtools.checkpoint.save
    (atomic), or in place with torch.save to directory/checkpoint.pt (the tutorial recipe). Runs in a child."""
    g = torch.Generator().manual_seed(0)
    state = {"model": {"w": torch.randn(numel, generator=g)}}
    done = [] if in_place else checkpoint.checkpoints(directory)
    step = int(done[-1].name.split("_")[1]) if done else 0  # go on from the newest checkpoint there
    while True:
        step += 1
        state["step"] = step
        if in_place:
            torch.save(state, Path(directory) / "checkpoint.pt")
            size = (Path(directory) / "checkpoint.pt").stat().st_size
            # for the parent: a whole file's size, published atomically (a plain write_text is read empty
            # now and then: the parent polls while the child has truncated but not yet written the file)
            (Path(directory) / "saved.tmp").write_text(str(size))
            os.replace(Path(directory) / "saved.tmp", Path(directory) / "saved")
        else:
            checkpoint.save(directory, step, keep=2, model=state["model"])
