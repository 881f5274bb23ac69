"""Lesson 03's clipping claims (they can fail) and clipping written out against torch's."""

from labtools.claims import Ledger
from lessons.stability import clipping


def _damage(sgd: tuple, adamw: tuple) -> dict:
    """Damage statistics with the mean excess (no clip, clip) of each optimizer; the rest is not read."""
    return {(o, c): {"mean_excess": v} for o, pair in (("SGD", sgd), ("AdamW", adamw))
            for c, v in zip((None, 1.0), pair)}


def test_the_clipping_claims_hold_when_clipping_helps_sgd_most():
    ledger = Ledger("03_stability (test)")
    for key, claim in clipping.clip_claims(_damage(sgd=(0.38, 0.05), adamw=(0.04, 0.025))).items():
        ledger.add(key, *claim, kind="measured")
    assert [c.key for c in ledger.claims] == ["sgd_clip", "adamw_gains_less"] and ledger.all_passed


def test_the_clipping_claims_fail_when_clipping_does_nothing():
    """The smoke notebook makes these claims on its own runs (seeds, lengths and thread counts in clip_claims'
    docstring); here: they can fail."""
    for key, claim in clipping.clip_claims(_damage(sgd=(0.3, 0.3), adamw=(0.1, 0.1))).items():
        assert not claim[2].check(claim[1]), key
    sgd_only = clipping.clip_claims(_damage(sgd=(0.3, 0.28), adamw=(0.3, 0.05)))  # AdamW helped more
    assert not any(c[2].check(c[1]) for c in sgd_only.values())


def test_clip_by_global_norm_matches_torch():
    import torch
    g = torch.Generator().manual_seed(0)
    grads = [torch.randn(s, generator=g) for s in ((5, 3), (7,), (2, 2, 2))]
    params = [torch.zeros_like(t, requires_grad=True) for t in grads]
    for p, t in zip(params, grads):
        p.grad = t.clone()
    ours = [t.clone() for t in grads]
    norm = clipping.clip_by_global_norm(ours, 0.5)
    theirs = torch.nn.utils.clip_grad_norm_(params, 0.5)
    assert abs(norm - theirs.item()) < 1e-5 and norm > 0.5
    for a, p in zip(ours, params):
        torch.testing.assert_close(a, p.grad, rtol=0, atol=1e-7)
    unchanged = [t.clone() for t in grads]
    clipping.clip_by_global_norm(unchanged, 100.0)  # under the threshold: untouched
    assert all(torch.equal(a, b) for a, b in zip(unchanged, grads))


def test_summed_losses_under_adam_differ_only_through_eps():
    """Summing k = 4 micro-batch losses makes every gradient exactly 4× (a power of two): Adam's m̂/√v̂ is then
    unchanged bit for bit, and only ε (added to √v̂) tells the runs apart."""
    import torch

    from labtools.data import synthetic
    from labtools.model import GPT, GPTConfig
    from labtools.train import TrainConfig, train
    corpus = synthetic()

    def losses(normalize: bool, eps: float) -> list[float]:
        torch.manual_seed(0)
        model = GPT(GPTConfig(vocab_size=corpus.vocab_size, block_size=16, n_layer=1, n_head=2, n_embd=16))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, eps=eps)
        cfg = TrainConfig(steps=12, batch_size=8, accum_steps=4, accum_normalize=normalize, grad_clip=None,
                          progress=False, eval_every=12, eval_batches=1)
        return train(model, corpus, cfg, optimizer=opt).loss

    assert losses(True, 0.0) == losses(False, 0.0)
    assert losses(True, 1e-3) != losses(False, 1e-3)
