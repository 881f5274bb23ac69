"""labtools.exercises and the lessons' write-it-yourself exercises: the solution passes, the stub says "not written
yet" (and costs nothing), a typical wrong answer fails with a hint that names the case."""

import math
import os
import threading
import time

import pytest
import torch

from labtools.exercises import NOT_WRITTEN, Case, check, difference
from labtools.learner import BOUND_FLOOR_S, TookTooLong, is_stub, time_bound
from lessons import data_parallel
from lessons.data_parallel import ring_exercise


def clip_reference(grads: list[torch.Tensor], max_norm: float) -> None:
    total = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
    for g in grads:
        g.mul_(min(1.0, max_norm / (total.item() + 1e-6)))


CASES = [Case("two small tensors", ([torch.full((1,), 0.5), torch.full((1,), 0.5)], 1.0)),
         Case("one huge, one tiny", ([torch.full((4,), 100.0), torch.full((4,), 1e-3)], 1.0),
              hint="the norm is over all gradients together, not per tensor")]


def test_a_right_answer_passes_with_its_largest_difference():
    def mine(grads, max_norm):
        norm = sum(g.pow(2).sum() for g in grads).sqrt()
        for g in grads:
            g.mul_(min(1.0, max_norm / (norm.item() + 1e-6)))

    out = check(mine, clip_reference, CASES)
    assert out.passed and "2 cases" in out.message and out.worst < 1e-6


def test_the_stub_is_not_written_yet_and_nothing_runs():
    ran = []

    def mine(grads, max_norm):
        """Clip all gradients together to max_norm."""
        ran.append(1)
        raise NotImplementedError("your code here")

    assert is_stub(mine)
    out = check(mine, clip_reference, CASES)
    assert out.status == "not written" and out.message == NOT_WRITTEN and ran == []


def test_clipping_per_tensor_fails_on_the_case_that_shows_it_with_the_hint():
    def per_tensor(grads, max_norm):
        for g in grads:
            g.mul_(min(1.0, max_norm / (g.norm().item() + 1e-6)))

    out = check(per_tensor, clip_reference, CASES)
    assert out.status == "fail" and "one huge, one tiny" in out.message and "not per tensor" in out.message


def test_an_error_names_the_case_and_the_learners_line_not_a_traceback():
    def broken(grads, max_norm):
        total = 0.0
        return total / 0

    out = check(broken, clip_reference, CASES)
    assert out.status == "fail" and "ZeroDivisionError" in out.message and "line 3 of your function" in out.message
    assert "Traceback" not in out.message


def test_a_loop_that_never_ends_stops_at_its_line_and_an_exit_is_a_message():
    def endless(grads, max_norm):
        i = 0
        while i < 10:
            total = 0.0
        return total

    start = time.monotonic()
    out = check(endless, clip_reference, CASES)
    assert out.status == "fail" and f"did not finish in {BOUND_FLOOR_S:.3g} s" in out.message
    assert "line 4: `total = 0.0`" in out.message or "line 3: `while i < 10:`" in out.message
    assert time.monotonic() - start < 10 * BOUND_FLOOR_S  # bounded (a loose bound: the machine may be busy)

    def leaves(grads, max_norm):
        raise SystemExit(0)

    out = check(leaves, clip_reference, CASES)  # the check, and the kernel it runs in, go on
    assert out.status == "fail" and "SystemExit" in out.message and "`raise SystemExit(0)`" in out.message


def test_a_learners_own_except_does_not_swallow_the_time_bound():
    def stubborn(grads, max_norm):
        while True:
            try:
                sum(range(1000))
            except Exception:
                pass

    assert "did not finish" in check(stubborn, clip_reference, CASES).message


def test_time_bound_is_checked_and_off_the_main_thread_does_not_bound():
    with pytest.raises(ValueError, match="seconds"):
        with time_bound(0):
            pass
    with pytest.raises(TookTooLong):
        with time_bound(0.05):
            while True:
                pass
    done = []
    thread = threading.Thread(target=lambda: [time_bound(0.01).__enter__(), time.sleep(0.05), done.append(1)])
    thread.start()
    thread.join()
    assert done == [1]


@pytest.mark.parametrize("kwargs, match", [({"cases": []}, "at least one case"), ({"tol": math.nan}, "tol"),
                                           ({"tol": -1.0}, "tol")])
