"""Run a lesson's rank function with torchrun yourself: on many GPUs, or on many nodes.

    $ python -m labtools.parallel make-job lessons.ranks.data_parallel:equivalence '{"n_layer": 2}' --run-dir RUN
    $ torchrun --nnodes 2 --nproc-per-node 8 --node-rank 0 --rdzv-backend c10d --rdzv-endpoint HOST:29500 \\
          -m labtools.parallel.worker RUN/job.json          # and --node-rank 1 on the second node
    $ python -m labtools.parallel collect RUN               # each rank's result, in rank order

The config JSON fills the fields of the dataclass the function is annotated with (others keep their defaults).
RUN must be new or empty (--force clears it) and visible to every node (a shared filesystem). A job file is
code: keep a shared RUN writable only by you; targets outside the lab's packages need LABTOOLS_ALLOW_TARGETS.
"""

import argparse
import json
import shutil
import sys
from pathlib import Path

from labtools.parallel.codec import config_type, decode_config, encode_config
from labtools.parallel.diagnose import diagnose, read_results
from labtools.parallel.launcher import write_job
from labtools.parallel.targets import resolve_target


def make_job(target: str, config: dict, run_dir: Path, backend: str, collective_timeout_s: float,
             force: bool = False) -> Path:
    _, fn = resolve_target(target)
    cls = config_type(fn)
    data = encode_config(fn, None if cls is None else decode_config(cls, config))  # validated here, not on the nodes
    if run_dir.exists() and any(run_dir.iterdir()):
        if not force:
            raise ValueError(f"run directory {run_dir} is not empty: a new run needs its own (or pass --force to "
                             "clear it), so results of two runs can never mix")
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "pids").mkdir()
    return write_job(run_dir, target, data, backend, collective_timeout_s)


def collect(run_dir: Path) -> list[dict]:
    """The results of the run whose job.json is in run_dir; a rank's failure raises."""
    job = json.loads((run_dir / "job.json").read_text())
    errors = [e for e in run_dir.glob("rank*.error.json") if json.loads(e.read_text()).get("run_id") == job["run_id"]]
    if errors:
        failure = diagnose(run_dir, 0, 1)
        raise SystemExit(str(failure))
    return read_results(run_dir)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m labtools.parallel", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    mk = sub.add_parser("make-job", help="write RUN/job.json for labtools.parallel.worker")
    mk.add_argument("target", help="package.module:function")
    mk.add_argument("config", nargs="?", default="{}", help="the function's config fields, as JSON")
    mk.add_argument("--run-dir", type=Path, required=True)
    mk.add_argument("--backend", default="nccl", choices=("gloo", "nccl"))
    mk.add_argument("--collective-timeout-s", type=float, default=300.0)
    mk.add_argument("--force", action="store_true", help="clear a non-empty run directory")
    co = sub.add_parser("collect", help="print the ranks' results as JSON, in rank order")
    co.add_argument("run_dir", type=Path)
    args = ap.parse_args(argv)
    if args.command == "make-job":
        try:
            config = json.loads(args.config)
        except json.JSONDecodeError as e:
            ap.error(f"config must be JSON: {e}")
        if not isinstance(config, dict):
            ap.error("config must be a JSON object of field: value")
        try:
            print(make_job(args.target, config, args.run_dir, args.backend, args.collective_timeout_s, args.force))
        except (ValueError, TypeError) as e:
            ap.error(str(e))
    else:
        try:
            print(json.dumps(collect(args.run_dir), indent=2))
        except (OSError, RuntimeError) as e:
            raise SystemExit(f"collect: {e}") from e
    return 0


if __name__ == "__main__":
    sys.exit(main())
