"""Run a lesson's notebook as a plain Python program, without Jupyter, and keep what it measured as JSON.

This is how the lessons run where no Jupyter stack is installed (the GPU machines we test on have torch but no
Jupyter): every code cell runs in order in one namespace, with the parameters cell's PROFILE replaced, panels
drawn for their default values (nothing is shown), and the notebook's ledger written to
`<out>/<device>/<lesson>.json` beside the device, the date, the versions, the lesson's settings and each cell's
time. It needs torch, plotly, ipywidgets, anywidget and IPython, not JupyterLab, papermill or a browser.

    $ python -m labtools.headless 03_stability --profile gpu            # -> results/<device>/03_stability.json
    $ python -m labtools.headless all --profile gpu --timeout 300       # every lesson, one process each

To read a lesson, open it in JupyterLab (`make lab`) or render it (`make book`); this module keeps numbers only.
"""

import argparse
import dataclasses
import datetime
import json
import linecache
import os
import re
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
PROFILES = ("smoke", "cpu", "gpu", "auto")


def lessons() -> list[str]:
    """Every lesson's name (its notebook's stem), in course order."""
    return sorted(p.stem for p in NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))


def slug(name: str) -> str:
    """A folder name for a device: 'NVIDIA H100 80GB HBM3' -> 'nvidia-h100-80gb-hbm3'."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "device"


def code_cells(lesson: str) -> list[tuple[str, bool]]:
    """(source, is_parameters_cell) for each code cell of the lesson's notebook."""
    path = NOTEBOOKS / f"{lesson}.ipynb"
    if not path.exists():
        raise ValueError(f"lesson must be one of {lessons()}, got {lesson!r}")
    cells = json.loads(path.read_text())["cells"]
    return [("".join(c["source"]), "parameters" in c.get("metadata", {}).get("tags", []))
            for c in cells if c["cell_type"] == "code"]


def _quiet_display():
    """Replace IPython's display and plotly's show with recorders: keep every ledger the notebook shows (its JSON
    payload), count the rest. Panels see no frontend (LABTOOLS_STATIC) and draw their default figure."""
    os.environ["LABTOOLS_STATIC"] = "1"
    import IPython.display
    import plotly.basedatatypes

    from labtools.claims import MIME

    seen = {"ledgers": [], "displayed": 0, "figures": 0}

    def display(*objs, **kwargs):
        for obj in objs:
            if isinstance(obj, dict) and MIME in obj:
                seen["ledgers"].append(obj[MIME])
            seen["displayed"] += 1

    def show(fig, *args, **kwargs):
        seen["figures"] += 1

    IPython.display.display = display
    plotly.basedatatypes.BaseFigure.show = show
    return seen


def run_lesson(lesson: str, profile: str) -> dict:
    """Execute the lesson's code cells here, in this process, and return what it measured."""
    if profile not in PROFILES:
        raise ValueError(f"profile must be one of {PROFILES}, got {profile!r}")
    cells = code_cells(lesson)
    sys.path.insert(0, str(ROOT))
    os.chdir(NOTEBOOKS)  # where JupyterLab runs a notebook: lessons may read files beside it
    seen = _quiet_display()
    from labtools.device import report
    ns: dict = {"__name__": "__main__"}
    times, error, start = [], None, time.perf_counter()
    for i, (src, is_parameters) in enumerate(cells):
        name = f"<{lesson} cell {i}>"
        linecache.cache[name] = (len(src), None, src.splitlines(True), name)  # so tracebacks and inspect see it
        t0 = time.perf_counter()
        try:
            exec(compile(src, name, "exec"), ns)
            if is_parameters:
                ns["PROFILE"] = profile
        except Exception:
            error = {"cell": i, "traceback": traceback.format_exc(limit=8)}
        first = next((ln for ln in src.splitlines() if ln.strip() and not ln.startswith("#")), "")
        times.append({"cell": i, "seconds": round(time.perf_counter() - t0, 3), "code": first[:100]})
        print(f"[{lesson}] cell {i}: {times[-1]['seconds']:.1f} s  {first[:70]}", file=sys.stderr, flush=True)
        if error:
            break
    S = ns.get("S")
    return {
        "lesson": lesson,
        "profile": profile,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "environment": report(),
        "settings": dataclasses.asdict(S) if dataclasses.is_dataclass(S) else None,
        "seconds": round(time.perf_counter() - start, 2),
        "cells": times,
        "figures_drawn": seen["figures"],
        "ledger": seen["ledgers"][-1] if seen["ledgers"] else None,
        "error": error,
    }


