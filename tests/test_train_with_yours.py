"""The lesson's real run made with the learner's own function (labtools.exercises.run_yours, and lessons 00, 02, 03
and 15; on ranks 08, 09 and 10; lesson 11's killed training): the solution trains the lab's curve, a typical wrong
mechanism parts from it within the first steps (or, on ranks, is refused before a rank would wait forever) and is
named, the stub runs nothing, and the learner's error or endless loop ends as a message at their line."""

import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from learner_files import load

from labtools.config import build_gpt, global_batch
from labtools.data import text
from labtools.exercises import EARLY_STEPS, YOURS_NOT_WRITTEN, run_yours
from labtools.optim import AdamW
from labtools.train import History
from lessons import (fault_tolerance, fsdp_zero, lr_schedules, mixture_of_experts, pipeline_parallel, stability,
                     tensor_parallel, training_loop)
from lessons.fault_tolerance import save_exercise, save_training
from lessons.fsdp_zero import Strategy, partition_exercise
from lessons.lr_schedules import equal_budget, schedule_exercise
from lessons.mixture_of_experts import router_exercise, training as moe_training
from lessons.pipeline_parallel import order_exercise, ranks as pipe_ranks
from lessons.stability import clip_exercise, clipping
from lessons.tensor_parallel import ranks as tp_ranks, shard_exercise
from lessons.training_loop import adamw_exercise, training


def solution(module, name: str, **namespace):
    exec(module.solution_source(), namespace)  # noqa: S102 - the lesson's own solution, as a cell holds it
    return namespace[name]


def lab_history(n: int, seconds: float = 0.01) -> History:
    return History(step=list(range(n)), loss=[3.0 - 0.01 * k for k in range(n)], val_step=[n], val_loss=[2.5],
                   seconds=seconds)


def test_run_yours_compares_the_first_steps_and_reports_the_whole_run():
    lab = lab_history(60)
    drifting = lambda fn: History(step=lab.step, loss=[x + (0.05 if k >= EARLY_STEPS else 1e-6)  # noqa: E731
                                                       for k, x in enumerate(lab.loss)], seconds=0.01)

    def mine(x):
        return x

    out = run_yours(mine, drifting, lab, what="yours", tol=1e-3)
    assert out.outcome.passed and math.isclose(out.difference, 0.05, rel_tol=1e-6)
    parted = run_yours(mine, lambda fn: History(step=lab.step, loss=[x + 0.01 * (k == 3) for k, x in
                                                                       enumerate(lab.loss)]), lab, what="yours",
                       tol=1e-3)
    assert parted.outcome.status == "fail" and "at step 3" in parted.outcome.message
    nan = run_yours(mine, lambda fn: History(step=lab.step, loss=[math.nan] * 60), lab, what="yours", tol=1e-3)
    assert nan.outcome.status == "fail" and "at step 0" in nan.outcome.message


def test_run_yours_names_the_learners_line_and_ends_a_loop_that_never_ends():
    lab = lab_history(10)

    def broken(x):
        y = x + 1
        return y / undefined_name  # noqa: F821 - the learner's mistake

    out = run_yours(broken, lambda fn: fn(1.0), lab, what="your thing", tol=1e-3)
    assert out.outcome.status == "fail" and "line 3 of your function" in out.outcome.message \
        and out.outcome.message.startswith("the run with your thing stopped: NameError")

    def spins(x):
        while True:
            x += 1

    out = run_yours(spins, lambda fn: fn(1.0), lab, what="your thing", tol=1e-3)
    assert out.outcome.status == "fail" and "did not finish in 2 s" in out.outcome.message


def test_a_stub_runs_nothing():
    def mine(x):
        raise NotImplementedError

    ran = []
    out = run_yours(mine, lambda fn: ran.append(1), lab_history(5), what="yours", tol=1e-3)
    assert out.outcome.message == YOURS_NOT_WRITTEN and out.yours is None and not ran


