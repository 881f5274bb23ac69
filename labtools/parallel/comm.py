"""Communication, written out and counted.

ring_all_reduce: the ring algorithm, from scratch, for learning (dist.all_reduce is what DDP uses).
Each rank's tensor is cut into N chunks. Reduce-scatter: N − 1 steps, each rank sends one chunk to its
right neighbour and adds the chunk arriving from its left; after them rank r owns the full sum of chunk
(r + 1) mod N. All-gather: N − 1 more steps pass the finished chunks around the ring. Each rank sends
2(N − 1) chunks of M/N elements: 2(N − 1)/N · M bytes, whatever N (labtools.plan.collective_bytes) — which
is why the ring is bandwidth-optimal. Checked against dist.all_reduce in tests/test_dist_comm.py.

DDPCommCounter: a DDP communication hook that counts the buckets all-reduced and their bytes, then does
the default all-reduce. CollectiveCounter: counts calls and input bytes of torch.distributed collectives
(all_reduce, all-gathers, reduce-scatters, …) made inside a `with` block.
Introduced in notebooks/07_data_parallel.ipynb.
"""

import inspect

import torch
import torch.distributed as dist


def ring_steps(n: int, r: int) -> list[tuple[str, int, int]]:
    """Rank r's 2(n − 1) steps of the ring all-reduce, (phase, chunk sent right, chunk received from the left):
    "reduce" adds the incoming chunk, "gather" copies it. The real ring below and lesson 07's pictures use this."""
    return ([("reduce", (r - s) % n, (r - s - 1) % n) for s in range(n - 1)]
            + [("gather", (r + 1 - s) % n, (r - s) % n) for s in range(n - 1)])


def ring_all_reduce(t: torch.Tensor) -> int:
    """Sum t over all ranks in place with the ring algorithm; return the bytes this rank sent."""
    n, r = dist.get_world_size(), dist.get_rank()
    if n == 1:
        return 0
    chunks = list(t.view(-1).tensor_split(n))  # views into t: updates land in place
    right, left = (r + 1) % n, (r - 1) % n
    sent = 0
    for phase, send_idx, recv_idx in ring_steps(n, r):  # reduce-scatter, then all-gather
        incoming = torch.empty_like(chunks[recv_idx])
        reqs = [dist.isend(chunks[send_idx].contiguous(), right), dist.irecv(incoming, left)]
        for q in reqs:
            q.wait()
        if phase == "reduce":
            chunks[recv_idx].add_(incoming)  # after n − 1 of these rank r holds the full sum of chunk (r + 1) % n
        else:
            chunks[recv_idx].copy_(incoming)
        sent += chunks[send_idx].numel() * t.element_size()
    return sent


class DDPCommCounter:
    """DDP communication hook: count each bucket (calls and bytes), then all-reduce it as DDP would.

        counter = DDPCommCounter(); model.register_comm_hook(None, counter.hook)
    """

    def __init__(self):
        self.calls = 0
        self.bytes = 0
        self.bucket_bytes: list[int] = []

    def reset(self) -> None:
        self.calls, self.bytes, self.bucket_bytes = 0, 0, []

    def hook(self, state, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
        buf = bucket.buffer()
        self.calls += 1
        self.bytes += buf.numel() * buf.element_size()
        self.bucket_bytes.append(buf.numel() * buf.element_size())
        return allreduce_hook(state, bucket)


class CollectiveCounter:
    """Count calls and bytes (of the input on this rank) of torch.distributed collectives inside `with`, and keep
    them in the order they were called (self.events: (name, bytes), with mark()'s labels in between).

    It wraps the functions in the torch.distributed module, so code that looks them up there at call
    time (DDP, FSDP) is counted; calls made from C++ directly are not.
    """

    NAMES = ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor", "all_gather_single",
             "reduce_scatter_single", "all_gather", "broadcast", "all_to_all_single")
    INPUTS = ("input_tensor", "input", "tensor")  # the argument holding this rank's contribution

    def __init__(self):
        self.calls: dict[str, int] = {}
        self.bytes: dict[str, int] = {}
        self.events: list[tuple[str, int]] = []
        self._saved = {}

    def mark(self, label: str) -> None:
        """A point in the sequence of events, e.g. "backward": the collectives after it were called after it."""
        self.events.append((label, 0))

    def _wrap(self, name, fn):
        signature = inspect.signature(fn)

        def counted(*args, **kwargs):
            bound = signature.bind_partial(*args, **kwargs).arguments  # callers pass positions or keywords
            src = next(bound[k] for k in self.INPUTS if torch.is_tensor(bound.get(k)))
            self.calls[name] = self.calls.get(name, 0) + 1
            self.bytes[name] = self.bytes.get(name, 0) + src.numel() * src.element_size()
            self.events.append((name, src.numel() * src.element_size()))
            return fn(*args, **kwargs)
        return counted

    def __enter__(self):
        for name in self.NAMES:
            fn = getattr(dist, name, None)
            if fn is not None:
                self._saved[name] = fn
                setattr(dist, name, self._wrap(name, fn))
        return self

    def __exit__(self, *exc):
        for name, fn in self._saved.items():
            setattr(dist, name, fn)
        self._saved = {}
        return False


LOOPBACK_TX = "/sys/class/net/lo/statistics/tx_bytes"


def loopback_bytes() -> int | None:
    """Bytes sent through the loopback interface since boot (Linux), or None where there is no such counter."""
    try:
        with open(LOOPBACK_TX) as f:
            return int(f.read())
    except OSError:
        return None


class WireBytes:
    """Bytes that crossed the loopback interface during a `with` block: what ranks on one machine really sent
    each other (gloo's traffic on the wire), TCP/IP and gloo headers and any other local traffic included.
    Call it on every rank of a group: it brackets the block with barriers and reads the counter on one side.
    .bytes is None where the counter does not exist (not Linux) and under NCCL (GPU links). Use it for gloo ranks
    on one machine: across machines the traffic leaves through another interface and this reads too little."""

    def __init__(self):
        self.bytes: int | None = None

    def __enter__(self):
        dist.barrier()
        # NCCL moves data over NVLink/PCIe/InfiniBand, not the loopback interface: nothing to read there
        self._start = loopback_bytes() if dist.get_backend() == "gloo" else None
        dist.barrier()  # no rank starts sending before every rank has read the counter (a few bytes of barrier)
        return self

    def __exit__(self, *exc):
        dist.barrier()
        end = loopback_bytes()
        if self._start is not None and end is not None:
            self.bytes = end - self._start
        return False
