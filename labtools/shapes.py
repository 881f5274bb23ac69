"""Model shapes that count themselves, and the named models the course plans with: one home for both.

    ModelShape(...).params()            parameters of a dense transformer of that shape (or the published count)
    ModelShape(...).flops_per_token()   training FLOPs per token: 6P (8P recomputed) + 12·L·s·h (lesson 12)
    MoEShape(...).params()              total, active per token, and the routed experts' share (lesson 15)
    MODELS                              dense shapes by name: GPT-2 124M, 7B, 13B, 70B, GPT-3 175B, Llama 3 405B
    MIXTRAL, DEEPSEEK_V3                mixtures of experts, with the parameters their papers publish

Nothing here is measured: every value is a count from a shape, or a figure as its source publishes it. Published
*runs* (their GPUs, layouts, throughput) are in labtools.runs.
"""

from dataclasses import dataclass

from labtools.budget import architecture
from labtools.validate import check_range


@dataclass(frozen=True)
class ModelShape:
    """A transformer by its dimensions; n_params None means "count it as labtools.model.GPT would"."""
    n_layer: int
    n_embd: int
    n_head: int
    vocab: int
    seq: int                   # training context length
    n_params: int | None = None
    n_kv_head: int | None = None  # grouped-query attention: heads of keys and values (None: n_head)

    def __post_init__(self):
        for name in ("n_layer", "n_embd", "n_head", "vocab", "seq"):
            check_range(name, getattr(self, name), 1, None, int)
        if self.n_embd % self.n_head:
            raise ValueError(f"n_head ({self.n_head}) must divide n_embd ({self.n_embd})")
        if self.n_kv_head is not None:
            check_range("n_kv_head", self.n_kv_head, 1, self.n_head, int)
            if self.n_head % self.n_kv_head:
                raise ValueError(f"n_kv_head ({self.n_kv_head}) must divide n_head ({self.n_head}): each key/value "
                                 "head serves a whole group of query heads")

    @property
    def kv_width(self) -> int:
        """Width of the keys (and of the values) of one token: n_embd · n_kv_head / n_head."""
        return self.n_embd * (self.n_kv_head or self.n_head) // self.n_head

    def params(self) -> int:
        """The published count where given, else the lab's GPT of this shape counted (labtools.budget)."""
        if self.n_params:
            return self.n_params
        return architecture(self.n_layer, self.n_embd, self.n_head, self.vocab, self.seq, 1).n_params

    def flops_per_token(self, recompute: bool = False) -> float:
        """Training FLOPs per token: 6P for the matrix products of forward (2P) and backward (4P) (Kaplan et al.
        2020), plus attention's own products 12·L·s·h, the causal mask's skipped half included (PaLM, Chowdhery et
        al. 2022, appendix B); with full recomputation one more forward: 8P + 16Lsh. Lesson 12 checks it against
        torch's FLOP counter."""
        attention = 12 * self.n_layer * self.seq * self.n_embd
        return (8 * self.params() + 16 / 12 * attention) if recompute else (6 * self.params() + attention)


@dataclass(frozen=True)
class MoEShape:
    """A decoder-only mixture of experts by its published shape. Attention parameters per layer are given (they
    differ between grouped-query attention and DeepSeek's multi-head latent attention); every expert is a SwiGLU MLP
    (3 matrices)."""
    name: str
    n_layer: int
    n_embd: int
    vocab: int
    attention: int          # parameters of one layer's attention
    expert_hidden: int      # width of one expert's MLP
    routed: int             # routed experts per MoE layer
    top_k: int              # routed experts per token
    shared: int = 0         # experts every token uses
    dense_layers: int = 0   # first layers with a dense MLP instead of experts
    dense_hidden: int = 0
    tied: bool = False
    published_total: float = 0.0
    published_active: float = 0.0
    source: str = ""

    def expert(self) -> int:
        return 3 * self.n_embd * self.expert_hidden

    def params(self) -> dict[str, float]:
        """Total, active per token, and the routed experts' share of the total (what expert parallelism splits)."""
        d, L = self.n_embd, self.n_layer
        moe_layers = L - self.dense_layers
        norms = 2 * d
        router = self.routed * d
        embeddings = self.vocab * d * (1 if self.tied else 2) + d
        dense = self.dense_layers * (self.attention + 3 * d * self.dense_hidden + norms)
        routed = moe_layers * self.routed * self.expert()
        rest = moe_layers * (self.attention + self.shared * self.expert() + router + norms)
        total = embeddings + dense + routed + rest
        active = embeddings + dense + rest + moe_layers * self.top_k * self.expert()
        return {"total": total, "active": active, "routed": routed}