def test_lesson_00_your_adamw_step_trains_the_gpt_and_adam_with_l2_parts_from_it():
    S = training_loop.settings("smoke", steps=40)
    corpus = training.synthetic_corpus(S)
    _, lab = training.train_run(S, corpus, S.steps, "lab")
    right = adamw_exercise.train_with_yours(solution(adamw_exercise, "my_adamw_step", torch=torch), S, corpus, lab)
    assert right.outcome.passed and len(right.yours.loss) == S.steps // 2 and right.difference < 1e-4

    def adam_l2(p, g, m, v, t, lr, beta1, beta2, eps, weight_decay):
        g = g + weight_decay * p
        m, v = beta1 * m + (1 - beta1) * g, beta2 * v + (1 - beta2) * g * g
        return p - lr * (m / (1 - beta1**t)) / ((v / (1 - beta2**t)).sqrt() + eps), m, v

    wrong = adamw_exercise.train_with_yours(adam_l2, S, corpus, lab)
    assert wrong.outcome.status == "fail" and "parts from the lab's at step" in wrong.outcome.message


def test_lesson_02_your_schedule_drives_the_cosine_run_and_a_warmup_one_step_ahead_parts_from_it():
    S = lr_schedules.settings("smoke", budget=50)
    lab = equal_budget.cosine_run(S, S.budget, int(round(0.1 * S.budget)))
    right = schedule_exercise.train_with_yours(solution(schedule_exercise, "my_warmup_cosine", math=math), S, lab)
    assert right.outcome.passed and right.difference == 0.0

    def ahead(step, warmup, total, min_ratio):
        if step < warmup:
            return (step + 1) / warmup
        p = min((step - warmup) / (total - warmup), 1.0)
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * p))

    assert schedule_exercise.train_with_yours(ahead, S, lab).outcome.status == "fail"


def test_lesson_03_your_clipping_survives_the_bad_batches_and_clipping_each_tensor_alone_parts():
    S = stability.settings("smoke", clip_steps=40)
    lab = {("SGD", 1.0, True): clipping.clip_run(S, "SGD", 1.0, True)}
    right = clip_exercise.train_with_yours(solution(clip_exercise, "my_clip_grad_norm", math=math, torch=torch),
                                           lab, S)
    assert right.outcome.passed and len(right.yours.loss) == S.clip_steps

    def per_tensor(grads, max_norm):
        total = 0.0
        for g in grads:
            norm = g.norm().item()
            total += norm * norm
            g.mul_(min(1.0, max_norm / (norm + 1e-6)))
        return math.sqrt(total)

    assert clip_exercise.train_with_yours(per_tensor, lab, S).outcome.status == "fail"


def test_lesson_15_your_routing_trains_the_moe_and_routing_without_capacity_parts_from_it():
    S = mixture_of_experts.settings("smoke", steps=30)
    model = moe_training.build(S, "MoE", text().vocab_size)
    lab = {"MoE": moe_training.train(S, model, S.balance_weight, "lab")}
    right = router_exercise.train_with_yours(solution(router_exercise, "my_route", torch=torch, F=F), S, lab)
    assert right.outcome.passed

    def no_capacity(logits, k, capacity):
        top_p, expert = F.softmax(logits, dim=-1).topk(k, dim=-1)
        gate = top_p / top_p.sum(-1, keepdim=True) if k > 1 else top_p
        return expert, gate, torch.ones_like(expert, dtype=torch.bool)

    assert router_exercise.train_with_yours(no_capacity, S, lab).outcome.status == "fail"


# --- on real ranks: lessons 08, 09 and 10 send the learner's function to the ranks; lesson 11 to a saving child ---

def _yours(tmp_path, module, name: str):
    """The lesson's solution defined in a file, as a notebook cell defines it: its source can be sent to ranks."""
    return load(tmp_path, module.solution_source(), name)


