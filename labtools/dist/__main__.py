"""Run a lesson's rank function with torchrun yourself: on many GPUs, or on many nodes.

    $ python -m labtools.dist make-job lessons.data_parallel:equivalence '{"n_layer": 2, ...}' --run-dir RUN
    $ torchrun --nnodes 2 --nproc-per-node 8 --node-rank 0 --rdzv-backend c10d --rdzv-endpoint HOST:29500 \\
          -m labtools.dist.worker RUN/job.json          # and --node-rank 1 on the second node
    $ python -m labtools.dist collect RUN               # each rank's result, in rank order

RUN must be visible to every node (a shared filesystem), or collect on each node what its ranks wrote.
"""

import argparse
import json
import sys
from pathlib import Path

from labtools.dist import _check_target, choose_backend


def make_job(target: str, config: dict, run_dir: Path, backend: str, collective_timeout_s: float) -> Path:
    _check_target(target)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "pids").mkdir(exist_ok=True)
    job = run_dir / "job.json"
    job.write_text(json.dumps({"target": target, "config": config, "backend": backend,
                               "collective_timeout_s": collective_timeout_s, "run_dir": str(run_dir.resolve())}))
    return job


def collect(run_dir: Path) -> list[dict]:
    errors = sorted(run_dir.glob("rank*.error.json"))
    if errors:
        first = min((json.loads(e.read_text()) for e in errors), key=lambda e: e["time"])
        raise SystemExit(f"rank {first['rank']} failed: {first['error']}\n{first['traceback']}")
    files = sorted(run_dir.glob("rank*.json"), key=lambda f: int(f.stem[4:]))
    return [json.loads(f.read_text()) for f in files]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m labtools.dist", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    mk = sub.add_parser("make-job", help="write RUN/job.json for labtools.dist.worker")
    mk.add_argument("target", help="package.module:function")
    mk.add_argument("config", nargs="?", default="{}", help="the function's config, as JSON")
    mk.add_argument("--run-dir", type=Path, required=True)
    mk.add_argument("--backend", default="nccl", choices=("gloo", "nccl"))
    mk.add_argument("--collective-timeout-s", type=float, default=300.0)
    co = sub.add_parser("collect", help="print the ranks' results as JSON, in rank order")
    co.add_argument("run_dir", type=Path)
    args = ap.parse_args(argv)
    if args.command == "make-job":
        try:
            config = json.loads(args.config)
        except json.JSONDecodeError as e:
            ap.error(f"config must be JSON: {e}")
        print(make_job(args.target, config, args.run_dir, args.backend, args.collective_timeout_s))
    else:
        print(json.dumps(collect(args.run_dir), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