def test_check_refuses_no_cases_and_a_tolerance_that_is_not_a_number(kwargs, match):
    args = {"cases": CASES} | kwargs
    with pytest.raises(ValueError, match=match):
        check(lambda grads, max_norm: None, clip_reference, args.pop("cases"), **args)


def test_difference_refuses_a_different_shape_or_structure():
    assert difference(torch.ones(3), torch.ones(3)) == 0.0
    assert difference(torch.ones(3), torch.ones(4)) == float("inf")
    assert difference([1.0, 2.0], [1.0]) == float("inf")
    assert difference({"a": 1.0}, {"a": 1.5}) == 0.5


@pytest.mark.ranks
def test_lesson_07_ring_on_real_ranks_solution_passes_and_a_ring_without_all_gather_fails():
    S = data_parallel.settings("smoke")
    good = ring_exercise.check(ring_exercise.reference, S)
    assert good.passed and "2(N−1)/N · M = 64" in good.message and "64 bytes sent" in good.message
    assert "DDP trained the lesson's model on 3 ranks with your ring" in good.message  # the ring, used

    def my_ring_all_reduce(x, exchange):
        raise NotImplementedError

    assert ring_exercise.check(my_ring_all_reduce, S).message == NOT_WRITTEN  # no launch

    def reduce_scatter_only(x, exchange):
        n, r = dist.get_world_size(), dist.get_rank()  # noqa: F821 - the ranks provide dist
        chunks = list(x.view(-1).tensor_split(n))
        for s in range(n - 1):
            chunks[(r - s - 1) % n] += exchange(chunks[(r - s) % n], chunks[(r - s - 1) % n])

    bad = ring_exercise.check(reduce_scatter_only, S)
    assert bad.status == "fail" and "12 elements on 3 ranks" in bad.message and "one chunk is right" in bad.message


@pytest.mark.ranks
def test_lesson_07_ring_that_never_ends_on_one_rank_stops_at_its_line_and_names_the_rank():
    S = data_parallel.settings("smoke")

    def forgets_to_move(x, exchange):
        n, r = dist.get_world_size(), dist.get_rank()  # noqa: F821 - the ranks provide dist
        chunks = list(x.view(-1).tensor_split(n))
        s = 0
        while s < n - 1:
            if r == 0:
                continue  # rank 0 spins; the others wait for its chunk
            chunks[(r - s - 1) % n] += exchange(chunks[(r - s) % n], chunks[(r - s - 1) % n])
            s += 1

    out = ring_exercise.check(forgets_to_move, S)
    assert out.status == "fail" and "rank 0: your function did not finish" in out.message
    assert "line 7: `continue" in out.message and "exchange()" not in out.message.split("hint")[0]


@pytest.mark.ranks
def test_lesson_07_ring_refuses_a_collective_called_directly_and_a_ring_that_sends_the_whole_tensor():
    S = data_parallel.settings("smoke")

    def own_collective(x, exchange):
        import torch.distributed
        torch.distributed.all_reduce(x)

    out = ring_exercise.check(own_collective, S)
    assert out.status == "fail" and "torch.distributed.all_reduce is not part of this exercise" in out.message

    def whole_tensor(x, exchange):
        total, y = x.clone(), x.clone()
        for _ in range(dist.get_world_size() - 1):  # noqa: F821 - the ranks provide dist
            y = exchange(y, y)
            total += y
        x.copy_(total)

    out = ring_exercise.check(whole_tensor, S)
    assert out.status == "fail" and "the sum is right, but a rank sent 96 bytes where a ring all-reduce sends 64" \
        in out.message


def test_lesson_00_adamw_step_solution_passes_and_adam_with_l2_fails_on_weight_decay():
    from lessons.training_loop import adamw_exercise

    assert adamw_exercise.check_step(adamw_exercise.reference).passed

    def my_adamw_step(p, g, m, v, t, lr, beta1, beta2, eps, weight_decay):
        raise NotImplementedError

    assert adamw_exercise.check_step(my_adamw_step).message == NOT_WRITTEN

    def adam_l2(p, g, m, v, t, lr, beta1, beta2, eps, weight_decay):
        g = g + weight_decay * p  # L2 through the gradient: not AdamW
        m, v = beta1 * m + (1 - beta1) * g, beta2 * v + (1 - beta2) * g * g
        return p - lr * (m / (1 - beta1**t)) / ((v / (1 - beta2**t)).sqrt() + eps), m, v

    out = adamw_exercise.check_step(adam_l2)
    assert out.status == "fail" and "weight decay 0.1" in out.message and "Adam + L2" in out.message