@pytest.mark.ranks
def test_lesson_09_your_1f1b_order_drives_the_pipeline_on_ranks_and_a_gpipe_order_is_refused_before_launching(
        tmp_path):
    S = pipeline_parallel.settings("smoke")
    p = min(S.worlds)
    lab = SimpleNamespace(ranks=[SimpleNamespace(training=SimpleNamespace(losses=pipe_ranks.single_process_losses(S)))])
    right = order_exercise.train_with_yours(_yours(tmp_path, order_exercise, "my_1f1b_order"), S, {p: lab})
    assert right.outcome.passed and "on 2 ranks" in right.outcome.message and right.difference < 1e-5
    assert len(right.yours.loss) == S.train_steps

    def gpipe(r, p, m):  # a valid pipeline order, but not 1F1B: refused before any rank starts
        return [("F", i) for i in range(m)] + [("B", i) for i in range(m)]

    wrong = order_exercise.train_with_yours(gpipe, S, {p: lab})
    assert wrong.outcome.status == "fail" and "rank 0" in wrong.outcome.message and wrong.yours is None


@pytest.mark.ranks
def test_lesson_10_your_mlp_shards_train_the_gpt_on_ranks_and_wrong_shards_are_refused(tmp_path):
    S = tensor_parallel.settings("smoke")
    res = SimpleNamespace(single=tp_ranks.single_process(S))
    right = shard_exercise.train_with_yours(_yours(tmp_path, shard_exercise, "my_mlp_shards"), S, res)
    assert right.outcome.passed and len(right.yours.loss) == S.steps and right.difference < 1e-5

    def whole(W_fc, b_fc, W_proj, tp, r):
        return W_fc, b_fc, W_proj

    wrong = shard_exercise.train_with_yours(whole, S, res)
    assert wrong.outcome.status == "fail" and "check above" in wrong.outcome.message and wrong.yours is None


@pytest.mark.ranks
def test_lesson_08_your_partition_shards_adamw_on_ranks_with_zero1s_state_and_a_wrong_one_is_refused(tmp_path):
    S = fsdp_zero.settings("smoke", steps=5)  # one process on the whole batch parts from DDP by rounding only
    n = 2
    sizes = [q.numel() for q in build_gpt(S).parameters()]
    parts = partition_exercise.reference(sizes, n)
    shard = {n: [SimpleNamespace(sizes=sizes, strategies={Strategy.ZERO1: SimpleNamespace(
        partition=part, optimizer=8 * sum(sizes[i] for i in part))}) for part in parts]}  # AdamW: 2 fp32 per number
    model = build_gpt(S)  # DDP over n ranks of S.batch_size rows is one process on all n · S.batch_size rows
    opt = AdamW(model.parameters(), lr=S.lr, betas=(0.9, 0.95), weight_decay=0.1)
    g, ddp = torch.Generator().manual_seed(S.seed + 1), []
    for _ in range(S.steps):
        X, Y = global_batch(S, g, n * S.batch_size)
        ddp.append(model(X, Y)[1].item())
        model(X, Y)[1].backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    eq = [SimpleNamespace(ddp=SimpleNamespace(losses=ddp))]
    right = partition_exercise.train_with_yours(_yours(tmp_path, partition_exercise, "my_zero1_partition"), S, shard,
                                                eq)
    assert right.run.outcome.passed and right.state_bytes == right.torch_state_bytes, right

    def round_robin(sizes, N):
        return [list(range(r, len(sizes), N)) for r in range(N)]

    wrong = partition_exercise.train_with_yours(round_robin, S, shard, eq)
    assert wrong.run.outcome.status == "fail" and "check above" in wrong.run.outcome.message and not wrong.state_bytes


def test_lesson_11_a_run_saving_with_your_save_survives_kills_bitwise_and_one_that_saves_nowhere_is_caught(tmp_path):
    S = fault_tolerance.settings("smoke")
    right = save_training.train_with_yours(_yours(tmp_path, save_exercise, "my_atomic_save"), S, tmp_path / "a")
    assert right.outcome.passed and right.difference == 0.0 and len(right.kills) == 3
    assert all(r >= S.every for r in right.resumed) and len(right.losses) == S.steps

    # a save that writes nothing: each restart begins again from step 0
    nowhere = load(tmp_path, "def nowhere(path, data):\n    pass\n", "nowhere")
    wrong = save_training.train_with_yours(nowhere, S, tmp_path / "b")
    assert wrong.outcome.status == "fail" and "checkpoint of step 0" in wrong.outcome.message
