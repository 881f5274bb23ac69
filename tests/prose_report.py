"""What a learner reads, per lesson: words of the notebook's markdown and of the findings an executed run printed,
and the longest paragraph. For issue reports and reviews, not a test:

    python tests/prose_report.py EXECUTED.ipynb ...      # e.g. papermill's or `make book`'s outputs
"""

import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_prose import blocks, words  # noqa: E402 - the same counting rules as the test


def report(path: Path) -> dict:
    nb = json.loads(path.read_text())
    markdown = ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown"]
    printed = ["".join(o["data"]["text/markdown"]) for c in nb["cells"] for o in c.get("outputs", [])
               if "text/markdown" in o.get("data", {})]
    paragraphs = [words(text) for md in markdown + printed for kind, text in blocks(md) if kind == "paragraph"]
    folded = sum(words(d) for m in markdown for d in re.findall(r"<details>(.*?)</details>", m, re.S))
    return {"lesson": path.stem, "markdown_words": sum(words(m) for m in markdown), "folded_words": folded,
            "printed_words": sum(words(p) for p in printed), "longest_paragraph": max(paragraphs, default=0)}


if __name__ == "__main__":
    rows = [report(Path(p)) for p in sys.argv[1:]]
    print(f"{'lesson':<30} {'markdown':>9} {'folded':>7} {'printed':>8} {'total':>6} {'longest ¶':>10}")
    for r in rows:
        print(f"{r['lesson']:<30} {r['markdown_words']:>9,} {r['folded_words']:>7,} {r['printed_words']:>8,} "
              f"{r['markdown_words'] + r['printed_words']:>6,} {r['longest_paragraph']:>10}")
    total = {k: sum(r[k] for r in rows) for k in ("markdown_words", "folded_words", "printed_words")}
    print(f"{'all':<30} {total['markdown_words']:>9,} {total['folded_words']:>7,} {total['printed_words']:>8,} "
          f"{total['markdown_words'] + total['printed_words']:>6,}")
    print("(markdown includes the folded <details> words; a learner opens those only if they want to)")
