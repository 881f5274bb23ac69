import math

import pytest
import torch

from labtools.budget import activation_bytes
from labtools.memory import model_state_bytes, peak_bytes, saved_activation_bytes, saved_activations
from labtools.model import GPT, GPTConfig

CONFIGS = [  # (n_layer, n_embd, n_head, vocab, T, B)
    (2, 64, 4, 96, 32, 4),
    (5, 32, 2, 50, 16, 3),
    (3, 128, 8, 128, 64, 2),
]
POLICIES = [("none", 1), ("block", 1), ("every_k", 2), ("attn", 1), ("mlp", 1)]


def model_and_batch(L, C, H, V, T, B, policy="none", every=1):
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=V, block_size=T, n_layer=L, n_head=H, n_embd=C, checkpoint=policy,
                          checkpoint_every=every))
    g = torch.Generator().manual_seed(0)
    return model, torch.randint(V, (B, T), generator=g), torch.randint(V, (B, T), generator=g)


@pytest.mark.parametrize("cfg", CONFIGS)
@pytest.mark.parametrize("policy, every", POLICIES)
def test_predicted_activation_bytes_equal_measured(cfg, policy, every):
    L, C, H, V, T, B = cfg
    model, X, Y = model_and_batch(*cfg, policy, every)
    measured = saved_activation_bytes(model, X, Y)
    predicted = activation_bytes(L, C, H, V, T, B, policy=policy, checkpoint_every=every)["total"]
    assert predicted == measured


def test_block_checkpointing_keeps_only_block_inputs():
    L, C, H, V, T, B = 8, 64, 4, 96, 32, 4
    none = saved_activation_bytes(*model_and_batch(L, C, H, V, T, B))
    model, X, Y = model_and_batch(L, C, H, V, T, B, "block")
    saved, _ = saved_activations(lambda: model(X, Y), exclude=list(model.parameters()))
    # what is left: each block's input, ln_f's input and lm_head's input (saved as a (B·T, C) view)
    assert sum(s.nbytes == B * T * C * 4 for s in saved) == L + 2
    assert none / sum(s.nbytes for s in saved) > 5


def test_measuring_a_forward_leaves_nothing_behind():
    """Measuring saved bytes runs a forward that is never backwarded: its graph, the model and the activations must
    be freed as soon as the caller drops them, without a gc pass (a sweep of models otherwise grows to the device's
    memory: lesson 05 ran out of 80 GB this way on an H100)."""
    import gc
    import weakref
    cfg = GPTConfig(vocab_size=32, block_size=16, n_layer=2, n_head=2, n_embd=32)
    for policy in ("none", "block"):
        torch.manual_seed(0)
        model = GPT(cfg.__class__(**{**cfg.__dict__, "checkpoint": policy}))
        X = torch.randint(32, (2, 16))
        assert saved_activation_bytes(model, X, X) > 0
        params = [weakref.ref(p) for p in model.parameters()]
        gc.disable()
        try:
            del model
            alive = sum(r() is not None for r in params)
        finally:
            gc.enable()
        assert alive == 0, f"{policy}: {alive} parameters still held after the model was dropped"


def test_saved_bytes_agree_with_torch_mem_tracker():
    L, C, H, V, T, B = CONFIGS[0]
    model, X, Y = model_and_batch(*CONFIGS[0])
    kept = []
    peak = peak_bytes(lambda: kept.append(model(X, Y)), model)  # forward only: the peak is at its end
    saved = saved_activation_bytes(model, X, Y)
    logits = B * T * V * 4  # returned to the caller, not saved for backward, but live: the tracker counts it
    assert abs(peak["activations"] - logits - saved) <= 0.005 * saved


def test_model_state_bytes():
    model, X, Y = model_and_batch(*CONFIGS[0])
    n = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    assert model_state_bytes(model, opt) == {"params": 4 * n, "grads": 0, "optimizer": 0}
    model(X, Y)[1].backward()
    opt.step()
    n_tensors = len(list(model.parameters()))
    assert model_state_bytes(model, opt) == {"params": 4 * n, "grads": 4 * n, "optimizer": 8 * n + 4 * n_tensors}


@pytest.mark.parametrize("kw, name", [(dict(policy="some"), "policy"), (dict(checkpoint_every=0), "checkpoint_every")])
def test_bad_prediction_arguments(kw, name):
    with pytest.raises(ValueError, match=name):
        activation_bytes(2, 64, 4, 96, 32, 4, **kw)


# --- the budget calculator ------------------------------------------------------------------------------------

from labtools import optim as O  # noqa: E402
from labtools.budget import architecture, estimate  # noqa: E402

