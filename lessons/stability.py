"""Lesson 03 — training stability: gradient clipping against bad batches, gradient accumulation and its
classic bug, effective batch size, and the published recipes that combine them.

Experiments for notebooks/03_stability.ipynb. Per-profile settings live in PROFILES.
"""

import math
from dataclasses import dataclass

import numpy as np
import plotly.graph_objects as go
import torch
import torch.nn.functional as F
from plotly.subplots import make_subplots

from labtools import data, plots
from labtools.claims import Ledger, at_least, at_most
from labtools.device import pick_device
from labtools.model import GPT, GPTConfig
from labtools.optim import param_groups
from labtools.profiles import check_range, resolve
from labtools.schedules import bind, warmup_cosine
from labtools.train import History, TrainConfig, train
from labtools.widgets import Panel, slider


@dataclass(frozen=True)
class Settings:
    profile: str
    n_layer: int
    n_embd: int
    block_size: int
    batch_size: int
    clip_steps: int        # length of each clipping run; the bad batches arrive at the middle
    n_bad: int             # consecutive bad batches
    adamw_lr: float
    sgd_lr: float          # SGD + momentum 0.9
    accum_k: int           # micro-batches per step in the accumulation experiments
    accum_steps: int       # steps of each accumulation run
    seed: int = 0

    def __post_init__(self):
        check_range("CLIP_STEPS", self.clip_steps, 40, 1_000_000, int)
        check_range("N_BAD", self.n_bad, 1, 100, int)
        check_range("ADAMW_LR", self.adamw_lr, 1e-6, 1.0)
        check_range("SGD_LR", self.sgd_lr, 1e-6, 10.0)
        check_range("ACCUM_K", self.accum_k, 2, self.batch_size, int)
        check_range("ACCUM_STEPS", self.accum_steps, 10, 1_000_000, int)
        check_range("SEED", self.seed, 0, 2**31 - 1, int)
        if self.batch_size % self.accum_k:
            raise ValueError(f"ACCUM_K must divide the batch size {self.batch_size}, got {self.accum_k}")


PROFILES = {
    "smoke": Settings("smoke", n_layer=2, n_embd=64, block_size=64, batch_size=16, clip_steps=100, n_bad=5,
                      adamw_lr=1e-2, sgd_lr=0.3, accum_k=4, accum_steps=60),
    "cpu": Settings("cpu", n_layer=2, n_embd=64, block_size=64, batch_size=16, clip_steps=400, n_bad=5,
                    adamw_lr=1e-2, sgd_lr=0.3, accum_k=4, accum_steps=300),
    "gpu": Settings("gpu", n_layer=6, n_embd=384, block_size=256, batch_size=64, clip_steps=2000, n_bad=5,
                    adamw_lr=3e-3, sgd_lr=0.1, accum_k=4, accum_steps=1500),
}


def settings(profile: str = "auto", **overrides) -> Settings:
    """Validated settings for a profile; None-valued overrides keep the profile's value."""
    return resolve(PROFILES, profile, **overrides)


def corpus() -> data.Corpus:
    return data.text()


def build(S: Settings, optimizer: str, lr: float) -> tuple[GPT, torch.optim.Optimizer]:
    text = corpus()
    torch.manual_seed(S.seed)
    model = GPT(GPTConfig(vocab_size=text.vocab_size, block_size=S.block_size, n_layer=S.n_layer, n_head=4,
                          n_embd=S.n_embd)).to(pick_device())
    if optimizer == "AdamW":
        return model, torch.optim.AdamW(param_groups(model, 0.1), lr=lr, betas=(0.9, 0.95))
    return model, torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)


# --- 1. gradient clipping against bad batches ---------------------------------------------------------------

