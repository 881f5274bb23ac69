"""Real multi-process runs: a launcher (from Python or a notebook cell, as torchrun does) and a toolkit for ranks.

Launching (the notebook's process):
    launcher.py    launch(fn, nprocs, config) -> each rank's dict, in rank order
    targets.py     which functions a job may name (a job file is code): the lab's packages, or allowed ones
    codec.py       a rank function's config dataclass to JSON and back, validated again in the rank
    processes.py   the run's processes: alive and ours, stopped, and the teardown after a good run
    diagnose.py    the results, or the root cause of a failure, named by rank (and signal): RankFailed
    supervise.py   ties the run to the launching process, so no run outlives it
    local.py       starts one machine's ranks as torchrun would, without its agent (torchrun runs restarts)
    __main__.py    the same worker on many nodes: make-job / collect
Inside a rank:
    worker.py      one rank: process group, config rebuilt as its dataclass, result or error written
    toolkit.py     rank(), world_size(), device(), report_progress(); the lab GPT and its data on this rank,
                   this rank's rows, a mean over ranks, one training step for a plain/DDP/FSDP model
    comm.py        the ring all-reduce written out; counters of collectives, DDP buckets and wire bytes
    mesh.py        a device mesh for dp × tp (× pp) over the ranks of a launch
    pipeline.py    the lab GPT in pipeline stages: GPipe and 1F1B written out, PyTorch's schedules, timed
    tensor.py      tensor and sequence parallelism: Megatron's split written out, then with DTensor
    experts.py     expert parallelism: a mixture of experts' tokens to their experts' ranks and back
    nd.py          one GPT on a mesh of dp × fsdp × tp × pp × cp (or dp × ep) ranks, held to one process's run
    checks.py      small rank functions that check a machine and the launcher

The names below are imported on first use, so `python -m labtools.parallel.supervise` starts without torch.
Introduced in notebooks/07_data_parallel.ipynb.
"""

import importlib

_EXPORTS = {
    "labtools.parallel.launcher": ("choose_backend", "launch"),
    "labtools.parallel.diagnose": ("RankFailed", "RunTimedOut"),
    "labtools.parallel.toolkit": ("accumulate", "build_gpt", "device", "global_batch", "mean_over_ranks", "rank",
                                  "rank_rows", "report_progress", "train_step", "world_size"),
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'labtools.parallel' has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
