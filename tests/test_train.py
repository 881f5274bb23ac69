import dataclasses

import pytest
import torch

from labtools import data
from labtools.model import GPT, GPTConfig
from labtools.schedules import bind, warmup_cosine
from labtools.train import TrainConfig, branches, train

CFG = GPTConfig(vocab_size=16, block_size=32, n_layer=2, n_head=2, n_embd=32)


def model(seed: int = 0, **kw) -> GPT:
    torch.manual_seed(seed)
    return GPT(dataclasses.replace(CFG, **kw))


def cfg(**kw) -> TrainConfig:
    return TrainConfig(**{**dict(steps=20, batch_size=8, eval_every=10, eval_batches=2, progress=False), **kw})


def test_loss_falls():
    corpus = data.synthetic()
    h = train(model(), corpus, cfg(steps=150, lr=1e-2, eval_every=150))
    assert h.val_step == [0, 150]
    assert h.val_loss[1] < h.val_loss[0] - 0.1


def grads_after_one_step(accum_steps: int, X: torch.Tensor, Y: torch.Tensor) -> list[torch.Tensor]:
    B = X.shape[0] // accum_steps
    captured = []
    train(model(), data.synthetic(), cfg(steps=1, batch_size=B, accum_steps=accum_steps, grad_clip=None),
          batch_fn=lambda step, micro: (X[micro * B:(micro + 1) * B], Y[micro * B:(micro + 1) * B]),
          callback=lambda info: captured.extend(p.grad.clone() for p in info.model.parameters()))
    return captured


@pytest.mark.parametrize("k", [2, 4])
def test_accumulating_k_micro_batches_equals_one_batch(k):
    X, Y = data.synthetic().batch("train", 16, 32, torch.Generator().manual_seed(0))
    full = grads_after_one_step(1, X, Y)
    accumulated = grads_after_one_step(k, X, Y)
    worst = max((a - b).abs().max().item() for a, b in zip(full, accumulated))
    assert worst <= 1e-6


def test_clipping_caps_the_global_norm_and_records_the_norm_before():
    after = []

    def post_clip_norm(info):
        after.append(torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in info.model.parameters()])).item())

    h = train(model(), data.synthetic(), cfg(steps=5, grad_clip=0.05), callback=post_clip_norm)
    assert all(n > 0.05 for n in h.grad_norm)  # the recorded norm is the one before clipping
    assert all(n <= 0.05 * (1 + 1e-5) for n in after)


def test_same_seed_same_history_and_other_seed_differs():
    def run(seed):
        h = train(model(), data.synthetic(), cfg(seed=seed, lr_schedule=bind(warmup_cosine, warmup=5, total=20)))
        return h.loss, h.grad_norm, h.val_loss, h.lr

    assert run(0) == run(0)
    assert run(0)[0] != run(1)[0]


def test_lr_follows_the_schedule():
    schedule = bind(warmup_cosine, warmup=4, total=20, min_ratio=0.1)
    h = train(model(), data.synthetic(), cfg(lr=3e-3, lr_schedule=schedule))
    assert h.lr == [pytest.approx(3e-3 * schedule(s), abs=1e-15) for s in range(20)]


def test_bf16_autocast_trains():
    h = train(model(), data.synthetic(), cfg(precision="bf16", steps=30, lr=1e-2))
    assert all(torch.isfinite(torch.tensor(h.loss)))
    assert h.val_loss[-1] < h.val_loss[0]


def test_fp16_uses_a_dynamic_loss_scaler_and_fp32_none():
    h = train(model(), data.synthetic(), cfg(precision="fp16", steps=3, eval_every=3, eval_batches=1))
    assert h.loss_scale[0] == 2.0**16  # GradScaler's initial scale
    h32 = train(model(), data.synthetic(), cfg(steps=3, eval_every=3, eval_batches=1))
    assert h32.loss_scale == [1.0] * 3 and h32.skipped == [False] * 3


def test_callback_columns():
    h = train(model(), data.synthetic(), cfg(steps=4), callback=lambda info: info.log.update(double=2 * info.loss))
    assert h.extra["double"] == [pytest.approx(2 * x) for x in h.loss]