OPTIMIZERS = {"sgd": lambda p: O.SGD(p, lr=0.1), "momentum": lambda p: O.SGD(p, lr=0.1, momentum=0.9),
              "adam": lambda p: O.Adam(p), "adamw": lambda p: O.AdamW(p, weight_decay=0.1),
              "lion": lambda p: O.Lion(p), "adafactor": lambda p: O.Adafactor(p)}


@pytest.mark.parametrize("precision, dtype", [("fp32", torch.float32), ("bf16", torch.bfloat16)])
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_predicted_model_states_equal_measured(name, precision, dtype):
    L, C, H, V, T, B = CONFIGS[0]
    model, X, Y = model_and_batch(*CONFIGS[0])
    model = model.to(dtype)
    opt = OPTIMIZERS[name](model.parameters())
    model(X, Y)[1].backward()
    opt.step()
    measured = model_state_bytes(model, opt)
    arch = architecture(L, C, H, V, T, B)
    assert arch.n_params == sum(p.numel() for p in model.parameters())
    budget = estimate(arch.n_params, precision=precision, optimizer=name, param_shapes=arch.param_shapes)
    predicted = {"params": budget.parts.get("weights", 0), "grads": budget.parts.get("gradients", 0),
                 "optimizer": budget.parts.get("optimizer state", 0)}
    assert predicted == measured


def test_published_numbers():
    GB = 1e9
    assert estimate(7_000_000_000, precision="fp32", optimizer="adam").total == 112 * GB
    assert estimate(7_000_000_000, precision="bf16-mixed", optimizer="adamw").total == 112 * GB
    assert estimate(70_000_000_000, zero_stage="FULL_SHARD", dp=8).total == 140 * GB
    zero = [round(estimate(7_500_000_000, zero_stage=z, dp=64).total / GB, 1) for z in range(4)]
    assert zero == [120.0, 31.4, 16.6, 1.9]  # Rajbhandari et al. 2020, Figure 1
    assert [estimate(10**9, grads=g).bytes_per_param() for g in ("param", "fp32", "param+fp32")] == [16, 18, 20]


def test_offload_moves_bytes_to_the_host():
    b = estimate(7_000_000_000, offload="optimizer")
    assert set(b.cpu_parts) == {"optimizer state", "master weights"} and b.total == 28e9 and b.cpu_total == 84e9
    assert estimate(7_000_000_000, offload="all").total == 0


def test_tp_pp_and_activations():
    b = estimate(8 * 10**9, tp=4, pp=2, activations=10**9)
    assert b.parts["weights"] == 2 * 10**9 and b.parts["activations"] == 10**9 and b.model_states == 16 * 10**9


@pytest.mark.parametrize("kw, name", [
    (dict(n_params=-5), "n_params"), (dict(zero_stage=4), "zero_stage"), (dict(zero_stage="HALF_SHARD"), "zero_stage"),
    (dict(dp=0), "dp"), (dict(optimizer="adagrad"), "optimizer"), (dict(precision="fp8"), "precision"),
    (dict(offload="disk"), "offload"), (dict(optimizer="adafactor"), "param_shapes"), (dict(tp=1.5), "tp"),
    (dict(param_shapes=[(10, 10)]), "param_shapes"),
])
def test_estimate_rejects_bad_input(kw, name):
    args = dict(n_params=10**9) | kw
    n = args.pop("n_params")
    with pytest.raises(ValueError, match=name):
        estimate(n, **args)


def test_saved_tensor_tracker_follows_forwards_and_backwards():
    from labtools.memory import SavedTensorTracker
    torch.manual_seed(0)
    m = GPT(GPTConfig(vocab_size=32, block_size=16, n_layer=2, n_head=2, n_embd=32))
    X, Y = torch.randint(32, (4, 16)), torch.randint(32, (4, 16))
    one = saved_activation_bytes(m, X, Y)
    with SavedTensorTracker(exclude=list(m.parameters())) as t:
        first = m(X, Y)[1]
        assert t.current == one
        second = m(X, Y)[1]
        assert t.current == 2 * one - X.numel() * 8 - Y.numel() * 8  # the same X and Y storages are counted once
        first.backward()
        assert t.current == one
        second.backward()
        assert t.current == 0
    assert t.peak == 2 * one - X.numel() * 8 - Y.numel() * 8


