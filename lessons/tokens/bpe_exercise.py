"""Lesson 17, your turn: BPE's merge loop, checked on small cases against the lab's trainer and on a slice of the
standard library against tiktoken's own educational trainer; then, written right, your merges make the tokenizer the
rest of the lesson trains with."""

import inspect
import time
from dataclasses import dataclass

from labtools import tokenizer
from labtools.exercises import NOT_WRITTEN, Outcome, attempt, failed, outcome
from labtools.learner import bound_for, is_stub
from lessons.tokens import Settings, texts
from lessons.tokens.bpe import PARITY_CHARS, PARITY_MERGES, check_supported

HINT = ("count each adjacent pair over every piece, weighted by the piece's count; merge the most frequent pair "
        "everywhere, left to right; then count again")


OVERLAP_HINT = ("the same bytes, split another way: an earlier merge was made in another order. Scan each piece left "
                "to right and, after joining two tokens, step past the new one: a a a becomes aa a")


def reference(pieces, n_merges):
    """The first n_merges merges of BPE over pieces {tuple of byte tokens: count}: each time the most frequent
    adjacent pair (a tie goes to the pair met first), merged everywhere, left to right."""
    words = [(list(piece), count) for piece, count in pieces.items()]
    merges = []
    for _ in range(n_merges):
        pairs = {}                                  # pair -> count, in the order pairs are first met
        for tokens, count in words:
            for pair in zip(tokens, tokens[1:]):
                pairs[pair] = pairs.get(pair, 0) + count
        if not pairs:
            break
        best = max(pairs, key=pairs.get)            # the first of the most frequent
        merges.append(best)
        for tokens, _ in words:                     # merge it in every piece, left to right, in place
            i = 0
            while i < len(tokens) - 1:
                if (tokens[i], tokens[i + 1]) == best:
                    tokens[i:i + 2] = [tokens[i] + tokens[i + 1]]
                i += 1
    return merges


def _pieces(text: str) -> dict:
    return tokenizer.pieces(text)


def cases(S: Settings | None = None) -> list[dict]:
    """(name, pieces, n_merges, expected merges, hint); the last from tiktoken's trainer on the lesson's text."""
    out = [
        {"case": "one word, three merges", "pieces": _pieces("aaabdaaabac"), "n": 3,
         "hint": "the most frequent pair first: in aaabdaaabac that is a a, four times"},
        {"case": "pairs as frequent: the first met wins", "pieces": _pieces("mn ab xy ab mn xy"), "n": 1,
         "hint": "m n, a b, x y and the pairs with a space each occur twice: take the one met first in the text "
                 "(max over a dict in the order pairs were first counted), not the largest or smallest pair"},
        {"case": "overlapping pairs, left to right", "pieces": _pieces("aaaa aaa"), "n": 3,
         "hint": "merging a a in a a a gives aa a, not a aa: scan left to right, and after a merge skip the token "
                 "just made"},
        {"case": "a piece that occurs many times", "pieces": {(b"t", b"h", b"e"): 50, (b"a", b"x"): 60,
                                                             (b"h", b"e"): 30}, "n": 2,
         "hint": "a piece's pairs count as often as the piece occurs: h e is in the (50) and he (30), 80 in all"},
    ]
    for c in out:
        c["expected"] = tokenizer.train_bpe_pieces(c["pieces"], c["n"])
    if S is not None:
        from tiktoken._educational import bpe_train
        text = texts(S.text_chars)[0][:PARITY_CHARS]
        theirs = bpe_train(text, tokenizer.BYTES + PARITY_MERGES, tokenizer.GPT2_PATTERN, visualise=None)
        out.append({"case": f"the first {PARITY_CHARS:,} characters of the lesson's text, {PARITY_MERGES} merges",
                    "pieces": _pieces(text), "n": PARITY_MERGES, "tiktoken": theirs, "hint": HINT})
    return out


def _copy(pieces: dict) -> dict:
    return {tuple(k): v for k, v in pieces.items()}


