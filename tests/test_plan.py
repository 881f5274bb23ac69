"""labtools.plan: pipeline bubbles, ring collectives and the α-β model, layouts and their constraints."""

import math

import pytest

from labtools import plan
from labtools.budget import architecture, estimate
from labtools.layout import Layout
from labtools.shapes import MODELS, ModelShape


@pytest.mark.parametrize("p, m, v, expected", [
    (4, 16, 1, 3 / 19),     # the source article's case: bubble 15.8%, efficiency 84.2% (not 78.9%)
    (2, 1, 1, 1 / 2),       # one micro-batch: each of 2 stages idles half the time
    (4, 8, 2, 3 / 19),      # interleaving with v = 2 halves the bubble of m = 8 ...
    (16, 16, 1, 15 / 31),   # Llama 3 405B without interleaving: pp 16, 16 micro-batches
    (1, 5, 1, 0.0),         # no pipeline, no bubble
])
def test_bubble_fraction(p, m, v, expected):
    assert plan.bubble_fraction(p, m, v) == pytest.approx(expected, rel=1e-12)
    assert plan.pipeline_efficiency(p, m, v) == pytest.approx(1 - expected, rel=1e-12)


def test_interleaving_divides_the_fill_time_by_v():
    for p, m in ((4, 8), (8, 32)):
        assert plan.bubble_fraction(p, m, 2) == pytest.approx((p - 1) / (2 * m + p - 1))
        assert plan.bubble_fraction(p, m, 2) < plan.bubble_fraction(p, m, 1)


@pytest.mark.parametrize("args", [(0, 4), (4, 0), (4, 4, 0), (2.5, 4), (True, 4)])
def test_bubble_rejects_bad_input(args):
    with pytest.raises(ValueError):
        plan.bubble_fraction(*args)


@pytest.mark.parametrize("world", [1, 2, 3, 8, 256])
def test_ring_collective_bytes(world):
    M = 1000.0
    assert plan.collective_bytes("all_reduce", M, world) == pytest.approx(2 * (world - 1) / world * M)
    # an all-reduce is a reduce-scatter then an all-gather: the bytes add up
    assert plan.collective_bytes("all_reduce", M, world) == pytest.approx(
        plan.collective_bytes("reduce_scatter", M, world) + plan.collective_bytes("all_gather", M, world))
    assert plan.collective_steps("all_reduce", world) == 2 * (world - 1)


def test_alpha_beta_time():
    # 70B bf16 gradients over 256 GPUs at 100 Gb/s with α = 10 µs: 2·255·α + 2·255/256·140e9 / 12.5e9
    t = plan.collective_time("all_reduce", 140e9, 256, bandwidth=12.5e9, latency=10e-6)
    assert t == pytest.approx(2 * 255 * 10e-6 + 2 * 255 / 256 * 140e9 / 12.5e9)
    with pytest.raises(ValueError, match="bandwidth"):
        plan.collective_time("all_reduce", 1, 2, bandwidth=0)
    with pytest.raises(ValueError, match="kind"):
        plan.collective_bytes("all_to_all", 1, 2)


def test_check_layout_names_the_constraint():
    m = ModelShape(n_layer=12, n_embd=768, n_head=12, vocab=50257, seq=1024)
    plan.check_layout(m, Layout(2, 4, 3), world=24)
    with pytest.raises(ValueError, match="heads"):
        plan.check_layout(m, Layout(1, 8, 1))
    with pytest.raises(ValueError, match="layers"):
        plan.check_layout(m, Layout(1, 1, 16))
    with pytest.raises(ValueError, match="world size"):
        plan.check_layout(m, Layout(2, 2, 2), world=16)
    with pytest.raises(ValueError, match="within a node"):
        plan.check_layout(MODELS["405B"], Layout(1, 16, 1), gpus_per_node=8)
    with pytest.raises(ValueError, match="dp"):
        plan.check_layout(m, Layout(0, 1, 1))


def test_layouts_enumerates_every_valid_factorisation():
    m = MODELS["7B"]  # 32 heads, 32 layers
    found = plan.layouts(64, m, gpus_per_node=8)
    assert all(lay.world == 64 and lay.tp <= 8 for lay in found)
    assert len(set(found)) == len(found)
    expected = {(64 // (t * p), t, p) for t in (1, 2, 4, 8) for p in (1, 2, 4, 8, 16, 32, 64) if 64 % (t * p) == 0
                and p <= 32}
    assert {(lay.dp, lay.tp, lay.pp) for lay in found} == expected
    assert found[0] == Layout(64, 1, 1)


def test_memory_per_gpu_without_pipeline_is_estimate_plus_activations():
    m = MODELS["70B"]
    b = plan.memory_per_gpu(m, Layout(8, 2, 1), zero_stage=3, micro_batch=2, checkpoint="block")
    arch = architecture(m.n_layer, m.n_embd, m.n_head, m.vocab, m.seq, 2, checkpoint="block", bytes_per_element=2)
    ref = estimate(m.n_params, zero_stage=3, dp=8, tp=2, activations=int(arch.activations["total"] / 2))
    assert b.parts == ref.parts


def test_uneven_stages_count_the_largest():
    m = MODELS["405B"]  # 126 layers: 16 stages of at most 8
    acts = plan.memory_per_gpu(m, Layout(1, 1, 16), checkpoint="block").parts["activations"]
    arch = architecture(m.n_layer, m.n_embd, m.n_head, m.vocab, m.seq, 1, checkpoint="block", bytes_per_element=2)
    per_layer = arch.activations["blocks"] / m.n_layer
    assert acts == int(per_layer * math.ceil(126 / 16) * 16 + arch.activations["outside"])


def test_tensor_parallel_bytes_is_the_sum_of_its_ring_collectives():
    """Megatron's TP: per layer 2 all-reduces forward and 2 backward of b·s·h, each 2(t−1)/t of it per rank; sequence
    parallelism swaps each for an all-gather plus a reduce-scatter ((t−1)/t each) and adds one gather before ln_f
    (forward) and its reduce-scatter (backward). Worked by hand for L 2, b 4, s 8, h 16, fp32, t 4."""
    bsh = 4 * 8 * 16 * 4                                          # 2048 bytes
    per_layer = 4 * plan.collective_bytes("all_reduce", bsh, 4)   # 4 × 3072
    assert plan.tensor_parallel_bytes(2, 4, 8, 16, 4, False) == 2 * per_layer == 24576
    sp_layer = 4 * (plan.collective_bytes("all_gather", bsh, 4) + plan.collective_bytes("reduce_scatter", bsh, 4))
    assert sp_layer == per_layer                                  # the same volume, in other collectives
    assert plan.tensor_parallel_bytes(2, 4, 8, 16, 4, True) == 24576 + 2 * 1536
    assert plan.tensor_parallel_bytes(2, 4, 8, 16, 1, True) == 0  # one rank sends nothing
