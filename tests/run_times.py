"""Write each lesson's smoke run time, as one `make test` measured it, into the three places that state it: the
lesson's own "Time" line, the README's lesson table and docs/profiles.md (test_prose.py checks that they agree).
For maintainers after a full run, not a test:

    python tests/run_times.py            # show what would change, from build/browser/<lesson>.json
    python tests/run_times.py --write    # and write it

A lesson's smoke time is its Run All in the browser, rounded to 5 s ("about"); docs/profiles.md also gets the whole
browser test (opening, Run All, saving, checking, every panel, the exercise). The cpu times are measured apart (a
profile `make test` does not run) and are left as they are.
"""

import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_prose import FRAMED  # noqa: E402 - the lessons the prose rules know

ROOT = Path(__file__).resolve().parents[1]
BROWSER = ROOT / "build" / "browser"


def measured(name: str) -> tuple[int, int]:
    """(Run All, the whole browser test) in seconds, from the last `make test`."""
    stages = json.loads((BROWSER / f"{name}.json").read_text())["stages_s"]
    return max(5, 5 * round(stages["run all"] / 5)), round(sum(stages.values()))


def update(write: bool) -> list[str]:
    changed = []
    readme, profiles = ROOT / "README.md", ROOT / "docs" / "profiles.md"
    texts = {readme: readme.read_text(), profiles: profiles.read_text()}
    for name in FRAMED:
        run_all, whole = measured(name)
        nb_path = ROOT / "notebooks" / f"{name}.ipynb"
        raw = nb_path.read_text()
        new = re.sub(r"(running takes about )\d+ s(\s+at\s+`smoke`)", rf"\g<1>{run_all} s\g<2>", raw, count=1)
        if new != raw:
            changed.append(f"{name}: notebook smoke {run_all} s")
            if write:
                nb_path.write_text(new)
        texts[readme] = re.sub(rf"(\[{name[:2]} ·[^\n]*\| )\d+ s(, [^|\n]+\|\n)", rf"\g<1>{run_all} s\g<2>",
                               texts[readme], count=1)
        texts[profiles] = re.sub(rf"(\| {name[:2]} ·[^|\n]*\| )\d+ s \| \d+ s \|", rf"\g<1>{run_all} s | {whole} s |",
                                 texts[profiles], count=1)
    for path, text in texts.items():
        if text != path.read_text():
            changed.append(f"{path.relative_to(ROOT)}: smoke times")
            if write:
                path.write_text(text)
    return changed


if __name__ == "__main__":
    print("\n".join(update("--write" in sys.argv)) or "nothing to change")
