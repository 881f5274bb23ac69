"""What a learner reads: short paragraphs and bullets, no insider words, and every lesson framed the same way —
objectives, prerequisites and times at the top; takeaways, the ledger and "try next" at the end.

FRAMED lists the lessons already rewritten in this shape (lesson 07 first, the pattern); every lesson joins it
as it is rewritten, and new lessons are born in it. The findings that a run prints are checked by the browser
test with the same rules (tests/test_browser.py)."""

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FRAMED = ("00_training_loop", "01_adamw_vs_adam_l2", "02_lr_schedules", "03_stability",
          "04_mixed_precision", "05_activation_checkpointing", "06_memory_budget", "07_data_parallel",
          "08_fsdp_zero", "09_pipeline_parallel",
          "10_tensor_parallel", "11_fault_tolerance",
          "12_compute_budget", "13_profiling", "14_context_parallel",
          "15_mixture_of_experts", "16_plan_a_run")
PARAGRAPH_WORDS, BULLET_WORDS = 80, 50
MAX_TAKEAWAYS = 5
# "the articles", "a source article", "the seeds" (sources the learner never sees); "the seed" of an RNG is fine
INSIDER = re.compile(r"\b(the|a|this course's|our) (source )?articles?\b|\bsource articles?\b|\bthe seeds\b"
                     r"|\bseed (articles?|documents?|sources?)\b", re.I)
OPENING = ("What you will learn", "Before you start", "Time")
ENDING = ("Key takeaways", "Try next")


def words(text: str) -> int:
    """Words a reader reads: maths, code spans and link targets count as one word each."""
    text = re.sub(r"\$\$.*?\$\$|\$[^$]+\$|`[^`]+`", " X ", text, flags=re.S)
    text = re.sub(r"\]\([^)]*\)", "]", text)
    return len(re.findall(r"[\w'’−–-]+", text))


def blocks(markdown: str) -> list[tuple[str, str]]:
    """("paragraph" | "bullet", text) of a markdown text: code fences, tables, headings, display maths and HTML
    tags skipped; a bullet's continuation lines joined to it."""
    markdown = re.sub(r"```.*?```|\$\$.*?\$\$", "\n\n", markdown, flags=re.S)
    out, current = [], None
    for line in markdown.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith(("#", "|", "<")):
            current = None
            continue
        bullet = re.match(r"^\s*([-*+]|\d+\.)\s+(.*)", line)
        if bullet:
            current = ["bullet", bullet.group(2)]
            out.append(current)
        elif current is not None:
            current[1] += " " + stripped
        else:
            current = ["paragraph", stripped]
            out.append(current)
    return [(kind, text) for kind, text in out]


def runs(markdown: str) -> list[str]:
    """The blocks a reader meets between blank lines (code, display maths, headings, tables and HTML tags left
    out): bullets written without blank lines between them read as one run of text."""
    markdown = re.sub(r"```.*?```|\$\$.*?\$\$", "\n\n", markdown, flags=re.S)
    out = []
    for block in re.split(r"\n\s*\n", markdown):
        lines = [ln.strip() for ln in block.splitlines() if ln.strip() and not ln.strip().startswith(("#", "|", "<"))]
        if lines:
            out.append(" ".join(lines))
    return out


def problems(markdown: str) -> list[str]:
    found = [f"a run of {words(r)} words between blank lines (at most {PARAGRAPH_WORDS}): {r[:70]}…"
             for r in runs(markdown) if words(r) > PARAGRAPH_WORDS]
    for kind, text in blocks(markdown):
        n, limit = words(text), PARAGRAPH_WORDS if kind == "paragraph" else BULLET_WORDS
        if n > limit:
            found.append(f"a {kind} of {n} words (at most {limit}): {text[:70]}…")
    found += [f"insider word {m.group(0)!r}: say what the source is" for m in INSIDER.finditer(markdown)]
    return found


def notebook_markdown(name: str) -> tuple[str, list[str]]:
    nb = json.loads((ROOT / "notebooks" / f"{name}.ipynb").read_text())
    md = "\n\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")
    code = ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]
    return md, code


@pytest.mark.parametrize("name", FRAMED)
def test_a_framed_lesson_reads_in_short_blocks_without_insider_words(name):
    md, _ = notebook_markdown(name)
    assert problems(md) == []


@pytest.mark.parametrize("name", FRAMED)
def test_a_framed_lesson_opens_with_goals_and_ends_with_takeaways_the_ledger_and_try_next(name):
    md, code = notebook_markdown(name)
    missing = [h for h in OPENING + ENDING if h not in md]
    assert not missing, f"{name}: no {missing}"
    assert md.index("Time") < md.index("## 1") < md.index("Key takeaways") < md.index("Try next")
    assert any("ledger.show()" in c for c in code), f"{name}: the ledger is not shown"
    takeaways = md.split("## Key takeaways")[1].split("##")[0]
    n = len(re.findall(r"^- ", takeaways, re.M))
    assert 1 <= n <= MAX_TAKEAWAYS, f"{name}: {n} key takeaways (at most {MAX_TAKEAWAYS})"


def test_the_rules_can_fail():
    long = "word " * 81
    assert problems(long) and "81 words" in problems(long)[0]
    assert problems("- " + "word " * 51) and not problems("- " + "word " * 49)
    five = "\n".join("- " + "word " * 20 for _ in range(5))  # five short bullets, no blank lines: one long run
    assert problems(five) and not problems(five.replace("\n", "\n\n"))
    assert problems("As the articles say, it works.")[0].startswith("insider word")
    assert problems("One of the seeds claims 2×.") and not problems("The sign changes with the seed.")
    assert not problems("```\n" + long + "\n```\n\n$$" + long + "$$")  # code and display maths do not count
    assert words("the ring sends $2\\frac{N-1}{N}M$ bytes (`collective_bytes`)") == 6