@pytest.mark.parametrize("shape", [(3, 4, 5), (2, 3, 4, 5), (6, 8), (7,)])
def test_adafactor_state_of_any_rank_equals_what_both_optimizers_allocate(shape):
    """One row and one column statistic per leading index: (a, n, m) keeps a·n + a·m numbers, not a·n + m."""
    predicted = estimate(math.prod(shape), precision="fp32", optimizer="adafactor",
                         param_shapes=[shape]).parts["optimizer state"]
    for make in (lambda p: O.Adafactor([p]), lambda p: torch.optim.Adafactor([p])):
        p = torch.nn.Parameter(torch.randn(shape))
        p.grad = torch.randn(shape)
        opt = make(p)
        opt.step()
        state = opt.state[p]
        held = sum(v.numel() * v.element_size() for k, v in state.items() if torch.is_tensor(v) and k != "step")
        assert held == predicted, (type(opt).__name__, {k: tuple(v.shape) for k, v in state.items()
                                                        if torch.is_tensor(v)})


# DeepSpeed's estimators (deepspeed/runtime/zero/stage_1_and_2.py and stage3.py), GPU side, no offload:
# ZeRO-2: 4·P + 16·P/N; ZeRO-3: 4·largest_layer + 18·P/N; ZeRO-3 with parameters and optimizer offloaded: 4·largest.
@pytest.mark.parametrize("P, N, largest", [(7_000_000_000, 8, 131_072_000), (1_300_000_000, 4, 51_000_000),
                                           (70_000_000_000, 64, 1_000_000_000)])
def test_estimate_matches_deepspeeds_estimators_with_their_conventions(P, N, largest):
    z2 = estimate(P, zero_stage=2, dp=N, grads="param+fp32", whole_low_precision_grads=True).total
    assert z2 == pytest.approx(4 * P + 16 * P / N, rel=0.01)
    z3 = estimate(P, zero_stage=3, dp=N, grads="fp32", gathered=largest).total
    assert z3 == pytest.approx(4 * largest + 18 * P / N, rel=0.01)
    off = estimate(P, zero_stage=3, dp=N, grads="fp32", gathered=largest, offload="all")
    assert off.total == pytest.approx(4 * largest, rel=0.01) and off.total > 0
    assert "gathered unit" in off.convention


def test_zero3_counts_the_gathered_unit_from_the_shapes_or_says_it_does_not():
    shapes = [(1000, 64), (64, 256), (256,)]
    n = sum(math.prod(s) for s in shapes)
    b = estimate(n, zero_stage=3, dp=4, param_shapes=shapes)
    assert b.parts["gathered unit"] == 2 * 2 * 64_000  # bf16 weights + gradients of the largest
    assert "not counted" in estimate(n, zero_stage=3, dp=4).convention
    with pytest.raises(ValueError, match="whole_low_precision_grads"):
        estimate(n, zero_stage=3, whole_low_precision_grads=True)


def test_a_steps_anatomy_shows_activations_come_and_go_and_sixteen_bytes_per_parameter():
    from labtools.config import LabConfig, build_gpt
    from labtools.data import text
    from labtools.memory import MOMENTS, step_anatomy
    corpus = text()
    model = build_gpt(LabConfig(n_layer=2, n_embd=32, n_head=4, block_size=16, seed=0), corpus.vocab_size)
    X, Y = corpus.batch("train", 4, 16, torch.Generator().manual_seed(0), torch.device("cpu"))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    a = step_anatomy(model, opt, X, Y)
    assert list(a) == list(MOMENTS)
    n = sum(p.numel() for p in model.parameters())
    assert a["start"]["params"] == 4 * n and a["start"]["grads"] == 0 and a["start"]["activations"] == 0
    assert a["after forward"]["activations"] > 10 * a["after backward"]["activations"]
    assert a["after backward"]["grads"] == 4 * n and a["after zero_grad"]["grads"] == 0
    assert abs(a["after optimizer step"]["optimizer"] - 8 * n) <= 8 * len(list(model.parameters()))  # + step counts
    assert a["peak"]["activations"] >= a["after forward"]["activations"]


def test_lesson_05_anatomy_agrees_with_the_saved_tensor_count_and_the_claim_can_fail():
    from labtools.claims import Ledger
    from lessons.activation_checkpointing import peak, settings
    S = settings("smoke", n_embd=32, seq_len=32)
    pk, an = peak.run(S), peak.anatomy(S)
    ledger = Ledger("05_test")
    peak.anatomy_findings(ledger, pk, an)
    assert ledger.claims[-1].passed and ledger.claims[-1].measured < 0.01
    swapped = {("none", 1): pk[("block", 1)], ("block", 1): pk[("none", 1)]}  # each policy against the other's count
    ledger = Ledger("05_test")
    peak.anatomy_findings(ledger, swapped, an)
    assert not ledger.claims[-1].passed
    assert an["none"]["peak"]["grads"] < an["block"]["peak"]["grads"]  # checkpointing moves the peak into backward
