"""Lesson 03, section 3: effective batch sizes and warm-up in published recipes, beside the lab's."""

import plotly.graph_objects as go

from labtools import plots
from labtools.claims import Findings, Ledger
from labtools.controls import slider
from labtools.widgets import Panel
from lessons.stability import Settings

# Published pre-training recipes; None where the paper does not state the value.
RECIPES = {
    "GPT-3 175B": dict(source="Brown et al. 2020, Table 2.1 and Appendix B", optimizer="Adam", beta2=0.95, eps=1e-8,
                       peak_lr=0.6e-4, schedule="cosine to 10% over 260B tokens", warmup="375M tokens",
                       weight_decay=0.1, clip=1.0, batch_tokens=3.2e6, context=2048, tokens=300e9),
    "LLaMA 2 70B": dict(source="Touvron et al. 2023, §2.2 and Table 1", optimizer="AdamW", beta2=0.95, eps=1e-5,
                        peak_lr=1.5e-4, schedule="cosine to 10%", warmup="2000 steps", weight_decay=0.1, clip=1.0,
                        batch_tokens=4e6, context=4096, tokens=2e12),
    "Chinchilla 70B": dict(source="Hoffmann et al. 2022, §4.1 and Table 4 (batch 1.5M tokens, doubled to 3M during "
                                  "training)", optimizer="AdamW", beta2=None, eps=None,
                           peak_lr=1e-4, schedule="cosine, 10× decay", warmup=None, weight_decay=None, clip=None,
                           batch_tokens=3e6, context=2048, tokens=1.4e12),
    "Mistral 7B": dict(source="Jiang et al. 2023: architecture only, no training hyperparameters published",
                       optimizer=None, beta2=None, eps=None, peak_lr=None, schedule=None, warmup=None,
                       weight_decay=None, clip=None, batch_tokens=None, context=8192, tokens=None),
}


def warmup_fraction(name: str) -> float | None:
    """Warmup as a fraction of the run, where both are published."""
    if name == "GPT-3 175B":
        return 375e6 / 300e9
    if name == "LLaMA 2 70B":
        return 2000 / (2e12 / 4e6)  # 2000 of 500,000 steps
    return None


def lab_recipe(S: Settings) -> dict:
    """The lab's scaled-down recipe: the published choices that do not depend on scale, kept; the ones that do,
    rescaled and measured in lessons 01–03."""
    return dict(source="this lab (lessons 01–03)", optimizer="AdamW", beta2=0.95, eps=1e-8, peak_lr=S.adamw_lr,
                schedule="cosine to 10%", warmup="10% of steps", weight_decay=0.1, clip=1.0,
                batch_tokens=S.batch_size * S.block_size, context=S.block_size, tokens=None)


def table(S: Settings) -> go.Figure:
    rows = dict(RECIPES, **{"this lab": lab_recipe(S)})
    fields = ("optimizer", "beta2", "eps", "peak_lr", "schedule", "warmup", "weight_decay", "clip", "batch_tokens",
              "context", "tokens")

    def fmt(v):
        if v is None:
            return "—"
        if isinstance(v, float) and v >= 1e4:
            for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
                if v >= size:
                    return f"{v / size:g}{unit}"
        if isinstance(v, float) and v < 1e-2:
            return f"{v:.2g}"
        return str(v)

    headers = {"beta2": "β2", "eps": "ε", "peak_lr": "peak learning rate", "weight_decay": "weight decay",
               "clip": "clip at", "batch_tokens": "tokens per step", "context": "sequence length",
               "tokens": "tokens in all"}
    body = [[name] + [fmt(r[f]) for f in fields] for name, r in rows.items()]
    return plots.table(["recipe", *(headers.get(f, f) for f in fields)], body,
                       title="Large runs agree on most choices (— = not published)", row_height=48)


def effective_batch_figure(batch: int, seq: int, dp: int, accum: int) -> go.Figure:
    tokens = batch * seq * dp * accum
    names = ["yours", *[n for n, r in RECIPES.items() if r["batch_tokens"]]]
    values = [tokens, *[r["batch_tokens"] for r in RECIPES.values() if r["batch_tokens"]]]
    fig = plots.bars(names, {"tokens per optimizer step": values},
                     title=f"Your setting: {tokens:,} tokens per step, beside published runs")
    fig.update_yaxes(type="log", title_text="tokens per step", range=[2, 7.5])  # bars rise from 100 tokens
    fig.update_traces(texttemplate="%{y:.3s}")
    return fig


def effective_batch_panel() -> Panel:
    controls = {
        "batch": slider(16, 1, 512, description="per-device batch"),
        "seq": slider(2048, 128, 8192, 128, description="sequence length"),
        "dp": slider(8, 1, 2048, description="data-parallel ranks"),
        "accum": slider(4, 1, 64, description="accumulation steps"),
    }
    return Panel(effective_batch_figure, controls, debounce_ms=0, title="Effective batch size")


def findings(ledger: Ledger, S: Settings) -> Findings:
    fractions = {n: warmup_fraction(n) for n in RECIPES}
    ledger.note("warmup_fraction", fractions)
    known = {n: f for n, f in fractions.items() if f is not None}
    ours = S.batch_size * S.block_size
    ratios = [r["batch_tokens"] / ours for r in RECIPES.values() if r["batch_tokens"]]
    table = ("| | warm-up, share of the run | peak learning rate |\n|---|---|---|\n"
             + "\n".join(f"| {n} | {f:.2%} | {RECIPES[n]['peak_lr']:.1e} |" for n, f in known.items())
             + "\n| LLaMA 2 7B (same paper) | | 3.0e-04 |"
             + f"\n| this lab | 10% | {S.adamw_lr:.1e} |")
    return Findings([
        "The lab keeps the published choices that do not depend on scale: AdamW, β2, weight decay on matrices only, "
        "clipping at $\\tau = 1$, a cosine to a tenth of the peak.",
        f"It rescales those that do: its batch is at least **{min(ratios):,.0f}×** smaller, and its short runs warm up "
        f"over a far larger share of their steps (the large runs: **{max(known.values()):.1%}** of theirs at most).",
    ], [
        table,
        "The peak learning rate grows as models shrink: this lesson's sub-million-parameter GPT runs far above "
        "LLaMA 2's.",
        f"The lab's batch: {S.batch_size} sequences of {S.block_size} tokens, {ours:,} tokens per step.",
    ])
