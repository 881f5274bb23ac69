"""The lesson's central claim, measured directly: under Adam + L2 the effective decay falls as
gradient variance grows; under AdamW it does not."""

import dataclasses

import numpy as np

from lessons import adamw_vs_adam_l2 as lesson
from lessons.adamw_vs_adam_l2 import toy


def test_decay_falls_with_gradient_noise_under_adam_l2_only():
    S = dataclasses.replace(lesson.PROFILES["smoke"], toy_n=2000, toy_steps=300)
    l2 = toy.effective_decay(toy.run("AdamL2", S))
    w = toy.effective_decay(toy.run("AdamW", S))
    assert np.all(np.diff(l2) <= 0.02 * l2[:-1])  # non-increasing in σ
    assert l2[0] / l2[-1] > 30
    assert w.max() / w.min() < 1.01
    assert abs(w.mean() - toy.TOY_LR * toy.TOY_WD) < 0.01 * toy.TOY_LR * toy.TOY_WD


def test_effective_decay_recovers_a_known_rate():
    t = np.arange(500)[:, None]
    means = np.exp(-np.array([1e-3, 1e-2])[None, :] * t)
    assert np.allclose(toy.effective_decay(means), [1e-3, 1e-2], rtol=1e-6)
