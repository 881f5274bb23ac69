"""Lesson 11, section 2: crashes during a save and corrupted files, against atomic, verified saves."""

import inspect
import multiprocessing
import os
import re
import shutil
import signal
import textwrap
import time
import warnings
from pathlib import Path

import numpy as np
import plotly.graph_objects as go
import torch

from labtools import checkpoint, plots
from labtools.claims import Findings, Ledger, approx, at_least, is_true
from lessons.fault_tolerance import MIN_KILLS, Settings, ranks


def context():
    """Children forked from a server that imported torch once: a killed saver restarts in milliseconds, and the
    notebook's own process (with its threads) is never forked."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["lessons.fault_tolerance.ranks", "lessons.fault_tolerance.save_exercise",
                                "lessons.fault_tolerance.save_training"])
    return ctx


def save_core() -> str:
    """The lines of the lab's checkpoint save that make it atomic (from the hidden directory to the verify), without
    its argument checks and pruning: the part section 2 teaches."""
    lines = inspect.getsource(checkpoint.save).splitlines()
    start = next((i for i, ln in enumerate(lines) if "final = directory" in ln), 0)
    end = next((i for i, ln in enumerate(lines) if ln.strip().startswith("verify(")), len(lines) - 1)
    return textwrap.dedent("\n".join(lines[start:end + 1]))


def save_seconds(numel: int, directory: Path, repeats: int = 3) -> float:
    """Median time of one checkpoint.save of a numel-float state here (write, fsync, hash, verify)."""
    state = {"w": torch.randn(numel)}
    times = []
    for i in range(repeats):
        t0 = time.perf_counter()
        checkpoint.save(directory, i, keep=1, model=state)
        times.append(time.perf_counter() - t0)
    shutil.rmtree(directory, ignore_errors=True)
    return float(np.median(times))


def _wait(condition, proc, timeout_s: float = 30.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if not proc.is_alive():
            raise RuntimeError(f"the saving child exited (code {proc.exitcode}) before {what}; its traceback is "
                               "above (from a script, run this under `if __name__ == '__main__':`, as "
                               "multiprocessing requires)")
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout_s} s for {what}")
        time.sleep(0.0005)


def kill_saver(directory: Path, numel: int, in_place: bool, delay_s: float | None) -> dict:
    """Start a child that saves over and over, wait for its first complete checkpoint, then SIGKILL it — after
    delay_s, or (delay_s=None) the moment a save is under way. Returns what the kill left behind."""
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / "checkpoint.pt"
    full = 0
    before = [] if in_place else checkpoint.checkpoints(directory)
    proc = context().Process(target=ranks.save_forever, args=(str(directory), numel, in_place), daemon=True)
    proc.start()
    try:
        if in_place:
            _wait(lambda: (directory / "saved").exists(), proc, what="the first in-place save")
            full = int((directory / "saved").read_text())  # the next save truncates the file and writes it again
        else:
            _wait(lambda: checkpoint.checkpoints(directory)[-1:] != before[-1:], proc, what="its first checkpoint")
        if delay_s is None:  # the moment a save is under way: a half-written file (in place) or an unfinished .tmp-
            if in_place:
                _wait(lambda: target.stat().st_size < full, proc, what="an in-place save to start")
            else:
                _wait(lambda: any(directory.glob(".tmp-step_*/state.pt")), proc, what="a save to start")
        else:
            time.sleep(delay_s)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.join(timeout=10)
        if proc.is_alive():
            proc.kill()
            proc.join()
    return {"exitcode": proc.exitcode, "bytes_expected": full,
            "bytes_on_disk": target.stat().st_size if in_place and target.exists() else None,
            "unfinished": len(list(directory.glob(".tmp-step_*"))) if not in_place else None}


def try_load(fn) -> tuple[bool, str]:
    """(loaded?, the message) of fn(); warnings raised while it runs are part of the message."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            result = fn()
            ok, msg = True, str(result)
        except Exception as e:  # noqa: BLE001 - the lesson shows whatever a load raises
            first = str(e).splitlines()[0][:160] if str(e).strip() else "(no message)"
            ok, msg = False, f"{type(e).__name__}: {first}"
    msg = re.sub(r"\x1b\[[0-9;]*m", "", msg)  # torch's messages carry terminal bold
    notes = [str(w.message) for w in caught]
    return ok, "; ".join(notes + [msg])