def check_merges(fn, S: Settings | None = None) -> Outcome:
    """Your merge loop on four small cases (ties, overlaps, counts) against the lab's trainer, then on a slice of the
    lesson's text against tiktoken's educational trainer (tiktoken._educational.bpe_train): the same merges, in the
    same order."""
    if is_stub(fn):
        return Outcome("not written", NOT_WRITTEN)
    results = []
    for c in cases(S):
        tried = attempt(fn, _copy(c["pieces"]), c["n"], case=c["case"], hint=c["hint"])
        if not tried.returned:
            return tried.outcome
        try:
            got = [(bytes(a), bytes(b)) for a, b in tried.value]
        except (TypeError, ValueError):
            return failed(c["case"], "return a list of merged pairs, each (left token, right token) as bytes",
                          c["hint"])
        if "tiktoken" in c:
            mine = tokenizer.ranks(got)
            if mine != c["tiktoken"]:
                k = next(i for i, (a, b) in enumerate(zip(_ordered(mine), _ordered(c["tiktoken"])))
                         if a != b) if len(mine) == len(c["tiktoken"]) else min(len(mine), len(c["tiktoken"]))
                return failed(c["case"], f"merge {k - tokenizer.BYTES + 1} differs from tiktoken's trainer: "
                                         f"{_say(_ordered(mine), k)} where it made {_say(_ordered(c['tiktoken']), k)}",
                              c["hint"])
        elif got != c["expected"]:
            k = next((i for i, (a, b) in enumerate(zip(got, c["expected"])) if a != b), min(len(got),
                                                                                           len(c["expected"])))
            want = _pair(c["expected"], k)
            had = _pair(got, k)
            same_token = k < len(got) and k < len(c["expected"]) and b"".join(got[k]) == b"".join(c["expected"][k])
            hint = OVERLAP_HINT if same_token else c["hint"]
            return failed(c["case"], f"merge {k + 1} should be {want}, yours is {had}", hint)
        results.append({"case": c["case"], "difference": 0.0})
    return outcome(results, tol=0.0, what="your merge loop", reference="the lab's trainer, and tiktoken's own "
                   "trainer on the lesson's text,")


def _ordered(table: dict) -> list[bytes]:
    return sorted(table, key=table.get)


def _say(tokens: list[bytes], k: int) -> str:
    return repr(tokens[k].decode("utf-8", errors="replace")) if k < len(tokens) else "nothing"


def _pair(merges: list, k: int) -> str:
    if k >= len(merges):
        return "nothing"
    a, b = merges[k]
    return f"{a.decode('utf-8', errors='replace')!r} + {b.decode('utf-8', errors='replace')!r}"


@dataclass(frozen=True)
class YourTokenizer:
    """The merges the rest of the lesson uses: yours where they match the lab's on the lesson's text, else the
    lab's (and why)."""
    outcome: Outcome
    merges: list
    yours: bool

    def _repr_html_(self) -> str:
        return self.outcome._repr_html_()


YOURS_NOT_WRITTEN = "not written yet: the lesson goes on with the lab's merges (run this cell again once yours pass)"


def learn_with_yours(fn, S: Settings, lab_merges: list) -> YourTokenizer:
    """Your merge loop run on the lesson's whole training slice: its merges make the tokenizer of sections 2-5 if
    they are the lab's; the lab's are used otherwise."""
    if is_stub(fn):
        return YourTokenizer(Outcome("not written", YOURS_NOT_WRITTEN), lab_merges, False)
    text = texts(S.text_chars)[0][:S.train_chars]
    pieces = tokenizer.pieces(text)
    start = time.perf_counter()
    tokenizer.train_bpe(text, S.merges)
    tried = attempt(fn, _copy(pieces), S.merges, case=f"the lesson's {S.train_chars:,} characters", hint=HINT,
                    seconds=bound_for(time.perf_counter() - start))
    if not tried.returned:
        return YourTokenizer(tried.outcome, lab_merges, False)
    try:
        mine = [(bytes(a), bytes(b)) for a, b in tried.value]
        check_supported(S, mine)
    except (TypeError, ValueError) as e:
        return YourTokenizer(Outcome("fail", f"your merges cannot make the tokenizer: {e}"), lab_merges, False)
    if tokenizer.ranks(mine) != tokenizer.ranks(lab_merges):
        return YourTokenizer(Outcome("fail", "on the lesson's text your merges differ from the lab's: the lesson goes "
                                             "on with the lab's (the check above says where)"), lab_merges, False)
    return YourTokenizer(Outcome("pass", f"your {len(mine):,} merges, learned from {S.train_chars:,} characters, are "
                                         "the lab's: the rest of the lesson tokenizes with yours", 0.0), mine, True)


def solution_source() -> str:
    """The reference as the learner's cell would hold it."""
    return inspect.getsource(reference).replace("def reference(", "def my_bpe_merges(")
