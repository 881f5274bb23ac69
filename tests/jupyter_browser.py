"""A real JupyterLab driven by a real headless Chromium (Playwright's Python API), for tests and benchmarks.

    with JupyterLab(root, marker) as lab, Browser(marker) as browser:
        page = browser.new_page()
        open_notebook(page, lab, "00_training_loop.ipynb")
        run_all(page, lab, "00_training_loop.ipynb", timeout=300)
        saved = save(page, lab, "00_training_loop.ipynb")

`JupyterLab` serves `root` on 127.0.0.1 (a free port, a fresh token) with its own settings and workspace
directories; `Browser` launches Chromium. Both tag their processes with a marker in the environment, and
`leftovers(marker)` lists any process still carrying it, so a test can prove nothing it started survives.
Both end only what they started, by PID (the server's session and the browser Playwright launched).
"""

import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

MARKER_ENV = "LAB_BROWSER_TEST"

# JupyterLab settings for an unattended run: every cell kept in the DOM (no windowing), each cell's execution
# times recorded in the saved notebook, no news or update toasts, no autosave racing our own save.
SETTINGS = {
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none", "recordTiming": True},
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {"fetchNews": "false",
                                                                         "checkForUpdates": False},
    "@jupyterlab/docmanager-extension/plugin.jupyterlab-settings": {"autosave": False},
}


def find_browser() -> str:
    """A Chromium to drive: LAB_CHROMIUM, one on PATH, or Playwright's own; else an error saying how to get one."""
    if os.environ.get("LAB_CHROMIUM"):
        return os.environ["LAB_CHROMIUM"]
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        if path := shutil.which(name):
            return path
    try:
        from playwright.sync_api import sync_playwright
        with sync_playwright() as p:
            path = p.chromium.executable_path
        if Path(path).exists():
            return path
    except Exception:  # noqa: BLE001 - any failure here means "no Playwright browser"
        pass
    raise RuntimeError(
        "no Chromium found for the browser tests. Install one: `apt-get install -y chromium` (Debian/Ubuntu, as "
        "root; `make test` does this itself when it can), or `.venv/bin/playwright install chromium` where "
        "downloads work, or point LAB_CHROMIUM at a Chromium/Chrome binary.")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def leftovers(marker: str) -> list[str]:
    """'pid command' of every process whose environment carries MARKER_ENV=marker."""
    needle = f"{MARKER_ENV}={marker}".encode()
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            if needle in (d / "environ").read_bytes().split(b"\0"):
                cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:120]
                found.append(f"{d.name} {cmd}")
        except OSError:  # gone, or not ours to read
            continue
    return found


