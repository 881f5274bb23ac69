"""Lesson 11, train with yours: a training run that checkpoints with the learner's atomic save, SIGKILLed at
random steps and restarted from whatever the kill left, against the same run uninterrupted. Each run is a child of
the lesson's forkserver (the same threads and code either way), so an intact chain of checkpoints gives the same
weights bit for bit.

The checkpoint is the whole state a step depends on (section 1): model, optimizer, the step, the random-number
state that draws dropout masks, and the losses so far; batches are drawn from a generator seeded by the step. It is
serialised with torch.save into bytes, and your function writes those bytes; it is read back with weights_only."""

import io
import os
import random
import signal
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from labtools.config import build_gpt, global_batch
from labtools.data import Corpus, text
from labtools.exercises import YOURS_NOT_WRITTEN, Outcome
from labtools.learner import is_stub, load_function, source_of
from lessons.fault_tolerance import Settings

TIMEOUT_S = 60  # one child's run, at most


def _publish(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def train_saving(S: Settings, source: str | None, name: str, directory: str, corpus: Corpus) -> None:
    """Run in a child: train S.steps steps, resuming from directory/checkpoint.pt if there is one; every S.every
    steps save the whole state with the learner's function (source None: no saving). Publishes the step reached
    (directory/step) and, at the end, the final weights and losses (directory/final.pt)."""
    torch.set_num_threads(1)  # the same in every child: the same sums, bit for bit
    d = Path(directory)
    save = load_function(source, name, {"os": os, "tempfile": tempfile, "Path": Path}) if source else None
    model = build_gpt(S, dropout=0.1)  # dropout: every step draws random numbers
    opt = torch.optim.AdamW(model.parameters(), lr=S.lr, betas=(0.9, 0.95), weight_decay=0.1)
    step, losses = 0, []
    ckpt = d / "checkpoint.pt"
    if ckpt.exists():
        try:
            state = torch.load(io.BytesIO(ckpt.read_bytes()), weights_only=True)
        except Exception as e:  # noqa: BLE001 - what the learner's save left is reported, not raised in a child
            _publish(d / "error", f"{type(e).__name__}: {str(e).splitlines()[0].split('. ')[0][:160]}")
            return
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["rng"])
        step, losses = state["step"], state["losses"]
    _publish(d / "resumed", str(step))
    while step < S.steps:
        X, Y = global_batch(S, torch.Generator().manual_seed(S.seed * 1_000_003 + step), S.batch_size, corpus)
        _, loss = model(X, Y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        losses.append(loss.item())
        if save is not None and step % S.every == 0:
            buf = io.BytesIO()
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "rng": torch.get_rng_state(),
                        "step": step, "losses": losses}, buf)
            save(str(ckpt), buf.getvalue())
        _publish(d / "step", str(step))
    out = io.BytesIO()
    torch.save({"model": model.state_dict(), "losses": losses}, out)
    (d / "final.tmp").write_bytes(out.getvalue())
    os.replace(d / "final.tmp", d / "final.pt")


def _run(S: Settings, fn, directory: Path, kill_at: int | None) -> dict:
    """One child: until it ends, or SIGKILLed once it has published step kill_at. Returns where it resumed from, and
    whether it finished."""
    directory.mkdir(parents=True, exist_ok=True)
    for name in ("step", "resumed", "error"):
        (directory / name).unlink(missing_ok=True)
    from lessons.fault_tolerance.crashes import context
    args = (S, source_of(fn) if fn else None, fn.__name__ if fn else "", str(directory), text())
    proc = context().Process(target=train_saving, args=args, daemon=True)
    proc.start()
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while proc.is_alive() and time.monotonic() < deadline:
            if kill_at is not None and _read(directory / "step") >= kill_at:
                os.kill(proc.pid, signal.SIGKILL)
                break
            time.sleep(0.001)
        proc.join(timeout=TIMEOUT_S)
    finally:
        if proc.is_alive():
            proc.kill()
        proc.join()
    error = directory / "error"
    return {"resumed": _read(directory / "resumed"), "exitcode": proc.exitcode,
            "finished": (directory / "final.pt").exists(), "error": error.read_text() if error.exists() else ""}


