"""Lesson 12: the FLOP formulas against torch's FLOP counter, the calculator against the published runs, bad input,
and the isoFLOP fit on data with a known optimum."""

import math

import numpy as np
import pytest
import torch

from labtools.compute import (Convention, flops_by_convention, training_cost, training_days, training_flops,
                              training_seconds)
from labtools.plan import CLUSTERS, GPU
from labtools.runs import GPT3, LLAMA3
from lessons import compute_budget as lesson
from lessons.compute_budget import flops, isoflop, training_time


@pytest.mark.parametrize("shape", [(2, 64, 4, 64), (4, 128, 4, 128), (3, 96, 6, 256)])
def test_the_matmul_weight_formula_equals_flop_counter_mode(shape):
    """6N + 12LTd with N = the matrix weights equals the counted FLOPs of a training step exactly; the two published
    conventions differ from it by exactly what they add or drop."""
    L, d, h, T = shape
    model = lesson.gpt(L, d, h, T)
    f = flops_by_convention(model, T)
    counted = flops.counted_flops(model, T, batch=2)
    assert f[Convention.MATMUL] == counted["train"]
    assert counted["train"] == 3 * counted["forward"]
    assert counted["by_op"], "the counter saw no operations"
    V = model.config.vocab_size
    extra = model.num_params() - (12 * L * d * d + V * d)  # biases, LayerNorms, position embedding
    assert f[Convention.ALL_PARAMETERS] - counted["train"] == 6 * extra
    assert counted["train"] - f[Convention.NO_TOKEN_EMBEDDING] == 6 * (V * d - extra)


def test_the_cpu_fused_attention_kernel_is_invisible_to_the_counter():
    """On a CPU the default attention kernel has no FLOP formula: counted without it, exactly 12·L·T·d is missing."""
    model = lesson.gpt(2, 64, 4, 64).cpu()
    fused = flops.counted_flops(model, 64, fused=True)["train"]
    counted = flops.counted_flops(model, 64)["train"]
    if next(model.parameters()).is_cuda:
        pytest.fail("the model should be on the CPU here")
    assert counted - fused == 12 * 2 * 64 * 64


def test_attention_is_counted_and_grows_with_the_context():
    """The 12·L·T·d term is real: the same weights at twice the context cost 12·L·d·ΔT more per token."""
    a, b = lesson.gpt(2, 64, 4, 64), lesson.gpt(2, 64, 4, 128)
    fa, fb = flops.counted_flops(a, 64)["train"], flops.counted_flops(b, 128)["train"]
    assert fb - fa == 12 * 2 * 64 * 64


def test_the_calculator_reproduces_the_published_runs():
    gpt3, llama = GPT3, LLAMA3
    assert training_flops(gpt3.n_params, gpt3.tokens) == pytest.approx(3.14e23, rel=0.02)
    assert training_days(gpt3.n_params, gpt3.tokens, 1024, 140e12) == pytest.approx(34, rel=0.02)
    assert training_flops(llama.n_params, llama.tokens) == pytest.approx(3.8e25, rel=0.02)
    rows = training_time.published()
    assert rows[GPT3].days_at_mfu == pytest.approx(rows[GPT3].days, rel=1e-12)


def test_time_and_cost_follow_the_formula():
    h100 = CLUSTERS[GPU.H100]
    flops = training_flops(70e9, 1.4e12)
    assert flops == 6 * 70e9 * 1.4e12
    assert training_flops(1e9, 1e9, n_layer=2, seq=1024, n_embd=64) == (6e9 + 12 * 2 * 1024 * 64) * 1e9
    s = training_seconds(flops, 2048, h100.peak_flops, 0.4)
    assert s == pytest.approx(flops / (2048 * 989e12 * 0.4))
    assert training_cost(3600.0, 10, 2.5) == pytest.approx(25.0)
    assert training_seconds(flops, 1, 1e15, 1.0) == pytest.approx(flops / 1e15)  # mfu = 1 is allowed