def test_lesson_02_schedule_solution_passes_and_a_schedule_that_does_not_clamp_fails_past_the_end():
    import math

    from lessons.lr_schedules import schedule_exercise

    namespace = {"math": math}
    exec(schedule_exercise.solution_source(), namespace)  # noqa: S102 - the lesson's own solution, as a cell holds it
    assert schedule_exercise.check_schedule(namespace["my_warmup_cosine"]).passed

    def no_clamp(step, warmup, total, min_ratio):
        if step < warmup:
            return step / warmup
        p = (step - warmup) / (total - warmup)
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * p))

    out = schedule_exercise.check_schedule(no_clamp)
    assert out.status == "fail" and "past the end" in out.message and "clamp" in out.message


def test_in_place_checks_both_the_value_returned_and_the_arguments_after_the_call():
    def ref(xs):
        total = sum(x.sum().item() for x in xs)
        for x in xs:
            x.mul_(2)
        return total

    def forgets_to_scale(xs):
        return sum(x.sum().item() for x in xs)

    def returns_after(xs):
        for x in xs:
            x.mul_(2)
        return sum(x.sum().item() for x in xs)

    case = [Case("two", ([torch.ones(2), torch.ones(3)],))]
    assert check(ref, ref, case, in_place=True).passed
    out = check(forgets_to_scale, ref, case, in_place=True)
    assert out.status == "fail" and "the arguments after the call" in out.message
    assert "expected [2, 2], got [1, 1]" in out.message
    out = check(returns_after, ref, case, in_place=True)
    assert out.status == "fail" and "the value returned" in out.message and "expected 5" in out.message


def _grads():
    g = torch.Generator().manual_seed(1)
    return [torch.randn(8, 8, generator=g), torch.randn(8, generator=g)]


def test_lesson_03_clipping_solution_passes_and_typical_mistakes_fail_on_the_case_that_shows_them():
    import math

    from lessons.stability import clip_exercise

    namespace = {"math": math, "torch": torch}
    exec(clip_exercise.solution_source(), namespace)  # noqa: S102 - the lesson's own solution, as a cell holds it
    good = clip_exercise.check_clipping(namespace["my_clip_grad_norm"], _grads())
    assert good.passed and "6 cases" in good.message

    def per_tensor(grads, max_norm):
        norms = [g.norm().item() for g in grads]
        for g, n in zip(grads, norms):
            g.mul_(min(1.0, max_norm / (n + 1e-6)))
        return math.sqrt(sum(n * n for n in norms))

    out = clip_exercise.check_clipping(per_tensor, _grads())
    assert out.status == "fail" and "different shapes" in out.message and "not a norm per tensor" in out.message

    def sum_of_norms(grads, max_norm):
        total = sum(g.norm().item() for g in grads)
        for g in grads:
            g.mul_(min(1.0, max_norm / (total + 1e-6)))
        return total

    out = clip_exercise.check_clipping(sum_of_norms, _grads())
    assert out.status == "fail" and "different shapes" in out.message and "not a sum of norms" in out.message

    def no_epsilon(grads, max_norm):
        total = math.sqrt(sum((g ** 2).sum().item() for g in grads))
        for g in grads:
            g.mul_(min(1.0, max_norm / total))
        return total

    out = clip_exercise.check_clipping(no_epsilon, _grads())
    assert out.status == "fail" and "all zeros" in out.message and "ZeroDivisionError" in out.message

    def returns_the_clipped_norm(grads, max_norm):
        total = math.sqrt(sum((g ** 2).sum().item() for g in grads))
        for g in grads:
            g.mul_(min(1.0, max_norm / (total + 1e-6)))
        return min(total, max_norm)

    out = clip_exercise.check_clipping(returns_the_clipped_norm, _grads())
    assert out.status == "fail" and "above the threshold" in out.message and "the value returned" in out.message


def test_lesson_01_weight_decay_solution_passes_and_the_two_forms_swapped_fail_with_the_hint():
    from lessons.adamw_vs_adam_l2 import decay_exercise

    assert decay_exercise.check_decay(decay_exercise.reference).passed

    def swapped(p, g, lr, weight_decay, decoupled):
        return decay_exercise.reference(p, g, lr, weight_decay, not decoupled)

    out = decay_exercise.check_decay(swapped)
    assert out.status == "fail" and "AdamW, λ = 0.1" in out.message and "leaves the gradient alone" in out.message

    def without_lr(p, g, lr, weight_decay, decoupled):
        return (p * (1 - weight_decay), g) if decoupled else (p, g + weight_decay * p)

    out = decay_exercise.check_decay(without_lr)
    assert out.status == "fail" and "AdamW, λ = 0.1" in out.message

    def returns_p_only(p, g, lr, weight_decay, decoupled):
        return p

    assert "return the pair (p, g)" in decay_exercise.check_decay(returns_p_only).message


