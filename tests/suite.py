"""`make test`: the unit tests and the lessons in the browser, side by side.

The browser tests leave most of one core idle (Chromium, the server and a one-thread kernel use ~1.4 of this
machine's 2 cores), so the unit tests run beside them instead of before them, both at one torch thread (two
processes of one thread each train faster together than one process of two threads). Lessons 07-10, 14 and 15
read the loopback interface's byte counters, to which the unit tests' gloo launches would add: the unit tests that
start ranks (marked `ranks`) run first, and the browser test holds those lessons back until they have finished
(LABTOOLS_WAIT_FOR, tests/test_browser.py) and runs them last. The other unit tests run after them, beside those
lessons; one that starts ranks without the mark fails (tests/conftest.py). Lesson 16 times two ranks against a
prediction: it waits for every unit test (LABTOOLS_WAIT_FOR_ALL). With the ranks' tests first, the lessons that
wait could start after 540 s instead of 600-640 s, and the browser tests took 883 s against 908 and 953 s (one host).
The unit tests run at the lowest priority (nice 19): they finish long before the browser tests either way, so the
CPU they would take from the lessons only lengthens the whole run. At nice 10 their ranks still took a share of the
kernel's core: lessons 01 and 02, which run beside them, took 46.8 and 49.0 s in the browser against 41.1 and 42.2 s
at nice 19, and the unit tests ended no later (309 and 280 s; fresh clones, one host, 101 GFLOP/s per core). For the
same reason the book's test (one lesson rendered by papermill and opened in Chromium; marked book) runs in the unit
tests' lane, not the browser's.
The unit tests' output goes to build/test-units.log and is printed after the browser tests' own. The exit status
is non-zero if either failed. Ctrl-C or SIGTERM stops both (each pytest tears its fixtures down: no process and no
run directory is left). The run ends with each lane's wall time and CPU seconds.

    python tests/suite.py [extra pytest arguments for both]
"""

import os
import resource
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / "build"
WAIT_ENV = "LABTOOLS_WAIT_FOR"          # the unit tests that start ranks are done
WAIT_ALL_ENV = "LABTOOLS_WAIT_FOR_ALL"  # every unit test is done
NO_RANKS_ENV = "LABTOOLS_NO_RANKS"      # tests/conftest.py: starting ranks here fails
UNITS_NICE = 19  # the browser tests are the longer lane: the unit tests (and their ranks) yield the CPU to them


def main(argv: list[str]) -> int:
    BUILD.mkdir(exist_ok=True)
    ranks_done, done = BUILD / "test-units.ranks-done", BUILD / "test-units.done"
    log_path = BUILD / "test-units.log"
    ranks_done.unlink(missing_ok=True)
    done.unlink(missing_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    pytest = [sys.executable, "-m", "pytest", *argv]
    # Each lane's wall time and CPU seconds (its processes and all they started and reaped: kernels, Chromium,
    # ranks), so a slower run says whether the tests did more work or the machine gave them less.
    start, finished, lock = time.monotonic(), {}, threading.Lock()

    def finish(lane):
        with lock:
            r = resource.getrusage(resource.RUSAGE_CHILDREN)
            finished[lane] = (time.monotonic() - start, r.ru_utime + r.ru_stime)

    with open(log_path, "w") as log:
        def unit_tests(marks, extra_env):
            return subprocess.Popen(pytest + ["-m", marks], cwd=ROOT, env=dict(env, **extra_env), stdout=log,
                                    stderr=subprocess.STDOUT, preexec_fn=lambda: os.nice(UNITS_NICE))

        units = [unit_tests("ranks and not browser", {})]
        codes = []
        stopping = threading.Event()

        def mark_done():
            codes.append(units[0].wait())
            ranks_done.write_text(str(codes[0]))
            if not stopping.is_set():
                units.append(unit_tests("(not browser or book) and not ranks", {NO_RANKS_ENV: "1"}))
                codes.append(units[1].wait())
            finish("unit tests")
            done.write_text(str(max(codes)))

        waiter = threading.Thread(target=mark_done, daemon=True)
        waiter.start()
        browser = subprocess.Popen(pytest + ["-m", "browser and not book"], cwd=ROOT,
                                   env=dict(env, **{WAIT_ENV: str(ranks_done), WAIT_ALL_ENV: str(done)}))

        def children():
            return (*units, browser)

        def stop(signum, frame):
            stopping.set()
            for child in children():
                if child.poll() is None:
                    child.send_signal(signal.SIGINT)  # pytest's KeyboardInterrupt: fixtures tear down

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGHUP, stop)
        try:
            browser.wait()
            finish("browser tests")
            waiter.join()
        except KeyboardInterrupt:  # the terminal sent SIGINT to the whole group already
            stopping.set()
            for child in children():
                try:
                    child.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    child.kill()
            raise
    print(f"\n{'=' * 30} unit tests (build/test-units.log) {'=' * 30}", flush=True)
    sys.stdout.write(log_path.read_text())
    units_code = max(codes) if codes else 1
    print(f"unit tests: exit {units_code}; browser tests: exit {browser.returncode}", flush=True)
    cpu_before = 0.0
    for lane, (wall, cpu) in sorted(finished.items(), key=lambda kv: kv[1][1]):  # in the order they were reaped
        print(f"{lane}: {wall:.0f} s, {cpu - cpu_before:.0f} CPU-s", flush=True)
        cpu_before = cpu
    return 0 if units_code == browser.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
