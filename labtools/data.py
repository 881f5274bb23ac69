"""Offline corpora: a synthetic source with a known entropy rate, and character-level text.

`synthetic()` draws a random sparse k-th-order Markov source over a small vocabulary: each
context of k tokens can be followed by only `branching` tokens, with Dirichlet-distributed
probabilities. Its entropy rate h = sum_ctx pi(ctx) H(P(. | ctx)) is computed exactly from
the stationary distribution pi, so a lesson can draw the loss no model can beat.

`text()` reads any local text file, or by default the Python standard library's own source,
which is on every Python installation: no downloads, ever.

Both return a `Corpus`; `Corpus.batch(split, batch_size, block_size, generator)` samples
windows deterministically from a torch.Generator. Introduced in notebooks/00_training_loop.ipynb.
"""

import functools
import math
import string
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

_SYMBOLS = string.ascii_lowercase + string.ascii_uppercase + string.digits
_PRINTABLE = set(string.printable) - set("\x0b\x0c\r")  # ASCII letters, digits, punctuation, space, \t, \n


@dataclass(eq=False)
class Corpus:
    name: str
    train_data: torch.Tensor        # (rows, L) int64; windows never cross a row boundary
    val_data: torch.Tensor          # (rows, L) int64
    itos: list[str]                 # token id -> string
    entropy_rate: float | None = None  # nats/token, when the source is known exactly
    prefix_entropy: list[float] = field(default_factory=list)  # H(X_t | X_<t) for t < order, nats
    transition: np.ndarray | None = None  # synthetic only: (V**order, V) next-token probabilities per context
    description: str = ""

    @property
    def vocab_size(self) -> int:
        return len(self.itos)

    @functools.cached_property
    def _stoi(self) -> dict[str, int]:
        return {s: i for i, s in enumerate(self.itos)}

    def encode(self, s: str) -> list[int]:
        """Characters -> token ids; raises ValueError naming characters outside the vocabulary."""
        unknown = sorted(set(s) - self._stoi.keys())
        if unknown:
            raise ValueError(f"characters not in this corpus's vocabulary: {unknown!r}")
        return [self._stoi[c] for c in s]

    def decode(self, ids) -> str:
        return "".join(self.itos[int(i)] for i in ids)

    def loss_floor(self, block_size: int) -> float:
        """The lowest mean cross-entropy any model can reach on windows of block_size tokens.

        Position t of a window is predicted from t earlier tokens only, so the first
        `order` positions cost more than the entropy rate: floor = mean_t H(X_t | X_<t).
        """
        if self.entropy_rate is None:
            raise ValueError(f"corpus {self.name!r} has no known entropy rate")
        k = len(self.prefix_entropy)
        head = self.prefix_entropy[:block_size]
        return (sum(head) + max(block_size - k, 0) * self.entropy_rate) / block_size

    def batch(self, split: str, batch_size: int, block_size: int,
              generator: torch.Generator | None = None, device=None) -> tuple[torch.Tensor, torch.Tensor]:
        """Random windows: X (B, T) and the next-token targets Y (B, T)."""
        data = self._split(split)
        rows, L = data.shape
        if not isinstance(block_size, int) or block_size < 1 or block_size + 1 > L:
            raise ValueError(f"block_size must be an int in [1, {L - 1}] for corpus {self.name!r}, got {block_size!r}")
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
        r = torch.randint(rows, (batch_size, 1), generator=generator)
        start = torch.randint(L - block_size, (batch_size, 1), generator=generator)
        chunk = data[r, start + torch.arange(block_size + 1)]  # (B, T+1)
        X, Y = chunk[:, :-1].contiguous(), chunk[:, 1:].contiguous()
        if device is not None and torch.device(device).type != "cpu":
            X, Y = X.pin_memory().to(device, non_blocking=True), Y.pin_memory().to(device, non_blocking=True)
        return X, Y

    def _split(self, split: str) -> torch.Tensor:
        if split == "train":
            return self.train_data
        if split == "val":
            return self.val_data
        raise ValueError(f"split must be 'train' or 'val', got {split!r}")


def _entropy(p: np.ndarray, axis=-1) -> np.ndarray:
    p = np.asarray(p, dtype=np.float64)
    return -np.sum(np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0), axis=axis)


def _strongly_connected(next_ctx: np.ndarray, n_ctx: int) -> bool:
    """Is every context reachable from every other along transitions of positive probability?"""
    src = np.repeat(np.arange(n_ctx), next_ctx.shape[1])
    dst = next_ctx.ravel()
    for a, b in ((src, dst), (dst, src)):  # forward reachability from 0, then backward
        seen = np.zeros(n_ctx, dtype=bool)
        seen[0] = True
        frontier = np.array([0])
        while frontier.size:
            nxt = np.unique(b[np.isin(a, frontier)])
            frontier = nxt[~seen[nxt]]
            seen[frontier] = True
        if not seen.all():
            return False
    return True