# Published sizes with depth, width, heads, vocabulary and training context. Activations are computed for a
# GPT-2-style block of the same depth and width (labtools.budget.architecture).
MODELS = {
    "GPT-2 124M": ModelShape(n_layer=12, n_embd=768, n_head=12, vocab=50257, seq=1024),
    "7B": ModelShape(n_layer=32, n_embd=4096, n_head=32, vocab=32000, seq=4096, n_params=7_000_000_000),
    "13B": ModelShape(n_layer=40, n_embd=5120, n_head=40, vocab=32000, seq=4096, n_params=13_000_000_000),
    "70B": ModelShape(n_layer=80, n_embd=8192, n_head=64, vocab=32000, seq=4096, n_params=70_000_000_000),
    "GPT-3 175B": ModelShape(n_layer=96, n_embd=12288, n_head=96, vocab=50257, seq=2048, n_params=175_000_000_000),
    # Llama 3 405B (Dubey et al. 2024, table 3): 126 layers, width 16384, 128 heads of which 8 for keys and values
    "405B": ModelShape(n_layer=126, n_embd=16384, n_head=128, vocab=128256, seq=8192, n_params=405_000_000_000,
                       n_kv_head=8),
}
LLAMA3_FFN = 53248  # Llama 3 405B's feed-forward width (Dubey et al. 2024, table 3)
# Megatron-Turing NLG 530B (Smith et al. 2022): 105 layers of width 20480, 128 heads, context 2048
MTNLG = ModelShape(n_layer=105, n_embd=20480, n_head=128, vocab=50272, seq=2048, n_params=530_000_000_000)

# Mixtral 8x7B (Jiang et al. 2024): 32 layers, width 4096, 32 query heads and 8 key/value heads of 128, experts of
# width 14336, 8 experts, top-2, vocabulary 32000, untied head. Published: 47B parameters, 13B active (the paper;
# Mistral AI's announcement gives 46.7B and 12.9B).
MIXTRAL = MoEShape("Mixtral 8x7B", n_layer=32, n_embd=4096, vocab=32000,
                   attention=2 * 4096 * 4096 + 2 * 4096 * 1024, expert_hidden=14336, routed=8, top_k=2,
                   published_total=47e9, published_active=13e9,
                   source="Jiang et al. 2024, who round to 47B and 13B; Mistral AI's announcement: 46.7B and 12.9B")
# DeepSeek-V3 (DeepSeek-AI 2024): 61 layers of width 7168, the first 3 dense (MLP width 18432), then 1 shared and 256
# routed experts of width 2048, top-8; multi-head latent attention with 128 heads (queries through a rank-1536
# projection, keys and values through a rank-512 one, head dims 128 + 64 rotary, values 128); vocabulary 129280.
# Published: 671B parameters, 37B active (the multi-token-prediction module not included).
DEEPSEEK_V3_HEADS, DEEPSEEK_V3_QK_DIM, DEEPSEEK_V3_V_DIM = 128, 192, 128
_MLA = (7168 * 1536 + 1536 + 1536 * 128 * (128 + 64) + 7168 * (512 + 64) + 512 + 512 * 128 * (128 + 128)
        + 128 * 128 * 7168)
DEEPSEEK_V3 = MoEShape("DeepSeek-V3", n_layer=61, n_embd=7168, vocab=129280, attention=_MLA, expert_hidden=2048,
                       routed=256, top_k=8, shared=1, dense_layers=3, dense_hidden=18432,
                       published_total=671e9, published_active=37e9, source="DeepSeek-AI 2024")
MOE_MODELS = (MIXTRAL, DEEPSEEK_V3)