@pytest.mark.parametrize("call, name", [
    (lambda: training_flops(0, 1e9), "n_params"),
    (lambda: training_flops(-1e9, 1e9), "n_params"),
    (lambda: training_flops(1e9, 0), "tokens"),
    (lambda: training_flops(1e9, math.inf), "tokens"),
    (lambda: training_flops(1e9, 1e9, n_layer=-1), "n_layer"),
    (lambda: training_seconds(1e20, 0, 1e15, 0.4), "gpus"),
    (lambda: training_seconds(1e20, 8, -1e15, 0.4), "peak_flops"),
    (lambda: training_seconds(1e20, 8, 1e15, 0.0), "mfu"),
    (lambda: training_seconds(1e20, 8, 1e15, 1.2), "mfu"),
    (lambda: training_seconds(1e20, 8, 1e15, -0.3), "mfu"),
    (lambda: training_cost(3600.0, 8, 0), "dollars_per_gpu_hour"),
    (lambda: training_cost(-1.0, 8, 2.0), "seconds"),
])
def test_bad_input_is_a_named_value_error(call, name):
    with pytest.raises(ValueError, match=name):
        call()


def test_the_fit_finds_a_known_optimum():
    """Losses on an exact parabola in log N with its minimum at N = 50,000: the fit returns it, and D/N = C/6N²."""
    runs = []
    for budget in (1e10, 3e10):
        for n in (10_000, 30_000, 100_000, 300_000):
            loss = 2.0 + 0.3 * (math.log(n) - math.log(50_000)) ** 2
            runs.append({"budget": budget, "n_params": n, "val_loss": loss, "flops": budget, "tokens": 1})
    fits = isoflop.fit(runs)
    for budget, f in fits.items():
        assert f["interior"]
        assert f["n_opt"] == pytest.approx(50_000, rel=1e-6)
        assert f["tokens_per_param"] == pytest.approx(budget / (6 * 50_000**2), rel=1e-6)
    edge = [dict(r, val_loss=-math.log(r["n_params"])) for r in runs]  # bigger is always better: no interior optimum
    assert not any(f["interior"] for f in isoflop.fit(edge).values())
    assert all(f["n_opt"] == 300_000 for f in isoflop.fit(edge).values())


def test_a_sweep_run_spends_its_budget_and_is_cached():
    S = lesson.settings("smoke")
    config = dict(width=32, budget=2e9, layers=2, batch=S.sweep_batch, block=S.sweep_block, lr=S.sweep_lr, seed=0)
    a = isoflop.SWEEP(**config)
    per_step = a["flops"] / a["steps"]
    assert abs(a["flops"] - 2e9) <= per_step / 2
    assert a["tokens"] == a["steps"] * S.sweep_batch * S.sweep_block
    assert math.isfinite(a["val_loss"])
    assert isoflop.SWEEP(**config) is a  # the panel redraws from the cache


def test_the_calculator_panel_redraws_and_rejects_bad_values():
    panel = training_time.calculator_panel()
    before = panel.figure.layout.title.text
    panel.controls["mfu"].value = 0.2
    panel.redraw()
    assert panel.figure.layout.title.text != before
    for typed, says in (("0", "GPUs must be in [1, inf]"), ("3.5", "GPUs: a whole number is needed"),
                        ("abc", "GPUs: a whole number is needed"), ("1,024", "without commas")):
        panel.controls["gpus"].value = typed
        panel.redraw()
        assert says in panel.status.value, (typed, panel.status.value)
    panel.controls["gpus"].value = "1e4"  # 10,000 GPUs, as written
    panel.redraw()
    assert panel.figure.data[1].name == "10,000 GPUs"
    assert panel.controls["n_params_b"].value == 175.0 and panel.controls["n_params_b"].label == "175"
    panel.controls["n_params_b"].value, panel.controls["tokens_b"].value = 405.0, 15_600.0  # Llama 3, exactly
    panel.redraw()
    assert "3.79e+25 FLOPs" in panel.figure.layout.title.text


def test_settings_reject_bad_budgets_and_widths():
    with pytest.raises(ValueError, match="BUDGETS"):
        lesson.settings("smoke", budgets=(3e10, 1e10))
    with pytest.raises(ValueError, match="WIDTHS"):
        lesson.settings("smoke", widths=(8, 12, 16))


def test_counted_flops_leave_no_gradients_behind():
    model = lesson.gpt(2, 64, 4, 64)
    flops.counted_flops(model, 64)
    assert all(p.grad is None for p in model.parameters())
    assert np.isfinite(sum(flops_by_convention(model, 64).values()))
    assert torch.is_grad_enabled()
