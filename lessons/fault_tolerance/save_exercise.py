"""Lesson 11, your turn: an atomic save, checked by SIGKILLing a process that runs it over and over and reading
what the kill left behind: the file must always hold one whole version, the old one or the new one. The kills land
right after each step of a save that touches the file (found by Python's audit events: opened for writing, removed,
renamed), so a save that rewrites the file in place, copies over it or removes it first fails every time, not only
when a random kill happens to land in its window.

The learner's function is sent to the saving child as source (labtools.learner.source_of) and rebuilt there."""

import inspect
import json
import os
import random
import re
import signal
import sys
import tempfile
import time
from pathlib import Path

from labtools.exercises import NOT_WRITTEN, Outcome, attempt, failed
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


# What a step of a save does to the target, as the audit events say it (sys.addaudithook), and what each tells
OPS = {"open": "opened it for writing", "os.remove": "removed it", "os.rename": "renamed a file onto it, or it "
       "away", "os.truncate": "truncated it", "shutil.copyfile": "started copying a file onto it"}
OP_HINTS = {"open": "your save rewrites the checkpoint itself: from the moment it is opened for writing until the "
            "write ends, a crash leaves part of a file. Write a temporary file and rename it over the target",
            "os.remove": "your save removes the old checkpoint before the new one is in place: a crash in between "
            "leaves none. os.replace puts the new file in the old one's place in one step"}
WRITING = os.O_WRONLY | os.O_RDWR | os.O_TRUNC | os.O_APPEND
FSYNC_HINT = ("a killed process loses nothing the operating system holds, so these kills cannot show it, but after "
              "a power cut the new name can point at bytes never written to disk: flush the file and os.fsync it, "
              "then rename")
UNWRITTEN_HINT = ("the new file took the checkpoint's name before its bytes were written: close (or flush) the "
                  "file before renaming it, or a kill leaves what is still in the buffer unwritten")
SMALL = 100  # bytes of a version in the kills right after a step: small enough to sit in a file's buffer


def _touches(event: str, args: tuple, target: str) -> bool:
    """Whether an audited operation writes, removes or renames the target file."""
    def same(a) -> bool:
        return isinstance(a, (str, bytes, os.PathLike)) and os.path.abspath(os.fsdecode(os.fspath(a))) == target
    if event == "open":
        mode, flags = args[1], args[2]
        return same(args[0]) and bool((mode and any(c in mode for c in "wax+")) or (flags or 0) & WRITING)
    if event in ("os.remove", "os.truncate"):
        return same(args[0])
    if event in ("os.rename", "shutil.copyfile"):
        return same(args[0]) or same(args[1])
    return False


class _Tracer:
    """In the saving child: counts the operations of one save that touch the target, records them, and SIGKILLs the
    process right after the k-th has run (at the next Python event: the operation itself has returned by then)."""

    def __init__(self, target: str, kill_after: int | None):
        self.target, self.kill_after, self.on, self.ops = target, kill_after, False, []
        sys.addaudithook(self.hook)

    def hook(self, event: str, args: tuple) -> None:
        if not self.on or event not in OPS or not _touches(event, args, self.target):
            return
        self.ops.append(event)
        if len(self.ops) == self.kill_after:
            sys.setprofile(self._kill_next)

    def watch(self, frame, event, arg) -> None:
        """While a traced save runs: note each os.fsync among the operations, in order."""
        if event == "c_call" and arg is os.fsync:
            self.ops.append("fsync")

    def _kill_next(self, frame, event, arg) -> None:
        if frame.f_code is self.hook.__code__ or (event == "c_return" and arg is sys.setprofile):
            return  # the audit hook returning, before the operation has run
        os.kill(os.getpid(), signal.SIGKILL)


def save_loop(source: str, name: str, path: str, size: int, kill_after: int | None = None,
              trace: str | None = None) -> None:
    """Run in a child: save version 1, 2, … with the learner's function until killed; after each save, publish its
    number (atomically, the lab's way) for the parent. From the second save on, the operations that touch the file
    are counted: kill_after=k SIGKILLs the process right after the k-th; trace=FILE writes the second save's list
    of them to FILE and ends there."""
    fn = load_function(source, name, {"os": os, "tempfile": tempfile, "Path": Path})
    done = Path(path).parent / "saved-version"
    tracer = _Tracer(os.path.abspath(path), kill_after)
    v = 0
    while True:
        v += 1
        tracer.on = v == 2
        if trace and tracer.on:
            sys.setprofile(tracer.watch)
        fn(path, version(v, size))
        sys.setprofile(None)
        tracer.on = False
        if trace and v == 2:
            Path(trace).write_text(json.dumps(tracer.ops))
        if (trace or kill_after) and v == 2:
            return  # traced, or the kill's step never came (a save that does less the second time)
        tmp = done.with_suffix(".tmp")
        tmp.write_text(str(v))
        os.replace(tmp, done)


