"""Real multi-process runs: a launcher (torchrun from Python or a notebook cell) and a toolkit for ranks.

    launcher.py    launch(fn, nprocs, config) -> each rank's dict; failures named by rank (and signal)
    supervise.py   ties torchrun to the launching process, so no run outlives it
    worker.py      one rank: process group, config rebuilt as its dataclass, result or error written
    toolkit.py     inside a rank: rank(), world_size(), device(), report_progress(); the lab GPT, its data,
                   this rank's rows, a mean over ranks, one training step for a plain/DDP/FSDP model
    comm.py        the ring all-reduce written out; counters of collectives and DDP buckets
    checks.py      small rank functions that check a machine and the launcher
    __main__.py    the same worker on many nodes: make-job / collect

The names below are imported on first use, so `python -m labtools.dist.supervise` starts without torch.
Introduced in notebooks/07_data_parallel.ipynb.
"""

import importlib

_EXPORTS = {
    "labtools.dist.launcher": ("RankFailed", "choose_backend", "launch"),
    "labtools.dist.toolkit": ("GPTJob", "accumulate", "build_gpt", "device", "global_batch", "mean_over_ranks", "rank",
                              "rank_rows", "report_progress", "train_step", "world_size"),
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'labtools.dist' has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
