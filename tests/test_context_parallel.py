"""Context parallelism (labtools.parallel.context, lesson 14): layouts, the online-softmax merge, ring attention on
real ranks against one process, its bytes and its causal balance; the merge exercise."""

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from learner_files import load

from labtools.exercises import NOT_WRITTEN
from labtools.parallel import launch
from labtools.parallel.context import (LAYOUTS, SeqLayout, block_attention, block_counts, merge, positions,
                                       predicted_bytes, scores_per_rank, segments)

CONTIGUOUS, ZIGZAG = SeqLayout.CONTIGUOUS, SeqLayout.ZIGZAG


def test_every_position_is_held_by_exactly_one_rank_in_either_layout():
    for layout in LAYOUTS:
        for c in (1, 2, 4):
            held = torch.cat([positions(32, c, r, layout) for r in range(c)])
            assert sorted(held.tolist()) == list(range(32))
    assert positions(16, 4, 1, ZIGZAG).tolist() == [2, 3, 12, 13]  # blocks 1 and 2c − 1 − 1 = 6 of 8
    assert positions(16, 4, 1, "zigzag").tolist() == [2, 3, 12, 13]  # a Key answers to its value
    assert [(s.start, s.stop) for s in segments(4, 2)] == [(0, 2), (2, 4)]


def test_blocks_merged_with_their_log_sum_exps_equal_attention_over_all_keys():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 12, 8, generator=g) for _ in range(3))
    pos = torch.arange(12)
    parts = [block_attention(q, k[..., a:b, :], v[..., a:b, :], pos, pos[a:b]) for a, b in ((0, 5), (5, 12))]
    out, lse = merge(*parts[0], *parts[1])
    assert torch.allclose(out, F.scaled_dot_product_attention(q, k, v, is_causal=True), atol=1e-6)
    assert block_attention(q[..., :4, :], k[..., 8:, :], v[..., 8:, :], pos[:4], pos[8:]) is None  # all masked


@pytest.mark.ranks
def test_ring_attention_on_four_ranks_equals_one_process_and_zigzag_evens_the_work(session_run_root):
    from lessons.context_parallel import ranks, settings
    from test_dist import wait_gone

    S = settings("smoke", seq=64, rounds=1)
    res = launch(ranks.lesson_run, 4, S, desc="ring attention × 4", show_progress=False)
    # the ranks exit in the background once their results are in: gone before the next test looks for orphans
    assert wait_gone(session_run_root) == []
    for layout in LAYOUTS:
        assert max(x.layouts[layout].max_diff for x in res) < 1e-5
        assert all(x.layouts[layout].bytes == predicted_bytes(1, S.heads, 64, S.head_dim, 4) for x in res)
    contiguous = [x.layouts[CONTIGUOUS].scores for x in res]
    zigzag = [x.layouts[ZIGZAG].scores for x in res]
    assert contiguous == [256, 512, 768, 1024]  # rank r computes r + 1 blocks of 16 × 16 scores
    assert zigzag == [576] * 4  # 2c + 1 = 9 blocks of 8 × 8 each
    assert contiguous == scores_per_rank(64, 4, CONTIGUOUS) and zigzag == scores_per_rank(64, 4, ZIGZAG)
    # in total zig-zag computes less: its diagonal blocks are 8 × 8, so fewer masked scores are computed and dropped
    assert sum(zigzag) < sum(contiguous)


def test_the_block_cost_claim_tells_its_model_from_costing_blocks_by_their_scores_alone():
    from lessons.context_parallel import ranks, settings
    from lessons.context_parallel.ranks import BlockCosts
    from lessons.context_parallel.ring import predicted_busiest
    S = settings("smoke", seq=64, rounds=2, worlds=(4,))
    timed_here = ranks.timings(S, 4)
    costs = timed_here.block_costs
    assert all(t > 0 for kind in dataclasses.astuple(costs) for t in kind.values())
    timed = predicted_busiest(costs, S)
    per_score = {n: costs.whole[16] * (n / 16) ** 2 for n in (16, 8)}
    scores_only = predicted_busiest(BlockCosts(whole=per_score, masked=per_score, merge={16: 0, 8: 0},
                                               skipped={16: 0, 8: 0}), S)
    ratio = (scores_only[ZIGZAG] / scores_only[CONTIGUOUS]) / (timed[ZIGZAG] / timed[CONTIGUOUS])
    assert abs(ratio - 1) > 0.25, f"costing blocks by scores alone would pass the ±25% claim: {ratio:.2f}"
    times = timed_here.times[CONTIGUOUS]
    assert len(times) == 4 and max(times) / min(times) > 1.5  # the last rank's work is the largest


