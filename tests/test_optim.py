"""Each from-scratch optimizer against the PyTorch optimizer it teaches: same parameters and
gradients in, parameters equal to <= 1e-6 after every one of 25 steps."""

import pytest
import torch

from labtools import optim as O

SHAPES = ((7,), (5, 3), (4, 6, 2), (1,))


def divergence(ours_cls, theirs_cls, ours_kw, theirs_kw):
    return O.max_divergence(lambda p: ours_cls(p, **ours_kw), lambda p: theirs_cls(p, **theirs_kw), SHAPES)


ADAM_SETTINGS = [
    dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8),
    dict(lr=3e-2, betas=(0.9, 0.95), eps=1e-8),
    dict(lr=1e-2, betas=(0.8, 0.95), eps=1e-6),
]


@pytest.mark.parametrize("kw", ADAM_SETTINGS)
def test_adam_matches_torch(kw):
    assert divergence(O.Adam, torch.optim.Adam, kw, dict(kw, foreach=False)) <= 1e-6


@pytest.mark.parametrize("kw", ADAM_SETTINGS)
@pytest.mark.parametrize("wd", [0.01, 0.1, 1.0])
def test_adamw_matches_torch(kw, wd):
    worst = divergence(O.AdamW, torch.optim.AdamW, dict(kw, weight_decay=wd), dict(kw, weight_decay=wd))
    assert worst <= 1e-6


@pytest.mark.parametrize("kw", ADAM_SETTINGS)
@pytest.mark.parametrize("wd", [0.01, 0.1, 1.0])
def test_adam_l2_matches_torch_adam_with_weight_decay(kw, wd):
    worst = divergence(O.AdamL2, torch.optim.Adam, dict(kw, weight_decay=wd), dict(kw, weight_decay=wd))
    assert worst <= 1e-6


@pytest.mark.parametrize("kw", ADAM_SETTINGS)
def test_independent_decay_is_torch_adamw_with_lambda_over_alpha_under_a_schedule(kw):
    """Loshchilov & Hutter's θ ← θ(1 − η_t·λ) is torch's AdamW with weight_decay λ/α, even while a schedule moves
    the lr (η_t = lr/α); and its decay per step does not change when α does."""
    lam, alpha = 1e-3, kw["lr"]
    g = torch.Generator().manual_seed(0)
    init = [torch.randn(s, generator=g) for s in SHAPES]
    a = [t.clone().requires_grad_() for t in init]
    b = [t.clone().requires_grad_() for t in init]
    ours = O.AdamW(a, weight_decay=lam, independent_decay=True, **kw)
    theirs = torch.optim.AdamW(b, **dict(kw, weight_decay=lam / alpha, foreach=False))
    for t in range(25):
        eta = 0.5 * (1 + torch.cos(torch.tensor(torch.pi * t / 25))).item()  # a cosine schedule
        for opt in (ours, theirs):
            for group in opt.param_groups:
                group["lr"] = alpha * eta
        for p, q in zip(a, b):
            p.grad = torch.randn(p.shape, generator=g)
            q.grad = p.grad.clone()
        ours.step()
        theirs.step()
    assert max((p - q).abs().max().item() for p, q in zip(a, b)) <= 1e-6
    for lr in (1e-3, 1e-1):  # zero gradients: only the decay acts, and it is η_t·λ whatever α is
        p = torch.ones(3, requires_grad=True)
        p.grad = torch.zeros(3)
        O.AdamW([p], lr=lr, weight_decay=lam, independent_decay=True).step()
        assert torch.equal(p.detach(), torch.full((3,), 1 - lam))


def test_the_parity_check_detects_a_difference():
    assert divergence(O.Adam, torch.optim.Adam, dict(lr=1e-3), dict(lr=1.01e-3)) > 1e-6


