"""Training throughput: labtools' GPT vs a straightforward reference GPT, same config, same device.

    $ .venv/bin/python bench/train_throughput.py                      # tiny preset on this machine
    $ python bench/train_throughput.py --preset small --dtype bf16 --compile   # on a GPU

The reference is written the textbook way: separate Q, K, V projections and explicit
attention (q @ k^T / sqrt(d), causal mask, softmax, @ v), with the same parameter count and
weight tying. Both models take full AdamW training steps (forward, backward, clip, step) on
the same random batches; rounds alternate A, B, A, B so drift on a noisy machine hits both.
Prints tokens/s for each (median over rounds) and the ratio ours / reference.
"""

import argparse
import datetime
import json
import math
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn
from torch.nn import functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from labtools.device import device_name, pick_device  # noqa: E402
from labtools.model import GPT, GPTConfig, gpt2_124m, small, tiny  # noqa: E402


class RefBlock(nn.Module):

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        C = cfg.n_embd
        self.n_head = cfg.n_head
        self.ln1, self.ln2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.q, self.k, self.v = nn.Linear(C, C), nn.Linear(C, C), nn.Linear(C, C)
        self.proj = nn.Linear(C, C)
        self.fc1, self.fc2 = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)
        self.register_buffer("mask", torch.tril(torch.ones(cfg.block_size, cfg.block_size, dtype=torch.bool)))

    def attention(self, x):
        B, T, C = x.shape
        hs = C // self.n_head
        q = self.q(x).view(B, T, self.n_head, hs).transpose(1, 2)  # (B, nh, T, hs)
        k = self.k(x).view(B, T, self.n_head, hs).transpose(1, 2)
        v = self.v(x).view(B, T, self.n_head, hs).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)  # (B, nh, T, T)
        att = att.masked_fill(~self.mask[:T, :T], float("-inf"))
        y = F.softmax(att, dim=-1) @ v  # (B, nh, T, hs)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))

    def forward(self, x):
        x = x + self.attention(self.ln1(x))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class RefGPT(nn.Module):

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.tok = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.pos = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.blocks = nn.ModuleList(RefBlock(cfg) for _ in range(cfg.n_layer))
        self.ln = nn.LayerNorm(cfg.n_embd)
        self.head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.head.weight = self.tok.weight

    def forward(self, idx, targets):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln(x))
        return logits, F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def time_steps(model, optimizer, batches, dtype, device) -> float:
    """Seconds for len(batches) full training steps."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    for X, Y in batches:
        with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
            _, loss = model(X, Y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    sync()
    return time.perf_counter() - t0


def main() -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", choices=("tiny", "small", "gpt2_124m"), default="tiny")
    ap.add_argument("--vocab-size", type=int, default=96)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--steps", type=int, default=10, help="training steps per timed round")
    ap.add_argument("--rounds", type=int, default=5, help="alternating rounds per model (median is reported)")
    ap.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32", help="autocast dtype")
    ap.add_argument("--compile", action="store_true", help="torch.compile both models (CUDA only)")
    ap.add_argument("--device", default=None, help="cpu, cuda, mps (default: best available)")
    ap.add_argument("--json", type=Path, default=None, help="also write the result as JSON here")
    args = ap.parse_args()
    for name in ("batch_size", "steps", "rounds", "vocab_size"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")
    device = pick_device(args.device)
    if args.compile and device.type != "cuda":
        ap.error("--compile is for CUDA: on this CPU it costs ~23 s cold and gains nothing at these sizes")
    cfg = {"tiny": tiny, "small": small, "gpt2_124m": gpt2_124m}[args.preset](vocab_size=args.vocab_size)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

    torch.manual_seed(0)
    models = {"labtools GPT": GPT(cfg).to(device), "reference GPT": RefGPT(cfg).to(device)}
    n_params = {k: sum(p.numel() for p in m.parameters()) for k, m in models.items()}
    assert n_params["labtools GPT"] == n_params["reference GPT"], n_params
    optimizers = {k: torch.optim.AdamW(m.parameters(), lr=1e-4) for k, m in models.items()}
    if args.compile:
        models = {k: torch.compile(m) for k, m in models.items()}
    g = torch.Generator().manual_seed(0)
    batches = [tuple(torch.randint(cfg.vocab_size, (args.batch_size, cfg.block_size), generator=g).to(device)
                     for _ in range(2)) for _ in range(args.steps)]
    tokens = args.batch_size * cfg.block_size * args.steps
    for name in models:  # warm-up: allocator, kernels, compilation
        time_steps(models[name], optimizers[name], batches[:2], dtype, device)
    rates = {name: [] for name in models}
    for _ in range(args.rounds):
        for name in models:
            rates[name].append(tokens / time_steps(models[name], optimizers[name], batches, dtype, device))

    result = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": str(device), "device_name": device_name(device), "torch": torch.__version__,
        "python": platform.python_version(),
        "threads": torch.get_num_threads(), "preset": args.preset, "params": n_params["labtools GPT"],
        "batch_size": args.batch_size, "block_size": cfg.block_size, "dtype": args.dtype, "compile": args.compile,
        "steps_per_round": args.steps, "rounds": args.rounds,
        "tokens_per_s": {k: statistics.median(v) for k, v in rates.items()},
        "tokens_per_s_all": rates,
    }
    ours, ref = result["tokens_per_s"]["labtools GPT"], result["tokens_per_s"]["reference GPT"]
    result["ratio"] = ours / ref
    print(f"{args.preset} ({n_params['labtools GPT']:,} params), batch {args.batch_size}x{cfg.block_size}, "
          f"{args.dtype}{' + compile' if args.compile else ''} on {device} ({result['device_name']}, "
          f"{result['threads']} threads)")
    for name, v in rates.items():
        print(f"  {name:14s} {statistics.median(v):>12,.0f} tokens/s  (rounds: {', '.join(f'{x:,.0f}' for x in v)})")
    print(f"  ratio ours / reference: {result['ratio']:.3f}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