def test_lesson_04_scaler_update_solution_passes_and_forgetting_the_reset_fails_with_the_hint():
    from lessons.mixed_precision import scaler_exercise

    assert scaler_exercise.check_update(scaler_exercise.reference).passed

    def no_reset(scale, clean_steps, found_inf, growth_interval):
        if found_inf:
            return scale * 0.5, clean_steps  # halves, but keeps counting
        clean_steps += 1
        return (scale * 2.0, 0) if clean_steps % growth_interval == 0 else (scale, clean_steps)

    out = scaler_exercise.check_update(no_reset)
    assert out.status == "fail" and "one overflow" in out.message and "restarts the count" in out.message
    assert "after step 4 the scale is 2^16, GradScaler's is 2^15" in out.message

    def never_grows(scale, clean_steps, found_inf, growth_interval):
        return (scale * 0.5, 0) if found_inf else (scale, clean_steps + 1)

    out = scaler_exercise.check_update(never_grows)
    assert out.status == "fail" and "ten clean steps" in out.message



def test_lesson_04_replay_puts_a_right_rule_on_the_runs_scale_and_names_the_step_a_wrong_one_leaves_it():
    from types import SimpleNamespace

    from lessons.mixed_precision import scaler_exercise
    from lessons.mixed_precision.loss_scaling import Recipe

    skipped = [False] * 5 + [True] + [False] * 6 + [True, True] + [False] * 4
    scale, clean, scales = 2.0**16, 0, []
    for k in skipped:  # the scale before each step, as the lab's DynamicLossScaler logs it
        scales.append(scale)
        scale, clean = scaler_exercise.reference(scale, clean, k, 3)
    runs = {Recipe.FP16_DYNAMIC: SimpleNamespace(step=list(range(1, 19)), loss_scale=scales, skipped=skipped)}
    S = SimpleNamespace(growth_interval=3)
    out = scaler_exercise.replay(scaler_exercise.reference, runs, S)
    assert out.passed and "all 18 steps" in out.message and "3 overflows" in out.message

    def no_reset(scale, clean_steps, found_inf, growth_interval):
        if found_inf:
            return scale * 0.5, clean_steps
        clean_steps += 1
        return (scale * 2.0, 0) if clean_steps % growth_interval == 0 else (scale, clean_steps)

    out = scaler_exercise.replay(no_reset, runs, S)
    assert out.status == "fail" and "from step 8 your scale differs" in out.message, out.message

def test_lesson_05_block_bytes_solution_passes_and_miscounting_a_half_fails_with_the_bytes():
    from lessons.activation_checkpointing import block_exercise

    assert block_exercise.check_bytes(block_exercise.reference).passed

    def keeps_both_halves_inputs_only(b, s, h, policy):  # forgets that the other half keeps all it did
        return {"none": 16, "attn": 2, "mlp": 2, "block": 1}[policy] * b * s * h * 4

    out = block_exercise.check_bytes(keeps_both_halves_inputs_only)
    assert out.status == "fail" and "checkpoint attention" in out.message and "autograd kept" in out.message

    def in_elements(b, s, h, policy):  # forgets the 4 bytes per element
        return {"none": 16, "attn": 11, "mlp": 7, "block": 1}[policy] * b * s * h

    out = block_exercise.check_bytes(in_elements)
    assert out.status == "fail" and "no checkpointing" in out.message and "4 bytes each" in out.message


def test_lesson_06_zero_solution_passes_and_forgetting_the_master_copy_fails_on_stage_0():
    from lessons.memory_budget import zero_exercise

    assert zero_exercise.check_zero(zero_exercise.reference).passed

    def no_master_copy(stage, N):  # the widely repeated 12 bytes per parameter
        weights, grads, states = 2, 2, 8
        return (weights / N if stage >= 3 else weights) + (grads / N if stage >= 2 else grads) + \
            (states / N if stage >= 1 else states)

    out = zero_exercise.check_zero(no_master_copy)
    assert out.status == "fail" and "no ZeRO, 8 GPUs" in out.message and "expected 16 bytes per parameter, got 12 bytes per parameter" in out.message

    def stage_1_shards_everything(stage, N):
        return 16 / N if stage else 16

    out = zero_exercise.check_zero(stage_1_shards_everything)
    assert out.status == "fail" and "ZeRO-1, 8 GPUs" in out.message and "master copy" in out.message


