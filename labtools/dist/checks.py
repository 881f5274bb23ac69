"""Small rank functions for checking a launcher and a machine: launch("labtools.dist.checks:hello", 2).

They also serve the tests: a rank that raises, a collective only some ranks reach, a run that outlasts
its timeout.
"""

import os
import time

import torch
import torch.distributed as dist

from labtools.dist import device, rank, report_progress, world_size


def hello(config: dict) -> dict:
    """All-reduce each rank's number: every rank gets 0 + 1 + … + (N − 1)."""
    t = torch.tensor([float(rank())], device=device())
    dist.all_reduce(t)
    return {"sum": t.item(), "pid": os.getpid(), "threads": torch.get_num_threads()}


def fail_on(config: dict) -> dict:
    """Rank config['rank'] raises before a collective the others then wait in."""
    if rank() == config.get("rank", 1):
        raise ValueError(f"deliberate failure on rank {rank()}")
    t = torch.ones(1, device=device())
    dist.all_reduce(t)
    return {"sum": t.item()}


def one_sided(config: dict) -> dict:
    """Only rank 0 enters the all-reduce: without a timeout it would wait forever."""
    if rank() == 0:
        dist.all_reduce(torch.ones(1, device=device()))
    else:
        time.sleep(config.get("sleep_s", 600))
    return {}


def slow(config: dict) -> dict:
    """Sleep, reporting progress from rank 0."""
    n = config.get("steps", 10)
    for i in range(n):
        time.sleep(config.get("step_s", 1.0))
        report_progress(i + 1, n, "sleeping")
    return {"world_size": world_size()}


def ddp_tiny(config: dict) -> dict:
    """Wrap a small model in DDP and take one step: the teardown that used to abort at exit."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 1)).to(device()))
    x = torch.randn(8, 32, device=device())
    model(x).pow(2).mean().backward()
    return {"grad_norm": float(torch.linalg.vector_norm(torch.cat([p.grad.flatten() for p in model.parameters()])))}


def ring_parity(config: dict) -> dict:
    """labtools.dist.comm.ring_all_reduce against dist.all_reduce on tensors of several sizes (some not
    divisible by the world size): max difference and bytes sent per size."""
    from labtools.dist.comm import ring_all_reduce
    out = {}
    for n in config.get("sizes", [1, 7, 64, 1001]):
        g = torch.Generator().manual_seed(rank() * 1000 + n)
        t = torch.randn(n, generator=g).to(device())
        ours, theirs = t.clone(), t.clone()
        sent = ring_all_reduce(ours)
        dist.all_reduce(theirs)
        out[str(n)] = {"max_diff": (ours - theirs).abs().max().item(), "sent": sent}
    return out
