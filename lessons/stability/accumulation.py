"""Lesson 03, section 2: gradient accumulation, its classic bug, and normalising by tokens."""

from dataclasses import dataclass

import numpy as np
import plotly.graph_objects as go
import torch
import torch.nn.functional as F
from plotly.subplots import make_subplots

from labtools import plots
from labtools.claims import Findings, Ledger, at_least, at_most
from labtools.device import pick_device
from labtools.schedules import bind, warmup_cosine
from labtools.train import History, TrainConfig, train
from lessons.stability import Settings, build, corpus


def accumulation_gradients(S: Settings) -> float:
    """max |g_accumulated − g_full| after one step: k micro-batches of B/k vs one batch of B (no clipping)."""
    text = corpus()
    X, Y = text.batch("train", S.batch_size, S.block_size, torch.Generator().manual_seed(S.seed), pick_device())
    B = S.batch_size // S.accum_k
    grads = {}
    for k, micro_b in ((1, S.batch_size), (S.accum_k, B)):
        model, opt = build(S, "AdamW", S.adamw_lr)
        captured = []
        cfg = TrainConfig(steps=1, batch_size=micro_b, block_size=S.block_size, accum_steps=k, grad_clip=None,
                          eval_batches=1, progress=False, seed=S.seed)
        train(model, text, cfg, optimizer=opt,
              batch_fn=lambda step, m, b=micro_b: (X[m * b:(m + 1) * b], Y[m * b:(m + 1) * b]),
              callback=lambda info: captured.extend(p.grad.clone() for p in info.model.parameters()))
        grads[k] = captured
    return max((a - b).abs().max().item() for a, b in zip(grads[1], grads[S.accum_k]))


