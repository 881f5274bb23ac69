"""Lesson 15, your turn: top-k routing with a capacity, checked against the lab's route() on cases that include
experts overflowing; then your routing trains the lesson's MoE."""

import inspect

import torch

import torch.nn.functional as F

from labtools.data import text
from labtools.exercises import Case, Outcome, YourRun, check, run_yours
from labtools.moe import Routing, moe_layers, route
from labtools.train import History
from lessons.mixture_of_experts import Settings
from lessons.mixture_of_experts.training import build, train

def reference(logits, k, capacity):
    """(expert, gate, kept), each (T, k): the chosen experts, their weights, and whether each fits its expert."""
    r = route(logits, k, capacity)
    return r.expert, r.gate, r.kept


def cases() -> list[Case]:
    g = torch.Generator().manual_seed(0)
    lg = lambda T, E: torch.randn(T, E, generator=g) * 2  # noqa: E731
    skew = lg(12, 4)
    skew[:, 1] += 4.0  # most tokens want expert 1 first
    # choices (first, second): token 0 (0, 1), token 1 (1, 0), token 2 (1, 2), token 3 (2, 1); two slots each
    ordered = torch.tensor([[3.0, 2.0, 0.0], [2.0, 3.0, 0.0], [0.0, 3.0, 2.0], [0.0, 2.0, 3.0]])
    return [
        Case("top-1, room for everyone", (lg(8, 4), 1, 8), "with k = 1 the gate is the probability itself: the "
             "router must still get a gradient"),
        Case("top-2, room for everyone", (lg(8, 4), 2, 16), "with k = 2 the two gates are renormalised to sum to 1"),
        Case("top-1, expert 1 overflows", (skew, 1, 4), "an expert past its capacity keeps its earliest tokens; the "
             "rest are dropped (kept = False)"),
        Case("top-2, first choices before second", (ordered, 2, 2), "all first choices are placed before any second "
             "choice: token 2's first choice (expert 1) must win over token 0's second"),
    ]


def check_route(fn) -> Outcome:
    """Your routing against the lab's on four cases: (expert, gate, kept), gates to 1e-6."""
    return check(fn, reference, cases(), tol=1e-6, what="your routing", against="the lab's routing")


def solution_source() -> str:
    body = inspect.getsource(route)
    body = body[body.index('    T, E = logits.shape'):].replace("    return Routing(expert, gate, kept, probs, logits)",
                                                               "    return expert, gate, kept")
    return ("def my_route(logits, k, capacity):\n    \"\"\"(expert, gate, kept), each (T, k).\"\"\"\n"
            "    import torch.nn.functional as F\n" + body)


TRAIN_TOL = 1e-3  # nats: routing right to rounding trains the same curve; second choices first does not


def history(out: dict) -> History:
    """A training run of this lesson (losses per step, one validation loss at the end) as the lab's History."""
    n = len(out["loss"])
    return History(step=list(range(n)), loss=out["loss"], val_step=[n], val_loss=[out["val"]],
                   seconds=out["seconds"])


def train_with_yours(fn, S: Settings, lab: dict) -> YourRun:
    """Section 2's MoE trained again with your routing in every MoE layer: the same model, batches and balancing
    loss. Your function gives (expert, gate, kept); the balancing loss reads the router's probabilities as before."""
    def run(my_route) -> History:
        def routing(logits, k, capacity):
            expert, gate, kept = my_route(logits, k, capacity)
            return Routing(expert, gate, kept, F.softmax(logits, dim=-1), logits)
        model = build(S, "MoE", text().vocab_size)
        for layer in moe_layers(model):
            layer.route = routing
        return history(train(S, model, S.balance_weight, "your routing"))
    return run_yours(fn, run, history(lab["MoE"]), what="your routing", tol=TRAIN_TOL)
