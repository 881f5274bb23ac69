"""The claims ledger: every number a lesson states, next to its measurement and the expectation.

    ledger = Ledger("00_training_loop")
    ledger.add("init_loss", "Loss at initialisation ≈ ln(V)", 4.16, approx(4.159, rel=0.02), kind="measured")
    ledger.note("final_gap", 0.07)   # a measurement tests may read, not a claim
    ledger.show()

`show()` renders a claimed-vs-measured table and also emits the ledger as JSON under the
MIME type `application/vnd.labtools.claims+json`, so an executed notebook carries it and
tests/test_notebooks.py can assert that every claim passed.

A section's `findings(ledger, results)` records its claims and returns `Findings`: the section's answer in words
(a sentence or two, one or two numbers at most), and the run's numbers folded in a `<details>` below it.
The table shows the lesson's headline claims (at most HEADLINE_MAX); checks the text does not state
(`detail=True`) are folded under them.

Every claim says what kind of number it holds (`KINDS`): one read from the run, one counted where a call was
made, or one worked out from a formula or published figures. The table shows it beside the number.
"""

import html
import json
import math
from dataclasses import asdict, dataclass, field

MIME = "application/vnd.labtools.claims+json"
HEADLINE_MAX = 12  # headline rows a ledger shows; the rest are folded (detail=True)

KINDS = {
    "measured": "read from the run, where the machine or chance decides it: losses, seconds, bytes on the wire, "
                "memory a tracker saw, bits of the tensors",
    "counted": "counted where a call was made: the FLOPs the dispatcher ran, the bytes autograd saved, what a "
               "collective was handed or our own code chose to send (the same on every machine; it checks the code, "
               "not the hardware)",
    "computed": "worked out from a formula or from published figures, no run involved",
}


@dataclass(frozen=True)
class Expectation:
    """A named predicate on a measured value, with a human description."""
    kind: str
    a: float | None = None
    b: float | None = None

    def check(self, measured) -> bool:
        if self.kind in INTERVAL_KINDS:  # a claim over seeds: it holds for the whole interval, or not at all
            if not hasattr(measured, "low"):
                raise ValueError(f"an expectation about an interval ({self.kind}) needs runs over seeds "
                                 "(labtools.evidence), got one value")
            lo, hi = measured.low, measured.high
            return {"above": lo > self.a, "below": hi < self.a, "within": -self.a <= lo and hi <= self.a,
                    "includes": lo <= self.a <= hi}[self.kind]
        if hasattr(measured, "low"):
            measured = measured.estimate
        if self.kind == "true":
            return bool(measured) is True
        x = float(measured)
        if math.isnan(x):
            return False
        if self.kind == "approx":  # a = target, b = absolute tolerance
            return abs(x - self.a) <= self.b
        if self.kind == "between":
            return self.a <= x <= self.b
        if self.kind == "at_least":
            return x >= self.a
        if self.kind == "at_most":
            return x <= self.a
        raise ValueError(f"unknown expectation kind {self.kind!r}")

    def describe(self) -> str:
        return {
            "true": lambda: "true",
            "approx": lambda: (f"= {_fmt(self.a)}" if self.b <= 1e-9 * max(1.0, abs(self.a))
                               else f"{_fmt(self.a)} ± {_fmt(self.b)}"),
            "between": lambda: f"in [{_fmt(self.a)}, {_fmt(self.b)}]",
            "at_least": lambda: f"≥ {_fmt(self.a)}",
            "at_most": lambda: f"≤ {_fmt(self.a)}",
            "above": lambda: f"interval above {_fmt(self.a)}",
            "below": lambda: f"interval below {_fmt(self.a)}",
            "within": lambda: f"interval within ±{_fmt(self.a)}",
            "includes": lambda: f"interval includes {_fmt(self.a)}",
        }[self.kind]()


def approx(target: float, *, rel: float | None = None, abs: float | None = None) -> Expectation:
    """|measured - target| <= abs, or <= rel * |target|."""
    if (rel is None) == (abs is None):
        raise ValueError("give exactly one of rel= or abs=")
    tol = abs if abs is not None else rel * math.fabs(target)
    return Expectation("approx", float(target), float(tol))


