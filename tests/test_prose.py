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
          "15_mixture_of_experts", "16_plan_a_run", "17_tokens_and_data", "18_evidence",
          "19_muon_and_mup", "20_sft_and_dpo", "21_rl_with_a_verifier",
          "22_flash_attention_and_fp8")
PARAGRAPH_WORDS, BULLET_WORDS = 80, 50
MAX_TAKEAWAYS = 5
# "the articles", "a source article", "the seeds" (sources the learner never sees); "the seed" of an RNG is fine
INSIDER = re.compile(r"\b(the|a|this course's|our) (source )?articles?\b|\bsource articles?\b|\bthe seeds\b"
                     r"|\bseed (articles?|documents?|sources?)\b", re.I)
# What a learner must not meet: our library's and lessons' module paths, file names, and words about our tests.
INTERNAL = re.compile(r"\blabtools\b|\blessons\.\w|\b[\w/]+\.py\b|\b(?:the|our|unit|parity|browser) tests?\b|\btested\b"
                      r"|\bpytest\b|\bin CI\b", re.I)
# Names with digits that are not quantities a reader must hold: code, maths and links; lesson, section, step and
# rank references; model and format names (GPT-3 175B, Llama 3, fp16, H100, 1F1B); years of citations.
NAMED = re.compile(
    r"\$[^$]*\$|`[^`]*`|\]\([^)]*\)"
    r"|\b(?:lessons?|sections?|§|table|eq\.|equation|record|steps?|ranks?|stage|figure)\s+\d+"
    r"(?:\s*(?:[–,-]|and|or)\s*\d+)*\b"
    r"|\b(?:GPT-\d|Llama\s\d|LLaMA\s\d|Mixtral\s8x7B|DeepSeek-V\d|MT-NLG|ZeRO-\d|ZeRO\s\d)(?:\s\d+(?:\.\d+)?[BM]\b)?"
    r"|\b\d+(?:\.\d+)?[BM]\s(?=model|parameters?\b)"
    r"|\b[A-Za-z]+\d\w*|\b\d+[A-Za-z]+\d\w*|\b\d+-[A-Za-z]\w*|\b0\d\b|\b(?:19[5-9]\d|20[0-2]\d)\b", re.I)
NUMBER = re.compile(r"(?<![\w.])[−+-]?\d[\d,]*(?:\.\d+)?(?:e[+−-]?\d+)?[⁰¹²³⁴⁵⁶⁷⁸⁹⁻]*")
ANSWER_NUMBERS, DETAIL_NUMBERS = 2, 3  # an answer in words holds one or two numbers; more than 3 is a table
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


def numbers(text: str) -> list[str]:
    """The quantities a reader must hold in a sentence: numbers, outside code, maths, references and names."""
    return [n.rstrip(",") for n in NUMBER.findall(NAMED.sub(" ", text))]


def finding_problems(markdown: str) -> list[str]:
    """A section's printed findings: the answer (outside <details>) in bullets of at most ANSWER_NUMBERS numbers,
    the folded numbers in bullets of at most DETAIL_NUMBERS (more is a table), no internal names anywhere."""
    answer = re.sub(r"<details>.*?</details>", "", markdown, flags=re.S)
    folded = "\n\n".join(re.findall(r"<details>(.*?)</details>", markdown, flags=re.S))
    found = problems(markdown)
    for text, limit in ((answer, ANSWER_NUMBERS), (folded, DETAIL_NUMBERS)):
        found += [f"{len(numbers(t))} numbers in one {kind} (at most {limit}; more is a table or a figure): "
                  f"{t[:70]}…" for kind, t in blocks(text) if len(numbers(t)) > limit]
    found += [f"internal name {m.group(0)!r} in what a learner reads" for m in INTERNAL.finditer(markdown)]
    return found


def read_problems(nb: dict) -> list[str]:
    """Everything an executed notebook shows a learner from its run: findings (finding_problems), the ledger's
    statements (no internal names), and no warning or tool output on stderr."""
    from labtools.claims import MIME
    found = []
    for cell in nb["cells"]:
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            text = "".join(data.get("text/markdown", ""))
            if text and "<summary>Solution</summary>" not in text:  # an on-paper exercise states its numbers
                found += finding_problems(text)
            for claim in data.get(MIME, {}).get("claims", []):
                found += [f"internal name {m.group(0)!r} in the ledger: {claim['statement'][:60]}…"
                          for m in INTERNAL.finditer(claim["statement"] + " " + claim.get("source", ""))]
            if out.get("name") == "stderr":
                found.append(f"output on stderr: {''.join(out.get('text', ''))[:80]!r}")
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
    assert [m.group(0) for m in INTERNAL.finditer(md)] == [], "module paths or test words in the lesson's text"


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


