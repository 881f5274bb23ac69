"""Context parallelism: the sequence split over c ranks, attention computed with ring attention, written out.

Each rank holds the queries, keys and values of its own positions. Ring attention takes c steps: at each, a rank
attends its queries to the key/value block it holds, then passes that block to the next rank in the ring and
receives one from the previous. Partial results merge with the online-softmax rule (`merge`): each block's output
and log-sum-exp of its scores are enough to combine them exactly, so no rank ever holds the whole s × s matrix.

    pos = positions(s, c, rank, SeqLayout.ZIGZAG)  # this rank's positions in the sequence: two blocks
    out = ring_attention(q[..., pos, :], k[..., pos, :], v[..., pos, :], pos, blocks=2)

Under a causal mask a query never looks at later keys: with contiguous blocks the last rank works c times as hard
as the first. The zig-zag layout gives rank r blocks r and 2c − 1 − r of 2c, one early and one late, evening it.

Gradients: the ring's pass is an autograd function (`RingShift`) whose backward passes the gradient back the other
way, so autograd differentiates the whole ring. Real implementations (e.g. torch's context_parallel) call a fused
kernel per block and recompute in backward; here each block is written out, so its weights are kept for backward.
Introduced in notebooks/14_context_parallel.ipynb.
"""

import math
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from labtools.keys import Key
from labtools.validate import check_range


class SeqLayout(Key):
    """How the sequence is split over the c ranks: one contiguous block each, or two (zig-zag)."""
    CONTIGUOUS = "contiguous"
    ZIGZAG = "zigzag"


LAYOUTS = tuple(SeqLayout)


def positions(s: int, c: int, r: int, layout: SeqLayout) -> torch.Tensor:
    """The sequence positions rank r of c holds: a contiguous s/c, or blocks r and 2c − 1 − r of 2c (zig-zag)."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {tuple(x.value for x in LAYOUTS)}, got {layout!r}")
    check_range("c", c, 1, None, int)
    check_range("r", r, 0, c - 1, int)  # a rank of the c
    check_range("s", s, 1, None, int)
    if s % (2 * c):
        raise ValueError(f"the sequence length ({s}) must split into 2c = {2 * c} equal blocks")
    if layout == SeqLayout.CONTIGUOUS:
        n = s // c
        return torch.arange(r * n, (r + 1) * n)
    n = s // (2 * c)
    return torch.cat([torch.arange(r * n, (r + 1) * n), torch.arange((2 * c - 1 - r) * n, (2 * c - r) * n)])


def pieces(layout: SeqLayout) -> int:
    """Blocks each rank holds: one (contiguous) or two (zig-zag, even where its two happen to be neighbours)."""
    return 2 if layout == SeqLayout.ZIGZAG else 1


def segments(n: int, k: int) -> list[slice]:
    """n positions held as k equal blocks, as slices."""
    return [slice(i * n // k, (i + 1) * n // k) for i in range(k)]


def block_attention(q, k, v, q_pos, k_pos):
    """Causal attention of queries at q_pos to keys at k_pos, written out: (out, lse), lse the log-sum-exp of each
    query's scores (−inf, with an output of 0, for a query that sees none of these keys); None where every key lies
    after every query (nothing to compute)."""
    if k_pos.min() > q_pos.max():
        return None
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))
    if k_pos.max() > q_pos.min():  # some keys lie after some queries: mask them
        scores = scores.masked_fill(k_pos[None, :] > q_pos[:, None], float("-inf"))
    lse = torch.logsumexp(scores, dim=-1, keepdim=True)
    safe = lse.masked_fill(torch.isinf(lse), 0.0)  # a query that sees no key here: weights 0, lse −inf
    return torch.exp(scores - safe) @ v, lse


def merge(out1, lse1, out2, lse2):
    """Two partial attentions of the same queries over disjoint keys, combined exactly: each output is a softmax
    average over its own keys; weighted by its share of the total exp-sum, they give the average over all."""
    lse = torch.logaddexp(lse1, lse2)
    return torch.exp(lse1 - lse) * out1 + torch.exp(lse2 - lse) * out2, lse


class RingShift(torch.autograd.Function):
    """Send x to the next rank and receive the previous rank's; backward sends the gradient back the other way."""

    @staticmethod
    def forward(ctx, x, counter, group=None):
        ctx.counter, ctx.group = counter, group
        return _shift(x, +1, counter, group)

    @staticmethod
    def backward(ctx, g):
        return _shift(g.contiguous(), -1, ctx.counter, ctx.group), None, None


def _shift(x: torch.Tensor, direction: int, counter: dict | None, group=None) -> torch.Tensor:
    """x to the next rank of the ring (group: the whole world when None), the previous rank's x back."""
    n, r = dist.get_world_size(group), dist.get_rank(group)
    peer = (lambda i: i) if group is None else (lambda i: dist.get_global_rank(group, i))
    out = torch.empty_like(x)
    ops = [dist.P2POp(dist.isend, x.contiguous(), peer((r + direction) % n), group),
           dist.P2POp(dist.irecv, out, peer((r - direction) % n), group)]
    for req in dist.batch_isend_irecv(ops):
        req.wait()
    if counter is not None:
        counter["bytes"] = counter.get("bytes", 0) + x.numel() * x.element_size()
        counter["sends"] = counter.get("sends", 0) + 1
    return out