def _shard_like(sizes, worlds=(2, 4)):
    """Section 1's results as the exercise reads them, with the rule's partitions (the notebook's ledger holds
    ZeroRedundancyOptimizer's own partition equal to the rule on every run: claim z1_greedy)."""
    from lessons.fsdp_zero import Strategy
    from lessons.fsdp_zero.partition_exercise import reference
    from lessons.fsdp_zero.ranks import ShardingResult, StrategyResult

    def zero1(part):
        return StrategyResult(params=0, held_after_forward=0, grads=0, optimizer=0, calls={}, input_bytes={},
                              events=[], wire_bytes=None, partition=part)
    return {w: [ShardingResult(sizes=sizes, strategies={Strategy.ZERO1: zero1(part)}) for part in reference(sizes, w)]
            for w in worlds}


def test_lesson_08_partition_solution_passes_and_round_robin_or_unsorted_fails_naming_the_rank():
    from lessons.fsdp_zero import partition_exercise

    shard = _shard_like([4096, 64, 64, 16384, 16384, 64, 4096, 65536, 256])
    assert partition_exercise.check_partition(partition_exercise.reference, shard).passed

    def round_robin(sizes, N):
        return [list(range(r, len(sizes), N)) for r in range(N)]

    out = partition_exercise.check_partition(round_robin, shard)
    assert out.status == "fail" and "on 2 ranks" in out.message and "rank 0 should hold" in out.message
    assert "largest parameters first" in out.message

    def unsorted_greedy(sizes, N):  # the least-loaded rank, but in the parameters' own order
        held, ranks = [0] * N, [[] for _ in range(N)]
        for i, s in enumerate(sizes):
            r = held.index(min(held))
            ranks[r].append(i)
            held[r] += s
        return ranks

    assert partition_exercise.check_partition(unsorted_greedy, shard).status == "fail"

    def my_zero1_partition(sizes, N):
        raise NotImplementedError

    assert partition_exercise.check_partition(my_zero1_partition, shard).message == NOT_WRITTEN


def _timed_1f1b(worlds=(2, 4), ms=(4, 8)):
    """Section 3's launches as the exercise reads them, with the rule's order as the timed actions (the notebook's
    ledger holds torch's Schedule1F1B to the same order on every run: claim torch_1f1b_order)."""
    from labtools.pipeline import Schedule
    from lessons.pipeline_parallel.launches import DepthRun
    from lessons.pipeline_parallel.order_exercise import rule_orders
    from lessons.pipeline_parallel.ranks import Timeline, TimelinesResult
    out = {}
    for p in worlds:
        runs = []
        for m in ms:
            intervals = [{"row": r, "kind": "forward" if k == "F" else "backward", "mb": i}
                         for r, order in enumerate(rule_orders(p, m)) for k, i in order]
            runs.append(Timeline(schedule=Schedule.ONE_F_ONE_B, p=p, m=m, intervals=intervals))
        out[p] = DepthRun(ranks=[TimelinesResult(timelines=runs, overruns=0, simulated=True)], single_losses=[],
                          real=None)
    return out


def test_lesson_09_order_solution_passes_and_gpipe_or_no_clamp_fails_naming_rank_and_action():
    from lessons.pipeline_parallel import order_exercise

    results = _timed_1f1b()
    assert order_exercise.check_order(order_exercise.reference, results).passed

    def gpipe(r, p, m):
        return [("F", i) for i in range(m)] + [("B", i) for i in range(m)]

    out = order_exercise.check_order(gpipe, results)
    assert out.status == "fail" and "p = 2, m = 4 (torch's run), rank 0" in out.message
    assert "action 3 should be ('B', 0)" in out.message and "min(m, p − r)" in out.message

    def warmup_then_f_b(r, p, m):  # the same order written with one forward fewer, then forward-backward pairs
        w = min(m, p - r) - 1
        order = [("F", i) for i in range(w)]
        for i in range(m - w):
            order += [("F", w + i), ("B", i)]
        return order + [("B", i) for i in range(m - w, m)]

    assert order_exercise.check_order(warmup_then_f_b, results).passed

    def no_clamp(r, p, m):  # forgets that m can be smaller than p − r
        return [("F", i) for i in range(p - r)] + [("B", i) for i in range(m)]

    out = order_exercise.check_order(no_clamp, results)
    assert out.status == "fail" and "rank" in out.message