def test_the_reading_rules_for_a_run_can_fail():
    assert numbers("Loss **2.806** against ln V = 2.773, after 500 steps, 1.3× faster") == ["2.806", "2.773", "500", "1.3"]
    assert numbers("GPT-3 175B on fp16 H100s, lesson 02, ZeRO-3, 1F1B, step 50, a 2-core CPU (Hoffmann et al. 2022)") == []
    assert numbers("$2(N-1)/N$ and `n=4`, 3.15e+23 FLOPs") == ["3.15e+23"]
    answer = "- Constant ends at **2.52**, cosine 2.52, linear 2.50."
    assert finding_problems(answer) and "3 numbers" in finding_problems(answer)[0]
    assert not finding_problems("- Decaying helped: **0.05** nats lower.")
    folded = "- The answer.\n\n<details><summary>n</summary>\n\n- 1, 2, 3 and 4.\n\n</details>"
    assert finding_problems(folded) and "4 numbers" in finding_problems(folded)[0]
    assert not finding_problems(folded.replace(" and 4", ""))
    assert finding_problems("- Per-rank bytes equal labtools.budget's prediction.")
    assert finding_problems("- As checked in the tests, it holds.")
    from labtools.claims import MIME
    nb = {"cells": [{"outputs": [{"name": "stderr", "text": "USDT: profiler_start"},
                                 {"data": {MIME: {"claims": [{"statement": "see lessons.fsdp_zero.sharding"}]}}}]}]}
    assert len(read_problems(nb)) == 2


# --- one notation: docs/notation.md -------------------------------------------------------------------------------

STOP = {"the", "and", "its", "per", "one", "each", "that", "this", "with", "from", "into", "over", "what", "which",
        "of", "a", "an", "in", "as", "by", "is", "to", "for", "or", "at", "on", "all"}


def page_symbols(text: str) -> dict[str, str]:
    """{symbol: meaning} of the notation page's tables: a row's first cell may hold several symbols."""
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 2 or not cells[0].startswith("$"):
            continue
        for sym in re.findall(r"\$([^$]+)\$", cells[0]):
            for one in sym.split(","):
                assert one.strip() not in rows, f"the notation page defines ${one.strip()}$ twice"
                rows[one.strip()] = cells[1]
    return rows


def lesson_symbols(markdown: str) -> list[tuple[str, str]]:
    """(symbol, meaning) pairs of a lesson's "Symbols: $x$ meaning, $y$ meaning" line."""
    m = re.search(r"Symbols?:(.*?)(?:\(\[notation|\n\n)", markdown, re.S)
    if not m:
        return []
    found = []
    for part in re.finditer(r"\$([^$]+)\$\s*([^$]*)", m.group(1)):
        meaning = part.group(2).strip(" ,;.\n")
        for one in part.group(1).split(","):
            if one.strip():
                found.append((one.strip(), meaning))
    return found


def notation_problems(markdown: str, page: dict[str, str]) -> list[str]:
    """Symbols a lesson defines that are not on the page, or that the lesson gives a meaning sharing no word with
    the page's (a symbol listed with the next one, "$b$, $s$, $h$ a batch's sequences, length and width", shares
    the list's meaning)."""
    out = []
    for sym, meaning in lesson_symbols(markdown):
        if sym not in page:
            out.append(f"${sym}$ ({meaning}) is not on the notation page")
            continue
        ours = {w for w in re.findall(r"[a-z]{3,}", meaning.lower()) if w not in STOP}
        theirs = {w for w in re.findall(r"[a-z]{3,}", page[sym].lower()) if w not in STOP}
        stems = lambda ws: {w[:5] for w in ws}
        if meaning and not stems(ours) & stems(theirs):
            out.append(f"${sym}$ means '{meaning}' here, '{page[sym]}' on the notation page")
    return out


def test_the_notation_page_gives_each_symbol_once():
    page = page_symbols((ROOT / "docs" / "notation.md").read_text())
    assert {"L", "h", "P", "N", "t", "m", "k", "G", r"\tau", r"\rho"} <= set(page)


