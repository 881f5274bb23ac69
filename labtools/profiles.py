"""Run profiles (smoke / cpu / gpu / auto) and parameter validation shared by every lesson.

A lesson keeps one settings dataclass and a table {profile: settings}. The notebook's
parameters cell passes PROFILE and any explicit overrides (None means "the profile's value");
`resolve()` returns validated settings before any heavy work starts.
"""

import dataclasses
from typing import TypeVar

import torch

PROFILES = ("smoke", "cpu", "gpu", "auto")

T = TypeVar("T")


def resolve_profile(profile: str) -> str:
    """'auto' -> 'gpu' when CUDA is present, else 'cpu'; other names are checked and returned."""
    if profile not in PROFILES:
        raise ValueError(f"PROFILE must be one of {PROFILES}, got {profile!r}")
    if profile == "auto":
        return "gpu" if torch.cuda.is_available() else "cpu"
    return profile


def resolve(table: dict[str, T], profile: str, **overrides) -> T:
    """The profile's settings with every non-None override applied (validated by the dataclass)."""
    base = table[resolve_profile(profile)]
    known = {f.name for f in dataclasses.fields(base)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise ValueError(f"unknown parameter(s) {unknown}; valid: {sorted(known)}")
    return dataclasses.replace(base, profile=resolve_profile(profile),
                               **{k: v for k, v in overrides.items() if v is not None})


def check_range(name: str, value, lo=None, hi=None, kind=(int, float)) -> None:
    """Raise ValueError naming `name` unless lo <= value <= hi (either bound may be None)."""
    ok = isinstance(value, kind) and not isinstance(value, bool)
    ok = ok and (lo is None or value >= lo) and (hi is None or value <= hi)
    if not ok:
        lo_s = "-inf" if lo is None else lo
        hi_s = "inf" if hi is None else hi
        raise ValueError(f"{name} must be in [{lo_s}, {hi_s}], got {value!r}")

