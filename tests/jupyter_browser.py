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
    # The server writes the file in place: its mtime moves when the write starts, and a slow host can be read
    # mid-write (CI once read it empty). A whole notebook parses; a partial one does not.
    while True:
        time.sleep(0.5)
        try:
            return json.loads(path.read_text())
        except json.JSONDecodeError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{notebook}: its saved file was still not whole JSON after {timeout:.0f} s")


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


_LAYOUT_JS = """() => {
  const out = [];
  const meet = (a, b) => !(a.right <= b.left || b.right <= a.left || a.bottom <= b.top || b.bottom <= a.top);
  // where a trace's points lie on one axis, in the axis's own coordinates (log10 on a log axis)
  const extent = (fl, data, letter, name, log) => {
    const vals = [];
    for (const t of data) {
      if ((t[letter + 'axis'] || letter) !== name || !Array.isArray(t[letter])) continue;
      for (const v of t[letter]) if (typeof v === 'number' && isFinite(v) && (!log || v > 0))
        vals.push(log ? Math.log10(v) : v);
    }
    return vals.length ? [Math.min(...vals), Math.max(...vals)] : null;
  };
  document.querySelectorAll('.lab-panel .widget-label').forEach(l => {
    if (l.offsetParent !== null && l.scrollWidth > l.clientWidth + 1)
      out.push(`a control's label is cut: '${l.innerText}' shows ${l.clientWidth} of its ${l.scrollWidth} px`);
  });
  document.querySelectorAll('.js-plotly-plot').forEach((gd, i) => {
    const t = gd.layout && gd.layout.title;
    const label = String((t && (t.text || (typeof t === 'string' && t))) || `figure ${i + 1}`)
      .replace(/<[^>]+>/g, ' ').slice(0, 60);
    const area = gd.closest('.jp-OutputArea-output'), svg = gd.querySelector('svg.main-svg');
    if (area && svg && svg.getBoundingClientRect().width > area.clientWidth + 1)
      out.push(`${label}: ${Math.round(svg.getBoundingClientRect().width)} px wide in a ${area.clientWidth}-px ` +
               'output area');
    const title = gd.querySelector('.gtitle'), legend = gd.querySelector('.legend');
    if (title && legend && meet(title.getBoundingClientRect(), legend.getBoundingClientRect()))
      out.push(`${label}: its legend covers its title`);
    if (title && area && title.getBoundingClientRect().right > area.getBoundingClientRect().right + 1)
      out.push(`${label}: its title runs past the output area's right edge`);
    const fl = gd._fullLayout || {}, data = gd._fullData || [];
    (fl.annotations || []).forEach(a => {
      for (const [letter, ref, pos] of [['x', a.xref, a.x], ['y', a.yref, a.y]]) {
        if (!ref || ref === 'paper' || ref.endsWith(' domain') || typeof pos !== 'number') continue;
        const ax = fl[letter + 'axis' + ref.slice(1)];
        if (!ax || !['linear', 'log'].includes(ax.type)) continue;
        const note = `${label}: the note '${String(a.text).replace(/<[^>]+>/g, ' ').slice(0, 30)}' sits at ` +
                     `${ref} = ${pos.toPrecision(3)}${ax.type === 'log' ? ' (log10)' : ''}`;
        const lo = Math.min(...ax.range), hi = Math.max(...ax.range);
        if (pos < lo - 1e-6 * (hi - lo) || pos > hi + 1e-6 * (hi - lo)) {
          out.push(`${note}, outside its axis [${lo.toPrecision(3)}, ${hi.toPrecision(3)}]`);
          continue;
        }
        // an axis stretched to hold a misplaced note (10^x on a log axis): the note is ten data spans away
        const span = extent(fl, data, letter, ref, ax.type === 'log');
        const reach = span && 10 * Math.max(span[1] - span[0], 1e-9);
        if (span && (pos < span[0] - reach || pos > span[1] + reach))
          out.push(`${note}, far outside the data [${span[0].toPrecision(3)}, ${span[1].toPrecision(3)}]`);
      }
    });
  });
  return out;
}"""


_WIDER_JS = """() => [...document.querySelectorAll('.js-plotly-plot')].some(gd => {
  const area = gd.closest('.jp-OutputArea-output'), svg = gd.querySelector('svg.main-svg');
  return area && svg && svg.getBoundingClientRect().width > area.clientWidth + 1; })"""


