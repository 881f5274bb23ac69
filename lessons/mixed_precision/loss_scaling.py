"""Lesson 04, section 4: loss scaling in a real run — none, static and dynamic (ours and GradScaler)."""

import math

import numpy as np
import plotly.graph_objects as go
import torch
import torch.nn as nn
import torch.nn.functional as F
from plotly.subplots import make_subplots

from labtools import plots
from labtools.claims import Findings, Ledger, approx, at_least, at_most, between
from labtools.device import pick_device
from labtools.keys import Key
from labtools.model import GPT
from labtools.precision import DynamicLossScaler
from labtools.train import History, StepInfo, TrainConfig, train
from lessons.mixed_precision import Settings, build, corpus


class _ShrinkGrad(torch.autograd.Function):
    """Identity forward; multiplies the gradient by c on the way back."""

    @staticmethod
    def forward(ctx, x, c):
        ctx.c = c
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return g * ctx.c, None


class SmallGradients(nn.Module):
    """The GPT with every gradient below its logits multiplied by c: a large model's gradient scale on a tiny
    model. The loss value is unchanged; in fp32 (and with Adam, which divides out a gradient's scale) so is
    training. Only a format with fp16's narrow range notices."""

    def __init__(self, model: GPT, c: float):
        super().__init__()
        self.model, self.c, self.config = model, c, model.config

    def forward(self, idx, targets=None):
        logits, _ = self.model(idx)
        logits = _ShrinkGrad.apply(logits, self.c)
        loss = None if targets is None else F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
        return logits, loss


PARTIAL_EXP = 12  # a shrink at which only part of this model's gradients fall below fp16's range


SHORT_RUN = 12   # steps of the runs whose outcome is decided at the first step


def _zero_grad_probe(info: StepInfo):
    """Fraction of gradient entries that are exactly zero after the step's backward (flushed, or never reached)."""
    zero = n = 0
    for p in info.model.parameters():
        if p.grad is not None:
            zero += int((p.grad == 0).sum())
            n += p.grad.numel()
    info.log["zero_grads"] = zero / n


class Recipe(Key):
    """The runs of this section: a precision and what scales its loss (the value keys the results)."""
    FP32 = "fp32"
    BF16 = "bf16"
    BF16_GRADSCALER = "bf16_gradscaler"
    FP16_NO_SCALER = "fp16_no_scaler"
    FP16_NO_SCALER_PARTIAL = "fp16_no_scaler_partial"  # gradients at 2^-PARTIAL_EXP instead of 2^-shrink_exp
    FP16_STATIC = "fp16_static"                        # a static 2^shrink_exp: exactly undoes the shrink
    FP16_STATIC_HIGH = "fp16_static_high"              # a static 2^(shrink_exp + 24): overflows
    FP16_DYNAMIC = "fp16_dynamic"

    def label(self, k: int) -> str:
        """What a reader sees, for gradients shrunk by 2^-k."""
        return {"fp32": "fp32", "bf16": "bf16", "bf16_gradscaler": "bf16 + GradScaler", "fp16_no_scaler":
                "fp16, no scaler", "fp16_no_scaler_partial": f"fp16, no scaler, gradients at 2^-{PARTIAL_EXP}",
                "fp16_static": f"fp16, static 2^{k}", "fp16_static_high": f"fp16, static 2^{k + 24}",
                "fp16_dynamic": "fp16, dynamic"}[self.value]


