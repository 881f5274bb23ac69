"""Lesson 17 — tokens and data: a BPE tokenizer learned and checked, what a vocabulary changes, packing documents
into rows, and a loader that keeps up.

The settings of notebooks/17_tokens_and_data.ipynb and the text every section shares. One module per section:

    bpe.py           the merges learned from the standard library's source; a piece of text as tokens
    bpe_exercise.py  your turn: the merge loop, checked against tiktoken's own trainer
    vocabulary.py    bytes per token and the embedding's share as the vocabulary grows, with a panel
    comparison.py    characters against BPE tokens at equal compute: loss per token and bits per byte
    packing.py       documents into rows: padding, concatenation, a document mask; the panel
    loader.py        tokens per second a loader delivers, against what the model consumes
"""

import functools
from dataclasses import dataclass

from labtools.config import LabConfig, resolve
from labtools.data import stdlib_text
from labtools.tokenizer import BYTES, pieces
from labtools.validate import check_range

VAL_FRACTION = 0.1  # the last tenth of the text is held out: every validation number reads it


@dataclass(frozen=True, kw_only=True)
class Settings(LabConfig):
    train_chars: int      # characters of the standard library's source the merges are learned from
    vocab_size: int       # the BPE model's vocabulary: 256 bytes, then merges (end-of-text one more)
    vocab_sweep: tuple    # vocabulary sizes whose bytes per token section 2 counts
    text_chars: int       # characters both models of section 3 train and are validated on
    row_len: int          # tokens per row in section 4
    pack_steps: int       # training steps per packing strategy (section 4)
    loader_tokens: int    # tokens each loader of section 5 delivers while it is timed
    seeds: int = 1        # seeds section 3's two models are compared over (1: this run only)

    RANGES = {"VOCAB_SIZE": (BYTES + 1, 8192), "TRAIN_CHARS": (2_000, 1_000_000),
              "TEXT_CHARS": (20_000, 1_000_000), "PACK_STEPS": (1, 100_000), "SEEDS": (1, 100)}

    def __post_init__(self):
        super().__post_init__()
        sweep = self.vocab_sweep
        if not sweep or list(sweep) != sorted(set(sweep)) or min(sweep) < BYTES:
            raise ValueError(f"VOCAB_SWEEP must be increasing sizes ≥ {BYTES} (the 256 bytes), got {sweep!r}")
        check_range("ROW_LEN", self.row_len, 2, self.block_size, int)

    @property
    def merges(self) -> int:
        """Merges to learn: enough for the model's vocabulary and for the sweep's largest."""
        return max(self.vocab_size, max(self.vocab_sweep)) - BYTES


PROFILES = {
    "smoke": Settings(profile="smoke", n_layer=2, n_embd=64, n_head=4, block_size=64, batch_size=16, steps=120,
                      lr=3e-3, train_chars=60_000, vocab_size=512, vocab_sweep=(256, 320, 512, 1024),
                      text_chars=400_000, row_len=64, pack_steps=40, loader_tokens=200_000),
    "cpu": Settings(profile="cpu", n_layer=4, n_embd=128, n_head=4, block_size=128, batch_size=16, steps=300,
                    lr=3e-3, train_chars=300_000, vocab_size=1024, vocab_sweep=(256, 384, 512, 1024, 2048, 4096),
                    text_chars=1_000_000, row_len=128, pack_steps=120, loader_tokens=1_000_000, seeds=2),
    "gpu": Settings(profile="gpu", n_layer=6, n_embd=384, n_head=6, block_size=256, batch_size=64, steps=2000,
                    lr=1e-3, train_chars=1_000_000, vocab_size=4096,
                    vocab_sweep=(256, 512, 1024, 2048, 4096, 8192), text_chars=1_000_000, row_len=256,
                    pack_steps=1000, loader_tokens=4_000_000),
}


def settings(profile: str = "auto", **overrides) -> Settings:
    """Validated settings for a profile; None-valued overrides keep the profile's value. A vocabulary the training
    slice cannot hold (more merges than it has pairs to merge, at most) is refused here, before any work."""
    S = resolve(PROFILES, profile, **overrides)
    most = BYTES + sum(len(p) - 1 for p in pieces(texts(S.text_chars)[0][:S.train_chars]))
    if BYTES + S.merges > most:
        raise ValueError(f"VOCAB_SIZE (and VOCAB_SWEEP) must be at most {most:,}: {S.train_chars:,} characters "
                         f"hold no more pairs to merge; got {BYTES + S.merges:,}")
    return S


@functools.lru_cache(maxsize=4)
def texts(text_chars: int) -> tuple[str, str]:
    """(training text, validation text): the standard library's source, its last tenth held out."""
    text = stdlib_text(text_chars)
    n_val = int(len(text) * VAL_FRACTION)
    return text[:-n_val], text[-n_val:]