def figure_layout_problems(page, widths: tuple[int, ...] = (1400, 1024)) -> list[str]:
    """At each window width: figures wider than their output area, legends over titles, titles cut at the
    figure's edge, notes (annotations) placed outside their axis's range, panel controls whose label is cut. The
    window is left at the first width."""
    found = []
    height = page.viewport_size["height"]
    for width in widths:
        if page.viewport_size["width"] != width:
            page.set_viewport_size({"width": width, "height": height})
            page.wait_for_timeout(300)
            deadline = time.monotonic() + 4  # plotly redraws each figure to the new width, one after another
            while time.monotonic() < deadline and page.evaluate(_WIDER_JS):
                page.wait_for_timeout(100)
        found += [f"at {width} px: {p}" for p in page.evaluate(_LAYOUT_JS)]
    page.set_viewport_size({"width": widths[0], "height": height})
    page.wait_for_timeout(300)
    return found


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


def controls(panel) -> int:
    """How many controls a panel has (sliders, dropdowns, boxes, toggle buttons)."""
    return panel.locator(CONTROLS).count()


def shown(panel, which: int) -> bool:
    """Whether the panel shows that control now (a panel may hide one that does not apply)."""
    return panel.locator(CONTROLS).nth(which).is_visible()


# Installed on a panel before its control moves: the first input event starts the clock; then, every 5 ms,
# whether the figure's traces/title/annotations/shapes differ from before, whether the panel drew again (its
# status counts draws: a control may rightly leave the figure as it was, e.g. data parallelism at ZeRO stage 0),
# whether progress bars appeared under the controls, and whether the panel reported an error.
_WATCH_JS = """(panel) => {
  const sig = () => { const gd = panel.querySelector('.js-plotly-plot'); if (!gd) return null;
    const l = gd.layout || {}; return JSON.stringify([gd.data, l.title, l.annotations, l.shapes]); };
  const draws = () => { const s = panel.querySelector('[data-draw]'); return s ? s.dataset.draw : null; };
  const w = {before: sig(), draws: draws(), t0: null, changed: null, redrawn: null, settled: false, progress: null,
             error: null};
  panel.__labWatch = w;
  const start = () => { if (w.t0 === null) w.t0 = performance.now(); };
  const events = ['keydown', 'input', 'change', 'click'];
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
      const d = draws();  // null while a run is going ("running…"): only a finished draw counts
      if (w.redrawn === null && d !== null && d !== w.draws) w.redrawn = now;  // drawn again, the same figure so far
      if (w.redrawn !== null && now - w.redrawn > 1000) { w.settled = true; return stop(); }  // the same figure
    }
    setTimeout(tick, 5);
  };
  tick();
  return w.before !== null;
}"""


CONTROLS = ".widget-hslider, .widget-dropdown, .widget-text, .widget-toggle-buttons"


def control_value(control) -> str:
    """What a control shows: a slider's readout, a dropdown's pick, a box's text."""
    kind = control.evaluate("e => e.className")
    if "widget-hslider" in kind:
        return control.locator(".widget-readout").first.inner_text()
    if "widget-dropdown" in kind:
        return control.locator("select").evaluate("s => s.options[s.selectedIndex].text")
    if "widget-toggle-buttons" in kind:
        return control.locator("button.mod-active").inner_text()
    return control.locator("input").input_value()


def move_control(panel, step: int = 1, which: int = 0) -> str:
    """Change one of the panel's controls (the first unless `which` says another, -1 the last) the way a user
    would (an arrow key on a slider, a pick in a dropdown, a number typed into a box), up for step=1 and down for
    step=-1 (the other way at an end); returns what was done."""
    first = panel.locator(CONTROLS).nth(which)
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
    if "widget-toggle-buttons" in kind:
        buttons = first.locator("button")
        texts = buttons.all_inner_texts()
        current = first.locator("button.mod-active").inner_text()
        i = texts.index(current) + step
        i = i if 0 <= i < len(texts) else texts.index(current) - step
        buttons.nth(i).click()
        return f"toggle {label!r} {current} → {texts[i]}"
    box = first.locator("input")
    old = box.input_value()
    new = repr(float(old or 0) * 2 + 1 if step > 0 else float(old or 0) / 2)
    box.fill(new)
    box.press("Enter")
    return f"box {label!r} {old} → {new}"


def move_and_watch(page, panel, timeout: float, step: int = 1, which: int = 0) -> dict:
    """Move one of the panel's controls (the first unless `which` says); wait for its figure to change, the panel to
    draw the same figure again, an error, or the timeout. Returns {'title', 'action', 'changed_ms', 'redrawn_ms',
    'progress_ms', 'error'} (times from the input event, in the browser)."""
    panel.scroll_into_view_if_needed()
    title = panel.locator(".widget-html").first.inner_text().strip().split("\n")[0]
    if not panel.evaluate(_WATCH_JS):
        return {"title": title, "action": None, "changed_ms": None, "progress_ms": None,
                "error": "the panel has no plotly figure"}
    action = move_control(panel, step, which)
    deadline = time.monotonic() + timeout
    while True:
        w = panel.evaluate("p => p.__labWatch")
        if w["changed"] is not None or w["error"] or w["settled"] or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    return {"title": title, "action": action, "changed_ms": w["changed"], "redrawn_ms": w["redrawn"],
            "progress_ms": w["progress"], "error": w["error"]}