def test_lesson_10_shards_solution_passes_and_splitting_c_proj_by_rows_fails_naming_the_shard():
    from lessons.tensor_parallel import shard_exercise

    assert shard_exercise.check_shards(shard_exercise.reference).passed

    def both_by_rows(W_fc, b_fc, W_proj, t, r):  # c_proj split like c_fc: the wrong dimension
        n = W_fc.shape[0] // t
        rows = slice(r * n, (r + 1) * n)
        return W_fc[rows], b_fc[rows], W_proj[rows]

    out = shard_exercise.check_shards(both_by_rows)
    assert out.status == "fail" and "rank 0" in out.message and "W_proj shard" in out.message
    assert "row-parallel" in out.message

    def whole(W_fc, b_fc, W_proj, t, r):  # every rank keeps everything: the partial outputs would add up t times
        return W_fc, b_fc, W_proj

    out = shard_exercise.check_shards(whole)
    assert out.status == "fail" and "W_fc shard" in out.message


def test_lesson_11_atomic_save_solution_survives_sigkills_and_an_in_place_write_does_not(tmp_path):
    from lessons.fault_tolerance import save_exercise

    good = save_exercise.check_save(save_exercise.reference, tmp_path / "good", kills=2)
    assert good.passed and "right after its one step that touches the file and 2 at random" in good.message, \
        good.message

    def in_place(path, data):
        with open(path, "wb") as f:
            f.write(data)

    out = save_exercise.check_save(in_place, tmp_path / "bad", kills=0)  # no random kill needed to catch it
    assert out.status == "fail" and "right after your save opened it for writing" in out.message, out.message
    assert "0 bytes that are no whole version" in out.message and "rename it over the target" in out.message

    def copy_over(path, data):  # a temporary file, then copied over the target: the target is rewritten in place
        import shutil
        tmp = path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(data)
        shutil.copyfile(tmp, path)

    out = save_exercise.check_save(copy_over, tmp_path / "copy", kills=0)
    assert out.status == "fail" and "opened it for writing" in out.message, out.message

    def remove_first(path, data):  # a temporary file, the old one removed, then the rename: a window with no file
        tmp = path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(data)
        if os.path.exists(path):
            os.remove(path)
        os.rename(tmp, path)

    out = save_exercise.check_save(remove_first, tmp_path / "remove", kills=0)
    assert out.status == "fail" and "right after your save removed it" in out.message, out.message
    assert "no file at all" in out.message and "os.replace" in out.message

    def my_atomic_save(path, data):
        raise NotImplementedError

    assert save_exercise.check_save(my_atomic_save, tmp_path / "stub").message == NOT_WRITTEN
    assert not (tmp_path / "stub").exists()  # a stub starts no process and writes nothing


def test_lesson_12_flops_solution_passes_and_forgetting_attention_or_the_head_fails():
    from lessons.compute_budget import flops_exercise

    counts = [{"shape": (L, d, 4, T), "vocab": V, "train": flops_exercise.reference(L, d, V, T)}
              for L, d, V, T in ((2, 64, 96, 64), (3, 96, 96, 256))]  # the notebook checks FlopCounterMode's counts
    assert flops_exercise.check_flops(flops_exercise.reference, counts).passed

    def no_attention(L, d, V, T):
        return 6 * (12 * L * d * d + V * d)

    out = flops_exercise.check_flops(no_attention, counts)
    assert out.status == "fail" and "L = 2, h = 64" in out.message and "12·L·s·h" in out.message
    assert "you said" in out.message

    def no_head(L, d, V, T):
        return 6 * 12 * L * d * d + 12 * L * T * d

    assert flops_exercise.check_flops(no_head, counts).status == "fail"


def _stub_of(module) -> object:
    """The learner's cell as the notebook gives it: the solution's signature, a body that raises NotImplementedError."""
    import ast
    tree = ast.parse(module.solution_source())
    fn = tree.body[0]
    fn.body = [ast.Raise(exc=ast.Name(id="NotImplementedError", ctx=ast.Load()))]
    fn.decorator_list = []  # lesson 22's @triton.jit: the stub is read, never launched
    namespace = {}
    if "tl.constexpr" in module.solution_source():  # lesson 22's kernel: its signature names Triton's types
        from labtools.kernels import tl
        namespace["tl"] = tl
    exec(compile(ast.fix_missing_locations(tree), "<stub>", "exec"), namespace)  # noqa: S102 - a test's own stub
    stub = namespace[fn.name]
    stub.__source__ = ast.unparse(tree)
    return stub


