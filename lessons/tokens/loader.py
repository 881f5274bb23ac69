"""Lesson 17, section 5: does the data loader keep up? Tokens per second three loaders deliver as batches (a Python
BPE encoder on the fly, with GPT-2's cache of pieces; tiktoken's encoder on the fly; token ids tokenized once and
read from a memory-mapped file), measured here in alternating rounds, against what the model consumes: this
machine's training step, measured, and a GPU's, computed from its peak."""

import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import plotly.graph_objects as go
import torch

from labtools import plots, tokenizer
from labtools.claims import Findings, Ledger, at_least
from labtools.config import gpt_config
from labtools.model import GPT
from labtools.plan import CLUSTERS, GPU
from labtools.shapes import MODELS
from labtools.tokenizer import BYTES
from lessons.tokens import Settings, texts

ROUNDS = 3          # alternating rounds of the three loaders; each reports its median
GPU_MFU = 0.4       # a good training run's share of the GPU's peak (lesson 12 measured MFU; Llama 3 reached 38-43%)
GPUS_PER_NODE = 8


class Loader:
    """Batches of (batch_size, block_size + 1) token ids, made one way."""
    PYTHON = "Python BPE, on the fly"
    TIKTOKEN = "tiktoken, on the fly"
    MEMMAP = "tokenized once, memory-mapped"
    ALL = (PYTHON, TIKTOKEN, MEMMAP)


@dataclass(frozen=True)
class Rates:
    """Tokens per second: each loader's (the median of its rounds), this machine's training step, and a GPU's
    (computed for GPT-2 124M at GPU_MFU of an H100's bf16 peak)."""
    loaders: dict[str, float]
    model: float
    gpu: float
    bytes_per_token: float

    @property
    def node(self) -> float:
        return GPUS_PER_NODE * self.gpu


def _windows(text: str, n_chars: int, g: np.random.Generator):
    while True:
        start = int(g.integers(0, len(text) - n_chars))
        yield text[start:start + n_chars]


def _rate(make_batch, tokens: int) -> float:
    """Tokens per second of make_batch() (which returns a (B, T + 1) tensor) until `tokens` are made."""
    made, t0 = 0, time.perf_counter()
    while made < tokens:
        made += make_batch().numel()
    return made / (time.perf_counter() - t0)


def model_rate(S: Settings, vocab: int, steps: int = 5) -> float:
    """Tokens per second one training step of the lesson's model consumes here (after a warm-up step)."""
    torch.manual_seed(S.seed)
    model = GPT(gpt_config(S, vocab))
    opt = torch.optim.AdamW(model.parameters(), lr=S.lr)
    X = torch.randint(vocab, (S.batch_size, S.block_size))
    times = []
    for i in range(steps + 1):
        t0 = time.perf_counter()
        model(X, X)[1].backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if i:
            times.append(time.perf_counter() - t0)
    return S.batch_size * S.block_size / statistics.median(times)


def gpu_rate() -> float:
    """Tokens per second an H100 trains GPT-2 124M at at GPU_MFU of its bf16 peak (computed: lesson 12)."""
    return GPU_MFU * CLUSTERS[GPU.H100].peak_flops / MODELS["GPT-2 124M"].flops_per_token()