class JupyterLab:
    """JupyterLab on 127.0.0.1 with token authentication, serving `root`; stopped (by PID) on exit."""

    def __init__(self, root: Path, marker: str, env: dict | None = None, log: Path | None = None):
        self.root, self.marker = Path(root), marker
        self.port, self.token = free_port(), secrets.token_hex(16)
        self.env = {**os.environ, **(env or {}), MARKER_ENV: marker}
        self.log_path = log or self.root / "jupyterlab.log"
        self.proc: subprocess.Popen | None = None

    def url(self, notebook: str = "", workspace: str | None = None) -> str:
        """The notebook's URL; a named workspace keeps two pages on one server from sharing their layout."""
        where = f"lab/workspaces/{workspace}" if workspace else "lab"
        return f"http://127.0.0.1:{self.port}/{where}/tree/{notebook}?token={self.token}&reset"

    def api(self, path: str, method: str = "GET") -> object:
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/api/{path}", method=method,
                                     headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(req, timeout=10) as r:
            body = r.read()
        return json.loads(body) if body else None

    def __enter__(self) -> "JupyterLab":
        home = self.root / ".lab"
        for name, values in SETTINGS.items():
            path = home / "settings" / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(values))
        cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ServerApp.ip=127.0.0.1",
               f"--ServerApp.port={self.port}", "--ServerApp.port_retries=0",
               f"--IdentityProvider.token={self.token}", f"--ServerApp.root_dir={self.root}",
               f"--LabApp.user_settings_dir={home / 'settings'}", f"--LabApp.workspaces_dir={home / 'workspaces'}",
               "--LabApp.news_url=", "--ServerApp.allow_root=True"]
        self.log = open(self.log_path, "w")
        # its own session: the server and the kernels it starts form a group we can end together
        self.proc = subprocess.Popen(cmd, env=self.env, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True, cwd=self.root)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"JupyterLab exited ({self.proc.returncode}); see {self.log_path}")
            try:
                self.api("status")
                return self
            except OSError:
                time.sleep(0.3)
        self.__exit__(None, None, None)
        raise RuntimeError(f"JupyterLab did not answer within 60 s; see {self.log_path}")

    def __exit__(self, *exc) -> None:
        if self.proc is None:
            return
        try:
            self.api("shutdown", "POST")  # shuts its kernels down too
            self.proc.wait(timeout=20)
        except (OSError, subprocess.TimeoutExpired):
            pass
        # whatever is left of the group we started (the server, its kernels, their launches): ended by PID
        for sig, wait in ((signal.SIGTERM, 5), (signal.SIGKILL, 5)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline and _group_alive(self.proc.pid):
                time.sleep(0.1)
        if self.proc.poll() is None:
            self.proc.wait(timeout=5)
        self.log.close()
        self.proc = None


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


class Browser:
    """A headless Chromium launched through Playwright; closed on exit."""

    def __init__(self, marker: str, executable: str | None = None):
        self.marker, self.executable = marker, executable or find_browser()

    def __enter__(self) -> "Browser":
        from playwright.sync_api import sync_playwright
        self._pw = sync_playwright().start()
        try:
            self.browser = self._pw.chromium.launch(
                executable_path=self.executable, headless=True,
                env={**os.environ, MARKER_ENV: self.marker}, args=["--no-sandbox", "--disable-gpu"])
        except Exception:
            self._pw.stop()
            raise
        return self

    def new_page(self):
        page = self.browser.new_page(viewport={"width": 1400, "height": 1000})
        page.set_default_timeout(30_000)
        return page

    def __exit__(self, *exc) -> None:
        try:
            self.browser.close()
        finally:
            self._pw.stop()


# ---- driving a notebook -------------------------------------------------------------------------------------

KERNELSPEC = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
WIDGET_ERRORS = ("Error displaying widget", "model not found", "Failed to load model class")

_PROMPTS_JS = ("() => [...document.querySelectorAll('.jp-Notebook .jp-CodeCell .jp-InputPrompt')]"
               ".map(e => e.textContent)")


def smoke_copy(src: Path, dst: Path, profile: str = "smoke") -> None:
    """The notebook with PROFILE set and a kernel named, as a reader's copy would be."""
    import nbformat
    nb = nbformat.read(src, as_version=4)
    params = [c for c in nb.cells if c.cell_type == "code"][1]
    if not params.source.startswith('PROFILE = "auto"'):
        raise ValueError(f"{src.stem}: the parameters cell does not start with PROFILE = \"auto\"")
    params.source = params.source.replace('PROFILE = "auto"', f'PROFILE = "{profile}"', 1)
    nb.metadata["kernelspec"] = KERNELSPEC
    nbformat.write(nb, dst)


def kernel_state(lab: JupyterLab, notebook: str) -> str | None:
    for s in lab.api("sessions"):
        if s.get("path") == notebook:
            return s["kernel"]["execution_state"]
    return None


def open_notebook(page, lab: JupyterLab, notebook: str, timeout: float = 90, workspace: str | None = None) -> float:
    """Open `notebook` in JupyterLab and wait until its kernel is up and idle; returns the seconds until the
    page showed the notebook (the rest was the kernel starting).

    On a page that already shows JupyterLab with no notebook open (see close_notebook), the notebook is opened
    from the file browser, as a reader would; loading the whole application again costs ~4 s here."""
    t0 = time.monotonic()
    item = page.locator(".jp-DirListing-item").filter(has=page.get_by_text(re.compile(rf"^{re.escape(notebook)}$")))
    if item.count() == 1 and not page.locator(".jp-NotebookPanel").count():
        item.dblclick()
    else:  # the first notebook, a file the browser has not listed yet, or a page left in a bad state
        page.goto(lab.url(notebook, workspace))
    page.wait_for_selector(".jp-Notebook .jp-CodeCell", timeout=timeout * 1e3)
    shown = time.monotonic() - t0
    deadline = time.monotonic() + timeout
    while kernel_state(lab, notebook) != "idle":
        if time.monotonic() > deadline:
            raise TimeoutError(f"{notebook}: its kernel was not idle within {timeout:.0f} s")
        time.sleep(0.3)
    return shown


def close_notebook(page, lab: JupyterLab, notebook: str, settle_s: float = 15) -> None:
    """Close the notebook's tab (discarding unsaved changes) and shut its kernel down, leaving JupyterLab open for
    the next one. If the tab will not close, the next open_notebook loads the page afresh.

    First it waits (up to settle_s) for the kernel's launches to finish tearing down: a launch returns its
    results while torchrun and the ranks still exit in the background, and ipykernel's shutdown kills its whole
    process tree, supervisor included, before the run directory is removed (seen with lesson 07's panel)."""
    from labtools.parallel.launcher import RUN_ROOT_ENV
    root = os.environ.get(RUN_ROOT_ENV)
    deadline = time.monotonic() + settle_s
    while root and list(Path(root).glob("labtools-run-*")) and time.monotonic() < deadline:
        time.sleep(0.2)
    try:
        page.locator(".lm-TabBar-tab.jp-mod-current .lm-TabBar-tabCloseIcon").first.click(timeout=5_000)
        discard = page.locator(".jp-Dialog button", has_text="Discard")
        if discard.count():
            discard.first.click(timeout=5_000)
        page.wait_for_selector(".jp-NotebookPanel", state="detached", timeout=10_000)
    except Exception:  # noqa: BLE001 - a stuck tab must not fail the lesson; the next open reloads instead
        page.goto("about:blank")
    for s in lab.api("sessions"):
        if s.get("path") == notebook:
            lab.api(f"sessions/{s['id']}", "DELETE")


def run_all(page, lab: JupyterLab, notebook: str, timeout: float) -> dict:
    """Run → Run All Cells, then wait until every code cell has run or the kernel stopped with cells left (a cell
    failed: JupyterLab then drops the rest). Returns {'seconds', 'prompts'}; the saved notebook says what failed."""
    page.locator(".jp-Notebook .jp-Cell").first.click()  # the menu acts on the focused notebook
    page.get_by_role("menuitem", name="Run", exact=True).click()
    page.locator('li[data-command="runmenu:run-all"]').click()
    t0 = time.monotonic()
    idle_since = None
    while True:
        time.sleep(0.5)
        prompts = page.evaluate(_PROMPTS_JS)
        if all(re.fullmatch(r"\[\d+\]:", p.strip()) for p in prompts):
            break
        busy = any("*" in p for p in prompts) or kernel_state(lab, notebook) != "idle"
        idle_since = None if busy else (idle_since or time.monotonic())
        if idle_since and time.monotonic() - idle_since > 5:
            break  # nothing running and cells left: execution stopped
        if time.monotonic() - t0 > timeout:
            raise TimeoutError(f"{notebook}: Run All had not finished after {timeout:.0f} s")
    return {"seconds": time.monotonic() - t0 - (5 if idle_since else 0), "prompts": prompts}


def save(page, lab: JupyterLab, notebook: str, timeout: float = 30) -> dict:
    """Save the notebook from the browser (Ctrl+S) and return the saved file as nbformat JSON."""
    path = lab.root / notebook
    before = path.stat().st_mtime_ns
    page.locator(".jp-Notebook").first.click(position={"x": 5, "y": 5})
    page.keyboard.press("Control+s")
    deadline = time.monotonic() + timeout
    while path.stat().st_mtime_ns == before:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{notebook}: not saved within {timeout:.0f} s")
        time.sleep(0.2)
    time.sleep(0.5)  # let the write finish
    return json.loads(path.read_text())


def cell_errors(notebook: dict) -> list[str]:
    """'ename: evalue' and the traceback's last lines of every error output in a saved notebook."""
    found = []
    for cell in notebook.get("cells", []):
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                tb = re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(out.get("traceback", [])))
                found.append(f"{out['ename']}: {out['evalue']}\n{tb[-1500:]}")
    return found


