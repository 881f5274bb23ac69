"""Lesson 22's mechanisms: the Triton FlashAttention kernels against PyTorch's attention (values, log-sum-exp,
gradients), the bytes they are counted to move, the FP8 quantiser against torch._scaled_mm, the two exercises'
checkers against planted mistakes, and the lesson's claims against the wrong kernel or recipe."""

import dataclasses
import importlib.util
import math

import pytest
import torch
import torch.nn.functional as F

from labtools import data, fp8, kernels
from labtools.claims import Ledger
from labtools.kernels import tl, triton
from lessons import inside_kernels
from lessons.inside_kernels import flash_exercise, flash_gpt, fp8_training, quant_exercise, scales, tiling

SMOKE = inside_kernels.settings("smoke")


def qkv(B, H, s, D, seed=0, grad=False):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, H, s, D, generator=g).requires_grad_(grad) for _ in range(3))


@pytest.mark.parametrize("B,H,s,D,causal,bq,bk", [(1, 2, 64, 16, True, 16, 16), (2, 1, 50, 16, True, 16, 32),
                                                   (1, 2, 33, 32, False, 32, 16), (1, 1, 17, 16, True, 16, 16)])
def test_the_kernels_equal_pytorchs_attention_in_values_log_sum_exp_and_gradients(B, H, s, D, causal, bq, bk):
    q, k, v = qkv(B, H, s, D, grad=True)
    o = kernels.flash_attention(q, k, v, causal=causal, block_q=bq, block_k=bk)
    o.square().sum().backward()
    ours = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    ref.square().sum().backward()
    assert (o - ref).abs().max() < 1e-5
    for a, t in zip(ours, (q, k, v)):
        assert (a - t.grad).abs().max() < 2e-5
    f = kernels.flash_forward(q.detach(), k.detach(), v.detach(), causal=causal, block_q=bq, block_k=bk)
    assert (f.lse - kernels.reference_lse(q.detach(), k.detach(), causal=causal)).abs().max() < 1e-5
    assert f.key_tiles_read == B * H * kernels.tiles_read(s, bq, bk, causal)


def test_bad_tiles_shapes_and_settings_are_refused_naming_the_parameter():
    q, k, v = qkv(1, 1, 32, 16)
    with pytest.raises(ValueError, match="BLOCK_Q"):
        kernels.flash_forward(q, k, v, block_q=24)
    with pytest.raises(ValueError, match="BLOCK_K"):
        kernels.flash_forward(q, k, v, block_k=8)
    with pytest.raises(ValueError, match="head dimension"):
        kernels.flash_forward(*qkv(1, 1, 32, 24))
    with pytest.raises(ValueError, match="alike"):
        kernels.flash_forward(q, k[:, :, :16], v)
    with pytest.raises(ValueError, match="float32"):
        kernels.flash_forward(q.half(), k.half(), v.half())
    with pytest.raises(ValueError, match="BLOCK_Q"):
        inside_kernels.settings("smoke", block_q=48)
    with pytest.raises(ValueError, match="N_EMBD"):
        inside_kernels.settings("smoke", n_embd=96, n_head=4)
    with pytest.raises(ValueError, match="divide"):
        fp8.quantise(torch.randn(3, 128), (2, 128))
    with pytest.raises(ValueError, match="fmt"):
        fp8.quantise(torch.randn(2, 128), (1, 128), "e3m4")
    from labtools.model import CausalSelfAttention, GPTConfig
    attention = CausalSelfAttention(GPTConfig(vocab_size=8, block_size=16, n_layer=1, n_head=2, n_embd=32))
    attention.attend = kernels.flash_attention
    with pytest.raises(ValueError, match="no document mask"):  # never silently PyTorch's attention instead
        attention(torch.randn(1, 16, 32), torch.ones(1, 1, 16, 16, dtype=torch.bool))


def test_causal_tiles_are_counted_as_the_loop_bounds_give_and_tiling_moves_fewer_bytes():
    assert kernels.tiles_read(64, 16, 16, False) == 16 and kernels.tiles_read(64, 16, 16, True) == 10
    assert kernels.tiles_read(50, 16, 32, True) == 1 + 1 + 2 + 2
    for s in (256, 1024):  # bigger query tiles re-read K and V fewer times: K and V move s²·d_h / B_q bytes
        moved = [kernels.flash_traffic(s, 64, b, 64).total for b in (16, 64, 128)]
        assert moved == sorted(moved, reverse=True)
    assert kernels.written_out_traffic(1024, 64).total > 3 * kernels.flash_traffic(1024, 64, 128, 64).total
    assert kernels.written_out_traffic(1024, 64).total < 1.2 * kernels.flash_traffic(1024, 64, 16, 64).total