def corrupt(path: Path, how: str) -> None:
    """Damage a file the way disks and interrupted copies do: truncate it, or flip one byte in its middle."""
    data = bytearray(path.read_bytes())
    if how == "truncate":
        path.write_bytes(bytes(data[:len(data) // 2]))
    elif how == "flip":
        data[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(data))
    else:
        raise ValueError(f"how must be 'truncate' or 'flip', got {how!r}")


def run(S: Settings, workdir: Path) -> dict:
    numel = S.kill_mb * 2**20 // 4
    out = {"numel": numel, "save_s": save_seconds(numel, workdir / "timing")}
    # The tutorial recipe's in-place save, killed mid-write: its only checkpoint is gone.
    d = workdir / "in_place"
    out["in_place"] = kill_saver(d, numel, in_place=True, delay_s=None)
    out["in_place_load"] = try_load(lambda: torch.load(d / "checkpoint.pt", weights_only=True)["step"])
    # labtools.checkpoint, killed the same way: latest() skips the unfinished save.
    d = workdir / "atomic"
    out["atomic"] = kill_saver(d, numel, in_place=False, delay_s=None)
    out["atomic_load"] = try_load(lambda: checkpoint.load(checkpoint.latest(d))["step"])
    # Kills at random moments, each followed by latest() + load().
    rng = np.random.default_rng(S.seed)
    events = []
    d = workdir / "random"
    for i in range(S.kills):
        before = [p.name for p in checkpoint.checkpoints(d)] if d.exists() else []
        k = kill_saver(d, numel, in_place=False, delay_s=float(rng.uniform(0, 3 * out["save_s"])))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", checkpoint.CheckpointWarning)
            path = checkpoint.latest(d)
        ok, msg = try_load(lambda: checkpoint.load(path)["step"]) if path is not None else (False, "none")
        events.append({"kill": i, "unfinished_saves": k["unfinished"], "latest": path.name if path else None,
                       "loads": ok, "had": before[-1] if before else None})
        for left in d.glob(".tmp-step_*"):  # clear the debris so that the next kill's count is its own
            shutil.rmtree(left, ignore_errors=True)
    out["random"] = events
    # Corruption: a good checkpoint, then its state file truncated, or one byte flipped.
    d = workdir / "corrupt"
    for step in (1, 2):
        checkpoint.save(d, step, keep=2, model={"w": torch.randn(1000)})
    out["corrupt"] = {}
    for how in ("truncate", "flip"):
        good = d / checkpoint.name(2)
        bad = d / f"_{how}"
        shutil.copytree(good, bad)
        corrupt(bad / checkpoint.STATE, how)
        out["corrupt"][how] = try_load(lambda: checkpoint.load(bad))
        shutil.rmtree(bad)
    corrupt(d / checkpoint.name(2) / checkpoint.STATE, "flip")
    out["corrupt_latest"] = try_load(lambda: checkpoint.latest(d).name)
    return out


def _error_type(msg: str) -> str:
    """The exception's type from try_load's message ("Type: text", after any warnings)."""
    return msg.split("; ")[-1].split(":")[0]


def outcomes(c: dict) -> list[tuple[str, str, str, str]]:
    """(writer, what happened, on disk, what loading gave) per case, in plain words: the exception's type and what it
    means, never its raw text or a temporary path."""
    ip, ok = c["in_place"], c["in_place_load"][0]
    rows = [("in place (the tutorial recipe)", "SIGKILL while torch.save wrote the file",
             "no file" if ip["bytes_on_disk"] is None else
             f"{ip['bytes_on_disk'] / 2**20:.1f} of {ip['bytes_expected'] / 2**20:.1f} MB",
             "loaded: the kill missed the write" if ok else
             f"fails ({_error_type(c['in_place_load'][1])}): a half-written file is no checkpoint")]
    ok, msg = c["atomic_load"]
    rows.append(("the lab's checkpoint", "SIGKILL during a save", "an unfinished hidden directory",
                 f"loaded step {msg.split('; ')[-1]}: latest() skipped the unfinished save" if ok else
                 f"fails ({_error_type(msg)})"))
    for how, (ok, msg) in c["corrupt"].items():
        why = ("its size differs from the manifest's" if "the manifest says" in msg else
               "its sha256 differs from the manifest's" if "sha256" in msg else "it does not verify")
        rows.append(("the lab's checkpoint", "its file cut in half" if how == "truncate" else "one byte flipped",
                     "load() verifies before unpickling",
                     "loaded: the damage went unnoticed" if ok else f"refused ({_error_type(msg)}): {why}"))
    ok, msg = c["corrupt_latest"]
    before = msg.split("; ")[-1]
    rows.append(("the lab's checkpoint", "the newest checkpoint damaged", "latest() verifies each, newest first",
                 f"returned the one before it (step {int(before.split('_')[-1])})" if ok and before.startswith("step_")
                 else f"fails ({_error_type(msg)})"))
    return rows


def table(c: dict) -> go.Figure:
    return plots.table(["writer", "what happened", "on disk", "what loading it gave"], outcomes(c),
                       title="Killed mid-save, or damaged: what each checkpoint gave back", row_height=48)


def random_kills_figure(c: dict) -> go.Figure:
    ev = c["random"]
    fig = go.Figure(go.Bar(x=[e["kill"] for e in ev], y=[e["unfinished_saves"] for e in ev],
                           marker_color=[plots.color(2 if e["loads"] else 3) for e in ev],
                           hovertext=[f"latest: {e['latest']}" for e in ev], name="unfinished saves left"))
    return plots.style(fig, f"{len(ev)} SIGKILLs at random moments (green: latest() loaded)", "kill",
                       "unfinished saves it left", height=300)


def findings(ledger: Ledger, S: Settings, c: dict) -> Findings:
    ev = c["random"]
    mid = sum(e["unfinished_saves"] > 0 for e in ev)
    ledger.add("kill_mid_save", "A SIGKILL in the middle of a save: the tutorial recipe's in-place torch.save leaves "
               "no loadable checkpoint, the lab's atomic save leaves the previous one, which loads (measured)",
               not c["in_place_load"][0] and c["atomic_load"][0], is_true(), kind="measured")
    ledger.add("random_kills", f"{len(ev)} SIGKILLs at random moments: latest() loads after every one (measured)",
               sum(e["loads"] for e in ev), approx(len(ev), abs=0), kind="measured")
    if len(ev) >= MIN_KILLS:  # with fewer, none may land mid-save by chance
        ledger.add("random_mid_save", f"Some of the {len(ev)} random SIGKILLs did land mid-save (kills that left an "
                   "unfinished save)", mid, at_least(1), kind="measured", detail=True)
    refused = not any(ok for ok, _ in c["corrupt"].values())
    skipped = c["corrupt_latest"][0] and c["corrupt_latest"][1].endswith(checkpoint.name(1))
    ledger.add("corruption", "A truncated file and a flipped byte are both refused by the manifest's size and "
               "sha256 check before unpickling, and latest() skips a damaged newest checkpoint for the one before it (measured)",
               refused and skipped, is_true(), kind="measured")
    ledger.note("save_s", c["save_s"])
    kept = c["atomic_load"][0] and all(e["loads"] for e in ev)
    return Findings([
        ("Nothing, with an in-place save: killed mid-write, the tutorial recipe's only checkpoint no longer loaded."
         if not c["in_place_load"][0] else
         "With an in-place save, this time the file survived: the kill missed the write."),
        ("With the lab's atomic save, the previous checkpoint: after every kill `latest()` found one that loaded"
         if kept else "With the lab's atomic save, not always: some kill left nothing that loaded")
        + ("; a damaged file was refused before a byte of it was unpickled." if refused else "."),
    ], [
        f"A save of {c['numel'] * 4 / 2**20:.0f} MB took {c['save_s'] * 1e3:.0f} ms here: write, fsync, hash, read "
        "back and verify.",
        f"Of {len(ev)} kills at random moments, {mid} landed mid-save.",
    ])
