"""Small rank functions that check a launcher and a machine: `launch(hello, 2)`.

They also serve the tests: a rank that raises, one that is killed, a collective only some ranks reach, a run
that outlasts its timeout, ranks that finish far apart.
"""

import os
import signal
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from labtools.parallel.toolkit import device, rank, report_progress, world_size


def hello() -> dict:
    """All-reduce each rank's number: every rank gets 0 + 1 + … + (N − 1)."""
    t = torch.tensor([float(rank())], device=device())
    dist.all_reduce(t)
    return {"sum": t.item(), "pid": os.getpid(), "threads": torch.get_num_threads()}


@dataclass(frozen=True)
class Fault:
    rank: int = 1          # the rank that misbehaves
    sleep_s: float = 600   # how long the others (or the slow one) sleep
    steps: int = 10
    step_s: float = 1.0


def fail_on(cfg: Fault) -> dict:
    """Rank cfg.rank raises before a collective the others then wait in."""
    if rank() == cfg.rank:
        raise ValueError(f"deliberate failure on rank {rank()}")
    t = torch.ones(1, device=device())
    dist.all_reduce(t)
    return {"sum": t.item()}


def killed(cfg: Fault) -> dict:
    """Rank cfg.rank is killed by SIGKILL (as by the OOM killer) while the others wait in a collective."""
    if rank() == cfg.rank:
        time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGKILL)
    t = torch.ones(1, device=device())
    dist.all_reduce(t)
    return {"sum": t.item()}


def one_sided(cfg: Fault) -> dict:
    """Only rank 0 enters the all-reduce: without a timeout it would wait forever."""
    if rank() == 0:
        dist.all_reduce(torch.ones(1, device=device()))
    else:
        time.sleep(cfg.sleep_s)
    return {}


def finish_apart(cfg: Fault) -> dict:
    """Rank cfg.rank returns cfg.sleep_s later than the others (longer than a short collective timeout)."""
    if rank() == cfg.rank:
        time.sleep(cfg.sleep_s)
    return {"rank": rank()}


def slow(cfg: Fault) -> dict:
    """Sleep cfg.steps × cfg.step_s, reporting progress from rank 0."""
    for i in range(cfg.steps):
        time.sleep(cfg.step_s)
        report_progress(i + 1, cfg.steps, "sleeping")
    return {"world_size": world_size()}


def ddp_tiny() -> dict:
    """Wrap a small model in DDP and take one step: the teardown that used to abort at exit."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 1)).to(device()))
    x = torch.randn(8, 32, device=device())
    model(x).pow(2).mean().backward()
    return {"grad_norm": float(torch.linalg.vector_norm(torch.cat([p.grad.flatten() for p in model.parameters()])))}


@dataclass(frozen=True)
class Sizes:
    sizes: tuple[int, ...] = (1, 7, 64, 1001)


def ring_parity(cfg: Sizes) -> dict:
    """labtools.parallel.comm.ring_all_reduce against dist.all_reduce on tensors of several sizes (some not
    divisible by the world size): max difference and bytes sent per size."""
    from labtools.parallel.comm import ring_all_reduce
    out = {}
    for n in cfg.sizes:
        g = torch.Generator().manual_seed(rank() * 1000 + n)
        t = torch.randn(n, generator=g).to(device())
        ours, theirs = t.clone(), t.clone()
        sent = ring_all_reduce(ours)
        dist.all_reduce(theirs)
        out[str(n)] = {"max_diff": (ours - theirs).abs().max().item(), "sent": sent}
    return out