def between(lo: float, hi: float) -> Expectation:
    return Expectation("between", float(lo), float(hi))


def at_least(lo: float) -> Expectation:
    return Expectation("at_least", float(lo))


def at_most(hi: float) -> Expectation:
    return Expectation("at_most", float(hi))


def is_true() -> Expectation:
    return Expectation("true")


INTERVAL_KINDS = ("above", "below", "within", "includes")


def above(x: float) -> Expectation:
    """Over seeds: the whole confidence interval lies above x (a difference that is real, in that direction)."""
    return Expectation("above", float(x))


def below(x: float) -> Expectation:
    """Over seeds: the whole confidence interval lies below x."""
    return Expectation("below", float(x))


def within(margin: float) -> Expectation:
    """Over seeds: the whole interval lies within ±margin: the same, to that margin (not merely 'not different')."""
    return Expectation("within", float(margin))


@dataclass
class Claim:
    key: str
    statement: str
    measured: float | bool | str
    expected: str
    passed: bool
    source: str = ""
    kind: str = ""  # one of KINDS; Ledger.add requires it, so no claim is "measured" by default
    detail: bool = False  # plumbing (e.g. "runs on gloo"): checked like any claim, folded away in the table
    interval: dict | None = None  # a claim over seeds: labtools.evidence.Interval's fields (measured is its estimate)


@dataclass
class Ledger:
    lesson: str
    claims: list[Claim] = field(default_factory=list)
    notes: dict = field(default_factory=dict)

    def add(self, key: str, statement: str, measured, expect: Expectation, source: str = "", *,
            kind: str, detail: bool = False) -> Claim:
        """Check the value against `expect` and record the claim (a repeated key replaces the old one).
        `kind` is one of KINDS: is the value measured, counted at a call, or computed from a formula?
        `detail`: a check the lesson's text does not state (plumbing), shown folded under the headline claims."""
        if kind not in KINDS:
            raise ValueError(f"claim {key!r}: kind must be one of {sorted(KINDS)}, got {kind!r}")
        if hasattr(measured, "item"):
            measured = measured.item()
        interval = asdict(measured) if hasattr(measured, "low") else None
        passed = expect.check(measured)
        value = measured.estimate if interval else measured
        claim = Claim(key, statement, value, expect.describe(), passed, source, kind, detail, interval)
        self.claims = [c for c in self.claims if c.key != key] + [claim]
        return claim

    def note(self, key: str, value) -> None:
        """Record a measurement (not a claim) in the ledger's JSON, for tests and results/."""
        self.notes[key] = value.item() if hasattr(value, "item") else value

    @property
    def all_passed(self) -> bool:
        return all(c.passed for c in self.claims)

    def to_dict(self) -> dict:
        return {"lesson": self.lesson, "claims": [asdict(c) for c in self.claims], "notes": self.notes}

    def to_html(self) -> str:
        headline = [c for c in self.claims if not c.detail]
        detail = [c for c in self.claims if c.detail]
        n_ok = sum(c.passed for c in self.claims)
        out = (f"<div><b>Claims ledger — {html.escape(self.lesson)}</b>: {n_ok} of {len(self.claims)} hold"
               + _table(headline))
        if detail:
            failed = sum(not c.passed for c in detail)
            out += (f"<details{' open' if failed else ''}><summary>{len(detail)} more checks the lesson relies on"
                    f"{f' ({failed} failed)' if failed else ''}</summary>{_table(detail)}</details>")
        return out + f"<details><summary><small>How to read this table</small></summary><p><small>{LEGEND}</small></p>" \
                     "</details></div>"

    def to_text(self) -> str:
        lines = [f"Claims ledger — {self.lesson}"]
        for c in self.claims:
            lines.append(f"[{'PASS' if c.passed else 'FAIL'}] {c.statement}: {c.kind} {_value(c)}, "
                         f"expected {c.expected}")
        return "\n".join(lines)

    def mimebundle(self) -> dict:
        """HTML table, plain text, and the ledger as JSON under MIME (what an executed notebook keeps)."""
        payload = json.loads(json.dumps(self.to_dict(), default=float))
        return {"text/html": self.to_html(), "text/plain": self.to_text(), MIME: payload}

    def show(self) -> None:
        """Display the table and embed the ledger as JSON in the notebook output."""
        from IPython.display import display
        display(self.mimebundle(), raw=True)

    def _repr_html_(self) -> str:
        return self.to_html()