def test_block_counts_are_the_blocks_ring_attention_computes():
    for layout in LAYOUTS:
        for c in (2, 4):
            for r in range(c):
                counts = block_counts(64, c, r, layout)
                blocks = counts.whole + counts.masked
                assert counts.length ** 2 * blocks == scores_per_rank(64, c, layout)[r]
                n_query_blocks = 2 if layout == ZIGZAG else 1
                assert counts.length == 64 // (c * n_query_blocks)
                assert blocks + counts.skipped == c * n_query_blocks ** 2  # every pair looked at
                assert counts.merges == blocks - n_query_blocks
                assert counts.masked == n_query_blocks  # the diagonal blocks


def test_lesson_14_merge_solution_passes_and_forming_the_exp_sums_fails_on_large_scores():
    from lessons.context_parallel import merge_exercise

    assert merge_exercise.check_merge(merge_exercise.reference).passed

    def naive(out1, lse1, out2, lse2):
        s = torch.exp(lse1) + torch.exp(lse2)
        return (torch.exp(lse1) * out1 + torch.exp(lse2) * out2) / s, torch.log(s)

    out = merge_exercise.check_merge(naive)
    assert out.status == "fail" and "large scores" in out.message and "overflows" in out.message

    def by_count(out1, lse1, out2, lse2):
        return (out1 + out2) / 2, torch.logaddexp(lse1, lse2)

    out = merge_exercise.check_merge(by_count)
    assert out.status == "fail" and "two equal blocks" in out.message

    def stub(out1, lse1, out2, lse2):
        raise NotImplementedError

    assert merge_exercise.check_merge(stub).message == NOT_WRITTEN


@pytest.mark.ranks
def test_lesson_14_a_merge_right_in_value_but_cut_from_autograd_fails_only_on_the_ranks(tmp_path, session_run_root):
    from lessons.context_parallel import merge_exercise, settings
    from test_dist import wait_gone

    # the ranks rebuild the function from its source, as from a notebook cell
    source = "import torch\n\n" + merge_exercise.solution_source() + '''

def my_detached_merge(out1, lse1, out2, lse2):
    lse = torch.logaddexp(lse1, lse2).detach()  # the right values, but no gradient flows through the weights
    return torch.exp(lse1 - lse) * out1 + torch.exp(lse2 - lse) * out2, lse
'''
    my_merge, my_detached_merge = load(tmp_path, source, "my_merge"), load(tmp_path, source, "my_detached_merge")
    S = settings("smoke", seq=64)
    assert merge_exercise.check_merge(my_detached_merge).passed  # one process compares values only
    out = merge_exercise.check_merge(my_detached_merge, S)
    assert out.status == "fail" and "inside ring attention on 2 ranks" in out.message, out.message
    out = merge_exercise.check_merge(my_merge, S)
    assert out.passed and "on 2 real ranks" in out.message, out.message
    assert wait_gone(session_run_root) == []


@pytest.mark.ranks
def test_lesson_14_a_merge_that_never_ends_on_one_rank_stops_at_its_line(tmp_path, session_run_root, monkeypatch):
    from lessons.context_parallel import merge_exercise, settings
    from test_dist import wait_gone

    monkeypatch.setattr(merge_exercise, "COLLECTIVE_TIMEOUT_S", 5)  # the rank left waiting ends sooner
    my_merge = load(tmp_path, '''import torch

def my_merge(out1, lse1, out2, lse2):
    import torch.distributed as d
    while d.is_initialized() and d.get_rank() == 0:
        pass
    lse = torch.logaddexp(lse1, lse2)
    return torch.nan_to_num(torch.exp(lse1 - lse)) * out1 + torch.nan_to_num(torch.exp(lse2 - lse)) * out2, lse
''', "my_merge")
    out = merge_exercise.check_merge(my_merge, settings("smoke", seq=64))
    assert out.status == "fail" and "rank 0: your function did not finish" in out.message, out.message
    assert "line 3: `while d.is_initialized() and d.get_rank() == 0:`" in out.message or "line 4: `pass`" in out.message
    assert wait_gone(session_run_root) == []


@pytest.mark.ranks
def test_lesson_14_a_merge_cut_from_autograd_is_named_not_a_checker_error(tmp_path, session_run_root):
    from lessons.context_parallel import merge_exercise, settings

    my_merge = load(tmp_path, '''import torch

def my_merge(out1, lse1, out2, lse2):
    with torch.no_grad():
        lse = torch.logaddexp(lse1, lse2)
        return torch.nan_to_num(torch.exp(lse1 - lse)) * out1 + torch.nan_to_num(torch.exp(lse2 - lse)) * out2, lse
''', "my_merge")
    out = merge_exercise.check_merge(my_merge, settings("smoke", seq=64))
    assert out.status == "fail" and "no gradient reached q through your merge" in out.message, out.message