def summary(result: dict) -> str:
    ledger = result.get("ledger") or {"claims": []}
    held = sum(c["passed"] for c in ledger["claims"])
    failed = [c["key"] for c in ledger["claims"] if not c["passed"]]
    state = "error in cell %d" % result["error"]["cell"] if result.get("error") else "ran"
    return (f"{result['lesson']:<28} {result.get('seconds', 0):7.1f} s  {state:<16} claims {held}/"
            f"{len(ledger['claims'])} hold" + (f"; failed: {', '.join(failed)}" if failed else ""))


def write(result: dict, out: Path) -> Path:
    name = result.get("environment", {}).get("device_name") or "unknown"
    path = out / slug(name) / f"{result['lesson']}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1, default=float) + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("lesson", nargs="+", help="a notebook's name (e.g. 03_stability), or 'all'")
    ap.add_argument("--profile", default="auto", choices=PROFILES)
    ap.add_argument("--out", type=Path, default=ROOT / "results", help="folder for <device>/<lesson>.json")
    ap.add_argument("--timeout", type=float, default=None, help="seconds per lesson (each runs in its own process)")
    ap.add_argument("--deadline", type=float, default=None,
                    help="seconds for the whole list: no lesson starts after it, none runs past it")
    args = ap.parse_args(argv)
    names = lessons() if args.lesson == ["all"] else args.lesson
    unknown = sorted(set(names) - set(lessons()))
    if unknown:
        ap.error(f"unknown lesson(s) {unknown}; valid: {lessons()} or 'all'")
    if len(names) == 1 and args.timeout is None:
        result = run_lesson(names[0], args.profile)
        print(f"wrote {write(result, args.out)}\n{summary(result)}")
        return 0 if result["error"] is None and (result["ledger"] or {}).get("claims") is not None else 1
    lines, rc, begin = [], 0, time.perf_counter()
    logs = args.out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    for name in names:  # one process per lesson: a fresh CUDA context, and a timeout that can end it
        timeout = args.timeout
        if args.deadline is not None:
            left = args.deadline - (time.perf_counter() - begin)
            if left < 5:
                lines.append(f"{name:<28}     -    not started (--deadline {args.deadline:g} s)")
                print(lines[-1], flush=True)
                rc = 1
                continue
            timeout = left if timeout is None else min(timeout, left)
        t0 = time.perf_counter()
        cmd = [sys.executable, "-m", "labtools.headless", name, "--profile", args.profile, "--out", str(args.out)]
        with open(logs / f"{name}.log", "w") as log:  # the cells' times and the lesson's own output, as it runs
            proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=log, text=True,
                                    start_new_session=True)  # its own group: a timeout ends the lesson and its ranks
            try:
                stdout, _ = proc.communicate(timeout=timeout)
                log.write(stdout)
                lines.append(stdout.strip().splitlines()[-1] if stdout.strip() else f"{name}: no output")
                rc |= proc.returncode
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()
                lines.append(f"{name:<28} {time.perf_counter() - t0:7.1f} s  timed out after {timeout:.0f} s")
                rc = 1
        print(lines[-1], flush=True)
    print("\n".join(["", "summary:"] + lines))
    return rc


if __name__ == "__main__":
    sys.exit(main())