def attend(q, pos, blocks: int, k, v, k_pos, acc: list, *, counter: dict | None = None, merge_fn=merge) -> list:
    """One ring step's work on this rank: its queries (at pos, `blocks` equal blocks) against one key/value block
    (at k_pos, held the same way), each pair skipped where the mask hides it all, merged into acc (per query
    block: (out, lse) so far, or None)."""
    segs = segments(len(pos), blocks)
    for i, qs in enumerate(segs):
        for ks in segs:  # every rank holds its keys as it holds its queries
            part = block_attention(q[..., qs, :], k[..., ks, :], v[..., ks, :], pos[qs], k_pos[ks])
            if part is None:
                continue
            if counter is not None:
                counter["scores"] = counter.get("scores", 0) + (qs.stop - qs.start) * (ks.stop - ks.start)
            acc[i] = part if acc[i] is None else merge_fn(*acc[i], *part)
    return acc


def ring_attention(q, k, v, pos, *, blocks: int = 1, counter: dict | None = None, merge_fn=merge, group=None):
    """Causal attention of this rank's queries to the whole sequence's keys, over c ring steps. q, k, v: (…, n, d)
    at this rank's positions pos, held as `blocks` equal blocks (pieces(layout)). counter (a dict) gathers bytes
    sent, score entries computed and the seconds of CPU this thread spent computing blocks (not the waits).
    group: the c ranks that share the sequence (a process group; None: every rank of the launch)."""
    n_ranks = dist.get_world_size(group)
    acc = [None] * blocks
    kv, kv_pos = torch.stack([k, v]), pos
    for step in range(n_ranks):
        t0 = time.thread_time()
        acc = attend(q, pos, blocks, kv[0], kv[1], kv_pos, acc, counter=counter, merge_fn=merge_fn)
        if counter is not None:
            counter["compute_s"] = counter.get("compute_s", 0.0) + time.thread_time() - t0
        if step < n_ranks - 1:  # pass the block on; the positions travel with it (a few bytes, not counted)
            kv = RingShift.apply(kv, counter, group)
            kv_pos = _shift(kv_pos, +1, None, group)
    out = torch.cat([a[0] for a in acc], dim=-2)
    # Every rank must take part in every backward pass of the ring, even where a causal mask made it skip the blocks
    # it received (the ranks would wait on each other): a zero-weight term keeps the last block, and through it the
    # whole chain of passes, in the graph.
    return out + 0.0 * kv.sum() if n_ranks > 1 else out


def scores_per_rank(s: int, c: int, layout: SeqLayout) -> list[int]:
    """Score entries each rank computes in ring attention (the blocks it does not skip, masked ones included):
    what ring_attention counts at run time, worked out here from the blocks' first and last positions (integer
    arithmetic: the panel redraws it for c up to 16)."""
    positions(s, c, 0, layout)  # validates s, c and the layout
    n = s // (c * pieces(layout))
    starts = ({r: [r * n] for r in range(c)} if layout == SeqLayout.CONTIGUOUS else
              {r: [r * n, (2 * c - 1 - r) * n] for r in range(c)})
    return [sum(n * n for q in starts[r] for j in range(c) for k in starts[j] if not k > q + n - 1)
            for r in range(c)]


@dataclass(frozen=True)
class BlockCounts:
    """The blocks one rank runs through in ring attention, all of one length (queries × keys)."""
    length: int    # positions per block: s/c (contiguous) or s/2c (zig-zag)
    whole: int     # computed, every key before every query
    masked: int    # computed, some keys after some queries: the diagonal blocks
    skipped: int   # looked at and skipped: every key after every query
    merges: int    # merges of partial results: one per computed block after a query block's first


def block_counts(s: int, c: int, r: int, layout: SeqLayout) -> BlockCounts:
    """The blocks rank r computes, masks and skips in ring attention, and its merges: what ring_attention runs,
    from positions alone."""
    pos = positions(s, c, r, layout)
    k = pieces(layout)
    whole = masked = skipped = merges = 0
    for qs in segments(len(pos), k):
        q_first, q_last = int(pos[qs][0]), int(pos[qs][-1])
        done = 0
        for j in range(c):
            k_pos = positions(s, c, (r - j) % c, layout)
            for ks in segments(len(k_pos), k):
                k_first, k_last = int(k_pos[ks][0]), int(k_pos[ks][-1])
                if k_first > q_last:  # looked at, and skipped: every key after every query
                    skipped += 1
                elif k_last > q_first:  # some keys after some queries: the mask is built and applied
                    masked += 1
                    done += 1
                else:
                    whole += 1
                    done += 1
        merges += max(done - 1, 0)
    return BlockCounts(length=len(pos) // k, whole=whole, masked=masked, skipped=skipped, merges=merges)


def predicted_saved(scores: int, heads: int, element_size: int = 4) -> int:
    """Bytes a rank keeps for backward, its leading term: for every score entry it computed, per head, the score
    (logsumexp's backward needs it) and the weight (the product with the values needs it). Key/value blocks
    received and the log-sum-exps add a little more."""
    return 2 * heads * element_size * scores


def predicted_bytes(b: int, heads: int, s: int, head_dim: int, c: int, element_size: int = 4) -> int:
    """Bytes one rank sends for one forward and backward: c − 1 key/value blocks forward, their gradients back."""
    block = 2 * b * heads * (s // c) * head_dim * element_size  # keys and values of s/c positions
    return 2 * (c - 1) * block
