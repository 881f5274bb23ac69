"""Lesson 19, section 1: what does Newton–Schulz do to an update? A momentum matrix of the lesson's model after a few
Muon steps, its singular values before and after the iteration, and what the iteration costs beside a training
step (FLOPs counted from the shapes)."""

from dataclasses import dataclass

import plotly.graph_objects as go
import torch

from labtools import plots
from labtools.claims import Findings, Ledger, at_least, in_words, is_true
from labtools.optim import newton_schulz, newton_schulz_flops
from labtools.shapes import MODELS, ModelShape
from labtools.train import TrainConfig, train
from lessons.muon_mup import Settings, ns_exercise
from lessons.muon_mup.runs import Recipe, corpus, model, optimizer, params

PROBED = "transformer.h.0.mlp.c_fc.weight"  # the first block's MLP up-projection: a tall matrix (4 C × C)


@dataclass(frozen=True)
class Orthogonalized:
    momentum: torch.Tensor      # the probed matrix's momentum after S.coord_steps Muon steps
    before: list[float]         # its singular values, largest first, divided by the largest
    after: list[float]          # newton_schulz(momentum)'s singular values, largest first
    same_as_torch: float        # largest |lab's − torch.optim.Muon's| over the probed matrix (0: the same bits)
    ns_flops: int               # Newton–Schulz FLOPs of one Muon step, every matrix it steps
    step_flops: float           # FLOPs of one training step (6 per parameter per token)


def run(S: Settings) -> Orthogonalized:
    r = Recipe(S.n_embd, S.coord_steps, S.muon_lrs[len(S.muon_lrs) // 2], "muon", adam_lr=S.lr)
    m = model(S, r.width, False, r.seed)
    opt = optimizer(m, r)
    cfg = TrainConfig(steps=r.steps, batch_size=S.batch_size, block_size=S.block_size, lr=r.lr, eval_every=r.steps,
                      eval_batches=1, desc="a few Muon steps")
    train(m, corpus(), cfg, optimizer=opt)
    p = dict(m.named_parameters())[PROBED]
    B = opt.state[p]["momentum_buffer"].detach().cpu().clone()
    before = torch.linalg.svdvals(B.double())
    after = torch.linalg.svdvals(newton_schulz(B).double())
    same = (newton_schulz(B).float() - ns_exercise.torch_orthogonalized(B)).abs().max().item()
    muon = [q for g in opt.param_groups if g["use_muon"] for q in g["params"]]
    return Orthogonalized(B, (before / before[0]).tolist(), after.tolist(), same,
                          sum(newton_schulz_flops(*q.shape) for q in muon),
                          6.0 * params(S, S.n_embd) * S.batch_size * S.block_size)


GPT3_SMALL_BATCH = 524_288  # tokens a step: GPT-3's paper gives its 125M model a batch of 0.5M (Brown et al. 2020,
                            # table 2.1); 2^19, the batch the GPT-2 small reproductions use


def ns_share_at(shape: ModelShape, tokens: int = GPT3_SMALL_BATCH) -> float:
    """Newton–Schulz FLOPs of one Muon step on every block matrix of a GPT of this shape (c_attn h × 3h, the
    attention's projection h × h, the MLP's h × 4h and 4h × h), ÷ the training FLOPs of a step of `tokens` tokens."""
    h = shape.n_embd
    ns = shape.n_layer * sum(newton_schulz_flops(*m) for m in ((3 * h, h), (h, h), (4 * h, h), (h, 4 * h)))
    return ns / (shape.flops_per_token() * tokens)


def spread(values: list[float]) -> float:
    return max(values) / min(values)


def near_one(values: list[float]) -> float:
    """The share of singular values between 0.5 and 1.5."""
    return sum(0.5 <= v <= 1.5 for v in values) / len(values)


def figure(o: Orthogonalized) -> go.Figure:
    fig = go.Figure()
    k = list(range(1, len(o.before) + 1))
    fig.add_trace(go.Scatter(x=k, y=o.before, mode="lines+markers", name="momentum (÷ its largest)"))
    fig.add_trace(go.Scatter(x=k, y=o.after, mode="lines+markers", name="after five Newton–Schulz steps"))
    fig.update_yaxes(type="log")
    return plots.style(fig, f"Newton–Schulz lifts {near_one(o.after):.0%} of the update's directions to about the "
                       "same size",
                       "singular value, largest first", "singular value (log scale)")


def findings(ledger: Ledger, S: Settings, o: Orthogonalized) -> Findings:
    share = o.ns_flops / o.step_flops
    ledger.add("ns_before", "the momentum's singular values span more than tenfold", spread(o.before), at_least(10),
               kind="measured")
    ledger.add("ns_after", "after Newton–Schulz nine in ten singular values or more lie between 0.5 and 1.5 "
               "(share)", near_one(o.after), at_least(0.9), kind="measured")
    ledger.add("ns_torch", "the lab's Newton–Schulz gives PyTorch's Muon update to the bit", o.same_as_torch == 0,
               is_true(), kind="measured", detail=True)
    at_scale = ns_share_at(MODELS["GPT-2 124M"])
    ledger.note("ns_flops_share", share)
    ledger.note("ns_flops_share_gpt2_small_0.5M_tokens", at_scale)
    return Findings(
        [f"It makes the update's directions nearly equal: the momentum's strongest direction was "
         f"{spread(o.before):,.0f} times its weakest; after five steps {_all_but(o.after)} lie near 1.",
         f"The iteration costs {share:.0%} of this run's step FLOPs. Its cost depends on the matrices alone, not "
         f"on the batch: at GPT-2 small's size and a batch of half a million tokens it would be {at_scale:.1%} "
         "(computed)."],
        [f"| | momentum | after Newton–Schulz |\n|---|---|---|\n"
         f"| largest ÷ smallest singular value | {spread(o.before):.0f} | {spread(o.after):.2f} |\n"
         f"| smallest and largest singular value | | {min(o.after):.2f}, {max(o.after):.2f} |\n"
         f"| share of them between 0.5 and 1.5 | | {near_one(o.after):.0%} |",
         f"Newton–Schulz: {o.ns_flops:.2g} FLOPs a Muon step; a training step: {o.step_flops:.2g} (counted from the "
         f"shapes, {S.batch_size * S.block_size} tokens a step). The same bits as PyTorch's Muon: "
         f"{'yes' if o.same_as_torch == 0 else 'no'}."])


def _all_but(values: list[float]) -> str:
    off = sum(not 0.5 <= v <= 1.5 for v in values)
    return "all of them" if off == 0 else f"all but {in_words(off)}"