def clip_by_global_norm(grads: list[torch.Tensor], max_norm: float) -> float:
    """Written out for learning (torch.nn.utils.clip_grad_norm_ is what train() uses):
    ‖g‖ = √(Σ over every gradient tensor of Σ g²);  g ← g · min(1, max_norm / (‖g‖ + 1e-6)).
    One scale for all tensors, so the update keeps its direction. Returns ‖g‖ before clipping."""
    total = math.sqrt(sum((g.double() ** 2).sum().item() for g in grads))
    scale = min(1.0, max_norm / (total + 1e-6))
    for g in grads:
        g.mul_(scale)
    return total


def clip_parity(S: Settings, max_norm: float = 0.1) -> tuple[float, float]:
    """(max |ours − torch| over the clipped gradients, pre-clip norm) on the GPT's real gradients of one batch."""
    text = corpus()
    model, _ = build(S, "AdamW", S.adamw_lr)
    X, Y = text.batch("train", S.batch_size, S.block_size, torch.Generator().manual_seed(S.seed), pick_device())
    model(X, Y)[1].backward()
    ours = [p.grad.clone() for p in model.parameters()]
    norm = clip_by_global_norm(ours, max_norm)
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    return max((a - p.grad).abs().max().item() for a, p in zip(ours, model.parameters())), norm


# --- the experiment ---------------------------------------------------------------


def clip_parity_findings(ledger: Ledger, clip_diff: float, norm: float) -> str:
    ledger.add("clip_parity", "Clipping written out matches torch.nn.utils.clip_grad_norm_ (max |Δg|)", clip_diff,
               at_most(1e-7), kind="measured")
    return f"Pre-clip norm {norm:.3f}; max |ours − torch| after clipping to 0.1: {clip_diff:.1e}."

def bad_batch(S: Settings, text: data.Corpus) -> tuple[torch.Tensor, torch.Tensor]:
    """A data-pipeline failure: a batch of one character repeated (as from a corrupt shard or runaway padding)."""
    X = torch.full((S.batch_size, S.block_size + 1), text.encode("~")[0], dtype=torch.long)
    return X[:, :-1].to(pick_device()), X[:, 1:].to(pick_device())


