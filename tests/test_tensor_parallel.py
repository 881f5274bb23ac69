"""Tensor parallelism: the written-out split and DTensor's against one rank, the memory model with tp, the mesh,
and tensor parallelism inside a node against across nodes."""

import pytest
import torch

from labtools.budget import activation_bytes, korthikanti_tp_bytes_per_layer
from labtools.model import GPT, GPTConfig
from labtools.parallel import launch
from labtools.parallel.mesh import check_mesh
from labtools.parallel.tensor import check_tensor_parallel
from labtools.shapes import MODELS
from lessons.tensor_parallel import Settings
from lessons.tensor_parallel.ranks import ParityResult, Version, parity


@pytest.mark.ranks
def test_two_ranks_written_out_and_dtensor_equal_one_rank():
    res = launch(parity, 2, Settings(n_layer=1, n_embd=32, n_head=4, block_size=16, batch_size=2), show_progress=False)
    for r in res:
        assert isinstance(r, ParityResult) and set(r.gpt) == set(Version)
        for part, versions in (("mlp", r.mlp), ("attention", r.attention), ("gpt", r.gpt)):
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


def test_flops_per_token_is_six_n_plus_attention():
    m = MODELS["7B"]
    assert m.flops_per_token() == pytest.approx(6 * 7e9 + 12 * 32 * 4096 * 4096)
    assert m.flops_per_token(recompute=True) > m.flops_per_token()
    torch.manual_seed(0)


def test_the_split_picture_draws_each_tensor_with_its_shape_on_one_rank():
    from lessons.tensor_parallel import picture
    texts = lambda fig: [t for tr in fig.data if tr.mode and "text" in tr.mode for t in tr.text]  # noqa: E731
    tp = texts(picture.figure(64, 256, 2, sequence_parallel=False))
    assert tp.count("c_fc 128×64") == 2 and tp.count("c_proj 64×128") == 2 and tp.count("x 256×64") == 2
    assert "reduce: all-reduce" in tp and "all-gather" not in tp
    sp = texts(picture.figure(64, 256, 4, sequence_parallel=True))
    assert sp.count("x 64×64") == 4 and sp.count("y 64×64") == 4 and sp.count("gelu 256×64") == 4
    assert "all-gather" in sp and "reduce-scatter" in sp


def test_tensor_parallelism_over_the_network_costs_far_more_than_over_nvlink():
    from lessons.tensor_parallel import interconnect
    r = interconnect.nvlink_vs_network()
    assert r["nvlink"] < 0.10 < 0.5 < r["network"]
    assert 8 < r["network"] / r["nvlink"] < 300 / 25  # the bandwidths' ratio, less the latency both pay alike