def run(S: Settings, merges: list) -> Rates:
    train_text, _ = texts(S.text_chars)
    table = tokenizer.ranks(merges[:S.vocab_size - BYTES])
    enc = tokenizer.encoding(merges[:S.vocab_size - BYTES])
    ids = np.array(enc.encode(train_text, disallowed_special=()), dtype=np.uint16)
    bpt = len(train_text) / len(ids)
    B, T = S.batch_size, S.block_size
    n_chars = int((T + 1) * bpt * 1.3) + 16  # enough characters for a row of T + 1 tokens, usually
    g = np.random.default_rng(S.seed)
    windows = _windows(train_text, n_chars, g)
    with tempfile.TemporaryDirectory(prefix="lab-17-") as tmp:
        path = Path(tmp) / "tokens.bin"
        ids.tofile(path)
        mapped = np.memmap(path, dtype=np.uint16, mode="r")
        cache: dict = {}

        def rows(encode) -> torch.Tensor:
            out = []
            while len(out) < B:
                row = encode(next(windows))[:T + 1]
                if len(row) == T + 1:
                    out.append(row)
            return torch.tensor(out, dtype=torch.long)

        def from_file() -> torch.Tensor:
            starts = g.integers(0, len(mapped) - T - 1, size=B)
            return torch.from_numpy(np.stack([mapped[s:s + T + 1] for s in starts]).astype(np.int64))

        makers = {Loader.PYTHON: lambda: rows(lambda s: tokenizer.encode_python(s, table, cache=cache)),
                  Loader.TIKTOKEN: lambda: rows(lambda s: enc.encode(s, disallowed_special=())),
                  Loader.MEMMAP: from_file}
        rounds = {name: [] for name in makers}
        for _ in range(ROUNDS):  # alternating, so that a busy moment of the machine hits all three alike
            for name, make in makers.items():
                rounds[name].append(_rate(make, S.loader_tokens // ROUNDS))
        del mapped
    return Rates({k: statistics.median(v) for k, v in rounds.items()}, model_rate(S, enc.n_vocab), gpu_rate(), bpt)


def figure(r: Rates) -> go.Figure:
    names = list(r.loaders) + ["the model here", "one H100, GPT-2 124M", "a node of 8 H100s"]
    values = list(r.loaders.values()) + [r.model, r.gpu, r.node]
    colors = [plots.color(0)] * len(r.loaders) + [plots.color(3)] * 3
    fig = go.Figure(go.Bar(x=values, y=names, orientation="h", marker_color=colors,
                           hovertemplate="%{y}: %{x:,.0f} tokens/s<extra></extra>"))
    fig.update_xaxes(type="log", title_text="tokens per second")
    fig.update_yaxes(autorange="reversed")
    return plots.style(fig, "What the loaders deliver (blue) against what training consumes (orange)", height=360,
                       legend="right")


def findings(ledger: Ledger, S: Settings, r: Rates) -> Findings:
    mem, py = r.loaders[Loader.MEMMAP], r.loaders[Loader.PYTHON]
    ledger.add("memmap_keeps_up", "Tokens read from a memory-mapped file arrive far faster than this machine's "
               "training step consumes them (loader ÷ model tokens per second, measured in the same run)", mem / r.model,
               at_least(20.0), kind="measured")
    ledger.add("python_vs_node", "A Python tokenizer on the fly delivers fewer tokens per second than a node of 8 H100s "
               f"would train GPT-2 124M on at {GPU_MFU:.0%} MFU (node ÷ Python loader; the node computed)", r.node / py,
               at_least(1.0), kind="measured")
    return Findings([
        f"Here, any of them: even tokenizing in Python on the fly delivers **{py / r.model:.0f}×** what this machine's "
        "training step consumes.",
        f"On GPUs the order flips: a node of eight H100s trains GPT-2's smallest model faster than Python tokenizes, "
        f"by **{r.node / py:.1f}×**. Tokenize once, store the ids, and read them back as a memory map.",
    ], ["| source | tokens per second |\n|---|---|\n" + "\n".join(
        f"| {name} | {v:,.0f} |" for name, v in [*r.loaders.items(), ("this machine's training step", r.model),
                                                  ("one H100, GPT-2 124M (computed)", r.gpu),
                                                  (f"a node of {GPUS_PER_NODE} H100s (computed)", r.node)]),
        f"The GPU's figure is computed: {GPU_MFU:.0%} of the H100's peak rate of 16-bit matrix products (the share "
        "a good run reaches, MFU in lesson 12) over GPT-2 124M's training FLOPs per token.",
        "The Python encoder keeps each piece it has tokenized, as GPT-2's did; the code's many repeated pieces make "
        "that cache unusually effective."])