def page_problems(page, settle: float = 15) -> list[str]:
    """Widget errors, widgets still loading after `settle` seconds, and plotly figures without a drawing."""
    deadline = time.monotonic() + settle
    while True:
        text = page.locator(".jp-Notebook").inner_text()
        loading = text.count("Loading widget")
        if not loading or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    problems = [f"'{e}' shown" for e in WIDGET_ERRORS if e in text]
    if loading:
        problems.append(f"{loading} widget(s) still 'Loading widget...' after {settle:.0f} s")
    empty = page.evaluate("""() => [...document.querySelectorAll('.js-plotly-plot')].filter(gd => {
        const svg = gd.querySelector('svg.main-svg');
        return !svg || !svg.querySelector('.plot, .pielayer, .cartesianlayer') || gd.offsetHeight === 0; }).length""")
    if empty:
        problems.append(f"{empty} plotly figure(s) without a drawing")
    return problems


def fill_exercise(page, solution: str, timeout: float) -> str:
    """Do an exercise as a learner would: in the cell that still raises NotImplementedError, select everything,
    type the solution (inserted as typed text, so the editor's auto-indent leaves it alone), run that cell and
    the next one (the check), and return the text the check printed ('' if nothing came in `timeout` s)."""
    cells = page.locator(".jp-Notebook .jp-CodeCell")
    texts = cells.locator(".cm-content").all_inner_texts()
    i = next(k for k, t in enumerate(texts) if "raise NotImplementedError" in t)
    stub, check = cells.nth(i), cells.nth(i + 1)  # by position: once filled, the stub no longer matches its text
    stub.locator(".cm-content").click()
    page.keyboard.press("Control+a")
    page.keyboard.insert_text(solution)
    page.keyboard.press("Shift+Enter")  # run the stub's cell; the next cell (the check) is now the active one
    page.keyboard.press("Shift+Enter")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = check.locator(".jp-OutputArea-output").all_inner_texts()
        if any(mark in t for t in text for mark in ("✓", "✗", "not written yet")):
            return "\n".join(text)
        time.sleep(0.5)
    return ""