def test_qdq_matmuls_multiply_what_torchs_scaled_mm_multiplies():
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(32, 256, generator=g), torch.randn(64, 256, generator=g)
    qa, qb = fp8.quantise(a, (32, 256)), fp8.quantise(b, (64, 256))
    ours = qa.dequantise() @ qb.dequantise().t()
    theirs = torch._scaled_mm(qa.data, qb.data.t(), scale_a=qa.scales.reshape(()), scale_b=qb.scales.reshape(()),
                              out_dtype=torch.float32)
    assert (ours - theirs).abs().max() <= 1e-4 * theirs.abs().max()
    assert torch.equal(fp8.qdq(a, fp8.TENSORWISE), qa.dequantise())
    zeros = torch.zeros(2, 128)
    assert torch.isfinite(fp8.quantise(zeros, (1, 128)).scales).all()
    assert fp8.relative_error(fp8.qdq(a, fp8.TILES), a) < 0.05  # e4m3 keeps about two significant digits


def test_an_fp8_linear_trains_with_gradients_near_fp32_and_unscaled_gradients_vanish():
    torch.manual_seed(0)
    lin = torch.nn.Linear(128, 256)
    x = torch.randn(4, 128, requires_grad=True)
    layer = fp8.FP8Linear(lin, fp8.RECIPES["blockwise"])
    layer(x).pow(2).sum().backward()
    g8 = lin.weight.grad.clone()
    lin.weight.grad = None
    lin(x).pow(2).sum().backward()
    assert fp8.relative_error(g8, lin.weight.grad) < 0.1
    tiny = torch.full((1, 128), 1e-4)
    assert fp8.unscaled(tiny, "e4m3").abs().max() == 0 and fp8.qdq(tiny, fp8.TILES).abs().max() > 0


# --- the exercises' checkers, against the solution and planted mistakes -------------------------------------------

# The lab's kernel with one mistake each, made from its own source so that they follow it: (what the lab wrote,
# what the mistake writes instead). A replacement that no longer finds its text fails the test, loudly.
MISTAKES = {
    1: ("alpha = tl.exp(m - m_new)", "alpha = tl.exp(m_new - m_new)"),                  # no rescaling
    2: ("tl.dot(q, tl.trans(k)) * qk_scale", "tl.dot(q, tl.trans(k))"),                 # no 1/√d_h
    3: ("end = tl.minimum(s, (tile + 1) * BLOCK_Q)", "end = s"),                        # no causal tile skip
    4: ("ok = keys[None, :] < s", "ok = keys[None, :] >= 0"),                           # padded keys seen
    5: ("m + tl.log(l)", "m"),                                                          # LSE without log(l)
    6: ("ok = ok & (keys[None, :] <= rows[:, None])", "ok = ok"),                       # no causal mask
    7: ("tl.atomic_add(SEEN + bh * tl.num_programs(0) + tile, 1)", "pass"),             # tiles not counted
}


def _compiled(source: str, path):
    """A learner's cell's kernel, compiled from a file (Triton reads a kernel's source)."""
    path.write_text("from labtools.kernels import tl, triton\n\n\n" + source)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.my_flash_forward


def planted(bug: int, tmp_path):
    lab, wrong = MISTAKES[bug]
    source = flash_exercise.solution_source()
    assert lab in source, f"the lab's kernel no longer has {lab!r}: update MISTAKES"
    return _compiled(source.replace(lab, wrong), tmp_path / f"planted_{bug}.py")


def test_the_kernel_check_passes_the_solution_and_names_each_planted_mistake(tmp_path):
    assert flash_exercise.check_kernel(_compiled(flash_exercise.solution_source(), tmp_path / "solution.py")).passed
    named = {1: "exp(m − m_new)", 2: "1/√d_h", 3: "min(s, (tile + 1)", 4: "mask keys ≥ s", 5: "LSE is m + log(l)",
             6: "not the whole causal mask", 7: "atomic_add"}
    for bug, words in named.items():
        out = flash_exercise.check_kernel(planted(bug, tmp_path))
        assert out.status == "fail" and words in out.message, (bug, out.message)


@triton.jit
def _stub(Q, K, V, O, LSE, SEEN, s, qk_scale, D: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr,
          CAUSAL: tl.constexpr):
    tile = tl.program_id(0)
    raise NotImplementedError  # your code


@triton.jit
def _typo(Q, K, V, O, LSE, SEEN, s, qk_scale, D: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr,
          CAUSAL: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_Q + tl.arange(0, BLOCK_Q)
    tl.store(O + rows, scores, mask=rows < s)  # noqa: F821 (the learner's typo)


def test_the_kernel_check_says_not_written_for_a_stub_and_names_an_error_by_its_message():
    assert "raise NotImplementedError" in next(c for c in _cells() if "def my_flash_forward" in c)
    assert flash_exercise.check_kernel(_stub).status == "not written"
    out = flash_exercise.check_kernel(_typo)
    assert out.status == "fail" and "NameError" in out.message and "scores" in out.message, out.message


def _cells() -> list[str]:
    import json
    from pathlib import Path
    nb = json.loads((Path(__file__).parents[1] / "notebooks" / "22_flash_attention_and_fp8.ipynb").read_text())
    return ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]


