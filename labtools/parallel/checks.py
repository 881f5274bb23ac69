"""Small rank functions that check a launcher and a machine: `launch(hello, 2)`.

They also serve the tests: a rank that raises, one that is killed, a collective only some ranks reach, a run
that outlasts its timeout, ranks that finish far apart.
"""

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from labtools.parallel.toolkit import device, rank, report_progress, world_size


@dataclass(frozen=True)
class Hello:
    """What a rank of hello() saw."""
    sum: float    # 0 + 1 + … + (N − 1), all-reduced
    pid: int      # the rank's process
    threads: int  # torch's intra-op threads in the rank


def hello() -> Hello:
    """All-reduce each rank's number: every rank gets 0 + 1 + … + (N − 1)."""
    t = torch.tensor([float(rank())], device=device())
    dist.all_reduce(t)
    return Hello(sum=t.item(), pid=os.getpid(), threads=torch.get_num_threads())


@dataclass(frozen=True)
class Fault:
    rank: int = 1          # the rank that misbehaves
    sleep_s: float = 600   # how long the others (or the slow one) sleep
    steps: int = 10
    step_s: float = 1.0
    code: int = 3          # exits(): the code it exits with


@dataclass(frozen=True)
class Sum:
    """The all-reduce of a one from every rank: N."""
    sum: float


@dataclass(frozen=True)
class Rank:
    """Which rank returned."""
    rank: int


@dataclass(frozen=True)
class World:
    """The world size a rank saw."""
    world_size: int


@dataclass(frozen=True)
class Nothing:
    """No result: the function checks how a run ends."""


def fail_on(cfg: Fault) -> Sum:
    """Rank cfg.rank raises before a collective the others then wait in."""
    if rank() == cfg.rank:
        raise ValueError(f"deliberate failure on rank {rank()}")
    t = torch.ones(1, device=device())
    dist.all_reduce(t)
    return Sum(t.item())


def exits(cfg: Fault) -> Sum:
    """Rank cfg.rank leaves by os._exit(cfg.code) (no Python error, no result) while the others wait in a
    collective; with code 0 the others do not wait, and every process exits 0 with one result missing."""
    if rank() == cfg.rank:
        time.sleep(0.3)
        os._exit(cfg.code)
    if cfg.code == 0:
        return Sum(0.0)
    t = torch.ones(1, device=device())
    dist.all_reduce(t)
    return Sum(t.item())


def aborts(cfg: Fault) -> Sum:
    """Rank cfg.rank aborts itself (SIGABRT, as a C++ library does on a fatal error) while the others wait."""
    if rank() == cfg.rank:
        time.sleep(0.3)
        os.abort()
    t = torch.ones(1, device=device())
    dist.all_reduce(t)
    return Sum(t.item())


def killed(cfg: Fault) -> Sum:
    """Rank cfg.rank is killed by SIGKILL (as by the OOM killer) while the others wait in a collective."""
    if rank() == cfg.rank:
        time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGKILL)
    t = torch.ones(1, device=device())
    dist.all_reduce(t)
    return Sum(t.item())


@dataclass(frozen=True)
class Child:
    """The process a rank started."""
    pid: int


def starts_a_process(cfg: Fault) -> Child:
    """Every rank starts a process that outlives it by cfg.sleep_s (a learner's subprocess, say) and returns; rank
    cfg.rank then hangs for as long, if cfg.steps is 0 (so the run times out)."""
    child = subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({cfg.sleep_s})"])
    if cfg.steps == 0 and rank() == cfg.rank:
        time.sleep(cfg.sleep_s)
    return Child(child.pid)


def one_sided(cfg: Fault) -> Nothing:
    """Only rank 0 enters the all-reduce: without a timeout it would wait forever."""
    if rank() == 0:
        dist.all_reduce(torch.ones(1, device=device()))
    else:
        time.sleep(cfg.sleep_s)
    return Nothing()


def finish_apart(cfg: Fault) -> Rank:
    """Rank cfg.rank returns cfg.sleep_s later than the others (longer than a short collective timeout)."""
    if rank() == cfg.rank:
        time.sleep(cfg.sleep_s)
    return Rank(rank())


def slow(cfg: Fault) -> World:
    """Sleep cfg.steps × cfg.step_s, reporting progress from rank 0."""
    for i in range(cfg.steps):
        time.sleep(cfg.step_s)
        report_progress(i + 1, cfg.steps, "sleeping")
    return World(world_size())


@dataclass(frozen=True)
class GradNorm:
    """The gradient's norm after one DDP backward."""
    grad_norm: float


def ddp_tiny() -> GradNorm:
    """Wrap a small model in DDP and take one step: the teardown that used to abort at exit."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 1)).to(device()))
    x = torch.randn(8, 32, device=device())
    model(x).pow(2).mean().backward()
    return GradNorm(float(torch.linalg.vector_norm(torch.cat([p.grad.flatten() for p in model.parameters()]))))


@dataclass(frozen=True)
class Sizes:
    sizes: tuple[int, ...] = (1, 7, 64, 1001)


@dataclass(frozen=True)
class RingCheck:
    """The written-out ring against dist.all_reduce on one tensor."""
    max_diff: float  # max |ring − dist.all_reduce|
    sent: int        # bytes this rank sent


@dataclass(frozen=True)
class RingParity:
    """One rank's checks, by tensor size (elements)."""
    by_size: dict[int, RingCheck]


def ring_parity(cfg: Sizes) -> RingParity:
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
        out[n] = RingCheck(max_diff=(ours - theirs).abs().max().item(), sent=sent)
    return RingParity(out)