def test_adamw_and_adam_l2_differ():
    kw = dict(lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    worst = divergence(O.AdamW, O.AdamL2, kw, kw)
    assert worst > 1e-3


@pytest.mark.parametrize("kw", [
    dict(lr=0.1), dict(lr=0.05, momentum=0.9), dict(lr=0.05, momentum=0.9, weight_decay=0.01),
    dict(lr=0.02, momentum=0.95, nesterov=True, weight_decay=0.1),
])
def test_sgd_matches_torch(kw):
    worst = divergence(O.SGD, torch.optim.SGD, kw, dict(kw, foreach=False))
    assert worst <= 1e-6


@pytest.mark.parametrize("kw", [dict(lr=1e-2), dict(lr=3e-2, weight_decay=0.1), dict(lr=0.5, d=2.0),
                                dict(lr=1e-2, eps=(1e-30, 1e-3), beta2_decay=-0.5)])
def test_adafactor_matches_torch(kw):
    worst = divergence(O.Adafactor, torch.optim.Adafactor, kw, dict(kw, foreach=False))
    assert worst <= 1e-6


def test_lion_per_step_table():
    # One scalar, lr=0.1, betas=(0.9, 0.99), weight_decay=0.5, θ0 = 1.0, gradients 2, −1, −1:
    #   step 1: c = 0.1·2 = 0.2 > 0          θ = 1·(1 − 0.05) − 0.1 = 0.85     m = 0.01·2 = 0.02
    #   step 2: c = 0.9·0.02 + 0.1·(−1) = −0.082 < 0
    #                                         θ = 0.85·0.95 + 0.1 = 0.9075    m = 0.99·0.02 − 0.01 = 0.0098
    #   step 3: c = 0.9·0.0098 − 0.1 = −0.09118 < 0
    #                                         θ = 0.9075·0.95 + 0.1 = 0.962125
    p = torch.tensor([1.0], requires_grad=True)
    opt = O.Lion([p], lr=0.1, betas=(0.9, 0.99), weight_decay=0.5)
    expected = [0.85, 0.9075, 0.962125]
    for g, want in zip([2.0, -1.0, -1.0], expected):
        p.grad = torch.tensor([g])
        opt.step()
        assert p.item() == pytest.approx(want, abs=1e-7)
    assert opt.state[p]["exp_avg"].item() == pytest.approx(0.99 * 0.0098 - 0.01, abs=1e-7)


def test_lion_moves_every_coordinate_by_exactly_lr():
    p = torch.zeros(1000, requires_grad=True)
    p.grad = torch.randn(1000) * torch.logspace(-6, 3, 1000)
    O.Lion([p], lr=1e-3).step()
    assert torch.allclose(p.abs(), torch.full_like(p, 1e-3))


@pytest.mark.parametrize("make, per_param", [
    (lambda ps: O.SGD(ps, lr=0.1), 0.0),
    (lambda ps: O.SGD(ps, lr=0.1, momentum=0.9), 4.0),
    (lambda ps: O.Adam(ps), 8.0),
    (lambda ps: O.AdamW(ps, weight_decay=0.1), 8.0),
    (lambda ps: O.Lion(ps), 4.0),
])
def test_state_bytes_per_parameter(make, per_param):
    params = [torch.zeros(64, 32, requires_grad=True), torch.zeros(32, requires_grad=True)]
    opt = make(params)
    for p in params:
        p.grad = torch.ones_like(p)
    opt.step()
    assert O.state_bytes(opt) == per_param * sum(p.numel() for p in params)


def test_adafactor_state_is_factored():
    W, b = torch.zeros(64, 32, requires_grad=True), torch.zeros(32, requires_grad=True)
    opt = O.Adafactor([W, b])
    W.grad, b.grad = torch.ones_like(W), torch.ones_like(b)
    opt.step()
    assert O.state_bytes(opt) == 4 * (64 + 32 + 32)  # row and column factors of W, full variance of b


@pytest.mark.parametrize("make", [
    lambda p: O.AdamW(p, lr=-1.0), lambda p: O.Adam(p, weight_decay=0.1), lambda p: O.SGD(p, momentum=-0.1),
    lambda p: O.Lion(p, betas=(1.0, 0.9)), lambda p: O.Adafactor(p, beta2_decay=0.5),
    lambda p: O.Adafactor(p, d=0.5),
])
def test_bad_hyperparameters_raise(make):
    with pytest.raises(ValueError):
        make([torch.zeros(2, requires_grad=True)])
