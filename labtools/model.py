"""A small GPT: token + position embeddings, pre-LN transformer blocks, an LM head tied to the embedding.

The architecture follows GPT-2 (Radford et al. 2019, "Language Models are Unsupervised
Multitask Learners"): LayerNorm before each sub-block, causal self-attention, a GELU MLP
of width 4C, a final LayerNorm, and an output projection tied to the token embedding.
Attention uses F.scaled_dot_product_attention, which picks a fused kernel where one exists.

This file knows nothing about distribution; labtools/parallel wraps a model from the outside.
Introduced in notebooks/00_training_loop.ipynb.
"""

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.nn import functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.checkpoint import checkpoint

# What activation checkpointing keeps (torch.utils.checkpoint, use_reentrant=False); everything else inside a
# checkpointed region is recomputed during backward. Introduced in notebooks/05_activation_checkpointing.ipynb.
#   none      keep everything
#   block     keep each block's input
#   every_k   keep the input of every segment of `checkpoint_every` blocks (e.g. √L segments)
#   attn      recompute the attention sub-block (LayerNorm, QKV, attention, projection) only
#   mlp       recompute the MLP sub-block (LayerNorm, up-projection, GELU, down-projection) only
CHECKPOINT_POLICIES = ("none", "block", "every_k", "attn", "mlp")