def accum_run(S: Settings, optimizer: str, lr: float, normalize: bool, clip: float | None) -> History:
    text = corpus()
    model, opt = build(S, optimizer, lr)
    cfg = TrainConfig(steps=S.accum_steps, batch_size=S.batch_size // S.accum_k, block_size=S.block_size,
                      accum_steps=S.accum_k, accum_normalize=normalize, grad_clip=clip,
                      lr_schedule=bind(warmup_cosine, warmup=S.accum_steps // 10, total=S.accum_steps, min_ratio=0.1),
                      eval_every=max(1, S.accum_steps // 5), eval_batches=10, seed=S.seed,
                      desc=f"{optimizer} lr={lr:g} {'mean' if normalize else 'SUM'} clip={clip}")
    return train(model, text, cfg, optimizer=opt)


@dataclass(frozen=True)
class Arm:
    """One run of the accumulation experiment: its key in the results; label() is what a reader sees."""
    optimizer: str             # "SGD" (momentum 0.9) or "AdamW"
    summed: bool = False       # the bug: micro-batch losses summed instead of averaged
    lr_times_k: bool = False   # SGD's learning rate × k: what summing amounts to
    clip: float | None = None  # clip the global gradient norm at this

    def label(self, k: int) -> str:
        return (f"{self.optimizer} · {'sum (bug)' if self.summed else 'mean'}"
                + (f", η × {k}" if self.lr_times_k else "") + (f" · clip {self.clip:g}" if self.clip else ""))


SGD_MEAN, SGD_SUM, SGD_MEAN_LR_K = Arm("SGD"), Arm("SGD", summed=True), Arm("SGD", lr_times_k=True)
ADAMW_MEAN, ADAMW_SUM = Arm("AdamW"), Arm("AdamW", summed=True)
ADAMW_MEAN_CLIP, ADAMW_SUM_CLIP = Arm("AdamW", clip=1.0), Arm("AdamW", summed=True, clip=1.0)


def accumulation_bug(S: Settings) -> dict[Arm, History]:
    """The bug (micro-batch losses summed, not averaged) under SGD and under AdamW, with the controls."""
    k = S.accum_k
    arms = (SGD_MEAN, SGD_SUM, SGD_MEAN_LR_K, ADAMW_MEAN, ADAMW_SUM, ADAMW_MEAN_CLIP, ADAMW_SUM_CLIP)
    def lr(a: Arm) -> float:  # SGD at lr/k: summing k losses then amounts to SGD's own lr
        return S.adamw_lr if a.optimizer == "AdamW" else (S.sgd_lr if a.lr_times_k else S.sgd_lr / k)

    return {a: accum_run(S, a.optimizer, lr(a), not a.summed, a.clip) for a in arms}


def figure(runs: dict[Arm, History], k: int) -> go.Figure:
    fig = make_subplots(rows=1, cols=2, subplot_titles=("SGD + momentum", "AdamW"))
    for i, (arm, h) in enumerate(runs.items()):
        col = 1 if arm.optimizer == "SGD" else 2
        dash = "dash" if arm.summed else ("dot" if arm.lr_times_k else "solid")
        fig.add_trace(go.Scatter(x=h.step, y=h.loss, mode="lines", name=arm.label(k),
                                 line=dict(color=plots.color(i), dash=dash, width=1.5)), row=1, col=col)
    fig.update_xaxes(title_text="step")
    fig.update_yaxes(title_text="training loss", row=1, col=1)
    plots.style(fig, "Accumulated losses summed instead of averaged: what it does to SGD and to AdamW", height=400)
    return fig


def clipped_fraction(h: History, clip: float = 1.0) -> float:
    return float(np.mean(np.array(h.grad_norm) > clip))


IGNORE = -100  # F.cross_entropy's ignore_index: a padded position's target


def token_normalization(S: Settings) -> dict:
    """Accumulation when micro-batches hold different numbers of real tokens (the rest padding, targets ignored):
    the gradient of the mean loss over every real token of the batch (one pass: the reference) against dividing
    each micro-batch's mean loss by k (a common tutorial loop, and the accumulation bug fixed across libraries in 2024)
    and against summing token losses and dividing by the batch's real-token count (the fix)."""
    text = corpus()
    model, _ = build(S, "AdamW", S.adamw_lr)
    X, Y = text.batch("train", S.batch_size, S.block_size, torch.Generator().manual_seed(S.seed), pick_device())
    k, rows = S.accum_k, S.batch_size // S.accum_k
    Y = Y.clone()
    for i in range(k):  # micro-batch i keeps (i + 1)/k of each row's targets: unequal real-token counts
        Y[i * rows:(i + 1) * rows, max(1, S.block_size * (i + 1) // k):] = IGNORE
    micro = [(X[i * rows:(i + 1) * rows], Y[i * rows:(i + 1) * rows]) for i in range(k)]
    total = int((Y != IGNORE).sum())

    def grads(step) -> torch.Tensor:
        model.zero_grad(set_to_none=True)
        step()
        return torch.cat([p.grad.flatten() for p in model.parameters()])

    def mean_of_means():
        for x, y in micro:
            (model(x, y)[1] / k).backward()

    def token_sum():
        for x, y in micro:
            logits, _ = model(x)
            F.cross_entropy(logits.view(-1, logits.size(-1)), y.reshape(-1), ignore_index=IGNORE,
                            reduction="sum").div(total).backward()

    ref = grads(lambda: model(X, Y)[1].backward())
    bug, fix = grads(mean_of_means), grads(token_sum)
    rel = lambda g: ((g - ref).norm() / ref.norm()).item()  # noqa: E731
    return {"tokens": [int((y != IGNORE).sum()) for _, y in micro], "total": total, "bug_rel_error": rel(bug),
            "fix_rel_error": rel(fix), "cosine_bug": F.cosine_similarity(bug, ref, 0).item()}


def token_findings(ledger: Ledger, S: Settings, t: dict) -> Findings:
    ledger.add("token_bug", "Micro-batches with unequal real-token counts: dividing each micro-batch's mean loss by G "
               "gives a different gradient from the batch's (relative error ‖Δg‖/‖g‖, measured)", t["bug_rel_error"],
               at_least(0.01), kind="measured")
    ledger.add("token_fix", "Summing token losses and dividing by the batch's real-token count gives the batch's "
               "gradient (relative error, measured)", t["fix_rel_error"], at_most(1e-5), kind="measured")
    return Findings([
        f"Dividing each micro-batch's *mean* loss by G gave a gradient off by **{t['bug_rel_error']:.0%}** of its "
        "norm: a token in a short micro-batch weighed more than one in a long micro-batch.",
        f"Summing the token losses and dividing by the batch's real-token count gave the batch's own gradient (off by "
        f"{t['fix_rel_error']:.0e}).",
    ], [
        f"The micro-batches held from {min(t['tokens']):,} to {max(t['tokens']):,} real tokens, {t['total']:,} in all; "
        "the rest was padding, whose targets the loss ignores.",
    ])


def findings(ledger: Ledger, S: Settings, runs: dict[Arm, History], max_grad_diff: float) -> Findings:
    k = S.accum_k
    v = {n: h.final_val_loss for n, h in runs.items()}
    same = max(abs(a - b) for a, b in zip(runs[SGD_SUM].loss, runs[SGD_MEAN_LR_K].loss))
    early = max(abs(a - b) for a, b in zip(runs[ADAMW_SUM].loss[:5], runs[ADAMW_MEAN].loss[:5]))
    clipped = {a: clipped_fraction(runs[a]) for a in (ADAMW_SUM_CLIP, ADAMW_MEAN_CLIP)}
    ledger.add("accum_equal", f"G = {k} micro-batches ≡ one batch: max gradient difference", max_grad_diff,
               at_most(1e-6), kind="measured")
    ledger.add("sgd_sum_is_lr_k", f"SGD: summing the micro-batch losses is exactly η × G, G = {k} (max |Δ loss| over "
               "the run)", same, at_most(1e-3), kind="measured")
    apart = max(abs(a - b) for a, b in zip(runs[SGD_SUM].val_loss, runs[SGD_MEAN].val_loss))
    ledger.add("sgd_sum_differs", "SGD: summing instead of averaging changes the run (max |Δ val| over the run, "
               "summed vs averaged: the final values alone can cross)", apart, at_least(0.02), kind="measured")
    ledger.add("adam_sum_harmless", "AdamW without clipping: summed and averaged runs take the same steps "
               "(max |Δ loss| over the first 5 steps, before rounding differences compound)", early, at_most(1e-5),
               kind="measured")
    ledger.add("adam_sum_clips", "AdamW with clipping: the bug makes clipping fire on more steps (fraction clipped, "
               "sum − mean)", clipped[ADAMW_SUM_CLIP] - clipped[ADAMW_MEAN_CLIP], at_least(0.2),
               kind="measured")
    ledger.note("accum_final_val", {a.label(k): x for a, x in v.items()})
    table = ("| run | final validation loss | steps clipped |\n|---|---|---|\n"
             + "\n".join(f"| {a.label(k)} | {x:.3f} | {f'{clipped[a]:.0%}' if a in clipped else '—'} |"
                         for a, x in v.items()))
    return Findings([
        f"Yes: G micro-batches, each loss divided by G, gave the big batch's gradient to within **{max_grad_diff:.0e}**.",
        "Forgetting the division is exactly a G× learning rate under SGD, as the warning says: the two runs' losses "
        "match step for step.",
        f"Under AdamW it changes almost nothing by itself, since Adam divides out the gradient's scale; with clipping, the "
        f"bug makes clipping fire on **{clipped[ADAMW_SUM_CLIP]:.0%}** of steps instead of "
        f"{clipped[ADAMW_MEAN_CLIP]:.0%}.",
    ], [
        table,
        f"G = {k} micro-batches against one batch of {S.batch_size} sequences: gradients equal to "
        f"{max_grad_diff:.1e}.",
        f"SGD summed against SGD averaged at η × G: losses equal to {same:.1e} over the whole run.",
        f"AdamW summed against averaged, no clipping: losses equal to {early:.0e} over the first 5 steps; after that "
        "they drift apart, since ε weighs G times less in the summed run and training amplifies the difference.",
        "Reading the table: clipping changes AdamW's run by itself (its two averaged rows, without and with "
        "clipping); the bug's own effect is the gap between the two clipped rows, averaged and summed.",
    ])