@pytest.mark.parametrize("name", FRAMED)
def test_a_lesson_defines_its_symbols_as_the_notation_page_does(name):
    md, _ = notebook_markdown(name)
    page = page_symbols((ROOT / "docs" / "notation.md").read_text())
    assert lesson_symbols(md), f"{name}: no 'Symbols:' in its Before you start"
    assert notation_problems(md, page) == []


def test_the_notation_check_can_fail():
    page = page_symbols((ROOT / "docs" / "notation.md").read_text())
    assert notation_problems("Symbols: $N$ the parameters, $T$ the sequence length ([notation", page) == [
        "$N$ means 'the parameters' here, 'ranks (processes, one per device) in a group; GPUs of a cluster' on the "
        "notation page", "$T$ means 'the sequence length' here, 'optimizer steps in a run' on the notation page"]
    assert notation_problems("Symbols: $q$ a queue ([notation", page) == ["$q$ (a queue) is not on the notation page"]
    assert notation_problems("Symbols: $P$ parameters, $N$ GPUs sharing the work ([notation", page) == []


# --- times that agree: the lesson's "Time", the README's table and docs/profiles.md --------------------------------

def _duration(text: str) -> str:
    """'about 35 s' / '1.5 minutes' / '2 min' -> '35 s' / '1.5 min'."""
    text = re.sub(r"\ba minute\b", "1 min", text)
    m = re.match(r"\s*(?:about\s+)?([\d.]+)\s*(s|min|minutes?)\b", text)
    assert m, f"not a duration: {text!r}"
    return f"{m.group(1)} {'s' if m.group(2) == 's' else 'min'}"


def stated_times() -> dict[str, dict[str, tuple[str, str]]]:
    """{lesson: {where: (smoke, cpu)}} as the notebook, the README and docs/profiles.md state them."""
    out = {}
    for name in FRAMED:
        md, _ = notebook_markdown(name)
        m = re.search(r"running takes (.*?)\s+at\s+`smoke`\s+and\s+(.*?)\s+at\s+`cpu`", md, re.S)
        assert m, f"{name}: its Time does not say how long smoke and cpu take"
        out[name] = {"notebook": (_duration(m.group(1)), _duration(m.group(2)))}
    readme = (ROOT / "README.md").read_text()
    for name in FRAMED:
        row = next(line for line in readme.splitlines() if f"notebooks/{name}.ipynb" in line)
        smoke, cpu = row.strip().strip("|").split("|")[-1].split(",")
        out[name]["README"] = (_duration(smoke), _duration(cpu))
    profiles = (ROOT / "docs" / "profiles.md").read_text()
    for name in FRAMED:
        row = next(line for line in profiles.splitlines() if line.startswith(f"| {name[:2]} ·"))
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        out[name]["docs/profiles.md"] = (_duration(cells[1]), _duration(cells[3]))
    return out


def test_each_lesson_states_the_run_times_the_readme_and_the_profiles_page_state():
    disagree = {name: where for name, where in stated_times().items() if len(set(where.values())) > 1}
    assert disagree == {}


# --- figure titles and axes -----------------------------------------------------------------------------------------

FIGURE_TEXT = {"title", "xaxis", "yaxis", "xaxis_title", "yaxis_title", "title_text", "zaxis", "legend_title"}


def figure_texts(source: str) -> list[str]:
    """The literal text of every title and axis label a module passes to a figure (f-strings: their fixed parts)."""
    import ast
    texts = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.keyword) and node.arg in FIGURE_TEXT:
            parts = [node.value] if isinstance(node.value, ast.Constant) else getattr(node.value, "values", [])
            texts.append(" ".join(p.value for p in parts if isinstance(p, ast.Constant) and isinstance(p.value, str)))
    return texts


def test_no_figure_title_or_axis_names_our_code():
    found = [(path.relative_to(ROOT).as_posix(), t) for path in sorted((ROOT / "lessons").rglob("*.py"))
             + [ROOT / "labtools" / "plots.py"] for t in figure_texts(path.read_text()) if INTERNAL.search(t)]
    assert found == []
    assert figure_texts("fig.update_layout(title=f'bytes / labtools.budget.estimate at {n}')") == [
        "bytes / labtools.budget.estimate at "]