@dataclass
class GPTConfig:
    vocab_size: int = 64      # number of distinct tokens
    block_size: int = 128     # longest context the model sees (positions)
    n_layer: int = 4          # transformer blocks
    n_head: int = 4           # attention heads per block; n_embd must divide by it
    n_embd: int = 128         # residual stream width C
    dropout: float = 0.0      # dropout on attention weights, residual adds and embeddings
    bias: bool = True         # biases in Linear and LayerNorm (GPT-2 has them)
    checkpoint: str = "none"  # activation checkpointing policy, one of CHECKPOINT_POLICIES
    checkpoint_every: int = 1 # blocks per checkpointed segment when checkpoint == "every_k"
    tie_embeddings: bool = True  # LM head shares the token embedding (GPT-2); False for a pipeline's last stage
    mup_base_width: int | None = None  # µP (lesson 19): the width at which it equals the standard init; None: standard

    def __post_init__(self):
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"GPTConfig.{name} must be a positive int, got {value!r}")
        if self.n_embd % self.n_head:
            raise ValueError(f"GPTConfig.n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"GPTConfig.dropout must be in [0, 1), got {self.dropout!r}")
        if self.checkpoint not in CHECKPOINT_POLICIES:
            raise ValueError(f"GPTConfig.checkpoint must be one of {CHECKPOINT_POLICIES}, got {self.checkpoint!r}")
        if not isinstance(self.checkpoint_every, int) or self.checkpoint_every < 1:
            raise ValueError(f"GPTConfig.checkpoint_every must be an int >= 1, got {self.checkpoint_every!r}")
        if self.mup_base_width is not None:
            if not isinstance(self.mup_base_width, int) or self.mup_base_width < 1:
                raise ValueError(f"GPTConfig.mup_base_width must be a positive int or None, got {self.mup_base_width!r}")
            if self.tie_embeddings:
                raise ValueError("GPTConfig.mup_base_width needs tie_embeddings=False: under µP the head is scaled "
                                 "and initialised unlike the token embedding")

    @property
    def width_mult(self) -> float:
        """n_embd / mup_base_width under µP (1.0 otherwise): what the hidden learning rates and the logits divide by."""
        return 1.0 if self.mup_base_width is None else self.n_embd / self.mup_base_width


def tiny(vocab_size: int = 64) -> GPTConfig:
    """4 layers, width 128, context 128: ~0.8M parameters, trains on 2 CPU cores in seconds."""
    return GPTConfig(vocab_size=vocab_size, block_size=128, n_layer=4, n_head=4, n_embd=128)


def small(vocab_size: int = 64) -> GPTConfig:
    """6 layers, width 384, context 256: ~10.7M parameters (nanoGPT's shakespeare-char size)."""
    return GPTConfig(vocab_size=vocab_size, block_size=256, n_layer=6, n_head=6, n_embd=384)


def gpt2_124m(vocab_size: int = 50257) -> GPTConfig:
    """GPT-2 small: 12 layers, width 768, 12 heads, context 1024: 124M parameters."""
    return GPTConfig(vocab_size=vocab_size, block_size=1024, n_layer=12, n_head=12, n_embd=768)


class CausalSelfAttention(nn.Module):
    """Causal self-attention with q, k, v from one matmul, laid out head by head: c_attn's output is
    [q₀ k₀ v₀ | q₁ k₁ v₁ | …], each block 3·hs wide. So any contiguous run of whole heads' columns — what
    column-wise tensor parallelism gives a rank — holds those heads' q, k and v, and the head count is read
    from the width actually computed (n_head here, n_head / t on a rank of t)."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.head_size = config.n_embd // config.n_head
        self.dropout = config.dropout
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)  # q, k, v in one matmul
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.attend = None  # a function (q, k, v) -> causal attention, used in place of SDPA (lesson 22's kernel)

    def forward(self, x, mask=None):
        """mask (B, 1, T, T), True where a query may attend a key (labtools.model.document_mask); None: causal."""
        B, T, _ = x.size()
        qkv = self.c_attn(x)                              # (B, T, nh·3·hs): the heads this module computes
        nh = qkv.size(-1) // (3 * self.head_size)
        qkv = qkv.view(B, T, nh, 3, self.head_size)       # (B, T, nh, 3, hs)
        q, k, v = qkv.permute(3, 0, 2, 1, 4).unbind(0)    # each (B, nh, T, hs)
        dropout_p = self.dropout if self.training else 0.0
        causal = dict(is_causal=True) if mask is None else dict(attn_mask=mask)
        if self.attend is not None:
            if mask is not None or dropout_p:
                raise ValueError("attend computes plain causal attention: it takes no document mask and no dropout")
            y = self.attend(q, k, v)
        elif q.device.type == "cpu" and q.dtype != torch.float32:
            # On CPU the fused kernel's backward is slow in bf16/fp16 (measured, torch 2.13, B32 T128:
            # bf16 fwd+bwd 26.5 ms fused vs 11.0 ms math); the math kernel computes the same thing.
            with sdpa_kernel(SDPBackend.MATH):
                y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, **causal)
        else:
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, **causal)  # (B, nh, T, hs)
        y = y.transpose(1, 2).reshape(B, T, nh * self.head_size)  # heads side by side: (B, T, nh·hs)
        return self.resid_dropout(self.c_proj(y))


def document_mask(doc: torch.Tensor) -> torch.Tensor:
    """(B, 1, T, T) True where query t may attend key u: u ≤ t and both in the same document (doc (B, T) ids)."""
    T = doc.size(1)
    causal = torch.ones(T, T, dtype=torch.bool, device=doc.device).tril()
    return (causal & (doc[:, :, None] == doc[:, None, :]))[:, None]  # (B, 1, T, T)


def document_positions(doc: torch.Tensor) -> torch.Tensor:
    """(B, T) each token's position within its document (doc (B, T) ids, each document one run of tokens)."""
    t = torch.arange(doc.size(1), device=doc.device).expand_as(doc)
    starts = torch.ones_like(doc, dtype=torch.bool)
    starts[:, 1:] = doc[:, 1:] != doc[:, :-1]
    return t - torch.where(starts, t, 0).cummax(dim=1).values


class MLP(nn.Module):

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    """Pre-LN block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)
        self.policy = config.checkpoint

    def _attn(self, x, mask=None):
        # called with one input when there is no mask: tensor parallelism's plans expect the block's input alone
        return self.attn(self.ln_1(x)) if mask is None else self.attn(self.ln_1(x), mask)

    def _mlp(self, x):
        return self.mlp(self.ln_2(x))

    def forward(self, x, mask=None):
        recompute = torch.is_grad_enabled()
        if recompute and self.policy == "attn":
            x = x + checkpoint(self._attn, x, mask, use_reentrant=False)
        else:
            x = x + self._attn(x, mask)
        if recompute and self.policy == "mlp":
            x = x + checkpoint(self._mlp, x, use_reentrant=False)
        else:
            x = x + self._mlp(x)
        return x


class GPT(nn.Module):

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            wpe=nn.Embedding(config.block_size, config.n_embd),
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
            ln_f=nn.LayerNorm(config.n_embd, bias=config.bias),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.transformer.wte.weight = self.lm_head.weight  # weight tying (Press & Wolf 2017)
        self.apply(self._init_weights)
        # GPT-2: scale the init of projections that write into the residual stream by 1/sqrt(2L),
        # so the stream's variance does not grow with depth.
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))
        if config.mup_base_width is not None:
            # µP (Yang et al. 2022, "Tensor Programs V"): a hidden matrix's init variance falls as 1/fan_in, equal to
            # the standard one at the base width; the head starts at zero and its logits are divided by width_mult
            # (forward), so the head's updates move the logits as much at every width. Embeddings keep theirs.
            for name, p in self.transformer.h.named_parameters():
                if p.dim() == 2:
                    p.data.mul_(1 / math.sqrt(config.width_mult))
            nn.init.zeros_(self.lm_head.weight)

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def num_params(self, exclude_embeddings: bool = False) -> int:
        """Parameter count; a tied head is counted once (an untied one is counted). Optionally without the
        token and position embeddings."""
        n = sum(p.numel() for p in self.parameters())
        if exclude_embeddings:
            n -= self.transformer.wte.weight.numel() + self.transformer.wpe.weight.numel()
        return n

    def forward(self, idx, targets=None, doc=None):
        """idx (B, T) token ids; targets (B, T), -100 where no prediction counts (padding); doc (B, T) the document
        each token belongs to: each document then sees only itself, its positions counted from its own start, as if
        it were alone (None: every token attends all before it)."""
        B, T = idx.size()
        if T > self.config.block_size:
            raise ValueError(f"sequence length {T} exceeds block_size {self.config.block_size}")
        pos = torch.arange(T, dtype=torch.long, device=idx.device)  # (T,)
        mask = None
        if doc is not None:  # each document on its own: positions count from its start, attention stays inside
            pos, mask = document_positions(doc), document_mask(doc)  # (B, T), (B, 1, T, T)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))  # (B, T, C)
        policy, L = self.config.checkpoint, self.config.n_layer
        if policy in ("block", "every_k") and torch.is_grad_enabled():
            k = 1 if policy == "block" else self.config.checkpoint_every
            for start in range(0, L, k):  # keep only each segment's input; recompute the rest in backward
                x = checkpoint(self._segment, x, start, min(start + k, L), mask, use_reentrant=False)
        else:
            for block in self.transformer.h:
                x = block(x) if mask is None else block(x, mask)
        x = self.transformer.ln_f(x)
        logits = self.lm_head(x)  # (B, T, vocab_size)
        if self.config.mup_base_width is not None:
            logits = logits / self.config.width_mult
        loss = None
        if targets is not None:  # targets of -100 (cross_entropy's ignore_index) are left out of the mean
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))
        return logits, loss

    def _segment(self, x, start: int, end: int, mask=None):
        for block in self.transformer.h[start:end]:
            x = block(x) if mask is None else block(x, mask)
        return x

    @torch.no_grad()
    def generate(self, idx, max_new_tokens: int, temperature: float = 1.0, top_k: int | None = None,
                 generator: torch.Generator | None = None):
        """Sample max_new_tokens continuations of idx (B, T), feeding back the last block_size tokens."""
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        was_training = self.training
        self.eval()
        for _ in range(max_new_tokens):
            idx_cond = idx[:, -self.config.block_size:]
            logits, _ = self(idx_cond)
            logits = logits[:, -1, :].float() / temperature  # (B, vocab_size)
            if top_k is not None:
                v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
                logits[logits < v[:, [-1]]] = -float("inf")
            probs = F.softmax(logits, dim=-1)
            idx_next = torch.multinomial(probs, num_samples=1, generator=generator)  # (B, 1)
            idx = torch.cat((idx, idx_next), dim=1)
        self.train(was_training)
        return idx