SMALL = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve")


def in_words(n: int) -> str:
    """A small count as a word ("two chunks"), so that an answer's numbers are its results, not its settings."""
    return SMALL[n] if isinstance(n, int) and 0 <= n < len(SMALL) else f"{n:,}"


class Findings(str):
    """A section's answer in words, then the run's numbers folded away.

    `statements`: one or two short sentences that answer the section's question, with at most one or two numbers
    each, shown as markdown bullets (a blank line between them, so each reads as its own block). `details`: the
    run's numbers behind them, one bullet each (or a markdown table: an item that starts with "|"), inside a folded
    `<details>` that a reader opens only if they want them. A str, so `display(Markdown(findings))` shows it too."""

    statements: tuple[str, ...]
    details: tuple[str, ...]

    def __new__(cls, statements, details=(), *, summary: str = "The numbers from this run"):
        items = tuple(s.strip() for s in statements if s and s.strip())
        more = tuple(s.strip() for s in details if s and s.strip())
        text = "\n\n".join(f"- {s}" for s in items)
        if more:
            body = "\n\n".join(s if s.startswith("|") else f"- {s}" for s in more)
            text += f"\n\n<details><summary>{summary}</summary>\n\n{body}\n\n</details>"
        obj = super().__new__(cls, text.strip())
        obj.statements, obj.details = items, more
        return obj

    def _repr_markdown_(self) -> str:
        return str(self)


LEGEND = ("<b>kind</b>: <i>measured</i> = read from your run; <i>counted</i> = what a call ran or was handed (the "
          "same on every machine); <i>computed</i> = a formula or published figures. <b>✗</b> = on your machine the "
          "measurement did not come out as stated: rerun the cell (timings vary), or try the cpu profile (smoke "
          "runs are short); if it persists, the statement does not hold there — tell us, with the ledger.")


def _table(claims: list[Claim]) -> str:
    rows = []
    for c in claims:
        mark = '<span style="color:#1a7f37">✓</span>' if c.passed else '<span style="color:#cf222e">✗</span>'
        src = f'<br><small style="color:#666">{html.escape(c.source)}</small>' if c.source else ""
        rows.append(f"<tr><td>{mark}</td><td style='text-align:left'>{html.escape(c.statement)}{src}</td>"
                    f"<td>{html.escape(_value(c))}</td><td><small>{c.kind}</small></td>"
                    f"<td>{html.escape(c.expected)}</td></tr>")
    return ("<table><thead><tr><th></th><th style='text-align:left'>claim</th><th>value</th><th>kind</th>"
            f"<th>expected</th></tr></thead><tbody>{''.join(rows)}</tbody></table>")


def read_ledgers(notebook: dict) -> list[dict]:
    """Every ledger an executed notebook (nbformat dict) displayed, in order."""
    found = []
    for cell in notebook.get("cells", []):
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            if MIME in data:
                found.append(data[MIME])
    return found


def _value(c: Claim) -> str:
    """A claim's value as the table shows it; over seeds, the estimate, its interval and how many runs."""
    if not c.interval:
        return _fmt(c.measured)
    i = c.interval
    p = f", p = {i['p_value']:.2g}" if i.get("p_value") is not None else ""
    over = {"runs": "seeds"}.get(i.get("over", "runs"), i.get("over", "runs"))
    return f"{_fmt(i['estimate'])} [{_fmt(i['low'])}, {_fmt(i['high'])}], {i['n']} {over}{p}"


def _fmt(x) -> str:
    if isinstance(x, bool) or x is None or isinstance(x, str):
        return str(x)
    if isinstance(x, int):
        return f"{x:,}"
    x = float(x)
    if x == 0 or math.isnan(x) or math.isinf(x):
        return str(x)
    if 1e-3 <= abs(x) < 1e5:
        return f"{x:.4g}"
    return f"{x:.3e}"
