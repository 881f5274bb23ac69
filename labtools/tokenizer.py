"""Byte-pair encoding (BPE): the merges learned from a text, and the tokenizer they make.

    merges = train_bpe(text, n_merges)    # [(b"s", b"e"), (b" ", b"t"), ...]: pairs of byte strings, in order
    enc = encoding(merges)                # tiktoken's fast encoder over exactly those merges
    ids = enc.encode(text)                # enc.decode(ids) == text, for any text

Written out for learning (lesson 17, which has the learner write the merge loop). The text is first cut into
pieces by GPT-2's pattern (Radford et al. 2019: words with their leading space, numbers, punctuation, runs of white
space), so that no token spans two words; each distinct piece is counted once, with how often it occurs. Then,
n_merges times: count every adjacent pair of tokens over the pieces (each piece weighted by its count), take the
most frequent pair, and merge it everywhere, left to right. A tie goes to the pair that occurs first in the text,
which is the rule of tiktoken's educational trainer (tiktoken._educational.bpe_train: Python's max() over a
Counter filled in text order); tests/test_tokenizer.py checks that both learn the same merges.

The lab's trainer keeps the pair counts up to date as it merges, instead of counting every pair again for each
merge (the learner's loop may): only the pieces that hold the merged pair change.
"""

from collections import defaultdict
from collections.abc import Iterable

GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
BYTES = 256          # every byte is a token before any merge: ids 0-255
END_OF_TEXT = "<|endoftext|>"


def pieces(text: str, pattern: str = GPT2_PATTERN) -> dict[tuple[bytes, ...], int]:
    """Each distinct piece of the text as a tuple of single bytes, with how often it occurs, in the order of first
    occurrence."""
    import regex
    counts: dict[tuple[bytes, ...], int] = {}
    for piece in regex.findall(pattern, text):
        key = tuple(bytes([b]) for b in piece.encode("utf-8"))
        counts[key] = counts.get(key, 0) + 1
    return counts


def merge_pair(piece: tuple[bytes, ...], pair: tuple[bytes, bytes]) -> tuple[bytes, ...]:
    """The piece with every occurrence of pair merged into one token, left to right (b"aaa" and (a, a): aa, a)."""
    out, i = [], 0
    while i < len(piece):
        if i + 1 < len(piece) and (piece[i], piece[i + 1]) == pair:
            out.append(piece[i] + piece[i + 1])
            i += 2
        else:
            out.append(piece[i])
            i += 1
    return tuple(out)


def train_bpe(text: str, n_merges: int, pattern: str = GPT2_PATTERN) -> list[tuple[bytes, bytes]]:
    """The first n_merges merges BPE learns from text: the most frequent adjacent pair each time, ties to the pair
    that occurs first in the text. Stops early if no pair is left."""
    return train_bpe_pieces(pieces(text, pattern), n_merges)


def train_bpe_pieces(counted: dict[tuple[bytes, ...], int], n_merges: int) -> list[tuple[bytes, bytes]]:
    """train_bpe on pieces already cut and counted ({tuple of byte tokens: count}, in the order of first
    occurrence)."""
    if not isinstance(n_merges, int) or isinstance(n_merges, bool) or n_merges < 0:
        raise ValueError(f"n_merges must be an int >= 0, got {n_merges!r}")
    words = [[list(p), c] for p, c in counted.items()]  # [tokens, count], first occurrence first
    counts: dict[tuple[bytes, bytes], int] = defaultdict(int)
    where: dict[tuple[bytes, bytes], set[int]] = defaultdict(set)  # the pieces a pair occurs in
    for w, (tokens, c) in enumerate(words):
        for pair in zip(tokens, tokens[1:]):
            counts[pair] += c
            where[pair].add(w)
    merges = []
    for _ in range(n_merges):
        if not counts:
            break
        top = max(counts.values())
        tied = [p for p, c in counts.items() if c == top]
        best = tied[0] if len(tied) == 1 else min(tied, key=lambda p: _first(words, where[p], p))
        merges.append(best)
        for w in sorted(where.pop(best)):
            tokens, c = words[w]
            for pair in zip(tokens, tokens[1:]):  # the piece's old pairs out ...
                counts[pair] -= c
                where[pair].discard(w)
                if counts[pair] == 0:
                    del counts[pair]
                    del where[pair]
            tokens = list(merge_pair(tuple(tokens), best))
            words[w][0] = tokens
            for pair in zip(tokens, tokens[1:]):  # ... and its new ones in
                counts[pair] += c
                where[pair].add(w)
        counts.pop(best, None)
    return merges


def _first(words: list, holders: set[int], pair: tuple[bytes, bytes]) -> tuple[int, int]:
    """Where a pair first occurs in the text: (piece, position), the order Python's Counter would meet it in."""
    w = min(holders)
    tokens = words[w][0]
    return w, next(i for i, p in enumerate(zip(tokens, tokens[1:])) if p == pair)


def ranks(merges: Iterable[tuple[bytes, bytes]]) -> dict[bytes, int]:
    """Token bytes -> id: the 256 single bytes, then each merge's result in the order it was learned."""
    out = {bytes([b]): b for b in range(BYTES)}
    for a, b in merges:
        if a + b not in out:
            out[a + b] = len(out)
    return out


def encoding(merges: list[tuple[bytes, bytes]], pattern: str = GPT2_PATTERN, name: str = "lab-bpe"):
    """A tiktoken Encoding that applies exactly these merges (its fast encoder, written in Rust), with an
    end-of-text token after the merged ones."""
    import tiktoken
    table = ranks(merges)
    return tiktoken.Encoding(name, pat_str=pattern, mergeable_ranks=table, special_tokens={END_OF_TEXT: len(table)})


def bits_per_byte(mean_nats_per_token: float, tokens: int, n_bytes: int) -> float:
    """A loss per token turned into bits per byte of text: comparable across tokenizers, since every one must
    describe the same bytes (nats -> bits: divide by ln 2)."""
    import math
    if tokens < 1 or n_bytes < 1:
        raise ValueError(f"tokens and n_bytes must be >= 1, got {tokens}, {n_bytes}")
    return mean_nats_per_token * tokens / (n_bytes * math.log(2))


def encode_python(text: str, table: dict[bytes, int], pattern: str = GPT2_PATTERN,
                  cache: dict[str, list[int]] | None = None) -> list[int]:
    """Text -> ids in plain Python, as GPT-2's own encoder did: each piece's bytes merged lowest rank first until no
    merge applies; a piece seen before comes from `cache`. The same ids as encoding(...).encode (tested); the lab
    uses it to time a Python tokenizer in a data loader."""
    import regex
    cache = {} if cache is None else cache
    out = []
    for piece in regex.findall(pattern, text):
        ids = cache.get(piece)
        if ids is None:
            parts = [bytes([b]) for b in piece.encode("utf-8")]
            while len(parts) > 1:
                ranked = [(table.get(a + b, None), i) for i, (a, b) in enumerate(zip(parts, parts[1:]))]
                rank, i = min(((r, i) for r, i in ranked if r is not None), default=(None, None))
                if rank is None:
                    break
                parts[i:i + 2] = [parts[i] + parts[i + 1]]
            ids = cache[piece] = [table[p] for p in parts]
        out += ids
    return out
