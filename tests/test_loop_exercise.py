"""Lesson 04's whole-training-loop exercise: the solution gives labtools.train's losses and weights on every run,
each typical mistake fails on the run that shows it with its hint, and the stub costs nothing."""

import pytest
import torch

from lessons.mixed_precision import loop_exercise as lx

SOLUTION = lx.solution_source()


def variant(old: str, new: str):
    assert old in SOLUTION, old
    namespace = {"torch": torch}
    exec(SOLUTION.replace(old, new), namespace)  # noqa: S102 - the lesson's solution with one mistake
    return namespace["my_training_loop"]


def test_the_solution_gives_the_labs_losses_and_weights_on_every_run():
    out = lx.check_loop(variant("", ""))
    assert out.passed and out.worst == 0.0 and f"all {len(lx.CASES)} runs" in out.message


def test_the_stub_runs_nothing():
    def my_training_loop(model, optimizer, get_batch, loop):
        raise NotImplementedError

    assert lx.check_loop(my_training_loop).status == "not written"


MISTAKES = {
    "the loss not divided by G": ("loss = loss / loop.accum_steps", "loss = loss", "four micro-batches"),
    "gradients zeroed per micro-batch": ("            total += loss.item()",
                                         "            total += loss.item()\n            optimizer.zero_grad()",
                                         "one micro-batch"),
    "gradients never zeroed": ("        optimizer.zero_grad(set_to_none=True)", "        pass", "one micro-batch"),
    "the schedule compounds": ('group["lr"] = lr * loop.schedule(step)',
                               'group["lr"] = group["lr"] * loop.schedule(step)', "warm-up"),
    "steps counted from 1": ("loop.schedule(step)", "loop.schedule(step + 1)", "warm-up"),
    "no autocast": ("enabled=dtype is not None", "enabled=False", "bf16"),
    "clipping tensor by tensor": ("torch.nn.utils.clip_grad_norm_(params, loop.max_norm)",
                                  "[torch.nn.utils.clip_grad_norm_([p], loop.max_norm) for p in params]", "clipping"),
    "clipping scaled gradients": ("            g.mul_(1.0 / scale)", "            pass", "fp16"),
    "an overflowing step taken": ("        if finite:\n            torch.nn.utils",
                                  "        if True:\n            torch.nn.utils", "fp16"),
    "the scale never grows": ("scale, clean = scale * 2, 0", "clean = 0", "the scale grows"),
    "the scale never backs off": ("scale /= 2", "pass", "fp16"),
    "the clean count not restarted after an overflow": ("clean = clean + 1 if finite else 0", "clean = clean + 1",
                                                        "counted again"),
}


@pytest.mark.parametrize("mistake", MISTAKES)
def test_each_typical_mistake_fails_on_the_run_that_shows_it_with_its_hint(mistake):
    old, new, case = MISTAKES[mistake]
    out = lx.check_loop(variant(old, new))
    assert out.status == "fail" and case in out.message and "— hint:" in out.message, (mistake, out.message)


def test_a_loop_that_returns_nothing_or_raises_is_told_where():
    def returns_nothing(model, optimizer, get_batch, loop):
        return None

    assert "return the list of each step's loss" in lx.check_loop(returns_nothing).message

    def raises(model, optimizer, get_batch, loop):
        x = 1
        return x / 0

    assert "ZeroDivisionError" in lx.check_loop(raises).message and "line 3" in lx.check_loop(raises).message
