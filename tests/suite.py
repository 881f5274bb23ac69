"""`make test`: the unit tests and the lessons in the browser, side by side.

Three lanes share the machine. The lessons run in two browsers at once (tests/test_browser.py splits them): lane 1
holds those that start ranks or time something, lane 2 those that only train and draw (00-03, 18, 19), at nice 5, so
that a rank of lane 1 that wakes finds its core. The unit tests run at the lowest priority (nice 19) beside them, both
at one torch thread (two processes of one thread each train faster together than one process of two threads). With
one browser lane the lessons ran one after another on about one core: 1,253 s here against 901 s for the unit tests,
the machine 68% busy on average (fresh clones, one host).
Lessons 07-10, 14 and 15 read the loopback interface's byte counters, to which the unit tests' gloo launches would
add: the unit tests that start ranks (marked `ranks`) run first, and lane 1 holds those lessons back until they have
finished (LABTOOLS_WAIT_FOR) and runs them last. The other unit tests run after them, beside those lessons; one that
starts ranks without the mark fails (tests/conftest.py). Lesson 16 times two ranks against a prediction: it waits for
every unit test and for lane 2 (LABTOOLS_WAIT_FOR_ALL). The book's test (one lesson rendered by papermill and opened
in Chromium; marked book) runs in the unit tests' lane.
The unit tests' output goes to build/test-units.log, lane 2's to build/test-browser2.log; both are printed after
lane 1's own. The exit status is non-zero if any lane failed. Ctrl-C or SIGTERM stops them all (each pytest tears its
fixtures down: no process and no run directory is left). The run ends with each lane's wall time and CPU seconds.

    python tests/suite.py [extra pytest arguments for every lane]
"""

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / "build"
WAIT_ENV = "LABTOOLS_WAIT_FOR"          # the unit tests that start ranks are done
WAIT_ALL_ENV = "LABTOOLS_WAIT_FOR_ALL"  # every unit test, and browser lane 2, are done
NO_RANKS_ENV = "LABTOOLS_NO_RANKS"      # tests/conftest.py: starting ranks here fails
LANE_ENV = "LABTOOLS_BROWSER_LANE"      # tests/test_browser.py: which lessons this browser drives
UNITS_NICE = 19  # the unit tests yield the CPU to the lessons
LANE2_NICE = 5   # lane 2 trains only: lane 1's ranks and timings come first


def reap(proc: subprocess.Popen) -> float:
    """Wait for proc; its CPU seconds and those of every process it started and reaped (kernels, Chromium, ranks)."""
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return usage.ru_utime + usage.ru_stime


def main(argv: list[str]) -> int:
    BUILD.mkdir(exist_ok=True)
    ranks_done, done = BUILD / "test-units.ranks-done", BUILD / "test-units.done"
    units_log, lane2_log = BUILD / "test-units.log", BUILD / "test-browser2.log"
    ranks_done.unlink(missing_ok=True)
    done.unlink(missing_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    pytest = [sys.executable, "-m", "pytest", *argv]
    start, lanes, lock = time.monotonic(), {}, threading.Lock()  # lane -> (wall s, CPU s, exit code)
    children: list[subprocess.Popen] = []
    stopping = threading.Event()

    def run(name, args, extra_env, nice, log=None) -> int:
        proc = subprocess.Popen(pytest + args, cwd=ROOT, env=dict(env, **extra_env), stdout=log,
                                stderr=subprocess.STDOUT if log else None,
                                preexec_fn=(lambda: os.nice(nice)) if nice else None)
        with lock:
            children.append(proc)
        cpu = reap(proc)
        with lock:
            wall, (w0, c0, code0) = time.monotonic() - start, lanes.get(name, (0.0, 0.0, 0))
            lanes[name] = (wall, c0 + cpu, max(code0, proc.returncode))
        return proc.returncode

    with open(units_log, "w") as ulog, open(lane2_log, "w") as blog:
        def units():
            run("unit tests", ["-m", "ranks and not browser"], {}, UNITS_NICE, ulog)
            ranks_done.write_text("done")
            if not stopping.is_set():
                run("unit tests", ["-m", "(not browser or book) and not ranks"], {NO_RANKS_ENV: "1"}, UNITS_NICE, ulog)

        def lane2():
            run("browser lane 2", ["-m", "browser and not book"], {LANE_ENV: "2"}, LANE2_NICE, blog)

        others = [threading.Thread(target=f, daemon=True) for f in (units, lane2)]
        for t in others:
            t.start()

        def everything_else_done():
            for t in others:
                t.join()
            done.write_text("done")

        threading.Thread(target=everything_else_done, daemon=True).start()

        def stop(signum, frame):
            stopping.set()
            with lock:
                for child in children:
                    if child.returncode is None:
                        try:
                            child.send_signal(signal.SIGINT)  # pytest's KeyboardInterrupt: fixtures tear down
                        except ProcessLookupError:
                            pass

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGHUP, stop)
        try:
            run("browser lane 1", ["-m", "browser and not book"],
                {LANE_ENV: "1", WAIT_ENV: str(ranks_done), WAIT_ALL_ENV: str(done)}, 0)
            for t in others:
                t.join()
        except KeyboardInterrupt:  # the terminal sent SIGINT to the whole group already
            stopping.set()
            for t in others:
                t.join(timeout=120)
            raise
    for title, path in (("browser lane 2", lane2_log), ("unit tests", units_log)):
        print(f"\n{'=' * 30} {title} ({path.relative_to(ROOT)}) {'=' * 30}", flush=True)
        sys.stdout.write(path.read_text())
    codes = {name: code for name, (_, _, code) in lanes.items()}
    print("; ".join(f"{name}: exit {code}" for name, code in codes.items()), flush=True)
    for name, (wall, cpu, _) in sorted(lanes.items(), key=lambda kv: kv[1][0]):  # in the order they ended
        print(f"{name}: {wall:.0f} s, {cpu:.0f} CPU-s", flush=True)
    return 0 if len(codes) == 3 and not any(codes.values()) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
