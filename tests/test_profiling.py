"""labtools.profiling and lesson 13: op kinds, FLOPs and bytes per op against torch's counter and the tensors,
the roofline's arithmetic, attention's saved bytes exactly, and the exercise's checks."""

import math
from dataclasses import replace

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from labtools import profiling
from labtools.config import LabConfig, build_gpt
from labtools.data import text
from labtools.exercises import NOT_WRITTEN

CPU = torch.device("cpu")


@pytest.mark.parametrize("name, kind", [("aten::mm", "matrix products"), ("aten.addmm.default", "matrix products"),
                                        ("aten::_scaled_dot_product_flash_attention_for_cpu_backward", "attention"),
                                        ("aten::native_layer_norm_backward", "normalisation"),
                                        ("aten::gelu", "element-wise"), ("aten::_foreach_mul_", "element-wise"),
                                        ("aten::embedding_dense_backward", "other"), ("aten::nll_loss", "other")])
def test_ops_are_sorted_into_kinds_of_work(name, kind):
    assert profiling.kind_of(name) == kind


def test_the_op_timer_counts_what_flopcountermode_counts_and_each_products_bytes():
    cfg = LabConfig(n_layer=2, n_embd=32, n_head=4, block_size=16, seed=0)
    corpus = text()
    model = build_gpt(cfg, corpus.vocab_size)
    X, Y = corpus.batch("train", 2, 16, torch.Generator().manual_seed(0), CPU)

    def step():
        model(X, Y)[1].backward()

    with FlopCounterMode(display=False) as counter:
        step()
    model.zero_grad(set_to_none=True)
    ops = profiling.OpTimer.run(step, CPU)
    products = sum(o.flops for o in ops if o.kind == "matrix products")
    assert products == counter.get_total_flops() > 0 and all(o.counted for o in ops if o.kind == "matrix products")
    # the counter has no formula for the CPU's fused attention; the CUDA flash kernel's counts 4·s·h per token and
    # layer forward and 10·s·h backward, where the fused kernel recomputes the scores: 14·L·s·h per token, not
    # lesson 12's 12 (written-out attention keeps its scores); every score counted, no causal half
    attention = sum(o.flops for o in ops if o.kind == "attention")
    assert attention == 14 * 2 * (2 * 16) * 16 * 32
    mm = next(o for o in ops if o.name == "mm")
    (m, k), (_, n) = [tuple(map(int, s.split("×"))) for s in mm.shapes.split(" · ")]
    assert mm.flops == 2 * m * k * n and mm.bytes == 4 * (m * k + k * n + m * n)
    add = next(o for o in ops if o.name == "add" and o.flops > 0)
    assert add.flops / add.bytes <= 1 / 8  # one FLOP per output element, at least two fp32 tensors moved per element
    assert all(o.name not in profiling.FREE for o in ops)  # views move nothing and are not placed


def test_the_roofline_is_the_lower_of_its_two_roofs_and_they_meet_at_the_ridge():
    peak, bw = 100e9, 20e9
    assert profiling.ridge(peak, bw) == 5
    assert profiling.roof(1.0, peak, bw) == 20e9 and profiling.roof(50.0, peak, bw) == peak
    assert math.isclose(profiling.roof(5.0, peak, bw), peak)


def test_bandwidth_and_peak_are_measured_and_positive():
    bw = profiling.bandwidth(1 << 20, CPU, repeats=2)
    assert bw["copy"] > 1e8 and bw["triad"] > 1e8
    peak = profiling.matmul_peak([64, 128], CPU, repeats=1)
    assert set(peak["fp32"]["by_size"]) == {64, 128} and peak["fp32"]["peak"] > 1e7


def test_attention_written_out_keeps_the_weights_and_the_fused_kernel_only_its_output_and_logsumexp():
    from labtools.memory import saved_activations
    from lessons.profiling import attention

    a, s, hd = 2, 64, 8
    q, k, v = (torch.randn(1, a, s, hd, requires_grad=True) for _ in range(3))
    saved, out_w = saved_activations(lambda: attention.written_out(q, k, v), exclude=[q, k, v])
    assert sum(t.nbytes for t in saved) == 4 * a * s * s + s * s  # the fp32 weights and the bool mask
    saved, out_f = saved_activations(lambda: attention.fused(q, k, v), exclude=[q, k, v])
    assert sum(t.nbytes for t in saved) == 4 * a * s * hd + 4 * a * s  # the output and one log-sum-exp per row
    assert torch.allclose(out_w, out_f, atol=1e-5)


def test_the_chain_compiles_into_one_kernel_and_gives_the_same_result():
    from lessons.profiling import compiled, settings

    c = compiled.run(replace(settings("smoke"), compile_rounds=1, chain_elems=1 << 12, compile_calls=2))
    assert "skipped" not in c, c.get("skipped")
    assert c["eager_ops"] == ["add", "relu", "mul", "add"] and c["kernels"] == 1 and c["max_diff"] < 1e-5


def test_a_bad_attention_length_is_a_named_error():
    from lessons.profiling import settings

    with pytest.raises(ValueError, match="MAX_LENGTH"):
        settings("smoke", max_length=64)
    assert settings("smoke", max_length=2048).attn_lengths == (128, 256, 512, 1024, 2048)


def _roof_of_products(*shapes):
    """Section 2's result for a few real products: their ops timed, grouped, and this machine's ridge."""
    mats = [(torch.randn(m, k), torch.randn(k, n)) for m, k, n in shapes]
    scalar = torch.tensor(2.0)  # an op on 0-d tensors lists no shapes: the check must pass over it
    ops = profiling.group(profiling.OpTimer.run(lambda: [a @ b for a, b in mats] + [scalar * 3], CPU))
    return {"ops": ops, "ridge": 2.0}


def test_lesson_13_intensity_solution_passes_and_forgetting_the_output_fails_with_the_hint():
    from lessons.profiling import intensity_exercise

    roof = _roof_of_products((64, 32, 16), (128, 128, 8))
    out = intensity_exercise.check_intensity(intensity_exercise.reference, roof)
    assert out.passed and "3 cases" in out.message and "right of this machine's ridge" in out.message

    def no_output(m, k, n, bytes_per_element):
        return 2 * m * k * n / (bytes_per_element * (m * k + k * n))

    out = intensity_exercise.check_intensity(no_output, roof)
    assert out.status == "fail" and "64×32 @ 32×16" in out.message and "the m×n result" in out.message

    def one_flop_per_multiply_add(m, k, n, bytes_per_element):
        return m * k * n / (bytes_per_element * (m * k + k * n + m * n))

    assert intensity_exercise.check_intensity(one_flop_per_multiply_add, roof).status == "fail"

    def stub(m, k, n, bytes_per_element):
        raise NotImplementedError

    assert intensity_exercise.check_intensity(stub, roof).message == NOT_WRITTEN


def test_native_stderr_silenced_drops_what_native_code_writes_and_restores_it(capfd):
    import os

    from labtools.profiling import native_stderr_silenced
    with native_stderr_silenced():
        os.write(2, b"USDT: profiler_start\n")
    os.write(2, b"after\n")
    err = capfd.readouterr().err
    assert "USDT" not in err and "after" in err