def panels(page) -> list:
    """Every control panel (labtools.widgets.Panel) on the page, as locators."""
    return page.locator(".lab-panel").all()


# Installed on a panel before its control moves: the first input event starts the clock; then, every 5 ms,
# whether the figure's traces/title/annotations/shapes differ from before, whether progress bars appeared
# under the controls, and whether the panel reported an error.
_WATCH_JS = """(panel) => {
  const sig = () => { const gd = panel.querySelector('.js-plotly-plot'); if (!gd) return null;
    const l = gd.layout || {}; return JSON.stringify([gd.data, l.title, l.annotations, l.shapes]); };
  const w = {before: sig(), t0: null, changed: null, progress: null, error: null};
  panel.__labWatch = w;
  const start = () => { if (w.t0 === null) w.t0 = performance.now(); };
  const events = ['keydown', 'input', 'change'];
  for (const ev of events) panel.addEventListener(ev, start, true);
  const stop = () => { for (const ev of events) panel.removeEventListener(ev, start, true); };
  const born = performance.now();
  const tick = () => {
    if (panel.__labWatch !== w || performance.now() - born > 300000) return stop();
    if (w.t0 !== null) {
      const now = performance.now() - w.t0;
      const err = panel.querySelector('.lab-panel-error');
      if (err) { w.error = err.innerText; return stop(); }
      if (w.progress === null && panel.querySelector('.widget-output .widget-hprogress, .widget-output progress'))
        w.progress = now;
      const s = sig();
      if (s !== null && s !== w.before) { w.changed = now; return stop(); }
    }
    setTimeout(tick, 5);
  };
  tick();
  return w.before !== null;
}"""


