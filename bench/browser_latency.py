"""How fast each control panel answers in a real browser: from the input event to the figure's update.

    $ .venv/bin/python bench/browser_latency.py                 # every lesson, smoke profile
    $ .venv/bin/python bench/browser_latency.py 02 06 --moves 9

Starts JupyterLab (127.0.0.1, a token) and a headless Chromium, runs each lesson's notebook, then moves the
first control of every panel back and forth `--moves` times. The clock runs in the browser, from the input
event to the moment the figure's traces change (and, for panels that train, to the first progress bar).
A formula panel (no training behind it) is held to a median of at most 100 ms; a panel that trains must show
progress within 1 s — a move back to a setting already run answers from its cache like a formula panel.
Results go to build/browser_latency.json. A benchmark, not a test: this machine's noise is reported, not judged.
"""

import argparse
import json
import os
import secrets
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from jupyter_browser import (Browser, JupyterLab, close_notebook, leftovers, move_and_watch,  # noqa: E402
                             open_notebook, panels, run_all, smoke_copy)

FORMULA_MS, PROGRESS_MS = 100, 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("lessons", nargs="*", help="lesson numbers or names (default: all)")
    ap.add_argument("--moves", type=int, default=5, help="moves per panel (alternating up and down)")
    ap.add_argument("--profile", default="smoke")
    args = ap.parse_args()
    if args.moves < 1:
        ap.error("--moves must be at least 1")
    notebooks = sorted((ROOT / "notebooks").glob("*.ipynb"))
    if args.lessons:
        notebooks = [p for p in notebooks if any(p.stem.startswith(a) for a in args.lessons)]
        if not notebooks:
            ap.error(f"no lesson matches {args.lessons}")

    rows = []
    marker = secrets.token_hex(8)
    root = Path(tempfile.mkdtemp(prefix="lab-latency-"))
    try:
        for p in notebooks:
            smoke_copy(p, root / p.name, args.profile)
        env = {k: v for k, v in os.environ.items() if k != "LABTOOLS_STATIC"}  # the live panels, not static ones
        with JupyterLab(root, marker, env=env) as lab, Browser(marker) as browser:
            page = browser.new_page()
            for p in notebooks:
                try:
                    open_notebook(page, lab, p.name)
                    run = run_all(page, lab, p.name, timeout=900)
                    print(f"{p.stem}: Run All {run['seconds']:.0f} s", flush=True)
                    for panel in panels(page):
                        moves = [move_and_watch(page, panel, timeout=300, step=1 if i % 2 == 0 else -1)
                                 for i in range(args.moves)]
                        rows.append(summarise(p.stem, moves))
                        print(format_row(rows[-1]), flush=True)
                finally:
                    close_notebook(page, lab, p.name)
    finally:
        shutil.rmtree(root, ignore_errors=True)
        left = leftovers(marker)
        if left:
            print("left behind:", left, file=sys.stderr)
    out = ROOT / "build" / "browser_latency.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(rows, indent=1))
    print(f"\n{len(rows)} panels; {sum(r['meets_target'] for r in rows)} meet their target; written to {out}")


def summarise(lesson: str, moves: list[dict]) -> dict:
    changed = [m["changed_ms"] for m in moves if m["changed_ms"] is not None]
    trained = [m for m in moves if m["progress_ms"] is not None]
    kind = "training" if trained else "formula"
    row = {"lesson": lesson, "panel": moves[0]["title"], "kind": kind, "moves": moves,
           "median_ms": statistics.median(changed) if changed else None,
           "first_progress_ms": trained[0]["progress_ms"] if trained else None,
           "failures": [m["error"] or f"no change after {m['action']}" for m in moves if m["changed_ms"] is None]}
    if kind == "formula":
        row["meets_target"] = not row["failures"] and row["median_ms"] <= FORMULA_MS
    else:
        row["meets_target"] = not row["failures"] and row["first_progress_ms"] <= PROGRESS_MS
    return row


def format_row(r: dict) -> str:
    target = f"median ≤ {FORMULA_MS} ms" if r["kind"] == "formula" else f"progress ≤ {PROGRESS_MS} ms"
    got = (f"median {r['median_ms']:.0f} ms" if r["median_ms"] is not None else "never changed")
    if r["kind"] == "training":
        got += f", first progress bar after {r['first_progress_ms']:.0f} ms"
    return f"  {r['panel'][:60]:<60} {r['kind']:<8} {got:<50} {target}: {'yes' if r['meets_target'] else 'NO'}" + (
        f"  ({'; '.join(r['failures'])})" if r["failures"] else "")


if __name__ == "__main__":
    main()