def run(S: Settings) -> dict[Recipe, History]:
    k = S.shrink_exp
    configs = {
        Recipe.FP32: ("fp32", None, k),
        Recipe.BF16: ("bf16", None, k),
        Recipe.BF16_GRADSCALER: ("bf16", torch.amp.GradScaler(pick_device().type, init_scale=2.0**16,
                                                              growth_interval=S.growth_interval), k),
        Recipe.FP16_NO_SCALER: ("fp16", DynamicLossScaler(enabled=False), k),
        Recipe.FP16_NO_SCALER_PARTIAL: ("fp16", DynamicLossScaler(enabled=False), PARTIAL_EXP),
        Recipe.FP16_STATIC: ("fp16", DynamicLossScaler(2.0**k, growth_factor=1.0, backoff_factor=1.0), k),
        Recipe.FP16_STATIC_HIGH: ("fp16", DynamicLossScaler(2.0 ** (k + 24), growth_factor=1.0,
                                                            backoff_factor=1.0), k),
        Recipe.FP16_DYNAMIC: ("fp16", DynamicLossScaler(2.0**16, growth_interval=S.growth_interval), k),
    }
    # Runs whose outcome is fixed from the first step (every gradient flushed, every step skipped, every bit the
    # same as bf16's) show it in SHORT_RUN steps; the claims read only the first and last validation estimates,
    # so four estimates per run draw the curves (each costs S.eval_batches forward passes, emulated on CPUs without
    # fp16).
    short = {Recipe.BF16_GRADSCALER, Recipe.FP16_NO_SCALER, Recipe.FP16_STATIC_HIGH}
    out = {}
    for recipe, (precision, scaler, shrink) in configs.items():
        model = SmallGradients(build(S), 2.0**-shrink)
        steps = min(S.scaling_steps, SHORT_RUN) if recipe in short else S.scaling_steps
        cfg = TrainConfig(steps=steps, batch_size=S.batch_size, block_size=S.block_size, lr=3e-3,
                          precision=precision, eval_every=max(1, steps // 3), eval_batches=S.eval_batches,
                          seed=S.seed, desc=recipe.label(k))
        out[recipe] = train(model, corpus(), cfg, scaler=scaler, callback=_zero_grad_probe)
    return out


def figure(runs: dict[Recipe, History], S: Settings) -> go.Figure:
    fig = make_subplots(rows=1, cols=2, subplot_titles=("validation loss", "dynamic scaler: scale and skipped steps"))
    for i, (recipe, h) in enumerate(runs.items()):
        fig.add_trace(go.Scatter(x=h.val_step, y=h.val_loss, mode="lines+markers", name=recipe.label(S.shrink_exp),
                                 line=dict(color=plots.color(i)), marker=dict(size=4)), row=1, col=1)
    h = runs[Recipe.FP16_DYNAMIC]
    fig.add_trace(go.Scatter(x=h.step, y=h.loss_scale, mode="lines", name="scale κ", line=dict(color="black")),
                  row=1, col=2)
    skipped = [s for s, k in zip(h.step, h.skipped) if k]
    fig.add_trace(go.Scatter(x=skipped, y=[h.loss_scale[s - h.step[0]] for s in skipped], mode="markers",
                             name="skipped step", marker=dict(color="red", symbol="x", size=9)), row=1, col=2)
    fig.update_yaxes(type="log", title_text="κ", row=1, col=2)
    fig.update_xaxes(title_text="step")
    plots.style(fig, "fp16 against fp32 and bf16: without a scale the gradients flush to zero, with one it trains",
                height=420)
    return fig


def findings(ledger: Ledger, S: Settings, runs: dict[Recipe, History]) -> Findings:
    k = S.shrink_exp
    f = {n: h.final_val_loss for n, h in runs.items()}
    dyn, none, fp32 = runs[Recipe.FP16_DYNAMIC], runs[Recipe.FP16_NO_SCALER], runs[Recipe.FP32]
    high = runs[Recipe.FP16_STATIC_HIGH]
    ledger.add("no_scaler_stalls", f"Gradients at 2⁻{k}: fp16 without a scaler learns nothing (val loss drop over "
               f"its {len(none.loss)} steps)", none.val_loss[0] - none.final_val_loss, at_most(0.05), kind="measured")
    ledger.add("fp32_learns", f"Gradients at 2⁻{k}: fp32 learns (val loss drop over its {len(fp32.loss)} steps)",
               fp32.val_loss[0] - fp32.final_val_loss, at_least(0.5), kind="measured", detail=True)
    gap = {r: abs(f[r] - f[Recipe.FP32]) for r in (Recipe.FP16_STATIC, Recipe.FP16_DYNAMIC)}
    ledger.add("scaled_like_fp32", f"A static scale of 2^{k} and the dynamic scaler both train like fp32 (worst "
               "|Δ final val| of the two ≤ 0.1; fp16 rounding and skipped steps drift the runs apart by a few "
               "hundredths, while a scale that fails loses the whole drop fp32 makes)", max(gap.values()),
               at_most(0.1), kind="measured")
    ledger.add("static_too_high", f"A static scale of 2^{k + 24} overflows: every step skipped (fraction)",
               float(np.mean(high.skipped)), approx(1.0, abs=1e-9), kind="measured", detail=True)
    ledger.add("dynamic_backs_off", "The dynamic scaler both grows and backs off (skipped steps)", sum(dyn.skipped),
               at_least(1), kind="measured", detail=True)
    partial = Recipe.FP16_NO_SCALER_PARTIAL
    flushed = {n: float(np.mean(h.extra["zero_grads"])) for n, h in runs.items()}
    drop = {n: h.val_loss[0] - h.final_val_loss for n, h in runs.items()}
    ledger.add("partial_underflow", f"At 2^-{PARTIAL_EXP} underflow is partial: fp16 without a scaler flushes some of "
               "the gradient entries to zero, not all (fraction exactly zero, mean over steps)",
               flushed[partial], between(0.01, 0.99), kind="measured", detail=True)
    ledger.add("partial_costs", f"Partial underflow (gradients at 2^-{PARTIAL_EXP}, no scaler) is not harmless: the "
               "run ends clearly worse than fp32 (final val loss − fp32's)", f[partial] - f[Recipe.FP32],
               at_least(0.1), kind="measured")
    bf, bs = runs[Recipe.BF16], runs[Recipe.BF16_GRADSCALER]
    same = max(abs(a - b) for a, b in zip(bf.loss, bs.loss))
    ledger.add("bf16_scaler_same", "bf16 autocast with a GradScaler: every training loss (its first "
               f"{len(bs.loss)} steps) equals the run without one "
               "(max |Δ loss|; a power-of-two scale is exact in bf16, and nothing underflows)",
               same, at_most(0.0), kind="measured")
    ledger.note("bf16_scaler_skipped", sum(bs.skipped))
    ledger.note("scaling_final_val", f)
    ledger.note("zero_grad_fraction", flushed)
    lost = flushed[Recipe.FP16_NO_SCALER]
    short = sorted({len(h.loss) for h in runs.values()})
    table = ("| run | steps | validation loss change | gradient entries exactly zero | steps skipped |\n"
             "|---|---|---|---|---|\n"
             + "\n".join(f"| {r.label(k)} | {len(h.loss)} | {-drop[r]:+.2f} | {flushed[r]:.1%} | {sum(h.skipped)} |"
                         for r, h in runs.items()))
    return Findings([
        (f"Without a scaler {'every gradient entry' if lost > 0.999 else f'{lost:.0%} of the gradient entries'} "
         "flushed to zero and "
         "fp16 learned nothing; a static scale that undoes the shrink, or the dynamic scaler, trains like fp32 (final "
         f"losses within **{max(gap.values()):.2f}** nats)."),
        (f"Partial underflow is the quiet failure: with {flushed[partial]:.0%} of the gradients lost, the run "
         + ("still learned" if drop[partial] > 0 else "got worse") + f", and ended **{f[partial] - f[Recipe.FP32]:.2f}**"
         " nats behind fp32. Nothing announces it but the loss."),
        ("bf16 needs no scaler: with one, its losses were the same to the last bit for as long as it ran." if same == 0
         else
         f"bf16 with a scaler differed from bf16 without by {same:.1g} in loss."),
    ], [
        table,
        (f"Runs whose outcome is fixed at their first step stop after {short[0]} steps, the others run "
         f"{short[-1]}: compare a loss change only between runs of the same length." if len(short) > 1 else
         f"Every run took {short[0]} steps."),
        f"The dynamic scaler backed off {sum(dyn.skipped)} time{'s' * (sum(dyn.skipped) != 1)} and ended at "
        f"$2^{{{math.log2(dyn.loss_scale[-1]):.0f}}}$.",
        (f"bf16 with a GradScaler never skipped a step: its scale only grew, to "
         f"$2^{{{math.log2(bs.loss_scale[-1]):.0f}}}$." if not sum(bs.skipped) else
         f"bf16 with a GradScaler skipped {sum(bs.skipped)} steps."),
    ])
