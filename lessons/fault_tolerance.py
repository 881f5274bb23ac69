"""Lesson 11 — fault tolerance: checkpoints that survive crashes, bitwise resume, sharded and elastic restarts.

The notebook side of notebooks/11_fault_tolerance.ipynb: settings, experiments, figures, findings, the
checkpoint-interval panel and exercises. The checkpoint format: labtools/checkpoint.py; resuming inside
labtools.train.train (TrainConfig.checkpoint_dir); rank functions and the saver that gets killed:
lessons/ranks/fault_tolerance.py.
"""

import math
import multiprocessing
import os
import re
import shutil
import signal
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import plotly.graph_objects as go
import torch

from labtools import checkpoint, plots
from labtools.claims import Ledger, approx, at_least, is_true
from labtools.dist import launch
from labtools.dist.toolkit import corpus
from labtools.model import GPT, GPTConfig
from labtools.optim import param_groups
from labtools.profiles import check_range, resolve
from labtools.schedules import bind, warmup_cosine
from labtools.train import TrainConfig, train
from labtools.widgets import Exercise, Panel, answer_check, slider
from lessons.ranks import fault_tolerance as ranks
from lessons.ranks.fault_tolerance import ElasticJob, ShardJob

HOUR = 3600.0
MIN_KILLS = 8  # random kills from which at least one lands mid-save (about half did here)
# Published cases (sources in the notebook): BLOOM-176B wrote 2.3 TB checkpoints in ~40 s every ~3 h; Llama 3 405B
# saw 419 unexpected interruptions in 54 days; PyTorch's async DCP post: 148.8 s blocking vs 6.3 s async.
LLAMA3_MTBF_S = 54 * 24 * HOUR / 419
CASES = {
    "BLOOM-176B (40 s save every 3 h)": dict(save_s=40.0, interval_s=3 * HOUR, mtbf_s=LLAMA3_MTBF_S),
    "Llama-3-like, blocking save (148.8 s)": dict(save_s=148.8, interval_s=None, mtbf_s=LLAMA3_MTBF_S),
    "Llama-3-like, async save (6.3 s)": dict(save_s=6.3, interval_s=None, mtbf_s=LLAMA3_MTBF_S),
}


@dataclass(frozen=True)
class Settings:
    profile: str
    n_layer: int
    n_embd: int
    block_size: int
    batch_size: int
    steps: int             # the single-process run
    every: int             # steps between checkpoints
    stop_at: int           # where the interrupted run dies (between two checkpoints)
    kills: int             # random SIGKILLs of a process that is saving
    kill_mb: int           # size of the state that process saves
    dist_steps: int        # FSDP steps before the sharded save
    save_world: int        # ranks that save the sharded checkpoint ...
    load_world: int        # ... and ranks that load it
    elastic_steps: int     # the elastic DDP run
    kill_at: int           # the step before which one of its ranks is killed
    lr: float = 3e-3
    seed: int = 0

    def __post_init__(self):
        # The run dies at STOP_AT, after its first checkpoint (EVERY) and before its end (STEPS): the three bound
        # each other, so a value out of place is reported with every parameter whose range it leaves.
        errors = []
        for check in (lambda: check_range("STEPS", self.steps, self.stop_at + 1, 100_000, int),
                      lambda: check_range("EVERY", self.every, 1, self.stop_at, int),
                      lambda: check_range("STOP_AT", self.stop_at, self.every, self.steps - 1, int)):
            try:
                check()
            except ValueError as e:
                errors.append(str(e))
        if errors:
            raise ValueError("; ".join(errors) + " (EVERY ≤ STOP_AT < STEPS)")
        check_range("KILLS", self.kills, 1, 1000, int)
        check_range("SEED", self.seed, 0, 2**31 - 1, int)
        if not 0 < self.kill_at < self.elastic_steps:
            raise ValueError(f"kill_at must be in (0, elastic_steps), got {self.kill_at}")