def _child(fn, directory: Path, size: int, rng: random.Random, kill_after: int | None = None,
           trace: Path | None = None) -> dict:
    """Start a saving child and wait for its first whole save; then let it run until it kills itself after an
    operation (kill_after), ends its traced save (trace), or is SIGKILLed here at a random moment. Reads the target."""
    directory.mkdir(parents=True, exist_ok=True)
    target, done = directory / "checkpoint.bin", directory / "saved-version"
    from lessons.fault_tolerance.crashes import context  # the lesson's forkserver: torch imported once
    proc = context().Process(target=save_loop, args=(source_of(fn), fn.__name__, str(target), size, kill_after,
                                                     str(trace) if trace else None), daemon=True)
    proc.start()
    try:
        deadline = time.monotonic() + 30
        while not done.exists():
            if not proc.is_alive() and not done.exists():  # ended without a save (not one that saved and ended)
                return {"error": f"the saving process stopped (exit code {proc.exitcode}) before its first save "
                                 "finished: run your function once in a cell to see why"}
            if time.monotonic() > deadline:
                return {"error": "no save finished within 30 s"}
            time.sleep(0.0005)
        if kill_after is None and trace is None:
            time.sleep(rng.uniform(0.0, 0.05))
            os.kill(proc.pid, signal.SIGKILL)
        proc.join(timeout=30)
    finally:
        if proc.is_alive():
            proc.kill()
        proc.join()
    if trace is not None:
        return {"ops": json.loads(trace.read_text()) if trace.exists() else None, "exitcode": proc.exitcode}
    if not target.exists():
        return {"left": "no file at all"}
    data = target.read_bytes()
    v = whole(data, size)
    return {"left": f"version {v}, whole" if v else f"{len(data):,} bytes that are no whole version", "whole": v}


def check_save(fn, workdir, size: int = 4 * 2**20, kills: int = 3, seed: int = 0) -> Outcome:
    """Your save, first run here (the file must hold what was saved); then in a child that saves versions over and
    over, SIGKILLed right after each step of a save that touches the file (opening it for writing, removing or
    renaming it; SMALL-byte versions, one child per step), then `kills` times at a random moment (`size`-byte
    versions); last, whether it fsyncs the new file before renaming it (which no kill of a process can show)."""
    if is_stub(fn):  # said before any work: the reference's save below writes to workdir
        return Outcome("not written", NOT_WRITTEN)
    try:
        source_of(fn)
    except ValueError as e:
        return Outcome("fail", str(e))
    base = Path(workdir) / "exercise"
    base.mkdir(parents=True, exist_ok=True)
    target = base / "first.bin"
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
    rng = random.Random(seed)
    traced = _child(fn, base / "trace", size, rng, trace=base / "trace.json")
    if "error" in traced:
        return failed("a save in a child process", traced["error"])
    if traced["ops"] is None:
        return failed("a save in a child process", f"the saving process stopped (exit code {traced['exitcode']}) "
                                                   "in its second save: run your function twice in a cell to see why")
    ops = [op for op in traced["ops"] if op != "fsync"]
    for k, op in enumerate(ops, 1):  # small versions: a write still in a buffer shows, not only one under way
        r = _child(fn, base / f"after-{k}", SMALL, rng, kill_after=k)
        name = f"SIGKILL right after your save {OPS[op]} (step {k} of {len(ops)} that touch the file)"
        if "error" in r:
            return failed(name, r["error"])
        if not r.get("whole"):
            return failed(name, f"the kill left {r['left']}", OP_HINTS.get(op, UNWRITTEN_HINT))
    for k in range(kills):
        r = _child(fn, base / f"random-{k}", size, rng)
        name = f"SIGKILL {k + 1} of {kills} at a random moment"
        if "error" in r:
            return failed(name, r["error"])
        if not r.get("whole"):
            return failed(name, f"the kill left {r['left']}", HINT)
    renamed = traced["ops"].index("os.rename") if "os.rename" in traced["ops"] else len(traced["ops"])
    if "fsync" not in traced["ops"][:renamed]:  # last: what no kill of a process can show
        return failed("a save in a child process", "every kill left a whole version, but your save never calls "
                                                   "os.fsync on the new file before it takes the checkpoint's name",
                      FSYNC_HINT)
    steps = "its one step" if len(ops) == 1 else f"each of its {len(ops)} steps"
    touch = "touches" if len(ops) == 1 else "touch"
    return Outcome("pass", f"your save wrote what it was given, and every SIGKILL, right after {steps} that {touch} "
                           f"the file and {kills} at random moments, left one whole version, the old or the new", 0.0)


def solution_source() -> str:
    """The reference as the learner's cell would hold it."""
    return inspect.getsource(reference).replace("def reference(", "def my_atomic_save(")
