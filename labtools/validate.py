"""One check for every argument a learner or a lesson hands the library: a ValueError that names the argument and
its valid range, raised at the boundary, before any work.

    check_range("k", k, 1, n_experts, int)       # k must be in [1, 8], got 0
    check_range("factor", factor, 0, open_lo=True)  # factor must be in (0, inf], got -1.0
"""

import math


def check_range(name: str, value, lo=None, hi=None, kind=(int, float), *, open_lo: bool = False,
                open_hi: bool = False) -> None:
    """Raise ValueError naming `name` unless value is a `kind` (never a bool), finite, and lo <= value <= hi
    (lo < value with open_lo, value < hi with open_hi; either bound may be None)."""
    ok = isinstance(value, kind) and not isinstance(value, bool)
    ok = ok and (isinstance(value, int) or math.isfinite(value))
    ok = ok and (lo is None or (value > lo if open_lo else value >= lo))
    ok = ok and (hi is None or (value < hi if open_hi else value <= hi))
    if not ok:
        kinds = kind if isinstance(kind, tuple) else (kind,)
        what = "a whole number" if kinds == (int,) else "a number"
        bounds = (f"{'(' if open_lo else '['}{'-inf' if lo is None else lo}, {'inf' if hi is None else hi}"
                  f"{')' if open_hi else ']'}")
        raise ValueError(f"{name} must be {what} in {bounds}, got {value!r}")
