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


@pytest.mark.parametrize("shape", [(8, 8), (12, 5), (5, 12)])
@pytest.mark.parametrize("kw", [dict(lr=0.02, weight_decay=0.1), dict(lr=0.05, momentum=0.9, nesterov=False),
                                dict(lr=0.01, ns_steps=3)])
def test_muon_matches_torch_to_the_bit(shape, kw):
    """Muon's groups step exactly as torch.optim.Muon (the same bf16 products in the same order), tall and wide."""
    worst = O.max_divergence(lambda p: O.Muon(p, **kw), lambda p: torch.optim.Muon(p, **kw), shapes=(shape,))
    assert worst == 0.0


def test_muon_steps_its_other_groups_as_torch_adamw_and_refuses_vectors_in_a_muon_group():
    kw = dict(lr=3e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    worst = O.max_divergence(lambda p: O.Muon([dict(params=p, use_muon=False, **kw)]),
                             lambda p: torch.optim.AdamW(p, **kw, foreach=False), SHAPES)
    assert worst <= 1e-6
    with pytest.raises(ValueError, match="matrices only"):
        O.Muon([torch.zeros(3, requires_grad=True)])


def test_newton_schulz_is_torchs_and_lifts_every_singular_value_towards_one():
    from lessons.muon_mup.ns_exercise import torch_orthogonalized
    g = torch.Generator().manual_seed(0)
    for shape in ((32, 32), (64, 16), (16, 64)):
        G = torch.randn(shape, generator=g) * 1e-3
        X = O.newton_schulz(G)
        assert X.dtype == torch.bfloat16 and X.shape == G.shape
        assert torch.equal(X.float(), torch_orthogonalized(G))
        s = torch.linalg.svdvals(X.float())
        assert s.min() > 0.5 and s.max() < 1.3, s  # the exact polar factor would give all 1; Muon's lands near
    assert O.newton_schulz_flops(64, 16) == O.newton_schulz_flops(16, 64) == 5 * (4 * 16 * 16 * 64 + 2 * 16 ** 3)


def test_muon_groups_put_only_the_blocks_matrices_on_muon():
    from labtools.model import GPT, GPTConfig
    m = GPT(GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=16))
    muon, decay, rest = O.muon_groups(m, 0.02, 3e-3, 0.1)
    names = {id(p): n for n, p in m.named_parameters()}
    assert {names[id(p)].split(".")[-2] for p in muon["params"]} == {"c_attn", "c_proj", "c_fc"}
    assert all(names[id(p)].startswith("transformer.h.") and p.dim() == 2 for p in muon["params"])
    assert {names[id(p)] for p in decay["params"]} == {"transformer.wte.weight", "transformer.wpe.weight"}
    assert all(p.dim() == 1 for p in rest["params"]) and rest["weight_decay"] == 0.0
    assert sum(p.numel() for g in (muon, decay, rest) for p in g["params"]) == m.num_params()


def test_mup_groups_divide_only_the_hidden_matrices_learning_rate_by_the_width_multiplier():
    from labtools.model import GPT, GPTConfig
    m = GPT(GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=4, n_embd=64, tie_embeddings=False,
                      mup_base_width=16))
    groups = O.mup_groups(m, 0.01, 0.1)
    names = {id(p): n for n, p in m.named_parameters()}
    for g in groups:
        hidden = {names[id(p)].startswith("transformer.h.") and p.dim() == 2 for p in g["params"]}
        assert len(hidden) == 1
        assert g["lr"] == (0.01 / 4 if hidden.pop() else 0.01)
    assert sum(p.numel() for g in groups for p in g["params"]) == m.num_params()
