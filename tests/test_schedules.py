"""Schedules against per-step tables worked out by hand (≤ 1e-12), and against torch's own
schedulers where the two coincide."""

import math

import pytest
import torch

from labtools.schedules import bind, constant, linear_warmup, warmup_cosine, warmup_linear, wsd

R2 = math.sqrt(2)

TABLES = [
    # linear_warmup(warmup=4): step/4 for steps 0..3, then 1
    (bind(linear_warmup, warmup=4), [0.0, 0.25, 0.5, 0.75, 1.0, 1.0, 1.0]),
    # warmup_cosine(warmup=2, total=6, min_ratio=0.2): 0, 1/2, then 0.2 + 0.8·(1 + cos(π p))/2 with p = (s − 2)/4:
    #   p = 0 → 1;  p = 1/4 → 0.6 + 0.2√2;  p = 1/2 → 0.6;  p = 3/4 → 0.6 − 0.2√2;  p = 1 → 0.2; after: 0.2
    (bind(warmup_cosine, warmup=2, total=6, min_ratio=0.2),
     [0.0, 0.5, 1.0, 0.6 + 0.2 * R2, 0.6, 0.6 - 0.2 * R2, 0.2, 0.2]),
    # warmup_linear(warmup=2, total=6, min_ratio=0.2): 0, 1/2, then 1 − 0.8 p: 1, 0.8, 0.6, 0.4, 0.2; after: 0.2
    (bind(warmup_linear, warmup=2, total=6, min_ratio=0.2), [0.0, 0.5, 1.0, 0.8, 0.6, 0.4, 0.2, 0.2]),
    # wsd(warmup=2, stable=3, decay=4, linear): 0, 1/2, 1 1 1 (stable, steps 2-4), then 1 − p with p = (s − 5)/4
    (bind(wsd, warmup=2, stable=3, decay=4, shape="linear"), [0.0, 0.5, 1.0, 1.0, 1.0, 1.0, 0.75, 0.5, 0.25, 0.0, 0.0]),
    # wsd(... cosine): decay (1 + cos(π p))/2: p = 1/4 → 1/2 + √2/4, p = 1/2 → 1/2, p = 3/4 → 1/2 − √2/4
    (bind(wsd, warmup=2, stable=3, decay=4), [0.0, 0.5, 1.0, 1.0, 1.0, 1.0, 0.5 + R2 / 4, 0.5, 0.5 - R2 / 4, 0.0, 0.0]),
    # wsd(... 1-sqrt, Hägele et al. 2024): 1 − √p over 4 steps: p = 1/4 → 1/2, p = 1/2 → 1 − √2/2, p = 3/4 → 1 − √3/2
    (bind(wsd, warmup=2, stable=3, decay=4, shape="1-sqrt"),
     [0.0, 0.5, 1.0, 1.0, 1.0, 1.0, 0.5, 1 - R2 / 2, 1 - math.sqrt(3) / 2, 0.0, 0.0]),
    # wsd with min_ratio 0.1 and no warmup: 1 for 2 steps, then 0.1 + 0.9·(1 − p) over 3 steps
    (bind(wsd, warmup=0, stable=2, decay=3, min_ratio=0.1, shape="linear"), [1.0, 1.0, 1.0, 0.7, 0.4, 0.1, 0.1]),
    (constant, [1.0] * 5),
]


@pytest.mark.parametrize("schedule, table", TABLES)
def test_schedule_matches_its_table(schedule, table):
    for step, want in enumerate(table):
        assert abs(schedule(step) - want) <= 1e-12, (step, schedule(step), want)


def torch_multipliers(make, steps):
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=1.0)
    sched = make(opt)
    out = []
    for _ in range(steps):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


S = torch.optim.lr_scheduler
N, W = 300, 30
COUNTERPARTS = [
    # torch's cosine keeps going back up after T_max, ours holds min_ratio: compare up to total
    (bind(warmup_cosine, warmup=0, total=N, min_ratio=0.1),
     lambda o: S.CosineAnnealingLR(o, T_max=N, eta_min=0.1), N + 1),
    (bind(warmup_linear, warmup=0, total=N, min_ratio=0.1),
     lambda o: S.LinearLR(o, start_factor=1.0, end_factor=0.1, total_iters=N), N + 50),
    # LinearLR needs start_factor > 0; 1e-14 stands in for our warmup's 0 at step 0
    (bind(linear_warmup, warmup=W), lambda o: S.LinearLR(o, start_factor=1e-14, total_iters=W), W + 20),
    (bind(warmup_cosine, warmup=W, total=N, min_ratio=0.1),
     lambda o: S.SequentialLR(o, [S.LinearLR(o, start_factor=1e-14, total_iters=W),
                                  S.CosineAnnealingLR(o, T_max=N - W, eta_min=0.1)], milestones=[W]), N + 1),
    (bind(warmup_linear, warmup=W, total=N, min_ratio=0.1),
     lambda o: S.SequentialLR(o, [S.LinearLR(o, start_factor=1e-14, total_iters=W),
                                  S.LinearLR(o, start_factor=1.0, end_factor=0.1, total_iters=N - W)],
                              milestones=[W]), N + 40),
    (bind(wsd, warmup=W, stable=100, decay=100, min_ratio=0.1),
     lambda o: S.SequentialLR(o, [S.LinearLR(o, start_factor=1e-14, total_iters=W),
                                  S.ConstantLR(o, factor=1.0, total_iters=100),
                                  S.CosineAnnealingLR(o, T_max=100, eta_min=0.1)], milestones=[W, W + 100]), W + 201),
]


@pytest.mark.parametrize("ours, make, steps", COUNTERPARTS)
def test_schedule_matches_torch(ours, make, steps):
    theirs = torch_multipliers(make, steps)
    assert max(abs(ours(s) - x) for s, x in enumerate(theirs)) <= 1e-12


@pytest.mark.parametrize("call, name", [
    (lambda: bind(warmup_cosine, warmup=10, total=5), "total"),
    (lambda: bind(warmup_cosine, warmup=-1, total=5), "warmup"),
    (lambda: bind(warmup_linear, warmup=1, total=5, min_ratio=1.5), "min_ratio"),
    (lambda: bind(wsd, warmup=1, stable=2, decay=0), "decay"),
    (lambda: bind(wsd, warmup=1, stable=2, decay=3, shape="step"), "shape"),
])
def test_bad_arguments_raise_at_bind_time(call, name):
    with pytest.raises(ValueError, match=name):
        call()
