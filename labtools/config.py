"""The one config every lesson starts from, its run profiles, and the builders notebooks and ranks share.

A lesson's settings extend `LabConfig` with their own fields and a table {profile: settings}; the notebook's
parameters cell passes PROFILE and any explicit overrides (None keeps the profile's value), and `resolve()`
returns validated settings before any heavy work starts:

    @dataclass(frozen=True, kw_only=True)
    class Settings(LabConfig):
        accum_k: int = 4                      # micro-batches per step
        RANGES = {"ACCUM_K": (2, 64)}         # the notebook's parameter: (low, high) of the field accum_k

    PROFILES = {"smoke": Settings(profile="smoke", steps=15), "cpu": ..., "gpu": ...}
    S = resolve(PROFILES, "smoke", steps=20)

The same settings travel to torchrun ranks as they are, or as a smaller config `derive`d from them
(labtools.parallel.codec rebuilds the dataclass there), so a rank reads S.accum_k, builds `build_gpt(S)` and
draws `global_batch(S, g, rows)` like the notebook does.
"""

import dataclasses
from dataclasses import dataclass
from typing import ClassVar, TypeVar

import torch

from labtools import data
from labtools.model import GPT, GPTConfig
from labtools.validate import check_range

PROFILES = ("smoke", "cpu", "gpu", "auto")

T = TypeVar("T")


def resolve_profile(profile: str) -> str:
    """'auto' -> 'gpu' when CUDA is present, else 'cpu'; other names are checked and returned."""
    if profile not in PROFILES:
        raise ValueError(f"PROFILE must be one of {PROFILES}, got {profile!r}")
    if profile == "auto":
        return "gpu" if torch.cuda.is_available() else "cpu"
    return profile


@dataclass(frozen=True, kw_only=True)
class LabConfig:
    """Profile, model shape, batch, steps, learning rate and seed: what every lesson and rank has."""
    profile: str = "smoke"   # smoke (CI) | cpu (a laptop) | gpu (one GPU); 'auto' is resolved before this
    n_layer: int = 2         # transformer blocks
    n_embd: int = 64         # d, the residual width
    n_head: int = 4          # attention heads (n_embd must be a multiple)
    block_size: int = 64     # T, tokens per sequence
    batch_size: int = 8      # B, sequences per step (per rank in the multi-process lessons)
    steps: int = 10          # optimizer steps of the lesson's main run
    lr: float = 3e-3         # peak learning rate
    seed: int = 0            # weights and batches follow from it

    # A lesson's ranges: {"PARAMETER": (low, high)} for the field parameter.lower(), checked after the base's (an int
    # field when both bounds are ints). A bound that depends on another field is a check_range in __post_init__.
    RANGES: ClassVar[dict[str, tuple]] = {}

    def __post_init__(self):
        if self.profile not in PROFILES[:3]:
            raise ValueError(f"profile must be one of {PROFILES[:3]}, got {self.profile!r}")
        check_range("N_LAYER", self.n_layer, 1, 256, int)
        check_range("N_HEAD", self.n_head, 1, 256, int)
        check_range("N_EMBD", self.n_embd, 1, 65536, int)
        check_range("BLOCK_SIZE", self.block_size, 1, 1 << 20, int)
        check_range("BATCH_SIZE", self.batch_size, 1, 1 << 16, int)
        check_range("STEPS", self.steps, 1, 10_000_000, int)
        check_range("LR", self.lr, 1e-9, 10.0)
        check_range("SEED", self.seed, 0, 2**31 - 1, int)
        if self.n_embd % self.n_head:
            raise ValueError(f"N_EMBD must be a multiple of n_head={self.n_head}, got {self.n_embd}")
        for name, (lo, hi) in self.RANGES.items():
            kind = int if isinstance(lo, int) and isinstance(hi, int) else (int, float)
            check_range(name, getattr(self, name.lower()), lo, hi, kind)


C = TypeVar("C", bound=LabConfig)


def derive(cls: type[C], source: LabConfig, **changes) -> C:
    """A `cls` config that takes every field it shares with `source` (e.g. a rank's config from a lesson's
    settings: the model shape, lr and seed), then `changes`; validated by cls."""
    shared = {f.name: getattr(source, f.name) for f in dataclasses.fields(cls) if f.init and hasattr(source, f.name)}
    return cls(**(shared | changes))


def resolve(table: dict[str, T], profile: str, **overrides) -> T:
    """The profile's settings with every non-None override applied (validated by the dataclass)."""
    base = table[resolve_profile(profile)]
    known = {f.name for f in dataclasses.fields(base)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise ValueError(f"unknown parameter(s) {unknown}; valid: {sorted(known)}")
    return dataclasses.replace(base, profile=resolve_profile(profile),
                               **{k: v for k, v in overrides.items() if v is not None})


# --- builders: the lab's GPT and its data, from a config ---------------------------------------------------------

def gpt_config(cfg: LabConfig, vocab_size: int | None = None, **changes) -> GPTConfig:
    """The GPT of this config's shape; the vocabulary is the text corpus's unless given."""
    vocab = data.text().vocab_size if vocab_size is None else vocab_size  # the standard library's source
    base = GPTConfig(vocab_size=vocab, block_size=cfg.block_size, n_layer=cfg.n_layer, n_head=cfg.n_head,
                     n_embd=cfg.n_embd)
    return dataclasses.replace(base, **changes)


def build_gpt(cfg: LabConfig, vocab_size: int | None = None, device: torch.device | str = "cpu",
              **changes) -> GPT:
    """The GPT initialised from cfg.seed (the same weights wherever it is built), on `device`."""
    torch.manual_seed(cfg.seed)
    return GPT(gpt_config(cfg, vocab_size, **changes)).to(device)


def global_batch(cfg: LabConfig, g: torch.Generator, rows: int, corpus: data.Corpus | None = None,
                 split: str = "train", device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """`rows` windows of cfg.block_size tokens (of the text corpus unless given): the same batch wherever g is
    seeded the same."""
    X, Y = (corpus or data.text()).batch(split, rows, cfg.block_size, g)
    return X.to(device), Y.to(device)
