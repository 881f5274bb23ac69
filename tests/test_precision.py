import math

import pytest
import torch

from labtools.precision import FORMATS, DynamicLossScaler, decompose

STORAGE = [name for name, f in FORMATS.items() if f.dtype is not None]


@pytest.mark.parametrize("name", STORAGE)
def test_format_table_equals_torch_finfo(name):
    f, fi = FORMATS[name], torch.finfo(FORMATS[name].dtype)
    assert (f.bits, f.max, f.min_normal, f.eps) == (fi.bits, fi.max, fi.smallest_normal, fi.eps)


@pytest.mark.parametrize("name", STORAGE)
def test_smallest_subnormal_is_the_bit_pattern_one(name):
    f = FORMATS[name]
    one = torch.tensor([1], dtype={32: torch.int32, 16: torch.int16, 8: torch.uint8}[f.bits])
    assert one.view(f.dtype).to(torch.float64).item() == f.min_subnormal


def values():
    g = torch.Generator().manual_seed(0)
    mags = torch.pow(10.0, torch.empty(3000, dtype=torch.float64).uniform_(-46, 39, generator=g))
    signs = torch.where(torch.rand(3000, generator=g) < 0.5, -1.0, 1.0).double()
    special = [0.0, -0.0, math.inf, -math.inf, math.nan, 1.0, 65504.0, 65520.0, 448.0, 2**-24, 2**-25, 3e-41]
    return (mags * signs).tolist() + special


@pytest.mark.parametrize("name", list(FORMATS))
def test_decompose_rebuilds_the_stored_value_exactly(name):
    f = FORMATS[name]
    for x in values():
        d = decompose(x, name)
        if f.dtype is not None:
            expected = torch.tensor([x], dtype=torch.float64).to(f.dtype).double().item()
            assert d.stored == expected or (math.isnan(d.stored) and math.isnan(expected))
        if math.isnan(d.stored):
            assert math.isnan(d.rebuilt) and d.category == "nan"
        else:
            assert d.rebuilt == d.stored, (name, x, d)
            again = decompose(d.stored, name)  # a stored value is stored as itself
            assert again.stored == d.stored and again.bits == d.bits
        assert len(d.bits.replace(" ", "")) == f.bits


def test_known_bit_patterns():
    assert decompose(1.0, "fp16").bits == "0 01111 0000000000"
    assert decompose(-2.0, "bf16").bits == "1 10000000 0000000"
    assert decompose(65504.0, "fp16").category == "normal" and decompose(65520.0, "fp16").category == "inf"
    assert decompose(2**-24, "fp16").category == "subnormal" and decompose(2**-26, "fp16").stored == 0.0
    assert decompose(1 + 2**-9, "bf16").stored == 1.0           # a small update lost in bf16
    assert decompose(1 + 2**-9, "fp16").stored == 1 + 2**-9     # kept in fp16 (10 mantissa bits)
    assert decompose(1 + 3 * 2**-11, "tf32").stored == 1 + 2**-9  # tf32: halfway rounds to even
    assert decompose(1e6, "fp8_e4m3").stored == 448.0 and decompose(1e6, "fp8_e5m2").category == "inf"
    d = decompose(0.1, "fp32")
    assert d.abs_error == abs(d.stored - 0.1) and 0 < d.rel_error < FORMATS["fp32"].eps


def run_scaler(scaler, grads):
    p = torch.zeros(4, requires_grad=True)
    opt = torch.optim.SGD([p], lr=0.1)
    scales, skipped = [], []
    for g in grads:
        scaler.scale((p * g).sum()).backward()  # p.grad = g · S
        scales.append(scaler.get_scale())
        scaler.step(opt)
        scaler.update()
        skipped.append(scaler.get_scale() < scales[-1])  # a skipped step is exactly one that backs off
        opt.zero_grad(set_to_none=True)
    return scales, skipped, p.detach()


def test_loss_scaler_matches_grad_scaler_on_a_recorded_sequence_with_infs():
    g = torch.Generator().manual_seed(0)
    grads = [torch.randn(4, generator=g) * 10 ** torch.randint(-6, 3, (1,), generator=g).item() for _ in range(40)]
    for i in (3, 4, 5, 17, 30):
        grads[i] = grads[i].clone()
        grads[i][i % 4] = math.inf if i % 2 else math.nan
    grads[22] = torch.full((4,), 3e38)  # finite, but overflows once scaled
    kw = dict(init_scale=2.0**10, growth_factor=2.0, backoff_factor=0.5, growth_interval=3)
    ours = run_scaler(DynamicLossScaler(**kw), grads)
    theirs = run_scaler(torch.amp.GradScaler("cpu", **kw), grads)
    assert ours[0] == theirs[0]
    assert ours[1] == theirs[1]
    assert torch.equal(ours[2], theirs[2])
    assert sum(ours[1]) == 6 and len(set(ours[0])) > 3  # it did skip, back off and grow


def test_static_scale_skips_but_never_moves():
    grads = [torch.ones(4), torch.full((4,), math.inf), torch.ones(4)]
    scaler = DynamicLossScaler(init_scale=8.0, growth_factor=1.0, backoff_factor=1.0, growth_interval=1)
    scales, _, p = run_scaler(scaler, grads)
    assert scales == [8.0, 8.0, 8.0] and scaler.skipped_steps == 1
    assert torch.allclose(p, torch.full((4,), -0.2))  # two of the three steps were taken


def test_disabled_scaler_is_a_pass_through():
    scales, skipped, p = run_scaler(DynamicLossScaler(enabled=False), [torch.ones(4)])
    assert scales == [1.0] and skipped == [False] and torch.allclose(p, torch.full((4,), -0.1))


@pytest.mark.parametrize("kw", [dict(init_scale=0), dict(growth_factor=0.5), dict(backoff_factor=0),
                                dict(growth_interval=0)])
def test_bad_scaler_arguments(kw):
    with pytest.raises(ValueError):
        DynamicLossScaler(**kw)


def test_unknown_format():
    with pytest.raises(ValueError, match="fmt must be one of"):
        decompose(1.0, "fp4")