def test_every_lessons_exercise_reports_an_unfilled_stub_as_not_written_and_runs_nothing(tmp_path, monkeypatch):
    """Each lesson's check, given the stub as the notebook has it (inspect cannot read an exec'd function's source,
    so is_stub reads it from __source__ here), says 'not written yet' without launching, training or counting."""
    import importlib
    import inspect as inspect_module

    from test_browser import EXERCISES

    real_getsource = inspect_module.getsource
    monkeypatch.setattr(inspect_module, "getsource",
                        lambda obj: getattr(obj, "__source__", None) or real_getsource(obj))
    checks = {  # each module's check, with what it reads from the notebook's run (unused by a stub)
        "adamw_exercise": lambda m, f: m.check_step(f), "decay_exercise": lambda m, f: m.check_decay(f),
        "schedule_exercise": lambda m, f: m.check_schedule(f),
        "clip_exercise": lambda m, f: m.check_clipping(f, [torch.ones(2)]),
        "scaler_exercise": lambda m, f: m.check_update(f), "block_exercise": lambda m, f: m.check_bytes(f),
        "zero_exercise": lambda m, f: m.check_zero(f), "partition_exercise": lambda m, f: m.check_partition(f, {}),
        "order_exercise": lambda m, f: m.check_order(f, {}), "shard_exercise": lambda m, f: m.check_shards(f),
        "save_exercise": lambda m, f: m.check_save(f, tmp_path), "flops_exercise": lambda m, f: m.check_flops(f, []),
        "intensity_exercise": lambda m, f: m.check_intensity(f, {"ops": [], "ridge": 1.0}),
        "merge_exercise": lambda m, f: m.check_merge(f), "memory_exercise": lambda m, f: m.check_model_states(f),
        "router_exercise": lambda m, f: m.check_route(f),
        "ring_exercise": lambda m, f: m.check(f, data_parallel.settings("smoke")),
        "bpe_exercise": lambda m, f: m.check_merges(f),
        "interval_exercise": lambda m, f: m.check_interval(f),
        "ns_exercise": lambda m, f: m.check_newton_schulz(f),
        "sft_exercise": lambda m, f: m.check_sft_loss(f), "dpo_exercise": lambda m, f: m.check_dpo_loss(f),
        "adv_exercise": lambda m, f: m.check_advantages(f),
        "flash_exercise": lambda m, f: m.check_kernel(f), "quant_exercise": lambda m, f: m.check_quantiser(f),
    }
    assert len(EXERCISES) == 23
    for lesson, names in EXERCISES.items():
        for name in (names,) if isinstance(names, str) else names:
            module = importlib.import_module(name)
            out = checks[name.rsplit(".", 1)[1]](module, _stub_of(module))
            assert out.message == NOT_WRITTEN, f"{lesson}: {out.message}"
    assert not any(tmp_path.iterdir())  # the atomic-save check started no process and wrote nothing


def test_a_failure_on_a_long_tensor_names_the_entry_that_differs_most():
    def mine(x):
        y = x.clone()
        y[2, 1] += 5
        return y

    out = check(mine, lambda x: x.clone(), [Case("a 4 x 2 tensor", (torch.zeros(4, 2),))])
    assert out.status == "fail" and "entry [2, 1] differs most: expected 0.0, got 5.0" in out.message, out.message


