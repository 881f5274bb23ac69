"""Lesson 15, your turn: top-k routing with a capacity, checked against labtools.moe.route on cases that include
experts overflowing."""

import html
import inspect

import torch
from IPython.display import HTML, display

from labtools.exercises import NOT_WRITTEN, Outcome, is_stub, outcome, where_it_failed
from labtools.moe import route

HINT = ("softmax the logits, take the k largest probabilities per token; with k > 1 divide them by their sum; then "
        "give each expert at most `capacity` assignments, every token's first choice before any second choice, "
        "earlier tokens first")


def reference(logits, k, capacity):
    """(expert, gate, kept), each (T, k): the chosen experts, their weights, and whether each fits its expert."""
    r = route(logits, k, capacity)
    return r.expert, r.gate, r.kept


def cases() -> list[dict]:
    g = torch.Generator().manual_seed(0)
    lg = lambda T, E: torch.randn(T, E, generator=g) * 2  # noqa: E731
    skew = lg(12, 4)
    skew[:, 1] += 4.0  # most tokens want expert 1 first
    # choices (first, second): token 0 (0, 1), token 1 (1, 0), token 2 (1, 2), token 3 (2, 1); two slots each
    ordered = torch.tensor([[3.0, 2.0, 0.0], [2.0, 3.0, 0.0], [0.0, 3.0, 2.0], [0.0, 2.0, 3.0]])
    return [
        {"case": "top-1, room for everyone", "args": (lg(8, 4), 1, 8), "hint": "with k = 1 the gate is the "
         "probability itself: the router must still get a gradient"},
        {"case": "top-2, room for everyone", "args": (lg(8, 4), 2, 16), "hint": "with k = 2 the two gates are "
         "renormalised to sum to 1"},
        {"case": "top-1, expert 1 overflows", "args": (skew, 1, 4), "hint": "an expert past its capacity keeps "
         "its earliest tokens; the rest are dropped (kept = False)"},
        {"case": "top-2, first choices before second", "args": (ordered, 2, 2), "hint": "all first choices are "
         "placed before any second choice: token 2's first choice (expert 1) must win over token 0's second"},
    ]


def _compare(got, want) -> float:
    expert, gate, kept = got
    if not torch.equal(expert, want[0]):
        return float("inf")
    if not torch.equal(kept, want[2]):
        return float("inf")
    return (gate - want[1]).abs().max().item()


def check_route(fn) -> Outcome:
    """Your routing against labtools.moe.route on four cases; experts and kept must match exactly, gates to 1e-6."""
    if is_stub(fn):
        return Outcome("not written", NOT_WRITTEN)
    results = []
    for c in cases():
        want = reference(*c["args"])
        try:
            got = fn(*c["args"])
        except NotImplementedError:
            return Outcome("not written", NOT_WRITTEN)
        except Exception as e:  # noqa: BLE001 - the learner's error becomes a message, not a traceback
            return outcome([{"case": c["case"], "error": where_it_failed(e, fn.__code__.co_filename),
                             "hint": c["hint"]}], tol=0.0, what="", reference="")
        if not (isinstance(got, tuple) and len(got) == 3 and all(torch.is_tensor(t) for t in got)):
            return outcome([{"case": c["case"], "error": "return three tensors (expert, gate, kept)"}], tol=0.0,
                           what="", reference="")
        if any(a.shape != b.shape for a, b in zip(got, want)):
            return outcome([{"case": c["case"], "error": f"shapes {[tuple(t.shape) for t in got]}, expected "
                             f"{[tuple(t.shape) for t in want]}"}], tol=0.0, what="", reference="")
        what = ("experts differ" if not torch.equal(got[0], want[0]) else
                "which assignments are kept differs" if not torch.equal(got[2], want[2]) else "")
        results.append({"case": c["case"], "difference": _compare(got, want),
                        "hint": f"{what}: {c['hint']}" if what else c["hint"]})
    return outcome(results, tol=1e-6, what="your routing", reference="labtools.moe.route")


def solution_source() -> str:
    body = inspect.getsource(route)
    body = body[body.index('    T, E = logits.shape'):].replace("    return Routing(expert, gate, kept, probs, logits)",
                                                               "    return expert, gate, kept")
    return ("def my_route(logits, k, capacity):\n    \"\"\"(expert, gate, kept), each (T, k).\"\"\"\n"
            "    import torch.nn.functional as F\n" + body)


def show_solution() -> None:
    """The reference solution, folded (open it once you have tried)."""
    display(HTML(f"<details><summary>A solution</summary><pre>{html.escape(solution_source())}</pre></details>"))
