"""Lesson 17, section 1: what BPE learns from text. The merges learned from the standard library's source, a piece
of held-out text cut into tokens, and whether every byte comes back."""

import html
from dataclasses import dataclass

from labtools import tokenizer
from labtools.claims import Findings, Ledger, at_least, is_true
from labtools.tokenizer import BYTES, END_OF_TEXT
from lessons.tokens import Settings, texts

PARITY_CHARS, PARITY_MERGES = 4_000, 60  # tiktoken's educational trainer is slow: its check runs on a slice
SAMPLE_LINES = 6                          # lines of held-out text shown as tokens


@dataclass(frozen=True)
class Learned:
    """The merges learned for the lesson, and what they do to held-out text."""
    merges: list[tuple[bytes, bytes]]  # in the order learned
    val_bytes: int                     # bytes of the validation text
    val_tokens: int                    # its tokens at the model's vocabulary
    round_trip: bool                   # decode(encode(text)) == text, for the whole validation text
    sample: list[bytes]                # the first SAMPLE_LINES of held-out text, token by token
    parity: bool                       # the lab's trainer and tiktoken's learned the same merges on a slice


def check_supported(S: Settings, merges: list) -> None:
    """ValueError naming VOCAB_SIZE when the text ran out of pairs before the merges the settings ask for."""
    if len(merges) < S.merges:
        raise ValueError(f"VOCAB_SIZE (and VOCAB_SWEEP) must be at most {BYTES + len(merges)}: {S.train_chars:,} "
                         f"characters support only {len(merges)} merges; raise TRAIN_CHARS or lower them")


def learn(S: Settings, merges=None) -> list[tuple[bytes, bytes]]:
    """The lesson's merges: learned by the lab's trainer from the first S.train_chars of the training text (or the
    ones given, a learner's), cut to what the model's vocabulary uses."""
    train, _ = texts(S.text_chars)
    merges = tokenizer.train_bpe(train[:S.train_chars], S.merges) if merges is None else list(merges)
    check_supported(S, merges)
    return merges


def run(S: Settings, merges=None) -> Learned:
    merges = learn(S, merges)
    _, val = texts(S.text_chars)
    enc = tokenizer.encoding(merges[:S.vocab_size - BYTES])
    ids = enc.encode(val, disallowed_special=())
    lines = "".join(val.splitlines(keepends=True)[:SAMPLE_LINES])
    from tiktoken._educational import bpe_train
    slice_ = texts(S.text_chars)[0][:PARITY_CHARS]
    parity = tokenizer.ranks(tokenizer.train_bpe(slice_, PARITY_MERGES)) == \
        bpe_train(slice_, BYTES + PARITY_MERGES, tokenizer.GPT2_PATTERN, visualise=None)
    return Learned(merges=merges, val_bytes=len(val.encode()), val_tokens=len(ids),
                   round_trip=enc.decode(ids) == val and END_OF_TEXT not in val,
                   sample=enc.decode_tokens_bytes(enc.encode(lines, disallowed_special=())), parity=parity)


def _shown(token: bytes) -> str:
    """A token as a reader sees it: spaces as ·, newlines as ↵."""
    return html.escape(token.decode("utf-8", errors="replace").replace(" ", "·").replace("\n", "↵"))


def sample_html(r: Learned) -> str:
    """The held-out lines, each token on its own colour."""
    colours = ("#dbeafe", "#fde68a", "#bbf7d0", "#fecaca", "#e9d5ff")
    spans = []
    for i, tok in enumerate(r.sample):
        text = html.escape(tok.decode("utf-8", errors="replace"))
        spans.append(f"<span style='background:{colours[i % len(colours)]}'>{text}</span>")
    return ("<pre style='line-height:1.6;white-space:pre-wrap'>" + "".join(spans) + "</pre>"
            "<p><small>Each colour is one token.</small></p>")


def merges_table(r: Learned, n: int = 12) -> str:
    """The first n merges, as markdown: what was joined, and the new token."""
    rows = "\n".join(f"| {i + 1} | `{_shown(a)}` + `{_shown(b)}` | `{_shown(a + b)}` |"
                     for i, (a, b) in enumerate(r.merges[:n]))
    return "| merge | the pair | the new token |\n|---|---|---|\n" + rows


def findings(ledger: Ledger, S: Settings, r: Learned) -> Findings:
    per_token = r.val_bytes / r.val_tokens
    ledger.add("round_trip", f"Every byte comes back: decoding the {r.val_tokens:,} tokens of the held-out text gives "
               "its bytes exactly (counted)", r.round_trip, is_true(), kind="counted")
    ledger.add("parity_tiktoken", f"The lab's trainer learns the same {PARITY_MERGES} merges as tiktoken's own "
               f"educational trainer on the first {PARITY_CHARS:,} characters, pre-tokenised alike (counted)",
               r.parity, is_true(), kind="counted", detail=True)
    ledger.add("bytes_per_token", f"At {S.vocab_size:,} tokens a token of held-out text covers more than two bytes "
               "(bytes ÷ tokens, counted)", per_token, at_least(2.0), kind="counted")
    longest = max((a + b for a, b in r.merges[:S.vocab_size - BYTES]), key=len)
    return Findings([
        f"The commonest pieces of this text: first the runs of spaces that indent Python code, then frequent pairs of "
        f"letters, later whole words. At {S.vocab_size:,} tokens a token covers **{per_token:.1f}** bytes of text it "
        "never saw.",
        "Nothing is lost: every byte is a token before any merge, so any text comes back exactly.",
    ], [f"The longest token at this vocabulary is `{_shown(longest)}`, {len(longest)} bytes.",
        f"Held-out text: {r.val_bytes:,} bytes, {r.val_tokens:,} tokens."])