def test_mistakes_a_learner_made_that_the_checks_once_passed_or_misnamed():
    """Found by trying plausible wrong answers on every exercise: each is refused now, with the hint that names it."""
    import torch.nn.functional as F

    from lessons.mixture_of_experts import router_exercise
    from lessons.plan_a_run import memory_exercise
    from lessons.training_loop import adamw_exercise

    def kept_as_int(logits, k, capacity):  # the right routing, its mask as 0/1 integers: indexing breaks later
        expert, gate, kept = router_exercise.reference(logits, k, capacity)[:3]
        return expert, gate, kept.long()

    out = router_exercise.check_route(kept_as_int)
    assert out.status == "fail" and "expected a mask (bool) (torch.bool), got whole numbers" in out.message, \
        out.message

    def counts_in_float(logits, k, capacity):  # torch's own NotImplementedError: not the stub's
        T, E = logits.shape
        return logits.topk(k, dim=-1)[1], F.softmax(logits, -1).topk(k, dim=-1)[0], \
            torch.bincount(logits.argmax(-1).float(), minlength=E) > 0

    out = router_exercise.check_route(counts_in_float)
    assert out.status == "fail" and "NotImplementedError" in out.message and "not written" not in out.message, \
        out.message

    def decay_after_the_update(p, g, m, v, t, lr, beta1, beta2, eps, weight_decay):
        m, v = beta1 * m + (1 - beta1) * g, beta2 * v + (1 - beta2) * g * g
        p = p - lr * (m / (1 - beta1**t)) / ((v / (1 - beta2**t)).sqrt() + eps)
        return p * (1 - lr * weight_decay), m, v

    out = adamw_exercise.check_step(decay_after_the_update)
    assert out.status == "fail" and "a large rate and decay" in out.message and "before this step" in out.message

    def forgets_pp(n_params, layout, zero_stage):
        per_gpu, replicas = n_params / layout.tp, layout.dp * layout.cp
        states = 2 * per_gpu + 2 * per_gpu / (replicas if zero_stage >= 2 else 1) \
            + 12 * per_gpu / (replicas if zero_stage >= 1 else 1)
        return states / (replicas if zero_stage >= 3 else 1) if zero_stage >= 3 else states

    out = memory_exercise.check_model_states(forgets_pp)
    assert out.status == "fail" and "tp 8 × pp 4" in out.message and "tp · pp" in out.message, out.message


def test_lesson_14_says_whether_out_or_lse_differs_and_names_the_lse_mistake():
    from lessons.context_parallel import merge_exercise

    def lse_as_max(out1, lse1, out2, lse2):
        out, _ = merge_exercise.reference(out1, lse1, out2, lse2)
        return out, torch.maximum(lse1, lse2)

    out = merge_exercise.check_merge(lse_as_max)
    assert out.status == "fail" and "your out is right but your lse differs" in out.message
    assert "neither their sum nor their maximum" in out.message


def test_lesson_11_a_save_without_fsync_and_one_that_renames_an_unflushed_file_are_refused(tmp_path):
    from lessons.fault_tolerance import save_exercise
    from learner_files import load

    no_fsync = load(tmp_path, "import os\n\ndef no_fsync(path, data):\n    tmp = path + '.tmp'\n"
                              "    with open(tmp, 'wb') as f:\n        f.write(data)\n    os.replace(tmp, path)\n",
                    "no_fsync")
    out = save_exercise.check_save(no_fsync, tmp_path / "a", kills=0)
    assert out.status == "fail" and "never calls os.fsync" in out.message and "power cut" in out.message

    unflushed = load(tmp_path, "import os\n\ndef unflushed(path, data):\n    tmp = path + '.tmp'\n"
                               "    f = open(tmp, 'wb')\n    f.write(data)\n    os.fsync(f.fileno())\n"
                               "    os.replace(tmp, path)\n", "unflushed")
    out = save_exercise.check_save(unflushed, tmp_path / "b", kills=0)
    assert out.status == "fail" and "renamed a file onto it" in out.message and "buffer" in out.message, out.message


def test_lessons_12_and_13_name_the_mistake_a_wrong_count_matches():
    from lessons.compute_budget import flops_exercise
    from lessons.profiling import intensity_exercise

    counts = [{"shape": (2, 64, 4, 64), "vocab": 96, "train": flops_exercise.reference(2, 64, 96, 64)}]
    out = flops_exercise.check_flops(lambda L, h, V, s: 2 * (12 * L * h * h + V * h) + 4 * L * s * h, counts)
    assert out.status == "fail" and "a forward pass only" in out.message, out.message
    out = flops_exercise.check_flops(lambda L, h, V, s: 6 * (12 * L * h * h + V * h) + 12 * L * s * s * h, counts)
    assert "not s²" in out.message, out.message
    roof = {"ops": [{"name": "mm", "shapes": "64×128 · 128×256",
                     "intensity": intensity_exercise.reference(64, 128, 256, 4)}], "ridge": 1.0}
    out = intensity_exercise.check_intensity(lambda m, k, n, b: 2 * m * k * n / (m * k + k * n + m * n), roof)
    assert out.status == "fail" and "bytes, not elements" in out.message, out.message
    out = intensity_exercise.check_intensity(lambda m, k, n, b: b * (m * k + k * n + m * n) / (2 * m * k * n), roof)
    assert "not bytes per FLOP" in out.message, out.message
