"""Tensor parallelism: the written-out split and DTensor's against one rank, the memory model with tp, the mesh,
and the planner against published numbers."""

import pytest
import torch

from labtools import compute, plan
from labtools.budget import activation_bytes, korthikanti_tp_bytes_per_layer
from labtools.compute import training_days
from labtools.model import GPT, GPTConfig
from labtools.parallel import launch
from labtools.parallel.mesh import check_mesh
from labtools.parallel.tensor import check_tensor_parallel
from labtools.plan import CLUSTERS, MODELS, Layout
from lessons.tensor_parallel import Settings
from lessons.tensor_parallel.ranks import parity

A100, H100 = CLUSTERS["A100 80GB, NVLink 3, HDR 200 Gb/s"], CLUSTERS["H100 80GB, NVLink 4, NDR 400 Gb/s"]


def test_two_ranks_written_out_and_dtensor_equal_one_rank():
    res = launch(parity, 2, Settings(n_layer=1, n_embd=32, n_head=4, block_size=16, batch_size=2), show_progress=False)
    for r in res:
        for part, versions in r.items():
            if part == "dist":
                continue
            for version, diff in versions.items():
                assert diff <= 1e-5, (part, version, diff)


def test_tp_must_divide_the_heads():
    model = GPT(GPTConfig(vocab_size=16, block_size=8, n_layer=1, n_head=6, n_embd=48))
    with pytest.raises(ValueError, match="heads"):
        check_tensor_parallel(model, 4)
    check_tensor_parallel(model, 3)  # whole heads per rank (and so a whole share of the width)


def test_the_memory_model_splits_12_of_16_tensors_with_tp_and_14_with_sp():
    base = dict(n_layer=3, n_embd=64, n_head=8, vocab_size=50, seq_len=32, batch_size=2)
    E = 2 * 32 * 64 * 4
    none = activation_bytes(**base)["blocks"]
    tp2 = activation_bytes(**base, tp=2)["blocks"]
    sp2 = activation_bytes(**base, tp=2, sequence_parallel=True)["blocks"]
    assert none - tp2 == 3 * (6 * E + 4 * 2 * 8 * 32 // 2)  # 12 tensors halved, the log-sum-exp halved
    assert tp2 - sp2 > 0
    with pytest.raises(ValueError, match="tp"):
        activation_bytes(**base, tp=3)
    # Korthikanti: with SP everything is divided by t
    assert korthikanti_tp_bytes_per_layer(2048, 1, 4096, 32, 8, True) * 8 == pytest.approx(
        korthikanti_tp_bytes_per_layer(2048, 1, 4096, 32, 1, True))


def test_mesh_sizes_must_multiply_to_the_world():
    with pytest.raises(ValueError, match="world size"):
        check_mesh(2, 2, 1, 8)
    with pytest.raises(ValueError, match="tp"):
        check_mesh(2, 0, 1, 0)


def test_planner_fits_and_ranks_layouts_with_the_published_pipeline_and_days_arithmetic():
    llama = plan.step_time(MODELS["405B"], H100, Layout(128, 8, 16), 2048)
    assert llama.bubble == pytest.approx(15 / 31) and llama.micro_batches == 16
    gpt3 = plan.step_time(MODELS["GPT-3 175B"], A100, Layout(8, 8, 16), 1536)
    assert gpt3.fits and gpt3.bubble == pytest.approx(15 / 207)
    assert training_days(175e9, 300e9, 1024, 140e12) == pytest.approx(34, rel=0.02)
    ranked = plan.rank_layouts(MODELS["GPT-3 175B"], A100, 1024, 1536)
    fitting = [e for e in ranked if e.fits]
    assert fitting and all(a.step_s <= b.step_s for a, b in zip(fitting, fitting[1:]))
    assert all(e.layout.world == 1024 and e.layout.tp <= 8 for e in ranked)


@pytest.mark.parametrize("kw, match", [
    (dict(layout=Layout(8, 16, 8)), "heads"),            # 96 heads, tp 16 divides — but not within a node
    (dict(layout=Layout(8, 7, 16)), "heads"),
    (dict(global_batch=1001), "global batch"),
    (dict(mfu=0.0), "mfu"),
    (dict(layout=Layout(1024, 1, 1), global_batch=2048, require_fit=True), "does not fit"),
])
def test_planner_bad_layouts_are_named(kw, match):
    args = dict(model=MODELS["GPT-3 175B"], cluster=A100, layout=Layout(8, 8, 16), global_batch=1536) | kw
    if match == "heads" and args["layout"].tp == 16:
        with pytest.raises(ValueError, match="within a node"):
            plan.check_layout(args["model"], args["layout"], gpus_per_node=8)
        return
    with pytest.raises(ValueError, match=match):
        plan.step_time(**args)


def test_flops_per_token_is_six_n_plus_attention():
    m = MODELS["7B"]
    assert compute.flops_per_token(m) == pytest.approx(6 * 7e9 + 12 * 32 * 4096 * 4096)
    assert compute.flops_per_token(m, recompute=True) > compute.flops_per_token(m)
    torch.manual_seed(0)


def test_the_split_picture_draws_each_tensor_with_its_shape_on_one_rank():
    from lessons.tensor_parallel import picture
    texts = lambda fig: [t for tr in fig.data if tr.mode and "text" in tr.mode for t in tr.text]  # noqa: E731
    tp = texts(picture.figure(64, 256, 2, sequence_parallel=False))
    assert tp.count("c_fc 128×64") == 2 and tp.count("c_proj 64×128") == 2 and tp.count("x 256×64") == 2
    assert "g: all-reduce" in tp and "all-gather" not in tp
    sp = texts(picture.figure(64, 256, 4, sequence_parallel=True))
    assert sp.count("x 64×64") == 4 and sp.count("y 64×64") == 4 and sp.count("gelu 256×64") == 4
    assert "all-gather" in sp and "reduce-scatter" in sp


def test_the_planner_says_what_a_layout_needs_instead_of_dp_zero():
    from labtools.plan import CLUSTERS
    from lessons.tensor_parallel import planner
    fig = planner.figure("GPT-3 175B", 64, 1536, 8, 16, 1, list(CLUSTERS)[0])
    title = fig.layout.title.text
    assert "needs 128 GPUs per model copy, more than 64" in title and "dp 0" not in title
    fig = planner.figure("GPT-3 175B", 1024, 1536, 8, 16, 1, list(CLUSTERS)[0])
    assert "dp 8 × tp 8 × pp 16" in fig.layout.title.text
