"""Lesson 15: the router and its capacity, the balancing and z losses, the MoE GPT, expert parallelism on real ranks
against one process, and the published parameter counts."""

import math

import pytest
import torch

from labtools import moe
from labtools.claims import Ledger
from labtools.layout import moe_model_states
from labtools.model import GPTConfig
from labtools.shapes import DEEPSEEK_V3


def test_routing_keeps_first_choices_before_second_and_earlier_tokens_first():
    logits = torch.tensor([[3.0, 2.0, 0.0], [2.0, 3.0, 0.0], [0.0, 3.0, 2.0], [0.0, 2.0, 3.0]])
    r = moe.route(logits, 2, 2)
    assert r.expert.tolist() == [[0, 1], [1, 0], [1, 2], [2, 1]]
    # expert 1: first choices of tokens 1 and 2 fill its two slots; token 0's and token 3's second choices drop
    assert r.kept.tolist() == [[True, False], [True, True], [True, True], [True, False]]
    assert r.dropped() == 2 and r.load().tolist() == [2, 4, 2]
    assert torch.allclose(r.gate.sum(-1), torch.ones(4))  # k > 1: renormalised
    one = moe.route(logits, 1, 4)
    assert torch.allclose(one.gate[:, 0], torch.softmax(logits, -1).max(-1).values)  # k = 1: the probability


@pytest.mark.parametrize("args, match", [((torch.zeros(4, 3), 4, 2), "^k must"), ((torch.zeros(4, 3), 0, 2), "^k must"),
                                         ((torch.zeros(4, 3), 1, 0), "capacity")])
def test_routing_refuses_bad_input(args, match):
    with pytest.raises(ValueError, match=match):
        moe.route(*args)


def test_capacity_and_the_losses_take_their_published_values_at_balance():
    assert moe.capacity(100, 8, 2, 1.25) == math.ceil(1.25 * 100 * 2 / 8)
    with pytest.raises(ValueError, match="^factor must"):
        moe.capacity(100, 8, 2, 0)
    even = moe.route(torch.zeros(8, 4) + torch.eye(4).repeat(2, 1) * 1e-3, 1, 8)
    assert moe.balance_loss(even).item() == pytest.approx(1.0, rel=1e-3)  # f and P both even
    crowded = moe.route(torch.tensor([[5.0, 0, 0, 0]] * 8), 1, 8)
    assert moe.balance_loss(crowded).item() > 3.0  # all on one expert: close to E
    assert moe.z_loss(torch.zeros(3, 4)).item() == pytest.approx(math.log(4) ** 2)


def test_the_moe_gpt_trains_its_router_and_counts_active_parameters():
    cfg = GPTConfig(vocab_size=32, block_size=8, n_layer=2, n_head=2, n_embd=16)
    m = moe.moe_gpt(cfg, 4, 2, 2.0)
    X = torch.randint(0, 32, (2, 8))
    _, loss = m(X, X)
    aux = moe.aux_losses(m)
    (loss + 0.1 * aux["balance"]).backward()
    assert all(layer.router.weight.grad.abs().sum() > 0 for layer in moe.moe_layers(m))
    per_expert = sum(p.numel() for p in m.transformer.h[0].mlp.experts[0].parameters())
    assert moe.active_params(m) == m.num_params() - 2 * 2 * per_expert  # 2 layers, 2 of 4 experts unused
    with pytest.raises(ValueError, match="top_k"):
        moe.MoEMLP(cfg, 4, 5, 1.0)
    with pytest.raises(ValueError, match="no MoE layer"):
        moe.aux_losses(moe.moe_gpt(cfg, 4, 1))


def test_lesson_15_route_solution_passes_and_token_major_capacity_fails_naming_the_case():
    from lessons.mixture_of_experts import router_exercise as rx
    ns = {}
    exec(rx.solution_source(), ns)  # noqa: S102 - the lesson's own solution
    assert rx.check_route(ns["my_route"]).passed

    def token_major(logits, k, capacity):
        p = torch.softmax(logits, -1)
        top, e = p.topk(k, -1)
        g = top / top.sum(-1, keepdim=True) if k > 1 else top
        oh = torch.nn.functional.one_hot(e.reshape(-1), logits.size(1))
        pos = (oh.cumsum(0) - 1).gather(1, e.reshape(-1, 1)).squeeze(1)
        return e, g, (pos < capacity).reshape(e.shape)

    out = rx.check_route(token_major)
    assert out.status == "fail" and "first choices before second" in out.message

    def always_renormalise(logits, k, capacity):
        e, g, kept = ns["my_route"](logits, k, capacity)
        return e, g / g.sum(-1, keepdim=True), kept

    assert "top-1" in rx.check_route(always_renormalise).message


def test_the_published_shapes_give_the_published_totals():
    from lessons.mixture_of_experts import scale
    ledger = Ledger("t")
    scale.findings(ledger, scale.rows())
    assert ledger.all_passed, ledger.to_text()
    assert moe_model_states(DEEPSEEK_V3, 16, 64, 128) < 80e9 < moe_model_states(DEEPSEEK_V3, 16, 1, 128)
    with pytest.raises(ValueError, match="ep"):
        moe_model_states(DEEPSEEK_V3, 16, 3, 128)


@pytest.mark.parametrize("kw, match", [(dict(top_k=5), "TOP_K"), (dict(n_experts=6, ep=4), "N_EXPERTS"),
                                       (dict(capacity_factor=0.0), "CAPACITY_FACTOR")])
def test_bad_settings_are_named(kw, match):
    from lessons.mixture_of_experts import settings
    with pytest.raises(ValueError, match=match):
        settings("smoke", **kw)


@pytest.mark.ranks
def test_expert_parallelism_on_two_ranks_equals_one_process(session_run_root):
    from lessons.mixture_of_experts import experts, settings
    from test_dist import wait_gone

    S = settings("smoke", ep_tokens=32)
    res = experts.run(S)
    assert wait_gone(session_run_root) == []
    assert all(x.max_diff.largest() < 1e-5 and x.others_untouched for x in res)
    # what a rank handed all-to-all: its assignments kept for the other rank's experts, there and back, twice
    for x in res:
        assert x.bytes > 0 and x.bytes % (4 * 4 * S.n_embd) == 0
    ledger = Ledger("t")
    experts.findings(ledger, res, S)
    # the wire is left to the lesson, which runs with nothing else on the loopback interface; here the browser
    # tests run beside the unit tests and their traffic crosses it too
    assert all(c.passed for c in ledger.claims if c.key != "ep_wire"), ledger.to_text()


@pytest.mark.parametrize("factor", [0.1, 1.1, 16.0])  # the range's ends and a value off the slider's grid
def test_the_routing_panel_takes_every_capacity_factor_the_lesson_allows(factor):
    from lessons.mixture_of_experts import settings, training

    S = settings("smoke", capacity_factor=factor)
    g = torch.Generator().manual_seed(0)
    logits = [torch.randn(64, S.n_experts, generator=g) for _ in range(2)]
    panel = training.routing_panel({"MoE": {"logits": logits}, "no balance": {"logits": logits}}, S)
    assert panel.values()["factor"] == factor
    slider = panel.controls["factor"]
    assert min(slider.options, key=lambda o: o[1])[1] == 0.1 and max(slider.options, key=lambda o: o[1])[1] == 16.0
    assert f"capacity factor {factor:g}" in panel.figure.layout.title.text
