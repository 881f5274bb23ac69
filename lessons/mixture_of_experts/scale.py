"""Lesson 15, section 5: mixtures of experts at scale — Mixtral 8x7B's and DeepSeek-V3's parameters, total and
active, counted from their published shapes; the memory each GPU holds with and without expert parallelism."""

from dataclasses import dataclass

import plotly.graph_objects as go

from labtools import plots
from labtools.claims import Findings, Ledger, approx, at_least

GB = 1e9


@dataclass(frozen=True)
class MoEShape:
    """A decoder-only MoE by its published shape. Attention parameters per layer are given (they differ between
    grouped-query attention and DeepSeek's multi-head latent attention); every expert is a SwiGLU MLP (3 matrices)."""
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
_MLA = (7168 * 1536 + 1536 + 1536 * 128 * (128 + 64) + 7168 * (512 + 64) + 512 + 512 * 128 * (128 + 128)
        + 128 * 128 * 7168)
DEEPSEEK_V3 = MoEShape("DeepSeek-V3", n_layer=61, n_embd=7168, vocab=129280, attention=_MLA, expert_hidden=2048,
                       routed=256, top_k=8, shared=1, dense_layers=3, dense_hidden=18432,
                       published_total=671e9, published_active=37e9, source="DeepSeek-AI 2024")
MODELS = (MIXTRAL, DEEPSEEK_V3)


def model_states(shape: MoEShape, pp: int, ep: int, dp: int, zero_stage: int = 1) -> float:
    """Bytes of model states per GPU (bf16 mixed-precision AdamW, 16 bytes per parameter, lesson 06): everything
    split over pp stages; the routed experts also over ep ranks; ZeRO-1 shards the 12 bytes of master weights and
    moments over the ranks holding the same weights (dp of them for the rest, dp / ep for an expert)."""
    if dp % ep:
        raise ValueError(f"the expert-parallel size ep ({ep}) must divide the data-parallel size dp ({dp})")
    p = shape.params()
    rest, routed = (p["total"] - p["routed"]) / pp, p["routed"] / (pp * ep)
    shard = (lambda n: 12 / n) if zero_stage >= 1 else (lambda n: 12)
    return rest * (4 + shard(dp)) + routed * (4 + shard(dp // ep))


def table(rows: list[dict]) -> go.Figure:
    body = [(r["name"], f"{r['total'] / 1e9:.1f} B", f"{r['published_total'] / 1e9:g} B",
             f"{r['active'] / 1e9:.1f} B", f"{r['published_active'] / 1e9:g} B",
             f"{r['active'] / r['total']:.1%}") for r in rows]
    return plots.table(("model", "total (computed)", "published", "active (computed)", "published",
                        "active ÷ total"), body, title="Parameters counted from the published shapes", row_height=30)


def rows() -> list[dict]:
    return [{"name": m.name, **m.params(), "published_total": m.published_total,
             "published_active": m.published_active, "source": m.source} for m in MODELS]


def memory_figure() -> go.Figure:
    """DeepSeek-V3's model states per GPU on 2,048 GPUs with 16 pipeline stages (dp = 128), as the expert-parallel
    size grows; DeepSeek-AI trained with ep = 64."""
    eps = [1, 2, 4, 8, 16, 32, 64, 128]
    gb = [model_states(DEEPSEEK_V3, 16, ep, 128) / GB for ep in eps]
    fig = go.Figure(go.Bar(x=[str(e) for e in eps], y=gb, marker_color=[plots.color(0) if g <= 80 else "#cf222e"
                                                                         for g in gb],
                           text=[f"{g:.0f}" for g in gb], textposition="outside"))
    plots.marked_line(fig, y=80, text="80 GB")
    plots.style(fig, "DeepSeek-V3 on 2,048 GPUs, 16 pipeline stages: model states per GPU", "expert-parallel size ep",
                "GB (computed)")
    return fig


def findings(ledger: Ledger, r: list[dict]) -> Findings:
    for row, key in zip(r, ("mixtral", "deepseek_v3")):
        ledger.add(f"{key}_total", f"{row['name']}'s {row['published_total'] / 1e9:g}B parameters, counted from its "
                   "published shape (computed ÷ published)", row["total"] / row["published_total"],
                   approx(1.0, rel=0.02), source=row["source"], kind="computed")
        ledger.add(f"{key}_active", f"… and its {row['published_active'] / 1e9:g}B active per token (computed ÷ "
                   "published)", row["active"] / row["published_active"], approx(1.0, rel=0.02),
                   source=row["source"], kind="computed")
    no_ep, ep64 = model_states(DEEPSEEK_V3, 16, 1, 128), model_states(DEEPSEEK_V3, 16, 64, 128)
    ledger.add("deepseek_needs_ep", "DeepSeek-V3's model states per GPU on 2,048 GPUs with 16 stages: without expert "
               "parallelism ÷ with ep = 64 (computed)", no_ep / ep64, at_least(10), kind="computed")
    mx, ds = r
    return Findings([
        f"Memory for all, FLOPs for a few: DeepSeek-V3 uses **{ds['active'] / ds['total']:.1%}** of its parameters "
        f"per token, yet without expert parallelism each GPU of its run would hold **{no_ep / GB:.0f} GB** of model "
        "states, more than any GPU has.",
        f"Spreading its experts over 64 ranks, as DeepSeek-AI did, brings that to **{ep64 / GB:.0f} GB**.",
    ], [
        "| model | parameters, counted | published | active per token, counted | published |\n|---|---|---|---|---|\n"
        + "\n".join(f"| {row['name']} | {row['total'] / 1e9:.1f}B | {row['published_total'] / 1e9:g}B | "
                     f"{row['active'] / 1e9:.1f}B | {row['published_active'] / 1e9:g}B |" for row in r),
        "Model states in bf16 mixed precision with AdamW and ZeRO-1, on DeepSeek-V3's 2,048 GPUs in 16 pipeline "
        "stages.",
    ])