_SIGNATURE_JS = """(panel) => { const gd = panel.querySelector('.js-plotly-plot'); if (!gd) return null;
  const l = gd.layout || {}; return JSON.stringify([gd.data, l.title]); }"""


def interrupt_kernel(lab, notebook: str) -> None:
    """The kernel menu's Interrupt, through the server's API."""
    for s in lab.api("sessions"):
        if s.get("path") == notebook:
            lab.api(f"kernels/{s['kernel']['id']}/interrupt", method="POST")
            return
    raise RuntimeError(f"{notebook}: no kernel to interrupt")


def ranks_running(marker: str) -> list[str]:
    """The processes of a launch (torchrun, its ranks, the supervisor) still alive."""
    return [p for p in leftovers(marker) if "torch.distributed.run" in p or "labtools.parallel" in p]


# A run that draws its figure within this long of the Cancel click had ended before the click could stop it; a run
# that draws later ignored the Cancel (a failure).
ENDED_BEFORE_CANCEL_S = 3.0


def start_and_stop(page, lab, notebook: str, panel, which: int, step: int, how: str = "Cancel",
                   timeout: float = 60) -> dict:
    """Move one control of a panel that trains or launches and, once its run is going (Cancel enabled, a progress
    bar, a second more), stop it with Cancel or the kernel's Interrupt. Returns whether the run started, the panel
    said "cancelled", the control went back, the figure stayed, the Cancel button went off, and what was left of
    the run. A setting the panel has run before draws at once: then "started" is False and "redrawn" True."""
    button = panel.locator("button", has_text="Cancel")
    control = panel.locator(CONTROLS).nth(which)
    figure, value = panel.evaluate(_SIGNATURE_JS), control_value(control)
    draws = panel.evaluate("p => p.querySelector('[data-draw]')?.dataset.draw")
    seen = {"how": how, "action": move_control(panel, step, which=which), "started": False, "cancelled": False,
            "redrawn": False}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not (seen["started"] or seen["redrawn"]):
        seen["started"] = button.is_enabled() and panel.locator(".widget-output .widget-hprogress").count() > 0
        now = panel.evaluate("p => p.querySelector('[data-draw]')?.dataset.draw")
        seen["redrawn"] = now is not None and now != draws
        time.sleep(0.05)
    if not seen["started"]:
        return seen
    time.sleep(1.0)  # well into the run: its steps going, or its ranks starting
    if not button.is_enabled():  # a short run already drew its figure: nothing left to stop
        seen["redrawn"] = True
        return seen
    if how == "Cancel":
        from playwright.sync_api import TimeoutError as ClickTimeout
        try:
            button.click(timeout=5_000)
        except ClickTimeout:  # the run drew its figure between the look above and the click (21's in CI)
            if button.is_enabled():
                raise
            seen["redrawn"] = True
            return seen
    else:
        interrupt_kernel(lab, notebook)
    clicked = time.monotonic()
    while time.monotonic() < deadline and not seen["cancelled"]:
        seen["cancelled"] = panel.locator(".lab-panel-cancelled").count() > 0
        now = panel.evaluate("p => p.querySelector('[data-draw]')?.dataset.draw")
        if (not seen["cancelled"] and now is not None and now != draws and not button.is_enabled()
                and time.monotonic() - clicked < ENDED_BEFORE_CANCEL_S):
            seen["redrawn"] = True  # the run ended and drew as the Cancel arrived (21's short runs, in CI)
            return seen
        time.sleep(0.05)
    seen["control_back"] = control_value(control) == value
    seen["figure_same"] = panel.evaluate(_SIGNATURE_JS) == figure
    seen["button_off"] = not button.is_enabled()
    seen["left"] = ranks_running(lab.marker)
    page.wait_for_timeout(300)
    panel.evaluate("p => p.querySelector('.lab-panel-cancelled')?.remove()")  # the next stop must say so anew
    return seen


def stop_runs(page, lab, notebook: str) -> list[dict]:
    """In the first panel with a Cancel button, start a run it has not made (its last control, up) and stop it,
    twice: with Cancel, then with the kernel's Interrupt (start_and_stop)."""
    panel = page.locator(".lab-panel").filter(has=page.locator("button", has_text="Cancel")).first
    if not panel.count():
        return [{"how": None, "error": "no panel with a Cancel button"}]
    panel.scroll_into_view_if_needed()
    return [start_and_stop(page, lab, notebook, panel, -1, 1, how) for how in ("Cancel", "Interrupt")]


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