def _quantisers():
    def inverted(x, rows, cols):
        data, scales = quant_exercise.reference(x, rows, cols)
        return data, 448 / (scales * 448)

    def no_floor(x, rows, cols):
        M, N = x.shape
        amax = x.reshape(M // rows, rows, N // cols, cols).abs().amax(dim=(1, 3))
        return quant_exercise.reference(x, rows, cols)[0], amax / 448

    def signed(x, rows, cols):
        M, N = x.shape
        top = x.reshape(M // rows, rows, N // cols, cols).amax(dim=(1, 3)).clamp(min=1e-12)
        return quant_exercise.reference(x, rows, cols)[0], top / 448

    def whole(x, rows, cols):
        data, scales = quant_exercise.reference(x, rows, cols)
        return data, (x.abs().max().clamp(min=1e-12) / 448).expand_as(scales).clone()

    def e5m2(x, rows, cols):
        data, scales = quant_exercise.reference(x, rows, cols)
        return data.float().to(torch.float8_e5m2), scales

    def multiplied(x, rows, cols):
        M, N = x.shape
        data, scales = quant_exercise.reference(x, rows, cols)
        blocks = x.reshape(M // rows, rows, N // cols, cols) * scales[:, None, :, None]
        return blocks.to(torch.float8_e4m3fn).reshape(M, N), scales

    return {inverted: "448 ÷ amax", no_floor: "NaN", signed: "largest magnitude", whole: "whole tensor",
            e5m2: "e4m3", multiplied: "do not multiply"}


def test_the_quantiser_check_passes_the_reference_and_names_each_planted_mistake():
    assert quant_exercise.check_quantiser(quant_exercise.reference).passed
    for fn, words in _quantisers().items():
        out = quant_exercise.check_quantiser(fn)
        assert out.status == "fail" and words in out.message, (fn.__name__, out.message)


# --- the lesson's claims, and the wrong kernel or recipe ------------------------------------------------------------

def _claims(ledger: Ledger) -> dict:
    return {c.key: c.passed for c in ledger.claims}


def test_the_tiling_claims_hold_and_fail_for_a_kernel_that_reads_every_tile(tmp_path):
    S = dataclasses.replace(SMOKE, lengths=(64, 128))
    good, bad = Ledger("t"), Ledger("t")
    tiling.findings(good, tiling.run(S))
    tiling.findings(bad, tiling.measure(S, planted(3, tmp_path)))
    assert tiling.run(S, planted(3, tmp_path)).tiles_as_computed  # the lesson's run: a kernel failing its check
    # is replaced by the lab's
    for key in ("tiles_as_bounds", "causal_half", "fewer_bytes", "kept_linear", "kept_quadratic"):
        assert _claims(good)[key], key
    for key in ("tiles_as_bounds", "causal_half", "fewer_bytes"):  # it masks the tiles it should have skipped
        assert not _claims(bad)[key], key


def test_a_kernel_right_in_values_but_not_in_its_log_sum_exp_trains_with_wrong_gradients(tmp_path):
    corpus = data.text()
    X, Y = corpus.batch("train", 2, SMOKE.flash_len, torch.Generator().manual_seed(0))
    ref = flash_gpt._grads(flash_gpt._model(SMOKE, False, corpus), X, Y)
    for kernel, close in ((None, True), (planted(5, tmp_path), False)):
        ours = flash_gpt._grads(flash_gpt._model(SMOKE, kernel, corpus), X, Y)
        gap = max(((ours[n] - g).norm() / g.norm()).item() for n, g in ref.items())
        assert (gap < 1e-4) is close, (kernel, gap)


def test_the_outlier_claim_holds_at_the_lessons_outlier_and_fails_at_a_small_one():
    grads = torch.randn(4096) * 1e-3
    for outlier, holds in ((SMOKE.outlier, True), (1e3, False)):
        ledger = Ledger("t")
        scales.findings(ledger, scales.run(dataclasses.replace(SMOKE, outlier=outlier), grads))
        assert _claims(ledger)["outlier_harms_tensorwise"] is holds


def test_the_fp8_training_claims_fail_when_the_recipes_swap_places(monkeypatch):
    """Fine-grained scales where the lesson has none, and none where it has them: both claims fail (their holding
    at the lesson's own settings is the browser test's)."""
    swapped = {"blockwise": fp8.RECIPES["unscaled_e4m3"], "unscaled_e4m3": fp8.RECIPES["blockwise"]}
    for name, recipe in swapped.items():
        monkeypatch.setitem(fp8.RECIPES, name, recipe)
    ledger = Ledger("t")
    fp8_training.findings(ledger, SMOKE, fp8_training.run(dataclasses.replace(SMOKE, seeds=2)))
    assert not _claims(ledger)["fp8_as_bf16"] and not _claims(ledger)["unscaled_behind"]


def test_with_yours_matches_the_labs_run_and_parts_for_a_quantiser_that_multiplies_by_its_scale():
    S = dataclasses.replace(SMOKE, steps=5, seeds=1)
    lab = fp8_training.train_one(S, fp8.RECIPES["blockwise"], 0)
    t = fp8_training.Training({}, {"blockwise": lab}, None, None)
    assert fp8_training.with_yours(S, t, quant_exercise.reference).outcome.passed
    wrong = next(fn for fn in _quantisers() if fn.__name__ == "multiplied")
    assert fp8_training.with_yours(S, t, wrong).outcome.status == "fail"
    assert math.isfinite(lab.loss[-1])