def _read(path: Path) -> int:
    try:
        return int(path.read_text())
    except (OSError, ValueError):
        return -1


@dataclass(frozen=True)
class SavedRun:
    """The run that saved with your function and was killed, beside the same run uninterrupted."""
    outcome: Outcome
    kills: list[int] | None = None     # the steps after which each SIGKILL landed
    resumed: list[int] | None = None   # the step each restart resumed from
    losses: list[float] | None = None  # the surviving run's loss per step
    reference: list[float] | None = None
    difference: float | None = None    # max |weight difference| at the end

    def _repr_html_(self) -> str:
        return self.outcome._repr_html_()

    def figure(self):
        from labtools import plots
        from labtools.exercises import losses_history
        fig = plots.loss_curves({"uninterrupted": losses_history(self.reference),
                                 "killed and resumed from your checkpoints": losses_history(self.losses)},
                                val=False, title="Killed and resumed from your saves: the same curve")
        for k in self.kills:
            fig.add_vline(x=k, line=dict(color="#cf222e", dash="dot", width=1))
        return fig

    def show(self) -> None:
        from IPython.display import display
        display(self)
        if self.losses:
            self.figure().show()


def train_with_yours(fn, S: Settings, workdir, kills: int = 3, seed: int = 0) -> SavedRun:
    """Train with checkpoints written by your save, SIGKILL the run `kills` times at random steps after its first
    checkpoint, restart it each time from what the kill left, and compare its final weights with the same run made
    without a kill."""
    if is_stub(fn):
        return SavedRun(Outcome("not written", YOURS_NOT_WRITTEN))
    base = Path(workdir) / "train-with-yours"
    ref = _run(S, None, base / "uninterrupted", None)
    if not ref["finished"]:
        return SavedRun(Outcome("fail", f"the uninterrupted run did not finish (exit code {ref['exitcode']})"))
    rng = random.Random(seed)
    at = sorted(rng.sample(range(S.every + 1, S.steps), min(kills, S.steps - S.every - 1)))
    d = base / "yours"
    resumed = []
    for i, k in enumerate(at + [None]):
        r = _run(S, fn, d, k)
        resumed.append(r["resumed"])
        if i == 0:
            continue
        killed, saved = at[i - 1], at[i - 1] // S.every * S.every  # the newest checkpoint saved before the kill
        if r["resumed"] < 0:
            why = f" ({r['error']})" if r["error"] else f" (it stopped with exit code {r['exitcode']})"
            return SavedRun(Outcome("fail", f"after the SIGKILL at step {killed} the restarted run could not load "
                                            f"the checkpoint your save left{why}"), at, resumed)
        if r["resumed"] < saved:
            return SavedRun(Outcome("fail", f"after the SIGKILL at step {killed} the restarted run found the "
                                            f"checkpoint of step {r['resumed']}, though step {saved}'s had been "
                                            "saved: your save did not leave it where it was asked to"), at, resumed)
    if not r["finished"]:
        return SavedRun(Outcome("fail", f"the last restart did not finish (exit code {r['exitcode']})"), at, resumed)
    mine = torch.load(d / "final.pt", weights_only=True)
    theirs = torch.load(base / "uninterrupted" / "final.pt", weights_only=True)
    diff = max((a - b).abs().max().item() for a, b in zip(mine["model"].values(), theirs["model"].values()))
    run = dict(kills=at, resumed=resumed[1:], losses=mine["losses"], reference=theirs["losses"], difference=diff)
    if diff != 0:
        return SavedRun(Outcome("fail", f"the run killed {len(at)} times ends {diff:.1e} away from the uninterrupted "
                                        "one: a checkpoint it resumed from was not the state it saved"), **run)
    return SavedRun(Outcome("pass", f"killed {len(at)} times and resumed each time from the checkpoint your save "
                                    "left, the run ended with the same weights as the uninterrupted one, bit for bit",
                            0.0), **run)
