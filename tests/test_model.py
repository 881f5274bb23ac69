import math

import pytest
import torch

from labtools.model import GPT, GPTConfig, gpt2_124m, small, tiny


def make(**kw) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(**{**dict(vocab_size=32, block_size=16, n_layer=2, n_head=2, n_embd=32), **kw}))


def test_shapes_and_loss():
    model = make()
    X = torch.randint(32, (3, 16))
    logits, loss = model(X, X)
    assert logits.shape == (3, 16, 32)
    assert loss.shape == ()
    logits, loss = model(X[:, :5])
    assert logits.shape == (3, 5, 32) and loss is None


def test_causal_future_tokens_do_not_change_earlier_logits():
    model = make().eval()
    X = torch.randint(32, (2, 16))
    X2 = X.clone()
    X2[:, 9:] = (X2[:, 9:] + 1) % 32  # change tokens from position 9 on
    a, _ = model(X)
    b, _ = model(X2)
    torch.testing.assert_close(a[:, :9], b[:, :9], rtol=0, atol=1e-6)
    assert (a[:, 9:] - b[:, 9:]).abs().max() > 1e-3  # and later positions do see the change


def test_init_loss_is_about_ln_vocab():
    model = make(vocab_size=64)
    X = torch.randint(64, (8, 16))
    _, loss = model(X, torch.randint(64, (8, 16)))
    assert loss.item() == pytest.approx(math.log(64), rel=0.05)


def test_weights_are_tied_and_counted_once():
    model = make()
    assert model.lm_head.weight is model.transformer.wte.weight
    assert model.num_params() == sum(p.numel() for p in model.parameters())


def test_untied_head_is_a_separate_parameter_with_the_same_function():
    """Untied (a pipeline keeps the embedding and the head on different stages): copy the shared matrix into
    both and the model computes the same logits; training then moves them apart."""
    tied, untied = make(), make(tie_embeddings=False)
    assert untied.lm_head.weight is not untied.transformer.wte.weight
    V, C = 32, 32
    assert untied.num_params() == tied.num_params() + V * C
    state = {k: v for k, v in tied.state_dict().items()}
    untied.load_state_dict(state)  # both keys present in a tied state dict: each gets the shared matrix
    X = torch.randint(32, (2, 16))
    torch.testing.assert_close(untied(X)[0], tied(X)[0], rtol=0, atol=0)
    untied(X, X)[1].backward()
    assert not torch.equal(untied.lm_head.weight.grad, untied.transformer.wte.weight.grad)


def test_gpt2_124m_parameter_count_matches_formula():
    cfg = gpt2_124m()
    with torch.device("meta"):
        model = GPT(cfg)
    V, T, L, C = cfg.vocab_size, cfg.block_size, cfg.n_layer, cfg.n_embd
    # per block: qkv 3C^2+3C, attn proj C^2+C, MLP 8C^2+5C, two LayerNorms 4C; plus embeddings and ln_f
    expected = V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C
    assert model.num_params() == expected == 124_439_808


def test_presets_are_valid_and_ordered():
    sizes = []
    for preset in (tiny, small):
        with torch.device("meta"):
            sizes.append(GPT(preset(vocab_size=96)).num_params())
    assert sizes[0] < sizes[1]


def test_generate_is_reproducible_with_a_generator():
    model = make()
    idx = torch.zeros(2, 1, dtype=torch.long)
    a = model.generate(idx, 20, generator=torch.Generator().manual_seed(1))
    b = model.generate(idx, 20, generator=torch.Generator().manual_seed(1))
    assert a.shape == (2, 21) and torch.equal(a, b)
    assert a.min() >= 0 and a.max() < 32
    assert model.training  # generate restores the mode


@pytest.mark.parametrize("kw, name", [
    (dict(n_embd=30, n_head=4), "n_embd"),
    (dict(n_layer=0), "n_layer"),
    (dict(dropout=1.5), "dropout"),
    (dict(checkpoint="sometimes"), "checkpoint"),
])
def test_bad_config_raises_naming_the_field(kw, name):
    with pytest.raises(ValueError, match=name):
        make(**kw)


def test_sequence_longer_than_block_size_raises():
    with pytest.raises(ValueError, match="block_size"):
        make()(torch.zeros(1, 17, dtype=torch.long))


@pytest.mark.parametrize("policy, every", [("block", 1), ("every_k", 2), ("every_k", 3), ("attn", 1), ("mlp", 1)])
@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_checkpointing_leaves_gradients_unchanged(policy, every, dropout):
    X, Y = torch.randint(32, (3, 16)), torch.randint(32, (3, 16))

    def grads(**kw):
        model = make(n_layer=5, dropout=dropout, **kw)  # same seed, same initial weights
        torch.manual_seed(7)  # same dropout masks
        model(X, Y)[1].backward()
        return [p.grad for p in model.parameters()]

    reference = grads()
    for a, b in zip(reference, grads(checkpoint=policy, checkpoint_every=every)):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


def test_head_by_head_qkv_layout_computes_the_fused_split_attention():
    """c_attn's rows are [q₀ k₀ v₀ | q₁ k₁ v₁ | …]. The same weights read the common way ([q | k | v], heads
    side by side in each) after permuting the rows give the same output: the layout changes nothing but where
    a head's q, k and v sit — together, so a column shard of whole heads holds all three."""
    from torch.nn import functional as F
    torch.manual_seed(0)
    model = make(n_head=4, n_embd=32)
    attn = model.transformer.h[0].attn
    C, nh, hs = 32, 4, 8
    x = torch.randn(2, 16, C)
    # the common layout's row index of (role, head, i) is role·C + head·hs + i; ours is head·3hs + role·hs + i
    perm = torch.tensor([h * 3 * hs + r * hs + i for r in range(3) for h in range(nh) for i in range(hs)])
    W, b = attn.c_attn.weight[perm], attn.c_attn.bias[perm]
    q, k, v = F.linear(x, W, b).split(C, dim=2)
    q, k, v = (t.view(2, 16, nh, hs).transpose(1, 2) for t in (q, k, v))
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(2, 16, C)
    torch.testing.assert_close(attn(x), attn.c_proj(y), rtol=0, atol=1e-6)


def test_attention_reads_its_head_count_from_the_width_it_computes():
    """Keep the first two heads' columns of c_attn and rows of c_proj's input: the module computes exactly those
    two heads (what a tensor-parallel rank holding half the heads does)."""
    torch.manual_seed(0)
    attn = make(n_head=4, n_embd=32).transformer.h[0].attn
    x = torch.randn(2, 16, 32)
    def part(rows: slice, bias: bool):
        c_attn, c_proj = torch.nn.Linear(32, 48), torch.nn.Linear(16, 32)
        with torch.no_grad():
            c_attn.weight.copy_(attn.c_attn.weight[rows])
            c_attn.bias.copy_(attn.c_attn.bias[rows])
            c_proj.weight.copy_(attn.c_proj.weight[:, rows.start // 3:rows.stop // 3])
            c_proj.bias.copy_(attn.c_proj.bias if bias else torch.zeros(32))  # the bias is added once
        return c_attn, c_proj

    half, other = part(slice(0, 48), False), part(slice(48, 96), True)
    outs = []
    for c_attn, c_proj in (half, other):
        attn.c_attn, attn.c_proj = c_attn, c_proj
        outs.append(attn(x))
    torch.manual_seed(0)
    whole = make(n_head=4, n_embd=32).transformer.h[0].attn
    torch.testing.assert_close(outs[0] + outs[1], whole(x), rtol=0, atol=1e-6)  # row-parallel: partial sums add up
