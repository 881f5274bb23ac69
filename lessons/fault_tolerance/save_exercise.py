"""Lesson 11, your turn: an atomic save, checked by SIGKILLing a process that runs it over and over and reading
what the kill left behind: the file must always hold one whole version, the old one or the new one.

The learner's function is sent to the saving child as source (labtools.learner.source_of) and rebuilt there."""

import inspect
import os
import random
import re
import signal
import tempfile
import time
from pathlib import Path

from labtools.exercises import NOT_WRITTEN, Outcome, attempt, failed, outcome
from labtools.learner import bound_for, is_stub, load_function, source_of

HEADER = 16  # bytes: b"v" + the version number, zero-padded; the rest of a version is its number's byte, repeated
HINT = ("write the bytes to a temporary file in the same directory, flush and fsync it, then os.replace it over the "
        "target: a rename is atomic, so a reader sees the old file or the new one, never half of one")


def reference(path, data):
    """Write `data` to `path` so that a crash at any moment leaves the old file or the new one, whole."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-")  # same directory: same filesystem, so rename works
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())  # the bytes are on disk before any name points at them
        os.replace(tmp, path)     # atomic: the name now points at the whole new file
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)          # the rename itself survives a power cut
    finally:
        os.close(dir_fd)


def version(v: int, size: int) -> bytes:
    return f"v{v:0{HEADER - 1}d}".encode() + bytes([v % 251]) * size


def whole(data: bytes, size: int) -> int | None:
    """The version a file's bytes are, if they are one whole version; else None."""
    if len(data) != HEADER + size or not re.fullmatch(rb"v\d+", data[:HEADER]):
        return None
    v = int(data[1:HEADER])
    return v if data[HEADER:] == bytes([v % 251]) * size else None


def save_loop(source: str, name: str, path: str, size: int) -> None:
    """Run in a child: save version 1, 2, … with the learner's function until killed; after each save, publish its
    number (atomically, the lab's way) for the parent."""
    fn = load_function(source, name, {"os": os, "tempfile": tempfile, "Path": Path})
    done = Path(path).parent / "saved-version"
    v = 0
    while True:
        v += 1
        fn(path, version(v, size))
        tmp = done.with_suffix(".tmp")
        tmp.write_text(str(v))
        os.replace(tmp, done)


def _kill_one(fn, directory: Path, size: int, when: str, rng: random.Random) -> dict:
    """Start a saving child, wait for its first whole save, SIGKILL it (mid-save or at a random moment), and read
    the target."""
    directory.mkdir(parents=True, exist_ok=True)
    target, done = directory / "checkpoint.bin", directory / "saved-version"
    from lessons.fault_tolerance.crashes import context  # the lesson's forkserver: torch imported once
    proc = context().Process(target=save_loop, args=(source_of(fn), fn.__name__, str(target), size), daemon=True)
    proc.start()
    try:
        deadline = time.monotonic() + 30
        while not done.exists():
            if not proc.is_alive():
                return {"error": f"the saving process stopped (exit code {proc.exitcode}) before its first save "
                                 "finished: run your function once in a cell to see why"}
            if time.monotonic() > deadline:
                return {"error": "no save finished within 30 s"}
            time.sleep(0.0005)
        if when == "mid-save":  # the moment a save is under way: the target shrinks, or a new file appears
            others = lambda: [p for p in directory.iterdir() if p.name not in (target.name, done.name,  # noqa: E731
                                                                                  done.with_suffix(".tmp").name)]
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and proc.is_alive():
                try:
                    if target.stat().st_size != HEADER + size or others():
                        break
                except FileNotFoundError:
                    break
                time.sleep(0.0002)
        else:
            time.sleep(rng.uniform(0.0, 0.05))
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.join(timeout=10)
        if proc.is_alive():
            proc.kill()
            proc.join()
    if not target.exists():
        return {"left": "no file at all"}
    data = target.read_bytes()
    v = whole(data, size)
    return {"left": f"version {v}, whole" if v else f"{len(data):,} bytes that are no whole version", "whole": v}


def check_save(fn, workdir, size: int = 4 * 2**20, kills: int = 6, seed: int = 0) -> Outcome:
    """Your save, first run here (the file must hold what was saved), then SIGKILLed `kills` times in a child that
    saves `size`-byte versions over and over: half the kills the moment a save is under way, half at random."""
    if is_stub(fn):  # said before any work: the reference's save below writes to workdir
        return Outcome("not written", NOT_WRITTEN)
    try:
        source_of(fn)
    except ValueError as e:
        return Outcome("fail", str(e))
    base = Path(workdir) / "exercise"
    base.mkdir(parents=True, exist_ok=True)
    target = base / "first.bin"
    results = []
    start = time.perf_counter()
    reference(str(base / "reference.bin"), b"the second, longer version")
    bound = bound_for(time.perf_counter() - start)
    for data in (b"the first version", b"the second, longer version"):
        tried = attempt(fn, str(target), data, case="saving here", hint=HINT, seconds=bound)
        if not tried.returned:
            return tried.outcome
        try:
            held = target.read_bytes()
        except OSError as e:  # no file where it was to be
            return failed("saving here", f"after saving {data!r} the file cannot be read: {type(e).__name__}: {e}",
                          HINT)
        if held != data:
            return failed("saving here", f"after saving {data!r} the file holds {held[:40]!r}", HINT)
    results.append({"case": "saving here", "difference": 0.0})
    rng = random.Random(seed)
    for k in range(kills):
        when = "mid-save" if k % 2 == 0 else "random"
        r = _kill_one(fn, base / f"kill-{k}", size, when, rng)
        moment = "the moment a save was under way" if when == "mid-save" else "at a random moment"
        name = f"SIGKILL {k + 1} of {kills} ({moment})"
        if "error" in r:
            return outcome(results + [{"case": name, "error": r["error"]}], tol=0.0, what="", reference="")
        if not r.get("whole"):
            return outcome(results + [{"case": name, "error": f"the kill left {r['left']}", "hint": HINT}], tol=0.0,
                           what="", reference="")
        results.append({"case": name, "difference": 0.0})
    return Outcome("pass", f"your save wrote what it was given, and survived {kills} SIGKILLs, half of them mid-save: "
                           "every kill left one whole version, the old or the new", 0.0)


def solution_source() -> str:
    """The reference as the learner's cell would hold it."""
    return inspect.getsource(reference).replace("def reference(", "def my_atomic_save(")