def clip_run(S: Settings, optimizer: str, clip: float | None, inject: bool) -> History:
    text = corpus()
    model, opt = build(S, optimizer, S.adamw_lr if optimizer == "AdamW" else S.sgd_lr)
    at = S.clip_steps // 2
    g = torch.Generator().manual_seed(S.seed)

    def batch_fn(step, micro):
        X, Y = text.batch("train", S.batch_size, S.block_size, g, pick_device())  # keep the clean stream in step
        return bad_batch(S, text) if inject and at <= step < at + S.n_bad else (X, Y)

    cfg = TrainConfig(steps=S.clip_steps, batch_size=S.batch_size, block_size=S.block_size, grad_clip=clip,
                      lr_schedule=bind(warmup_cosine, warmup=S.clip_steps // 10, total=S.clip_steps, min_ratio=0.1),
                      eval_every=max(1, S.clip_steps // 25), eval_batches=8, seed=S.seed,
                      desc=f"{optimizer} clip={clip} {'bad batches' if inject else 'clean'}")
    return train(model, text, cfg, optimizer=opt, batch_fn=batch_fn)


def clipping(S: Settings) -> dict[tuple, History]:
    """(optimizer, clip, injected) -> History, for AdamW and SGD + momentum, clip None or 1.0, clean or not."""
    return {(o, c, i): clip_run(S, o, c, i) for o in ("AdamW", "SGD") for c in (None, 1.0) for i in (False, True)}


def damage(S: Settings, runs: dict[tuple, History], optimizer: str, clip: float | None) -> dict:
    """The injected run against its own clean twin: excess val loss after the bad batches, and recovery."""
    clean, hit = runs[(optimizer, clip, False)], runs[(optimizer, clip, True)]
    at = S.clip_steps // 2
    steps = np.array(hit.val_step)
    excess = np.array(hit.val_loss) - np.array(clean.val_loss)
    after = steps > at
    recovered = np.nonzero(after & (excess <= 0.02))[0]
    gn = np.array(hit.grad_norm)
    return {"peak_excess": float(excess[after].max()), "mean_excess": float(excess[after].mean()),
            "final_excess": float(excess[-1]),
            "recovery_steps": int(steps[recovered[0]] - at) if recovered.size else None,
            "typical_grad_norm": float(np.median(gn[:at])), "bad_grad_norm": float(gn[at:at + S.n_bad].max())}


def clipping_figure(S: Settings, runs: dict[tuple, History]) -> go.Figure:
    fig = make_subplots(rows=2, cols=2, subplot_titles=("AdamW: val loss", "SGD + momentum: val loss",
                                                        "AdamW: grad norm before clipping",
                                                        "SGD + momentum: grad norm before clipping"),
                        vertical_spacing=0.14)
    for col, o in ((1, "AdamW"), (2, "SGD")):
        for k, clip in enumerate((None, 1.0)):
            c = plots.color(k)
            name = "no clipping" if clip is None else f"clip at {clip:g}"
            for inject, dash in ((False, "dot"), (True, "solid")):
                h = runs[(o, clip, inject)]
                fig.add_trace(go.Scatter(x=h.val_step, y=h.val_loss, mode="lines", line=dict(color=c, dash=dash),
                                         name=f"{name}{'' if inject else ' (clean twin)'}",
                                         legendgroup=f"{clip}{inject}",
                                         showlegend=col == 1), row=1, col=col)
            h = runs[(o, clip, True)]
            fig.add_trace(go.Scatter(x=h.step, y=h.grad_norm, mode="lines", line=dict(color=c, width=1),
                                     showlegend=False), row=2, col=col)
        for row in (1, 2):
            fig.add_vrect(x0=S.clip_steps // 2, x1=S.clip_steps // 2 + S.n_bad, fillcolor="red", opacity=0.15,
                          line_width=0, row=row, col=col)
    fig.update_yaxes(type="log", row=2)
    fig.update_xaxes(title_text="step", row=2)
    plots.style(fig, height=620, legend=dict(orientation="h", y=-0.12))
    return fig


# --- 2. gradient accumulation and its classic bug -------------------------------------------------------------

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
                      eval_every=max(1, S.accum_steps // 10), eval_batches=10, seed=S.seed,
                      desc=f"{optimizer} lr={lr:g} {'mean' if normalize else 'SUM'} clip={clip}")
    return train(model, text, cfg, optimizer=opt)


def accumulation_bug(S: Settings) -> dict[str, History]:
    """The bug (micro-batch losses summed, not averaged) under SGD and under AdamW, with the controls."""
    k = S.accum_k
    return {
        "SGD · mean": accum_run(S, "SGD", S.sgd_lr / k, True, None),
        "SGD · sum (bug)": accum_run(S, "SGD", S.sgd_lr / k, False, None),
        f"SGD · mean, lr × {k}": accum_run(S, "SGD", S.sgd_lr, True, None),
        "AdamW · mean": accum_run(S, "AdamW", S.adamw_lr, True, None),
        "AdamW · sum (bug)": accum_run(S, "AdamW", S.adamw_lr, False, None),
        "AdamW · mean · clip 1": accum_run(S, "AdamW", S.adamw_lr, True, 1.0),
        "AdamW · sum (bug) · clip 1": accum_run(S, "AdamW", S.adamw_lr, False, 1.0),
    }


def accumulation_figure(runs: dict[str, History]) -> go.Figure:
    fig = make_subplots(rows=1, cols=2, subplot_titles=("SGD + momentum", "AdamW"))
    for i, (name, h) in enumerate(runs.items()):
        col = 1 if name.startswith("SGD") else 2
        dash = "dash" if "sum" in name else ("dot" if "lr ×" in name else "solid")
        fig.add_trace(go.Scatter(x=h.step, y=h.loss, mode="lines", name=name, line=dict(color=plots.color(i), dash=dash,
                                                                                        width=1.5)), row=1, col=col)
    fig.update_xaxes(title_text="step")
    fig.update_yaxes(title_text="training loss", row=1, col=1)
    plots.style(fig, height=400)
    return fig


def clipped_fraction(h: History, clip: float = 1.0) -> float:
    return float(np.mean(np.array(h.grad_norm) > clip))


# --- 3. effective batch and the published recipes ---------------------------------------------------------------

# Published pre-training recipes; None where the paper does not state the value.
RECIPES = {
    "GPT-3 175B": dict(source="Brown et al. 2020, Table 2.1 and Appendix B", optimizer="Adam", beta2=0.95, eps=1e-8,
                       peak_lr=0.6e-4, schedule="cosine to 10% over 260B tokens", warmup="375M tokens",
                       weight_decay=0.1, clip=1.0, batch_tokens=3.2e6, context=2048, tokens=300e9),
    "LLaMA 2 70B": dict(source="Touvron et al. 2023, §2.2 and Table 1", optimizer="AdamW", beta2=0.95, eps=1e-5,
                        peak_lr=1.5e-4, schedule="cosine to 10%", warmup="2000 steps", weight_decay=0.1, clip=1.0,
                        batch_tokens=4e6, context=4096, tokens=2e12),
    "Chinchilla 70B": dict(source="Hoffmann et al. 2022, §4.1 and Table 4 (batch 1.5M tokens, doubled to 3M during "
                                  "training)", optimizer="AdamW", beta2=None, eps=None,
                           peak_lr=1e-4, schedule="cosine, 10× decay", warmup=None, weight_decay=None, clip=None,
                           batch_tokens=3e6, context=2048, tokens=1.4e12),
    "Mistral 7B": dict(source="Jiang et al. 2023: architecture only, no training hyperparameters published",
                       optimizer=None, beta2=None, eps=None, peak_lr=None, schedule=None, warmup=None,
                       weight_decay=None, clip=None, batch_tokens=None, context=8192, tokens=None),
}


def warmup_fraction(name: str) -> float | None:
    """Warmup as a fraction of the run, where both are published."""
    if name == "GPT-3 175B":
        return 375e6 / 300e9
    if name == "LLaMA 2 70B":
        return 2000 / (2e12 / 4e6)  # 2000 of 500,000 steps
    return None


def lab_recipe(S: Settings) -> dict:
    """The lab's scaled-down recipe: the published choices that do not depend on scale, kept; the ones that do,
    rescaled and measured in lessons 01–03."""
    return dict(source="this lab (lessons 01–03)", optimizer="AdamW", beta2=0.95, eps=1e-8, peak_lr=S.adamw_lr,
                schedule="cosine to 10%", warmup="10% of steps", weight_decay=0.1, clip=1.0,
                batch_tokens=S.batch_size * S.block_size, context=S.block_size, tokens=None)


def recipe_table(S: Settings) -> go.Figure:
    rows = dict(RECIPES, **{"this lab": lab_recipe(S)})
    fields = ("optimizer", "beta2", "eps", "peak_lr", "schedule", "warmup", "weight_decay", "clip", "batch_tokens",
              "context", "tokens")

    def fmt(v):
        if v is None:
            return "—"
        if isinstance(v, float) and v >= 1e4:
            for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
                if v >= size:
                    return f"{v / size:g}{unit}"
        if isinstance(v, float) and v < 1e-2:
            return f"{v:.2g}"
        return str(v)

    body = [[name] + [fmt(r[f]) for f in fields] for name, r in rows.items()]
    return plots.table(["recipe", *fields], body, title="Pre-training recipes (— = not published)", row_height=48)


def effective_batch_figure(batch: int, seq: int, dp: int, accum: int) -> go.Figure:
    tokens = batch * seq * dp * accum
    names = ["yours", *[n for n, r in RECIPES.items() if r["batch_tokens"]]]
    values = [tokens, *[r["batch_tokens"] for r in RECIPES.values() if r["batch_tokens"]]]
    fig = plots.bars(names, {"tokens per optimizer step": values},
                     title=f"{batch} seq × {seq} tokens × {dp} ranks × {accum} accumulation = {tokens:,} tokens/step")
    fig.update_yaxes(type="log", title_text="tokens per step", range=[2, 7.5])  # bars rise from 100 tokens
    fig.update_traces(texttemplate="%{y:.3s}")
    return fig


def effective_batch_panel() -> Panel:
    controls = {
        "batch": slider(16, 1, 512, description="per-device batch"),
        "seq": slider(2048, 128, 8192, 128, description="sequence length"),
        "dp": slider(8, 1, 2048, description="data-parallel ranks"),
        "accum": slider(4, 1, 64, description="accumulation steps"),
    }
    return Panel(effective_batch_figure, controls, debounce_ms=0, title="Effective batch size")


# --- words and claims ---------------------------------------------------------------------------------------------

def damages(S: Settings, runs: dict[tuple, History]) -> dict[tuple, dict]:
    """damage() of every (optimizer, clip) pair of the clipping experiment."""
    return {(o, c): damage(S, runs, o, c) for o in ("AdamW", "SGD") for c in (None, 1.0)}


def clipping_findings(ledger: Ledger, S: Settings, runs: dict[tuple, History]) -> str:
    d = damages(S, runs)
    a = d[("AdamW", None)]
    ledger.add("bad_norm", "A bad batch's gradient norm is far above a typical step's (ratio, AdamW)",
               a["bad_grad_norm"] / a["typical_grad_norm"], at_least(5), kind="measured")
    for key, claim in clip_claims(d).items():
        ledger.add(key, *claim, kind="measured")
    ledger.add("adam_vs_sgd", "Unclipped, the same bad batches hurt SGD more than AdamW (mean excess SGD ÷ AdamW)",
               d[("SGD", None)]["mean_excess"] / max(d[("AdamW", None)]["mean_excess"], 1e-3), at_least(1.5),
               kind="measured")
    ledger.note("damage", {f"{o} clip={c}": v for (o, c), v in d.items()})

    def rec(x):
        if x["recovery_steps"] is None:
            return "did not recover within the run"
        return f"recovered in {x['recovery_steps']} steps"
    lines = [f"The {S.n_bad} bad batches had a gradient norm of {d[('AdamW', None)]['bad_grad_norm']:.1f} against a "
             f"typical {d[('AdamW', None)]['typical_grad_norm']:.2f} (AdamW, before clipping). Damage = val loss of "
             "the "
             "run with bad batches minus its clean twin:"]
    for o in ("AdamW", "SGD"):
        a, b = d[(o, None)], d[(o, 1.0)]
        lines.append(f"* **{o}**: without clipping the excess peaked at {a['peak_excess']:.3f}, averaged "
                     f"{a['mean_excess']:.3f} over the rest of the run and {rec(a)}; clipped at 1.0 it peaked at "
                     f"{b['peak_excess']:.3f}, averaged {b['mean_excess']:.3f} and {rec(b)}.")
    ratio = d[("SGD", None)]["bad_grad_norm"] / d[("SGD", None)]["typical_grad_norm"]
    lines.append(f"Adam is partly protected by its own normalisation: the bad gradient's size is divided by √v̂. SGD "
                 f"steps in proportion to the gradient, so a {ratio:.0f}× gradient is a {ratio:.0f}× step.")
    lines.append("Clipping bounds that step. AdamW gains less from it: its own normalisation had already shrunk the "
                 "bad steps. The average excess over the rest of the run is the measure here, not the peak: one "
                 "evaluation right after the burst moves with the rounding of a run (on the same seed, AdamW's peak "
                 "differs between one and two torch threads; the average keeps its verdict).")
    return "\n".join(lines)


IGNORE = -100  # F.cross_entropy's ignore_index: a padded position's target


def token_normalization(S: Settings) -> dict:
    """Accumulation when micro-batches hold different numbers of real tokens (the rest padding, targets ignored):
    the gradient of the mean loss over every real token of the batch (one pass: the reference) against dividing
    each micro-batch's mean loss by k (the articles' code, and the accumulation bug fixed across libraries in 2024)
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


def token_findings(ledger: Ledger, S: Settings, t: dict) -> str:
    ledger.add("token_bug", "Micro-batches with unequal real-token counts: dividing each micro-batch's mean loss by k "
               "gives a different gradient from the batch's (relative error ‖Δg‖/‖g‖, measured)", t["bug_rel_error"],
               at_least(0.01), kind="measured")
    ledger.add("token_fix", "Summing token losses and dividing by the batch's real-token count gives the batch's "
               "gradient (relative error, measured)", t["fix_rel_error"], at_most(1e-5), kind="measured")
    return (f"{len(t['tokens'])} micro-batches here held {', '.join(f'{n:,}' for n in t['tokens'])} real tokens (the "
            "rest padding, targets ignored). Dividing each micro-batch's *mean* loss by k weights a token in a short "
            f"micro-batch more than one in a long micro-batch: the gradient is off by {t['bug_rel_error']:.1%} of its "
            f"norm. Summing the token losses and dividing by all {t['total']:,} real tokens gives the batch's "
            f"gradient (off by {t['fix_rel_error']:.0e}). With equal token counts — the experiment above, no "
            "padding — the two coincide, which is why the bug went unnoticed in widely used trainers until 2024.")


def accumulation_findings(ledger: Ledger, S: Settings, runs: dict[str, History], max_grad_diff: float) -> str:
    k = S.accum_k
    v = {n: h.final_val_loss for n, h in runs.items()}
    same = max(abs(a - b) for a, b in zip(runs["SGD · sum (bug)"].loss, runs[f"SGD · mean, lr × {k}"].loss))
    early = max(abs(a - b) for a, b in zip(runs["AdamW · sum (bug)"].loss[:5], runs["AdamW · mean"].loss[:5]))
    clipped = {n: clipped_fraction(runs[n]) for n in ("AdamW · sum (bug) · clip 1", "AdamW · mean · clip 1")}
    ledger.add("accum_equal", f"{k} micro-batches ≡ one batch: max gradient difference", max_grad_diff, at_most(1e-6),
               kind="measured")
    ledger.add("sgd_sum_is_lr_k", f"SGD: summing the micro-batch losses is exactly lr × {k} (max |Δ loss| over "
               "the run)", same, at_most(1e-3), kind="measured")
    apart = max(abs(a - b) for a, b in zip(runs["SGD · sum (bug)"].val_loss, runs["SGD · mean"].val_loss))
    ledger.add("sgd_sum_differs", "… which changes the run (max |Δ val| over the run, summed vs averaged SGD: the "
               "final values alone can cross)", apart, at_least(0.02), kind="measured")
    ledger.add("adam_sum_harmless", "AdamW without clipping: summed and averaged runs take the same steps "
               "(max |Δ loss| over the first 5 steps, before rounding differences compound)", early, at_most(1e-5),
               kind="measured")
    ledger.add("adam_sum_clips", "AdamW with clipping: the bug makes clipping fire on more steps (fraction clipped, "
               "sum − mean)", clipped["AdamW · sum (bug) · clip 1"] - clipped["AdamW · mean · clip 1"], at_least(0.2),
               kind="measured")
    ledger.note("accum_final_val", v)
    return (f"{k} micro-batches of {S.batch_size // k} gave the same gradients as one batch of {S.batch_size}: max "
            f"difference {max_grad_diff:.1e}. The bug: **SGD** with summed losses ended at val "
            f"{v['SGD · sum (bug)']:.3f} vs {v['SGD · mean']:.3f} averaged — and its loss curve is the averaged run at "
            f"lr × {k} (max difference {same:.1e}): summing is exactly a {k}× learning rate. **AdamW** without "
            f"clipping: {v['AdamW · sum (bug)']:.3f} summed vs {v['AdamW · mean']:.3f} averaged. Adam divides out the "
            f"gradient's scale, so both take the same steps (their losses agree to {early:.0e} over the first 5 "
            "steps); later they drift apart because of ε, which is added to √v̂: summing makes √v̂ k× larger, so ε "
            "weighs k× less (with ε = 0 the two runs are bitwise identical: tests/test_lesson_stability.py). With "
            f"clipping at 1.0 it does: the {k}× larger norm was clipped on "
            f"{clipped['AdamW · sum (bug) · clip 1']:.0%} of steps vs "
            f"{clipped['AdamW · mean · clip 1']:.0%}, and the runs ended at "
            f"{v['AdamW · sum (bug) · clip 1']:.3f} vs {v['AdamW · mean · clip 1']:.3f}. \"Summing multiplies the "
            "learning rate by k\" is true for SGD; for Adam it is the clipping threshold that changes.")


def clip_claims(d: dict[tuple, dict]) -> dict[str, tuple]:
    """The clipping-benefit claims from the damage statistics d[(optimizer, clip)]: the mean excess val loss over
    the evaluations after the burst (hit − clean twin). Seeds 0-2 at 100 and 160 steps, one and two torch threads,
    and seed 0 at 320 steps measured SGD's ratio 1.6-230 and the damage removed from SGD ÷ from AdamW 1.6-390;
    with clipping doing nothing both would be ~1."""
    sgd_removed = d[("SGD", None)]["mean_excess"] - d[("SGD", 1.0)]["mean_excess"]
    adamw_removed = d[("AdamW", None)]["mean_excess"] - d[("AdamW", 1.0)]["mean_excess"]
    return {
        "sgd_clip": ("SGD + momentum: clipping at 1.0 cuts the bad batches' damage (mean excess val loss after the "
                     "burst, no clip ÷ clip)",
                     d[("SGD", None)]["mean_excess"] / max(d[("SGD", 1.0)]["mean_excess"], 1e-3), at_least(1.4)),
        "adamw_gains_less": ("AdamW gains less from clipping: the damage clipping removes from SGD ÷ the damage it "
                             "removes from AdamW (mean excess, no clip − clip)",
                             sgd_removed / max(adamw_removed, 1e-3), at_least(1.4)),
    }


def recipe_findings(ledger: Ledger, S: Settings) -> str:
    fractions = {n: warmup_fraction(n) for n in RECIPES}
    ledger.note("warmup_fraction", fractions)
    gpt3, llama = fractions["GPT-3 175B"], fractions["LLaMA 2 70B"]
    ours = S.batch_size * S.block_size
    ratios = [r["batch_tokens"] / ours for r in RECIPES.values() if r["batch_tokens"]]
    return (f"Warmup is a tiny share of a large run: {gpt3:.2%} of GPT-3's tokens and {llama:.2%} of LLaMA 2's "
            "steps. Our runs "
            "are a few hundred steps, so the lab warms up over 10% of them — and lesson 02 measured that a warmup "
            "that short already protects Adam's first steps. The choices that do not depend on scale carry over "
            "unchanged: AdamW, β2 = 0.95 (lesson 01), weight decay 0.1 on matrices only, clipping at 1.0, cosine to "
            "10% of the peak. The peak learning rate grows as models shrink (LLaMA 2: 3e-4 at 7B, 1.5e-4 at 70B); our "
            f"sub-million-parameter models run here at {S.adamw_lr:g} (lesson 01 maps the landscape of its own). A "
            f"batch of {S.batch_size} × {S.block_size} = {ours:,} tokens is 1/{min(ratios):,.0f} to "
            f"1/{max(ratios):,.0f} of theirs. Two rows correct the source articles rather than leave a blank: "
            "they give **Mistral 7B** a training recipe, but Jiang et al. 2023 publish its architecture only — "
            "those numbers have no source; and they give **Chinchilla** a 1,500-step warmup, which is Gopher's "
            "(Rae et al. 2021, whose setup Chinchilla otherwise follows) — Hoffmann et al. state no warmup of "
            "their own.")