def move_control(panel, step: int = 1) -> str:
    """Change the panel's first control the way a user would (an arrow key on a slider, a pick in a dropdown,
    a number typed into a box), up for step=1 and down for step=-1 (the other way at an end); returns what
    was done."""
    first = panel.locator(".widget-hslider, .widget-dropdown, .widget-text").first
    kind = first.evaluate("e => e.className")
    label = first.locator(".widget-label").first.inner_text().strip()
    if "widget-hslider" in kind:
        handle, readout = first.locator(".noUi-handle").first, first.locator(".widget-readout").first
        before = readout.inner_text()
        keys = ["ArrowRight", "ArrowLeft"][::step]
        handle.focus()
        handle.press(keys[0])
        if readout.inner_text() == before:  # already at that end
            handle.press(keys[1])
        return f"slider {label!r} {before} → {readout.inner_text()}"
    if "widget-dropdown" in kind:
        select = first.locator("select")
        current = select.evaluate("s => s.options[s.selectedIndex].text")
        options = select.locator("option").all_inner_texts()
        i = options.index(current) + step
        pick = options[i if 0 <= i < len(options) else options.index(current) - step]
        select.select_option(label=pick)
        return f"dropdown {label!r} {current} → {pick}"
    box = first.locator("input")
    old = box.input_value()
    new = repr(float(old or 0) * 2 + 1 if step > 0 else float(old or 0) / 2)
    box.fill(new)
    box.press("Enter")
    return f"box {label!r} {old} → {new}"


def move_and_watch(page, panel, timeout: float, step: int = 1) -> dict:
    """Move the panel's first control; wait for its figure to change, an error, or the timeout.
    Returns {'title', 'action', 'changed_ms', 'progress_ms', 'error'} (times from the input event, in the browser)."""
    panel.scroll_into_view_if_needed()
    title = panel.locator(".widget-html").first.inner_text().strip().split("\n")[0]
    if not panel.evaluate(_WATCH_JS):
        return {"title": title, "action": None, "changed_ms": None, "progress_ms": None,
                "error": "the panel has no plotly figure"}
    action = move_control(panel, step)
    deadline = time.monotonic() + timeout
    while True:
        w = panel.evaluate("p => p.__labWatch")
        if w["changed"] is not None or w["error"] or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    return {"title": title, "action": action, "changed_ms": w["changed"], "progress_ms": w["progress"],
            "error": w["error"]}


def ensure_browser() -> str:
    """Find a Chromium, or install one the way this platform allows; a clear error when none can be had."""
    try:
        return find_browser()
    except RuntimeError:
        pass
    if os.geteuid() == 0 and shutil.which("apt-get"):
        print("no Chromium found: apt-get install -y chromium", flush=True)
        subprocess.run(["apt-get", "update", "-qq"], check=False)
        subprocess.run(["apt-get", "install", "-y", "-qq", "chromium"], check=False,
                       env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
    else:
        print("no Chromium found: playwright install chromium", flush=True)
        subprocess.run([sys.executable, "-m", "playwright", "install", "chromium"], check=False)
    return find_browser()  # raises with instructions if neither worked


if __name__ == "__main__":  # `python tests/jupyter_browser.py`: make sure the browser tests have a browser
    try:
        print("browser for the tests:", ensure_browser())
    except RuntimeError as e:
        sys.exit(str(e))
