"""Lesson 13, your turn: the arithmetic intensity of a matrix product, checked against the FLOPs and bytes that
section 2 read off every matrix product of a real training step, and a bf16 case."""

import inspect

from labtools.exercises import Outcome, attempt, failed, outcome

HINT = ("FLOPs: one multiply and one add for each of the m·n outputs' k terms, 2·m·k·n; bytes: each of the three "
        "matrices (m×k, k×n and the m×n result) once, times the bytes per element")


def reference(m, k, n, bytes_per_element):
    """FLOPs per byte moved of an (m×k) @ (k×n) product, reading both inputs and writing the output once."""
    flops = 2 * m * k * n
    moved = bytes_per_element * (m * k + k * n + m * n)
    return flops / moved


def cases(roof: dict) -> list[dict]:
    """The step's plain matrix products (aten mm, two 2-d inputs) with the intensity section 2 measured for each,
    smallest first (not in section 2's order, largest time first, which changes from run to run), and a bf16 product
    from the formula."""
    out = []
    for g in roof["ops"]:
        if g["name"] != "mm":
            continue
        dims = [tuple(int(x) for x in s.split("×")) for s in g["shapes"].split(" · ")]
        if len(dims) == 2 and all(len(d) == 2 for d in dims):
            (m, k), (_, n) = dims
            out.append({"case": f"{m}×{k} @ {k}×{n}, fp32", "args": (m, k, n, 4), "expected": g["intensity"]})
    out.sort(key=lambda c: (c["args"][0] * c["args"][1] * c["args"][2], c["args"]))
    out.append({"case": "4096×4096 @ 4096×4096, bf16", "args": (4096, 4096, 4096, 2),
                "expected": reference(4096, 4096, 4096, 2)})
    return out


def _misconception(got: float, m: int, k: int, n: int, b: int) -> str:
    """The typical mistake a wrong intensity matches, in words ("" if none does)."""
    flops, elements = 2 * m * k * n, m * k + k * n + m * n
    known = {
        "bytes, not elements: each element of the three matrices takes bytes_per_element bytes": flops / elements,
        "intensity is FLOPs per byte, not bytes per FLOP": b * elements / flops,
        "bytes_per_element is already in bytes: no factor of 8": flops / (8 * b * elements),
        "the result is written once, not read and written": flops / (b * (elements + m * n)),
        "a ratio of two counts is a fraction: divide with /, not //": float(flops // (b * elements)),
    }
    return next((what for what, value in known.items() if value and abs(got / value - 1) < 1e-9), "")


def check_intensity(fn, roof: dict) -> Outcome:
    """Your intensity against FLOPs ÷ bytes of each matrix product the step ran, and what it says about the ridge."""
    results = []
    for c in cases(roof):
        tried = attempt(fn, *c["args"], case=c["case"], hint=HINT)
        if not tried.returned:
            return tried.outcome
        got = tried.value
        if not isinstance(got, (int, float)):
            return failed(c["case"], f"return a number, got {type(got).__name__}")
        off = abs(got / c["expected"] - 1)
        named = _misconception(got, *c["args"])
        results.append({"case": c["case"], "difference": off,
                        "hint": f"{named or HINT} (you said {got:.3g} FLOPs per byte, the step's op "
                                f"{c['expected']:.3g})"})
    verdict = outcome(results, tol=1e-9, what="your intensity", reference="FLOPs ÷ bytes of the step's matrix "
                      "products", relative=True)
    if not verdict.passed:
        return verdict
    lowest = min(fn(*c["args"]) for c in cases(roof)[:-1])
    side = "right of" if lowest > roof["ridge"] else "not all right of"
    return Outcome("pass", f"{verdict.message}; the lowest, {lowest:.1f} FLOPs per byte, is {side} this machine's "
                           f"ridge at {roof['ridge']:.1f}", verdict.worst)


def solution_source() -> str:
    return inspect.getsource(reference).replace("def reference(", "def my_intensity(")