@pytest.mark.parametrize("kw, name", [
    (dict(steps=0), "steps"), (dict(precision="fp8"), "precision"), (dict(lr=-1.0), "lr"),
    (dict(grad_clip=0.0), "grad_clip"), (dict(accum_steps=0), "accum_steps"),
    (dict(lr=float("inf")), "lr"), (dict(lr=None), "lr"), (dict(lr=float("nan")), "lr"),
    (dict(block_size=0), "block_size"), (dict(weight_decay=-0.1), "weight_decay"),
    (dict(lr_schedule=0.5), "lr_schedule"), (dict(betas=(0.9, 1.0)), "betas"),
])
def test_bad_config_raises_naming_the_field(kw, name):
    with pytest.raises(ValueError, match=name):
        cfg(**kw)


def test_a_schedule_returning_nan_stops_training_with_its_step():
    with pytest.raises(ValueError, match="lr_schedule returned nan at step 3"):
        train(model(), data.synthetic(), cfg(steps=6, lr_schedule=lambda s: float("nan") if s == 3 else 1.0))


def test_a_corpus_larger_than_the_vocabulary_raises_before_training():
    text = data.text()
    with pytest.raises(ValueError, match=f"{text.vocab_size} tokens"):
        train(model(), text, cfg())


def test_block_size_beyond_the_model_raises_before_training():
    with pytest.raises(ValueError, match="block_size"):
        train(model(), data.synthetic(), cfg(block_size=64))


def test_checkpoint_roundtrip_and_resume_at_the_right_step(tmp_path):
    from labtools import checkpoint
    schedule = bind(warmup_cosine, warmup=4, total=30, min_ratio=0.1)
    m = model()
    opt = torch.optim.AdamW(m.parameters(), lr=3e-3)
    train(m, data.synthetic(), cfg(steps=10, lr_schedule=schedule), optimizer=opt)
    checkpoint.save(tmp_path, 10, model=m.state_dict(), optimizer=opt.state_dict())

    m2 = model(seed=1)
    opt2 = torch.optim.AdamW(m2.parameters(), lr=3e-3)
    saved = checkpoint.load(checkpoint.latest(tmp_path))
    checkpoint.load_model_state(m2, saved["model"])
    opt2.load_state_dict(saved["optimizer"])
    assert saved["step"] == 10
    assert all(torch.equal(a, b) for a, b in zip(m.state_dict().values(), m2.state_dict().values()))
    assert opt2.state_dict()["state"][0]["step"] == 10
    h = train(m2, data.synthetic(), cfg(steps=5, start_step=10, lr_schedule=schedule), optimizer=opt2)
    assert h.step == list(range(10, 15)) and h.val_step == [10, 15]
    assert h.lr == [pytest.approx(3e-3 * schedule(s), abs=1e-15) for s in range(10, 15)]


def test_summing_micro_batch_losses_scales_the_gradient_by_k():
    X, Y = data.synthetic().batch("train", 16, 32, torch.Generator().manual_seed(0))

    def grads(normalize):
        captured = []
        train(model(), data.synthetic(), cfg(steps=1, batch_size=4, accum_steps=4, grad_clip=None,
                                             accum_normalize=normalize),
              batch_fn=lambda step, micro: (X[micro * 4:(micro + 1) * 4], Y[micro * 4:(micro + 1) * 4]),
              callback=lambda info: captured.extend(p.grad.clone() for p in info.model.parameters()))
        return captured

    for right, summed in zip(grads(True), grads(False)):
        torch.testing.assert_close(summed, 4 * right, rtol=1e-5, atol=1e-7)


def test_branches_continue_bit_for_bit_like_runs_from_scratch():
    corpus = data.synthetic()

    def run(lr_after, kw=None):  # identical until step 10, then a different learning rate
        return train(model(), corpus, cfg(lr_schedule=lambda s: 1.0 if s < 10 else lr_after, **(kw or {})))

    alone = [run(1.0), run(0.1)]
    forked = branches(10, lambda kw: run(1.0, kw), lambda kw: run(1.0, kw), lambda kw: run(0.1, kw))
    for a, b in zip(alone, forked):
        assert (a.loss, a.val_loss, a.grad_norm, a.lr) == (b.loss, b.val_loss, b.grad_norm, b.lr)
    assert forked[0].loss[10:] != forked[1].loss[10:]  # they did branch
    late = branches(15, lambda kw: run(1.0, kw), lambda kw: run(0.1, kw))[0]  # a trunk past the fork is wrong
    assert late.loss != alone[1].loss
    with pytest.raises(ValueError, match="at least one run"):
        branches(10, lambda kw: run(1.0, kw))
