"""Lesson 11, section 1: resuming — the complete state against a recipe that saves only part of it."""

from pathlib import Path

import plotly.graph_objects as go
import torch

from labtools import checkpoint, plots
from labtools.claims import Findings, Ledger, approx, at_least, is_true
from labtools.config import build_gpt
from labtools.data import text
from labtools.model import GPT
from labtools.optim import param_groups
from labtools.schedules import bind, warmup_cosine
from labtools.train import TrainConfig, train
from lessons.fault_tolerance import Settings


def model(S: Settings) -> GPT:
    return build_gpt(S, dropout=0.1)  # dropout: the run draws random numbers every step


def train_config(S: Settings, **changes) -> TrainConfig:
    kw = dict(steps=S.steps, batch_size=S.batch_size, lr=S.lr, seed=S.seed, eval_every=S.every,
              lr_schedule=bind(warmup_cosine, warmup=S.steps // 10, total=S.steps), desc="train")
    return TrainConfig(**(kw | changes))


def article_save(path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, step: int) -> None:
    """The tutorial recipe's save: model, optimizer and step, written in place (no RNG, no data position)."""
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}, path)


def article_resume(path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """The tutorial recipe's resume (with weights_only=True, which it lacks: see section 3)."""
    ckpt = torch.load(path, weights_only=True)
    model.load_state_dict(ckpt["model"])
    optimizer.load_state_dict(ckpt["optimizer"])
    return ckpt["step"]


def run(S: Settings, workdir: Path) -> dict:
    """Three runs of the same training: uninterrupted; killed at stop_at and resumed from labtools.checkpoint;
    killed at stop_at and resumed with the tutorial recipe. Returns their histories and final parameters."""
    data = text()
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


def figure(S: Settings, r: dict) -> go.Figure:
    whole, lab, art = r["whole"], r["lab"], r["article"]
    def same(h):
        return all(a == whole.loss[whole.step.index(s)] for a, s in zip(h.loss, h.step))
    title = ("Resumed from the full checkpoint, the run " + ("is the uninterrupted one" if same(lab) else "drifts")
             + "; with the tutorial recipe it " + ("is too" if same(art) else "drifts"))
    fig = plots.subplots(1, 2, ("training loss", "|loss − uninterrupted run's| (0 is drawn at 1e-9)"), title=title,
                         height=380)
    fig.add_trace(go.Scatter(x=whole.step, y=whole.loss, name="uninterrupted", line=dict(color=plots.color(0))), 1, 1)
    fig.add_trace(go.Scatter(x=lab.step, y=lab.loss, name="killed, resumed from the full checkpoint",
                             line=dict(color=plots.color(1), dash="dot")), 1, 1)
    fig.add_trace(go.Scatter(x=art.step, y=art.loss, name="killed, resumed with the tutorial recipe",
                             line=dict(color=plots.color(3))), 1, 1)
    for i, (h, name) in enumerate(((lab, "full checkpoint"), (art, "tutorial recipe"))):
        ref = [whole.loss[whole.step.index(s)] for s in h.step]
        diff = [max(abs(a - b), 1e-9) for a, b in zip(h.loss, ref)]
        fig.add_trace(go.Scatter(x=h.step, y=diff, name=name, showlegend=False,
                                 line=dict(color=plots.color(1 if i == 0 else 3))), 1, 2)
    for col in (1, 2):
        fig.add_vline(x=S.stop_at, line=dict(color="grey", dash="dash"), row=1, col=col)
    fig.update_yaxes(type="log", row=1, col=2)
    fig.update_xaxes(title_text="step")
    return fig


def findings(ledger: Ledger, S: Settings, r: dict) -> Findings:
    s = resume_stats(S, r)
    ledger.add("bitwise_params", "Resumed from the lab's checkpoint, the run is the uninterrupted one: every "
               "training and validation loss and every final parameter bitwise equal (sha256 of every tensor, "
               "measured)", s["lab_losses_equal"] and s["lab_val_equal"] and s["lab_params_equal"], is_true(),
               kind="measured")
    ledger.add("tutorial_diverges", "The tutorial recipe (no RNG, no data position) resumes a different run: final "
               "parameters differ (the largest difference of any parameter, measured)", s["article_param_diff"], at_least(1e-4), kind="measured")
    ledger.add("redone", f"The stop at step {S.stop_at} cost the steps since the last checkpoint (step "
               f"{s['saved_at']}): redone steps (measured from the resumed run)", s["redone"],
               approx(S.stop_at % S.every, abs=0), kind="measured", detail=True)
    ledger.note("resume", s)
    same = s["lab_losses_equal"] and s["lab_val_equal"] and s["lab_params_equal"]
    return Findings([
        ("Yes, if the checkpoint holds everything a step depends on: resumed from the lab's checkpoint, every loss "
         "and every final parameter is bitwise the uninterrupted run's." if same else
         f"Not here: resumed from the lab's checkpoint, the run differs from the uninterrupted one by up to "
         f"**{s['lab_param_diff']:.2g}** in its parameters."),
        "No, with the tutorial recipe: without the random-number states and the data position it drew other batches "
        f"and dropout masks, and its final parameters ended up to **{s['article_param_diff']:.2g}** away.",
    ], [
        f"Both runs stopped at step {S.stop_at}; the newest checkpoint was at step {s['saved_at']}, so {s['redone']} "
        "steps were computed again.",
        f"The tutorial recipe's losses differed by up to {s['article_loss_diff']:.3f}, its final validation loss by "
        f"{s['article_val_diff']:.4f}.",
    ])
