"""Lesson 03, your turn: clipping by the global norm, checked against torch.nn.utils.clip_grad_norm_."""

import inspect

import torch

from labtools.exercises import Case, Outcome, YourRun, check, run_yours
from labtools.train import History
from lessons.stability import Settings
from lessons.stability.clipping import clip_by_global_norm, clip_run


def torch_clip(grads: list[torch.Tensor], max_norm: float) -> float:
    """The reference: torch.nn.utils.clip_grad_norm_ on parameters holding these gradients (scaled in place).
    Returns the norm before clipping."""
    params = []
    for g in grads:
        p = torch.nn.Parameter(torch.empty_like(g))
        p.grad = g  # the same tensor: torch scales it in place
        params.append(p)
    return torch.nn.utils.clip_grad_norm_(params, max_norm).item()


def cases(gpt_grads: list[torch.Tensor]) -> list[Case]:
    g = torch.Generator().manual_seed(0)
    return [
        Case("below the threshold", ([torch.tensor([0.3, 0.4])], 1.0),
             hint="the scale is min(1, τ / ‖g‖): below τ the gradients stay as they are"),
        Case("above the threshold", ([torch.tensor([3.0, 4.0])], 1.0),
             hint="above τ every entry is multiplied by τ / ‖g‖ (here 1 / 5), where ‖g‖ is the Euclidean norm, "
                  "√(3² + 4²) = 5, not the largest entry or a root-mean-square; return ‖g‖ before clipping"),
        Case("tensors of different shapes", ([torch.randn(3, 4, generator=g), torch.randn(4, generator=g),
                                              torch.randn(2, 2, 2, generator=g)], 0.5),
             hint="‖g‖ is one number for all tensors, √(sum of every entry squared): not a norm per tensor, not a "
                  "sum of norms"),
        Case("one huge, one tiny", ([torch.full((4,), 100.0), torch.full((4,), 1e-3)], 1.0),
             hint="one scale for every tensor, from the norm over all of them"),
        Case("all zeros", ([torch.zeros(3), torch.zeros(2, 2)], 1.0),
             hint="a zero gradient has norm 0: divide by ‖g‖ + 1e-6, as torch does, never by 0"),
        Case(f"this GPT's {len(gpt_grads)} gradient tensors", (gpt_grads, 0.1)),
    ]


def check_clipping(fn, gpt_grads: list[torch.Tensor]) -> Outcome:
    """Your clipping against torch's on six cases (edges included, and the GPT's real gradients): the gradients
    after the call and the norm returned."""
    return check(fn, torch_clip, cases(gpt_grads), tol=1e-5, relative=True, in_place=True,
                 what="your clipping (gradients and norm)",
                 against="torch's clip_grad_norm_")


def solution_source() -> str:
    """The lab's clip_by_global_norm as the learner's cell would hold it."""
    code = inspect.getsource(clip_by_global_norm).replace("def clip_by_global_norm(", "def my_clip_grad_norm(")
    return code.replace("grads: list[torch.Tensor], max_norm: float) -> float:", "grads, max_norm):")


TRAIN_TOL = 1e-3  # nats: clipping right to rounding trains the same curve; one that clips each tensor alone does not


def train_with_yours(fn, lab: dict[tuple, History], S: Settings) -> YourRun:
    """Section 1's hardest case again, SGD with momentum hit by the bad batches, clipped at 1 by your function in
    place of torch's: the same model, batches and schedule."""
    return run_yours(fn, lambda clip: clip_run(S, "SGD", 1.0, True, clip_fn=clip), lab[("SGD", 1.0, True)],
                     what="your clipping", tol=TRAIN_TOL)