PROFILES = {
    "smoke": Settings("smoke", n_layer=2, n_embd=32, block_size=32, batch_size=8, steps=40, every=10, stop_at=27,
                      kills=8, kill_mb=8, dist_steps=3, save_world=4, load_world=2, elastic_steps=12, kill_at=7),
    "cpu": Settings("cpu", n_layer=2, n_embd=64, block_size=64, batch_size=16, steps=200, every=25, stop_at=140,
                    kills=24, kill_mb=32, dist_steps=10, save_world=4, load_world=2, elastic_steps=40, kill_at=23),
    "gpu": Settings("gpu", n_layer=6, n_embd=384, block_size=256, batch_size=32, steps=600, every=100, stop_at=430,
                    kills=24, kill_mb=256, dist_steps=20, save_world=4, load_world=2, elastic_steps=60, kill_at=37),
}


def settings(profile: str = "auto", **overrides) -> Settings:
    """Validated settings for a profile; None-valued overrides keep the profile's value."""
    return resolve(PROFILES, profile, **overrides)


# --- 1. resuming: the whole state, or the article's recipe ------------------------------------------------------------

def model(S: Settings) -> GPT:
    torch.manual_seed(S.seed)
    return GPT(GPTConfig(vocab_size=corpus().vocab_size, block_size=S.block_size, n_layer=S.n_layer, n_head=4,
                         n_embd=S.n_embd, dropout=0.1))  # dropout: the run draws random numbers every step


def train_config(S: Settings, **changes) -> TrainConfig:
    kw = dict(steps=S.steps, batch_size=S.batch_size, lr=S.lr, seed=S.seed, eval_every=S.every,
              lr_schedule=bind(warmup_cosine, warmup=S.steps // 10, total=S.steps), desc="train")
    return TrainConfig(**(kw | changes))


def article_save(path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, step: int) -> None:
    """The source article's save: model, optimizer and step, written in place (no RNG, no data position)."""
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}, path)


