"""Lesson 14, your turn: merge two partial attentions of the same queries over disjoint blocks of keys, using each
block's output and log-sum-exp, checked against attention over all the keys at once (torch's
scaled_dot_product_attention) and their log-sum-exp."""

import inspect
import math

import torch
import torch.nn.functional as F

from labtools.exercises import Outcome, attempt, failed, outcome
from labtools.learner import source_of
from labtools.parallel.context import merge

HINT = ("the two outputs are not an equal average: each is normalised over its own keys only, so each must count "
        "with its block's share of the total exp-sum, and the lse returned is that of all the keys")


LSE_HINT = ("the lse of all the keys is the log of the sum of the blocks' exp-sums, log(e^lse1 + e^lse2): neither "
            "their sum nor their maximum")
GRAD_HINT = ("a part of your merge that autograd cannot see: a weight taken with .detach(), .item() or torch.no_grad() "
             "leaves the value right but cuts the gradient of lse, which the keys' gradients flow through")


reference = merge  # the lab's own merge, which ring attention uses: the solution shown is its source


def _partial(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1, keepdim=True)
    return torch.nan_to_num(torch.exp(scores - lse)) @ v, lse


def cases() -> list[dict]:
    """(name, the two partials' arguments, attention over all keys and its lse, hint)."""
    g = torch.Generator().manual_seed(0)
    out = []
    for name, n1, n2, scale, masked, hint in (
            ("two equal blocks", 6, 6, 1.0, False, HINT),
            ("unequal blocks", 3, 9, 1.0, False, "weight each output by its block's share of the total exp-sum, "
                                                  "not by its number of keys"),
            ("large scores", 5, 7, 60.0, False, "exp(lse) overflows float32 here: never form it; use logaddexp "
                                                "and exp(lseᵢ − lse)"),
            ("a block some queries cannot see", 4, 4, 1.0, True, "a query that sees no key of a block has lse "
                                                                 "−inf there: its weight must come out 0, not nan")):
        q = torch.randn(1, 2, 5, 8, generator=g) * scale
        k, v = torch.randn(1, 2, n1 + n2, 8, generator=g), torch.randn(1, 2, n1 + n2, 8, generator=g)
        mask = torch.ones(5, n1 + n2, dtype=torch.bool)
        if masked:
            mask[:2, n1:] = False  # the first two queries see nothing of block 2
        p1 = _partial(q, k[..., :n1, :], v[..., :n1, :], mask[:, :n1])
        p2 = _partial(q, k[..., n1:, :], v[..., n1:, :], mask[:, n1:])
        full = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        lse = torch.logsumexp((q @ k.transpose(-2, -1) / math.sqrt(8)).masked_fill(~mask, float("-inf")), -1, True)
        out.append({"case": name, "args": (*p1, *p2), "expected": (full, lse), "hint": hint})
    return out


RANKS = 2
COLLECTIVE_TIMEOUT_S = 20  # a merge that fails on the ranks leaves its peers waiting: end them soon
# Your merge has a bound of its own on the ranks (a multiple of the lab's merge's time); this one is the whole
# launch's, for what that cannot stop: the lab's merge takes 5-10 s here, most of it starting the processes
TIMEOUT_S = 90


def check_merge(fn, S=None) -> Outcome:
    """Your merge of two partials against attention over all the keys at once, and its log-sum-exp; then, given
    the lesson's settings S, inside ring attention on real ranks against one process."""
    results = []
    for c in cases():
        tried = attempt(fn, *c["args"], case=c["case"], hint=c["hint"])
        if not tried.returned:
            return tried.outcome
        got = tried.value
        if not (isinstance(got, tuple) and len(got) == 2 and all(torch.is_tensor(t) for t in got)):
            return failed(c["case"], "return the pair (out, lse), both tensors")
        if got[0].shape != c["expected"][0].shape or got[1].shape != c["expected"][1].shape:
            return failed(c["case"], f"shapes {tuple(got[0].shape)} and {tuple(got[1].shape)}, expected "
                                     f"{tuple(c['expected'][0].shape)} and {tuple(c['expected'][1].shape)}")
        d_out, d_lse = ((a - b).abs().max().item() / max(1.0, b.abs().max().item()) if torch.isfinite(a).all()
                        else math.inf for a, b in zip(got, c["expected"]))  # relative: lse runs to hundreds
        if d_out <= 1e-5 < d_lse:  # the output right, the lse not: say which, and why
            return failed(c["case"], f"your out is right but your lse differs by a relative {d_lse:.1e}", LSE_HINT)
        if d_lse <= 1e-5 < d_out:
            return failed(c["case"], f"your lse is right but your out differs by a relative {d_out:.1e}", c["hint"])
        results.append({"case": c["case"], "difference": max(d_out, d_lse), "hint": c["hint"]})
    verdict = outcome(results, tol=1e-5, what="your merge", reference="attention over all the keys at once",
                      relative=True)
    if not verdict.passed or S is None:
        return verdict
    return _on_ranks(fn, S, verdict)


def _on_ranks(fn, S, verdict: Outcome) -> Outcome:
    import dataclasses

    from labtools.parallel import RankFailed, RunTimedOut, launch
    from lessons.context_parallel.ranks import MergeJob, merge_on_ranks
    shared = {f.name: getattr(S, f.name) for f in dataclasses.fields(S) if f.init}
    job = MergeJob(**shared, source=source_of(fn), name=fn.__name__)
    try:
        res = launch(merge_on_ranks, RANKS, job, collective_timeout_s=COLLECTIVE_TIMEOUT_S, timeout_s=TIMEOUT_S,
                     desc=f"your merge × {RANKS}")
    except RunTimedOut as e:
        return Outcome("fail", f"inside ring attention on {RANKS} ranks your merge did not finish in {e.seconds:.0f} "
                               "s — hint: a loop whose counter never moves")
    except RankFailed as e:
        return Outcome("fail", f"on {RANKS} ranks the run stopped: {e.error.splitlines()[0][:200]}")
    errors = [r.error for r in res if r.error]  # a rank out of time first: the others only waited for it
    failed = next((e for e in errors if "did not finish" in e), errors[0] if errors else None)
    if failed:
        return Outcome("fail", f"inside ring attention on {RANKS} ranks: {failed}")
    worst = max(r.difference for r in res)
    if worst > 1e-5:
        if max(r.output_difference for r in res) <= 1e-5:  # the value right, its gradient not
            return Outcome("fail", f"inside ring attention on {RANKS} ranks your merge's output is right but the "
                                   f"gradients differ from one process's by {worst:.1e} — hint: {GRAD_HINT}", worst)
        return Outcome("fail", f"inside ring attention on {RANKS} ranks the output differs from one process's by "
                               f"{worst:.1e} — hint: {HINT}", worst)
    return Outcome("pass", f"{verdict.message}; inside ring attention on {RANKS} real ranks, its output and "
                           f"gradients equal one process's to {worst:.0e}", worst)


def solution_source() -> str:
    return inspect.getsource(merge).replace("def merge(", "def my_merge(")
