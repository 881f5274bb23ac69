import math

import numpy as np
import pytest
import torch

from labtools import data


def _empirical_conditional_entropy(corpus: data.Corpus, order: int) -> float:
    x = corpus.train_data.numpy()
    V = corpus.vocab_size
    ctx = np.zeros_like(x[:, order:])
    for j in range(order):
        ctx = ctx * V + x[:, j:x.shape[1] - order + j]
    counts = np.zeros((V**order, V))
    np.add.at(counts, (ctx.ravel(), x[:, order:].ravel()), 1)
    n = counts.sum(1, keepdims=True)
    p = counts / np.maximum(n, 1)
    logp = np.log(np.where(p > 0, p, 1.0))
    return float(-(counts * logp).sum() / counts.sum())


def test_entropy_rate_matches_an_independent_eigen_solution():
    corpus = data.synthetic(vocab_size=5, order=2, branching=3, n_tokens=4096, row_len=256, seed=3)
    V, k = 5, 2
    P = corpus.transition  # (V^k, V)
    n_ctx = V**k
    M = np.zeros((n_ctx, n_ctx))  # state-to-state transition matrix
    for c in range(n_ctx):
        for t in range(V):
            M[c, (c * V + t) % n_ctx] += P[c, t]
    w, vecs = np.linalg.eig(M.T)
    pi = np.real(vecs[:, np.argmin(np.abs(w - 1))])
    pi /= pi.sum()
    rows = -np.sum(np.where(P > 0, P * np.log(np.where(P > 0, P, 1)), 0), axis=1)
    assert corpus.entropy_rate == pytest.approx(float(pi @ rows), abs=1e-10)


def test_entropy_rate_matches_empirical_estimate():
    corpus = data.synthetic()
    assert corpus.entropy_rate == pytest.approx(_empirical_conditional_entropy(corpus, 2), abs=0.01)


def test_window_floor_is_above_the_rate_and_approaches_it():
    corpus = data.synthetic()
    floors = [corpus.loss_floor(T) for T in (1, 2, 3, 16, 128, 1000)]
    assert floors == sorted(floors, reverse=True)
    assert floors[0] == pytest.approx(corpus.prefix_entropy[0])
    assert floors[0] <= math.log(corpus.vocab_size) + 1e-12
    assert floors[-1] - corpus.entropy_rate < 0.01
    assert all(f > corpus.entropy_rate for f in floors)


def test_synthetic_is_deterministic_per_seed():
    data.synthetic.cache_clear()
    a = data.synthetic(seed=5)
    data.synthetic.cache_clear()
    b = data.synthetic(seed=5)
    c = data.synthetic(seed=6)
    assert torch.equal(a.train_data, b.train_data) and a.entropy_rate == b.entropy_rate
    assert not torch.equal(a.train_data, c.train_data)


def test_batches_are_deterministic_and_shifted_by_one():
    corpus = data.synthetic()
    X1, Y1 = corpus.batch("train", 8, 32, torch.Generator().manual_seed(0))
    X2, Y2 = corpus.batch("train", 8, 32, torch.Generator().manual_seed(0))
    X3, _ = corpus.batch("train", 8, 32, torch.Generator().manual_seed(1))
    assert torch.equal(X1, X2) and torch.equal(Y1, Y2) and not torch.equal(X1, X3)
    assert X1.shape == Y1.shape == (8, 32) and X1.dtype == torch.long
    assert torch.equal(X1[:, 1:], Y1[:, :-1])


def test_train_and_val_do_not_overlap():
    corpus = data.synthetic()
    assert corpus.train_data.shape[1] == corpus.val_data.shape[1]
    train_rows = {tuple(r[:64].tolist()) for r in corpus.train_data}
    assert not any(tuple(r[:64].tolist()) in train_rows for r in corpus.val_data)


def test_stdlib_text_roundtrip_and_split():
    corpus = data.text(max_chars=50_000)
    s = corpus.decode(corpus.train_data[0, :500])
    assert corpus.encode(s) == corpus.train_data[0, :500].tolist()
    assert all(32 <= ord(c) < 127 or c in "\t\n" for c in corpus.itos)  # printable ASCII only
    assert corpus.val_data.numel() == 5_000 and corpus.train_data.numel() == 45_000
    with pytest.raises(ValueError, match="vocabulary"):
        corpus.encode("\u00e9")


def test_text_from_a_local_file(tmp_path):
    p = tmp_path / "t.txt"
    p.write_text("hello world\n" * 200)
    corpus = data.text(str(p))
    assert corpus.vocab_size == len(set("hello world\n"))
    X, Y = corpus.batch("val", 2, 16, torch.Generator().manual_seed(0))
    assert corpus.decode(X[0]) in "hello world\n" * 200
    with pytest.raises(FileNotFoundError):
        data.text(str(tmp_path / "missing.txt"))


@pytest.mark.parametrize("call, name", [
    (lambda: data.synthetic(vocab_size=1), "vocab_size"),
    (lambda: data.synthetic(branching=99), "branching"),
    (lambda: data.synthetic().batch("test", 2, 8), "split"),
    (lambda: data.synthetic().batch("train", 2, 5000), "block_size"),
    (lambda: data.synthetic().batch("train", 2, 0), "block_size"),
    (lambda: data.synthetic().batch("train", 0, 8), "batch_size"),
])
def test_bad_input_raises(call, name):
    with pytest.raises(ValueError, match=name):
        call()