def article_resume(path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """The article's resume (with weights_only=True, which it lacks: see section 3)."""
    ckpt = torch.load(path, weights_only=True)
    model.load_state_dict(ckpt["model"])
    optimizer.load_state_dict(ckpt["optimizer"])
    return ckpt["step"]


def run_resume(S: Settings, workdir: Path) -> dict:
    """Three runs of the same training: uninterrupted; killed at stop_at and resumed from labtools.checkpoint;
    killed at stop_at and resumed with the article's recipe. Returns their histories and final parameters."""
    data = corpus()
    m = model(S)
    whole = train(m, data, train_config(S, desc="uninterrupted"))
    out = {"whole": whole, "whole_params": m.state_dict()}

    lab_dir = workdir / "lab"
    first = train(model(S), data, train_config(S, checkpoint_dir=str(lab_dir), checkpoint_every=S.every,
                                                stop_at=S.stop_at, desc="killed at step"))
    saved_at = int(checkpoint.latest(lab_dir).name.split("_")[1])
    m = model(S)
    out["lab"] = train(m, data, train_config(S, checkpoint_dir=str(lab_dir), checkpoint_every=S.every,
                                             desc="resumed"))
    out["lab_params"], out["lab_first"], out["saved_at"] = m.state_dict(), first, saved_at

    path = workdir / "article.pt"
    m = model(S)
    opt = torch.optim.AdamW(param_groups(m, 0.1), lr=S.lr, betas=(0.9, 0.95))

    def save_every(info):
        if (info.step + 1) % S.every == 0:
            article_save(path, info.model, info.optimizer, info.step + 1)
    train(m, data, train_config(S, stop_at=S.stop_at, desc="article: killed"), optimizer=opt, callback=save_every)
    m = model(S)
    opt = torch.optim.AdamW(param_groups(m, 0.1), lr=S.lr, betas=(0.9, 0.95))
    start = article_resume(path, m, opt)
    out["article"] = train(m, data, train_config(S, start_step=start, steps=S.steps - start,
                                                 desc="article: resumed"), optimizer=opt)
    out["article_params"], out["article_start"] = m.state_dict(), start
    return out


def max_abs_diff(a: dict, b: dict) -> float:
    return max((x.float() - y.float()).abs().max().item() for x, y in zip(a.values(), b.values()))


def resume_stats(S: Settings, r: dict) -> dict:
    whole, lab, art = r["whole"], r["lab"], r["article"]
    tail = [whole.loss[whole.step.index(s)] for s in art.step]
    return {"lab_losses_equal": whole.loss == lab.loss, "lab_val_equal": whole.val_loss == lab.val_loss,
            "lab_params_equal": checkpoint.digest(r["whole_params"]) == checkpoint.digest(r["lab_params"]),
            "lab_param_diff": max_abs_diff(r["whole_params"], r["lab_params"]),
            "article_param_diff": max_abs_diff(r["whole_params"], r["article_params"]),
            "article_loss_diff": max(abs(a - b) for a, b in zip(art.loss, tail)),
            "article_val_diff": abs(art.val_loss[-1] - whole.val_loss[-1]),
            "redone": S.stop_at - r["saved_at"], "saved_at": r["saved_at"]}


def resume_figure(S: Settings, r: dict) -> go.Figure:
    whole, lab, art = r["whole"], r["lab"], r["article"]
    fig = plots.subplots(1, 2, ("training loss", "|loss − uninterrupted run's| (0 is drawn at 1e-9)"), height=380)
    fig.add_trace(go.Scatter(x=whole.step, y=whole.loss, name="uninterrupted", line=dict(color=plots.color(0))), 1, 1)
    fig.add_trace(go.Scatter(x=lab.step, y=lab.loss, name="killed, resumed from the full checkpoint",
                             line=dict(color=plots.color(1), dash="dot")), 1, 1)
    fig.add_trace(go.Scatter(x=art.step, y=art.loss, name="killed, resumed with the article's recipe",
                             line=dict(color=plots.color(3))), 1, 1)
    for i, (h, name) in enumerate(((lab, "full checkpoint"), (art, "article's recipe"))):
        ref = [whole.loss[whole.step.index(s)] for s in h.step]
        diff = [max(abs(a - b), 1e-9) for a, b in zip(h.loss, ref)]
        fig.add_trace(go.Scatter(x=h.step, y=diff, name=name, showlegend=False,
                                 line=dict(color=plots.color(1 if i == 0 else 3))), 1, 2)
    for col in (1, 2):
        fig.add_vline(x=S.stop_at, line=dict(color="grey", dash="dash"), row=1, col=col)
    fig.update_yaxes(type="log", row=1, col=2)
    fig.update_xaxes(title_text="step")
    return fig


def resume_findings(ledger: Ledger, S: Settings, r: dict) -> str:
    s = resume_stats(S, r)
    ledger.add("bitwise_losses", "Resumed from labtools.checkpoint, every training and validation loss equals the "
               "uninterrupted run's bit for bit (measured)", s["lab_losses_equal"] and s["lab_val_equal"], is_true(),
               kind="measured")
    ledger.add("bitwise_params", "… and so do the final parameters (sha256 of every tensor, measured)",
               s["lab_params_equal"], is_true(), kind="measured")
    ledger.add("article_diverges", "The article's recipe (no RNG, no data position) resumes a different run: final "
               "parameters differ (max |Δ|, measured)", s["article_param_diff"], at_least(1e-4), kind="measured")
    ledger.add("redone", f"The kill at step {S.stop_at} cost the steps since the last checkpoint (step "
               f"{s['saved_at']}): redone steps (measured from the resumed run)", s["redone"],
               approx(S.stop_at % S.every, abs=0), kind="measured")
    ledger.note("resume", s)
    return (f"Both runs died at step {S.stop_at}; the newest checkpoint was at step {s['saved_at']}, so "
            f"{s['redone']} steps were computed again. Resumed from the whole state — model, optimizer, schedule "
            "position, loss scaler, the RNG that draws dropout masks and the generator that draws batches — the run "
            "is **the same run**: every loss and every final parameter is bitwise equal "
            f"(max |Δparameter| = {s['lab_param_diff']:g}). The article's recipe saves model, optimizer and step: "
            "its resumed run draws other batches and other dropout masks, so it is a different run — losses differ "
            f"by up to {s['article_loss_diff']:.3f}, final parameters by up to {s['article_param_diff']:.2g}, the "
            f"final validation loss by {s['article_val_diff']:.4f}. Not worse on average, but not reproducible: a "
            "loss spike after a restart can no longer be told apart from a bug.")


# --- 2. crashes during a save, and corrupted files --------------------------------------------------------------------

def _context():
    """Children forked from a server that imported torch once: a killed saver restarts in milliseconds, and the
    notebook's own process (with its threads) is never forked."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["lessons.ranks.fault_tolerance"])
    return ctx


def save_seconds(numel: int, directory: Path, repeats: int = 3) -> float:
    """Median time of one labtools.checkpoint.save of a numel-float state here (write, fsync, hash, verify)."""
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
    proc = _context().Process(target=ranks.save_forever, args=(str(directory), numel, in_place), daemon=True)
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


def run_crashes(S: Settings, workdir: Path) -> dict:
    numel = S.kill_mb * 2**20 // 4
    out = {"numel": numel, "save_s": save_seconds(numel, workdir / "timing")}
    # The article's in-place save, killed mid-write: its only checkpoint is gone.
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


def crash_table(c: dict) -> go.Figure:
    rows = [("in place (the article)", "SIGKILL while torch.save wrote checkpoint.pt",
             f"{c['in_place']['bytes_on_disk']:,} of {c['in_place']['bytes_expected']:,} bytes on disk",
             c["in_place_load"][1]),
            ("labtools.checkpoint", "SIGKILL during a save", f"{c['atomic']['unfinished']} unfinished .tmp- directory",
             c["atomic_load"][1])]
    for how, (ok, msg) in c["corrupt"].items():
        rows.append(("labtools.checkpoint", f"state.pt {'cut in half' if how == 'truncate' else 'one byte flipped'}",
                     "load() verifies before unpickling", msg))
    rows.append(("labtools.checkpoint", "newest checkpoint corrupted", "latest() skips it", c["corrupt_latest"][1]))
    return plots.table(["writer", "what happened", "on disk", "what loading it gave"], rows,
                       title="Crashes and corruption", row_height=64)


def random_kills_figure(c: dict) -> go.Figure:
    ev = c["random"]
    fig = go.Figure(go.Bar(x=[e["kill"] for e in ev], y=[e["unfinished_saves"] for e in ev],
                           marker_color=[plots.color(2 if e["loads"] else 3) for e in ev],
                           hovertext=[f"latest: {e['latest']}" for e in ev], name="unfinished saves left"))
    return plots.style(fig, f"{len(ev)} SIGKILLs at random moments (green: latest() loaded)", "kill",
                       "unfinished saves it left", height=300)


def crash_findings(ledger: Ledger, S: Settings, c: dict) -> str:
    ev = c["random"]
    mid = sum(e["unfinished_saves"] > 0 for e in ev)
    ledger.add("in_place_lost", "A SIGKILL during the article's in-place torch.save leaves no loadable checkpoint "
               "(measured)", not c["in_place_load"][0], is_true(), kind="measured")
    ledger.add("atomic_kept", "The same kill during labtools.checkpoint.save: latest() falls back to the previous "
               "checkpoint, which loads (measured)", c["atomic_load"][0], is_true(), kind="measured")
    ledger.add("random_kills", f"{len(ev)} SIGKILLs at random moments: latest() loads after every one (measured)",
               sum(e["loads"] for e in ev), approx(len(ev), abs=0), kind="measured")
    if len(ev) >= MIN_KILLS:  # with fewer, none may land mid-save by chance
        ledger.add("random_mid_save", "… and some of them did land mid-save (kills that left an unfinished save)",
                   mid, at_least(1), kind="measured")
    ledger.add("corruption", "A truncated file and a flipped byte are both refused by the hash check, before "
               "unpickling (measured)", not any(ok for ok, _ in c["corrupt"].values()), is_true(), kind="measured")
    ledger.add("skip_corrupt", "latest() skips a corrupted newest checkpoint for the one before it (measured)",
               c["corrupt_latest"][0] and c["corrupt_latest"][1].endswith(checkpoint.name(1)), is_true(),
               kind="measured")
    ledger.note("save_s", c["save_s"])
    return (f"A save of {c['numel'] * 4 / 2**20:.0f} MB takes {c['save_s'] * 1e3:.0f} ms here (write, fsync, hash, "
            "read back and verify). Killed in the middle of writing in place, the article's single file was "
            f"{c['in_place']['bytes_on_disk']:,} of {c['in_place']['bytes_expected']:,} bytes and would not load: "
            "the run had nothing left to resume from. Killed in the middle of a labtools.checkpoint save, only a "
            "hidden `.tmp-` directory was lost; `latest()` named it, skipped it and returned the previous step. Of "
            f"{len(ev)} kills at random moments, {mid} landed mid-save, and after every one `latest()` returned a "
            "checkpoint that loaded. A half file and a flipped byte were refused by their sha256 before a single "
            "byte was unpickled.")


# --- 3. loading as data -----------------------------------------------------------------------------------------------

class _Payload:
    """Unpickling this object calls print(...): any callable could stand in its place (os.system, …)."""

    def __reduce__(self):
        return (print, ("this line was printed by a checkpoint file while it was being loaded",))


def pickle_with_code(path: Path) -> Path:
    torch.save({"model": {"w": torch.zeros(2)}, "note": _Payload()}, path)
    return path


def run_security(workdir: Path) -> dict:
    path = pickle_with_code(workdir / "suspicious.pt")
    return {"weights_only": try_load(lambda: torch.load(path, weights_only=True))}


def security_findings(ledger: Ledger, sec: dict) -> str:
    ok, msg = sec["weights_only"]
    ledger.add("weights_only", "torch.load(weights_only=True) refuses a checkpoint whose pickle would call a "
               "function (measured)", not ok, is_true(), kind="measured")
    return (f"`torch.load(path, weights_only=True)` on a file whose pickle calls `print`: **{msg[:220]}…** The "
            "call never ran. Without `weights_only` (the article's `torch.load(path)` on torch < 2.6) it would have: "
            "a pickle is a program, and a checkpoint downloaded from elsewhere could run anything.")


# --- 4-5. sharded checkpoints, elastic restart ------------------------------------------------------------------------

def shard_job(S: Settings, directory: Path) -> ShardJob:
    return ShardJob(n_layer=S.n_layer, n_embd=S.n_embd, block_size=S.block_size, batch_size=4, steps=S.dist_steps,
                    lr=S.lr, seed=S.seed, directory=str(directory))


def elastic_job(S: Settings, directory: Path, kill: bool) -> ElasticJob:
    return ElasticJob(n_layer=S.n_layer, n_embd=S.n_embd, block_size=S.block_size, batch_size=4,
                      steps=S.elastic_steps, lr=S.lr, seed=S.seed, directory=str(directory),
                      every=max(1, S.elastic_steps // 4), kill_at=S.kill_at if kill else 0)


def run_sharded(S: Settings, workdir: Path) -> dict:
    d = workdir / "dcp"
    d.mkdir()
    saved = launch(ranks.sharded_save, S.save_world, shard_job(S, d), desc=f"FSDP × {S.save_world}: train, save",
                   timeout_s=None)
    loaded = launch(ranks.sharded_load, S.load_world, shard_job(S, d), desc=f"FSDP × {S.load_world}: load",
                    timeout_s=None)
    return {"saved": saved, "loaded": loaded}


def run_elastic(S: Settings, workdir: Path) -> dict:
    out = {}
    for kill in (False, True):
        d = workdir / f"elastic_{'killed' if kill else 'whole'}"
        d.mkdir()
        out["killed" if kill else "whole"] = launch(
            ranks.elastic, 2, elastic_job(S, d, kill), max_restarts=1 if kill else 0, timeout_s=None,
            desc="DDP × 2, rank 1 killed" if kill else "DDP × 2, uninterrupted")
    return out


def sharded_findings(ledger: Ledger, S: Settings, sh: dict) -> str:
    s, ld = sh["saved"][0], sh["loaded"][0]
    ledger.add("reshard_model", f"Saved at {S.save_world} ranks, loaded at {S.load_world}: the whole model is bitwise "
               "the saved one (sha256 of the gathered tensors, measured)", s["model_digest"] == ld["model_digest"],
               is_true(), kind="measured")
    ledger.add("reshard_optim", "… and so is the optimizer state (measured)", s["optim_digest"] == ld["optim_digest"],
               is_true(), kind="measured")
    ledger.add("one_file_per_rank", f"DCP wrote one shard file per saving rank ({S.save_world}) plus .metadata "
               "(counted)", len([f for f in s["files"] if f.endswith(".distcp")]), approx(S.save_world, abs=0),
               kind="measured")
    blocking = float(np.median([r["blocking_s"] for r in sh["saved"]]))
    ret = float(np.median([r["async_return_s"] for r in sh["saved"]]))
    done = float(np.median([r["async_done_s"] for r in sh["saved"]]))
    ledger.note("dcp_seconds", {"blocking": blocking, "async_return": ret, "async_done": done})
    return (f"Each of {S.save_world} ranks wrote only its own shards ({', '.join(s['files'])}); the coordinator wrote "
            f".metadata last — the map from every tensor's global layout to the slices in each file. {S.load_world} "
            "ranks then asked for *their* slices under the new layout, and the gathered model and optimizer state "
            "were bitwise the saved ones; training went on from there "
            f"(next loss {ld['next_loss']:.3f}). Timed here (one run, median over ranks): blocking `dcp.save` "
            f"{blocking * 1e3:.0f} ms; `dcp.async_save` returned after {ret * 1e3:.0f} ms and finished after "
            f"{done * 1e3:.0f} ms. At this size the fixed costs dominate; at scale the gap is the point: PyTorch "
            "reported 148.8 s blocking against a 6.3 s stall with async saves for a large distributed model (their "
            "async DCP blog post) — the section below turns that into lost hours.")


def elastic_figure(el: dict) -> go.Figure:
    whole, killed = el["whole"][0], el["killed"][0]
    fig = go.Figure([go.Scatter(x=list(range(1, len(whole["losses"]) + 1)), y=whole["losses"], name="uninterrupted",
                                line=dict(color=plots.color(0))),
                     go.Scatter(x=list(range(1, len(killed["losses"]) + 1)), y=killed["losses"],
                                name=f"rank 1 killed, restarted {killed['restarts']}×",
                                line=dict(color=plots.color(1), dash="dot"))])
    fig.add_vline(x=killed["resumed_from"], line=dict(color="grey", dash="dash"),
                  annotation_text=f"resumed from step {killed['resumed_from']}")
    return plots.style(fig, "Elastic DDP: a rank SIGKILLed, torchrun restarts the group", "step", "training loss")


def elastic_findings(ledger: Ledger, S: Settings, el: dict) -> str:
    whole, killed = el["whole"], el["killed"]
    ledger.add("elastic_restarts", "torchrun restarted the group once after the SIGKILL (each rank's restart count, "
               "measured)", min(r["restarts"] for r in killed), approx(1, abs=0), kind="measured")
    ledger.add("elastic_bitwise", "The restarted run's final parameters and every loss equal the uninterrupted run's "
               "bitwise (measured)", killed[0]["digest"] == whole[0]["digest"]
               and killed[0]["losses"] == whole[0]["losses"], is_true(), kind="measured")
    every = max(1, S.elastic_steps // 4)
    return (f"Rank 1 killed itself with SIGKILL before step {S.kill_at} — no Python error, no message, as the OOM "
            "killer or a failed GPU would do it. torchrun saw it, stopped rank 0, and started both again "
            f"(`launch(..., max_restarts=1)`; restart count {killed[0]['restarts']}). The new ranks found the "
            f"checkpoint of step {killed[0]['resumed_from']} (one every {every} steps), resumed, and finished with "
            "parameters bitwise equal to the uninterrupted run's. The failed attempt's errors did not fail the run "
            "that later succeeded, and no process was left behind (tests/test_dist.py checks both).")


# --- 6. how often to save -------------------------------------------------------------------------------------------

def waste(interval_s: float, save_s: float, mtbf_s: float, restart_s: float = 0.0) -> dict:
    """First-order expected waste per unit of time (Young 1974): saving (δ/τ), work lost since the last save
    (τ/2 per failure) and the restart, per failure (÷ MTBF). Fractions of the run's time."""
    return {"saving": save_s / interval_s, "lost work": interval_s / 2 / mtbf_s, "restart": restart_s / mtbf_s}


def young_interval(save_s: float, mtbf_s: float) -> float:
    """The interval that minimises waste(): √(2·δ·MTBF)."""
    return math.sqrt(2 * save_s * mtbf_s)


def case_rows() -> list[dict]:
    rows = []
    for name, c in CASES.items():
        tau = c["interval_s"] or young_interval(c["save_s"], c["mtbf_s"])
        w = waste(tau, c["save_s"], c["mtbf_s"])
        rows.append(dict(name=name, save_s=c["save_s"], mtbf_h=c["mtbf_s"] / HOUR, interval_min=tau / 60,
                         saving=w["saving"], lost=w["lost work"], total=w["saving"] + w["lost work"]))
    return rows


def interval_figure(save_s: float, mtbf_h: float, interval_min: float, restart_min: float) -> go.Figure:
    mtbf = mtbf_h * HOUR
    taus = np.geomspace(max(save_s, 1.0), 48 * HOUR, 200)
    parts = [waste(t, save_s, mtbf, restart_min * 60) for t in taus]
    fig = go.Figure()
    for i, key in enumerate(("saving", "lost work", "restart")):
        fig.add_trace(go.Scatter(x=taus / 60, y=[100 * p[key] for p in parts], name=key, stackgroup="w",
                                 line=dict(color=plots.color(i))))
    best = young_interval(save_s, mtbf)
    mine = waste(interval_min * 60, save_s, mtbf, restart_min * 60)
    fig.add_vline(x=best / 60, line=dict(color="black", dash="dash"),
                  annotation_text=f"√(2δ·MTBF) = {best / 60:.1f} min")
    fig.add_vline(x=interval_min, line=dict(color="crimson"),
                  annotation_text=f"yours: {100 * sum(mine.values()):.1f}% wasted", annotation_position="bottom right")
    plots.style(fig, f"Expected waste, δ = {save_s:g} s, MTBF = {mtbf_h:g} h", "checkpoint interval (min)",
                "% of the run's time")
    fig.update_xaxes(type="log")
    fig.update_yaxes(range=[0, 60])
    return fig


def interval_panel(save_s: float) -> Panel:
    controls = {"save_s": slider(round(save_s, 3), 0.01, 600.0, log=True, description="save time δ (s)"),
                "mtbf_h": slider(3.0, 0.1, 200.0, log=True, description="MTBF (h)"),
                "interval_min": slider(30.0, 0.1, 1440.0, log=True, description="interval (min)"),
                "restart_min": slider(10.0, 0.0, 60.0, description="restart (min)")}
    return Panel(interval_figure, controls, debounce_ms=0, title="How often to save")


def cases_table(rows: list[dict]) -> go.Figure:
    body = [[r["name"], f"{r['save_s']:g}", f"{r['mtbf_h']:.2f}", f"{r['interval_min']:.1f}",
             f"{100 * r['saving']:.2f}%", f"{100 * r['lost']:.2f}%", f"{100 * r['total']:.2f}%"] for r in rows]
    return plots.table(["case", "save δ (s)", "MTBF (h)", "interval (min)", "saving", "lost work", "total"], body,
                       title="Published cases (computed; restart time left out)", row_height=30)


def interval_findings(ledger: Ledger, rows: list[dict], save_s: float) -> str:
    by = {r["name"]: r for r in rows}
    bloom, block, asyn = (by[n] for n in CASES)
    ledger.add("bloom_overhead", "BLOOM: a 40 s save every 3 h costs 0.37% of training time (computed, as published)",
               100 * bloom["saving"], approx(0.37, abs=0.005), kind="computed")
    ledger.add("mtbf", "Llama 3: 419 interruptions in 54 days = one every ~3.1 h (computed)", bloom["mtbf_h"],
               approx(3.09, abs=0.01), kind="computed")
    taus = np.geomspace(1, 48 * HOUR, 20001)
    numeric = taus[np.argmin([sum(waste(t, 148.8, LLAMA3_MTBF_S).values()) for t in taus])]
    ledger.add("young", "√(2δ·MTBF) is the interval a brute-force search over the waste model finds (computed; "
               "ratio)", numeric / young_interval(148.8, LLAMA3_MTBF_S), approx(1.0, abs=0.002), kind="computed")
    ledger.add("async_gain", "Async saves cut the best total waste from blocking's (computed, ratio blocking ÷ "
               "async = √(148.8/6.3))", block["total"] / asyn["total"], approx(math.sqrt(148.8 / 6.3), rel=1e-6),
               kind="computed")
    here = young_interval(save_s, LLAMA3_MTBF_S)
    ledger.note("interval_here_s", here)
    return (f"With a failure every {bloom['mtbf_h']:.1f} h (Llama 3's rate), a blocking 148.8 s save is best "
            f"every {block['interval_min']:.0f} min and still wastes {100 * block['total']:.1f}% of the run; a 6.3 s "
            f"async stall is best every {asyn['interval_min']:.1f} min and wastes {100 * asyn['total']:.1f}%. BLOOM's "
            f"40 s every 3 h is {100 * bloom['saving']:.2f}% for saving; at Llama 3's failure rate a 3 h interval "
            "would be far too long (the first-order model, valid for intervals well below the MTBF, puts the redone "
            f"work near {100 * bloom['lost']:.0f}% of the run) — the right interval depends on the failure rate, not "
            f"only on the save time. This machine's measured δ ({save_s * 1e3:.0f} ms for the lesson's killed saver) "
            f"would call for a save every {here:.0f} s at the same MTBF.")


# --- 7. exercises ---------------------------------------------------------------------------------------------------

def exercises(ledger: Ledger) -> list[Exercise]:
    tau = young_interval(60.0, 6 * HOUR)
    w = sum(waste(tau, 60.0, 6 * HOUR).values())
    lost_steps = 137 % 50
    ledger.note("exercise_interval_min", tau / 60)

    return [
        Exercise("The interval", "A save stalls training for 60 s and the cluster fails every 6 h on average. How "
                 "often should you save (minutes), and what share of the run is wasted (%), restart left out?",
                 {"minutes": "interval (min)", "percent": "waste (%)"},
                 answer_check({"minutes": tau / 60, "percent": 100 * w}, rel=0.02),
                 f"τ = √(2·60·21600) s = **{tau / 60:.1f} min**; waste = δ/τ + τ/(2·MTBF) = **{100 * w:.2f}%** "
                 "(the two halves are equal at the optimum)."),
        Exercise("Redone work", "Checkpoints every 50 steps, the first at step 50. A rank dies during step 137. How "
                 "many steps are computed twice?", {"steps": "steps"}, answer_check({"steps": lost_steps}, rel=0.02),
                 f"The newest checkpoint is step 100 (saved after 100 steps); steps 100–136 ran and are lost: "
                 f"**{lost_steps}**. A kill in the middle of the save of step 150 would lose 50 — and with the "
                 "article's in-place save, everything."),
    ]


def workdir() -> tempfile.TemporaryDirectory:
    """A directory for the lesson's checkpoints, deleted when the notebook's kernel ends (or .cleanup())."""
    return tempfile.TemporaryDirectory(prefix="lab-11-")