@functools.lru_cache(maxsize=8)
def synthetic(vocab_size: int = 16, order: int = 2, branching: int = 4, concentration: float = 1.0,
              n_tokens: int = 2**20, row_len: int = 1024, val_fraction: float = 0.1, seed: int = 0) -> Corpus:
    """A random sparse Markov source of the given order; the Corpus carries its exact entropy rate.

    Read-only: the result is cached per arguments and shared.
    """
    V, k = vocab_size, order
    if not 2 <= V <= 256:
        raise ValueError(f"vocab_size must be in [2, 256], got {V}")
    if not 1 <= k <= 4 or V**k > 2**20:
        raise ValueError(f"order must be in [1, 4] with vocab_size**order <= 2**20, got order={k}")
    if not 1 <= branching <= V:
        raise ValueError(f"branching must be in [1, vocab_size={V}], got {branching}")
    if concentration <= 0:
        raise ValueError(f"concentration must be > 0, got {concentration}")
    if row_len < 2 or n_tokens < 2 * row_len:
        raise ValueError(f"need row_len >= 2 and n_tokens >= 2 * row_len, got {row_len}, {n_tokens}")
    if not 0 < val_fraction < 1:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
    rng = np.random.default_rng(seed)
    n_ctx = V**k
    # A context is the last k tokens as a base-V number; appending token t shifts it: (ctx*V + t) % V^k.
    for _ in range(100):
        support = np.argsort(rng.random((n_ctx, V)), axis=1)[:, :branching]  # (n_ctx, branching)
        probs = rng.dirichlet(np.full(branching, concentration), size=n_ctx)  # (n_ctx, branching)
        next_ctx = (np.arange(n_ctx)[:, None] * V + support) % n_ctx
        if _strongly_connected(next_ctx, n_ctx):
            break
    else:
        raise ValueError("could not draw an irreducible source; raise branching")
    # Stationary distribution by power iteration on the lazy chain (I + P) / 2: same fixed point,
    # and it converges for any irreducible chain, periodic or not.
    pi = np.full(n_ctx, 1.0 / n_ctx)
    for _ in range(200_000):
        step = np.bincount(next_ctx.ravel(), weights=(pi[:, None] * probs).ravel(), minlength=n_ctx)
        new = 0.5 * (pi + step)
        if np.abs(new - pi).sum() < 1e-15:
            pi = new
            break
        pi = new
    else:
        raise RuntimeError("stationary distribution did not converge")
    pi /= pi.sum()
    entropy_rate = float(np.sum(pi * _entropy(probs)))
    # Entropy of the first j tokens of a stationary window (marginals of pi over k-tuples).
    joint = pi.reshape((V,) * k)
    H = [0.0] + [float(_entropy(joint.sum(axis=tuple(range(j, k))).ravel())) for j in range(1, k + 1)]
    prefix_entropy = [H[j + 1] - H[j] for j in range(k)]

    n_rows = max(2, math.ceil(n_tokens / row_len))
    ctx = rng.choice(n_ctx, size=n_rows, p=pi)  # each row starts in the stationary distribution
    out = np.empty((n_rows, row_len), dtype=np.int64)
    for j in range(k):  # the starting context's digits, oldest first
        out[:, j] = (ctx // V ** (k - 1 - j)) % V
    cum = np.cumsum(probs, axis=1)
    for t in range(k, row_len):
        u = rng.random(n_rows)
        choice = np.minimum((u[:, None] > cum[ctx]).sum(axis=1), branching - 1)
        tok = support[ctx, choice]
        out[:, t] = tok
        ctx = (ctx * V + tok) % n_ctx
    n_val = max(1, round(n_rows * val_fraction))
    data = torch.from_numpy(out)
    itos = [_SYMBOLS[i] if i < len(_SYMBOLS) else chr(0x100 + i) for i in range(V)]
    transition = np.zeros((n_ctx, V))
    np.put_along_axis(transition, support, probs, axis=1)
    return Corpus(
        name=f"markov(V={V}, k={k}, b={branching}, seed={seed})",
        train_data=data[n_val:], val_data=data[:n_val], itos=itos,
        entropy_rate=entropy_rate, prefix_entropy=prefix_entropy, transition=transition,
        description=(f"random sparse order-{k} Markov source: {V} tokens, {branching} possible successors "
                     f"per context, entropy rate {entropy_rate:.4f} nats/token"),
    )


def stdlib_documents(max_chars: int = 1_000_000) -> list[tuple[str, str]]:
    """The Python standard library's top-level .py files, sorted by name, as (file name, printable ASCII text): the
    documents of stdlib_text, the last one cut where max_chars ends."""
    root = Path(sysconfig.get_paths()["stdlib"])
    docs, n = [], 0
    for path in sorted(root.glob("*.py")):
        src = path.read_text(encoding="utf-8", errors="replace")
        src = "".join(c for c in src if c in _PRINTABLE)[:max_chars - n]
        if src:
            docs.append((path.name, src))
        n += len(src)
        if n >= max_chars:
            break
    return docs


def stdlib_text(max_chars: int = 1_000_000) -> str:
    """The Python standard library's top-level .py files, sorted by name, as printable ASCII."""
    return "".join(text for _, text in stdlib_documents(max_chars))


@functools.lru_cache(maxsize=4)
def text(path: str | None = None, max_chars: int = 1_000_000, val_fraction: float = 0.1) -> Corpus:
    """Character-level corpus from a local text file, or (path=None) the standard library's source.

    The last val_fraction of the text is the validation split. Read-only: cached per arguments.
    """
    if max_chars < 1000:
        raise ValueError(f"max_chars must be >= 1000, got {max_chars}")
    if not 0 < val_fraction < 1:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
    if path is None:
        s, name = stdlib_text(max_chars), "python-stdlib"
    else:
        p = Path(path)
        if not p.is_file():
            raise FileNotFoundError(f"no such text file: {p}")
        s, name = p.read_text(encoding="utf-8", errors="replace")[:max_chars], p.name
    itos = sorted(set(s))
    stoi = {c: i for i, c in enumerate(itos)}
    ids = torch.tensor([stoi[c] for c in s], dtype=torch.int64)
    n_val = int(len(ids) * val_fraction)
    if n_val < 2 or len(ids) - n_val < 2:
        raise ValueError(f"text {name!r} is too short ({len(ids)} characters)")
    return Corpus(
        name=name, train_data=ids[:-n_val].unsqueeze(0), val_data=ids[-n_val:].unsqueeze(0), itos=itos,
        description=f"{name}: {len(s):,} characters, {len(itos)} distinct",
    )
