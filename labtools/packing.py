"""Documents of different lengths into rows of a fixed length, three ways (lesson 17 compares them):

    PAD      each document alone: its tokens in rows, the last row filled up with padding that no loss counts;
    CONCAT   the documents one after another, an end-of-text token after each, cut into rows: nothing wasted, but a
             row's later documents attend to its earlier ones;
    MASKED   the rows of CONCAT, each token labelled with its document: attention stays inside a document and
             positions count from its start (labtools.model's document mask), as if each were alone.

    rows = pack(docs, row_len, Packing.CONCAT, end=eot_id)     # docs: lists of token ids
    X, Y, doc = rows.batch(rows_index)                         # inputs, targets (-100: no loss), document ids
"""

from dataclasses import dataclass

import torch

from labtools.keys import Key

IGNORE = -100  # a target no loss counts (torch's cross_entropy ignore_index)


class Packing(Key):
    PAD = "pad"
    CONCAT = "concat"
    MASKED = "masked"

    @property
    def label(self) -> str:
        return {"pad": "padding", "concat": "concatenated", "masked": "concatenated + document mask"}[self.value]


@dataclass(frozen=True)
class Rows:
    """Packed rows of row_len + 1 tokens (inputs and, shifted by one, targets), with each token's document (−1 for
    padding) and whether the rows carry the document mask."""
    tokens: torch.Tensor   # (N, row_len + 1) int64
    doc: torch.Tensor      # (N, row_len + 1) int64: the document of each token, −1 for padding
    masked: bool           # MASKED: the model gets doc and keeps attention inside documents
    dropped: int           # tokens of the documents left out (CONCAT's last, partial row)

    @property
    def row_len(self) -> int:
        return self.tokens.size(1) - 1

    @property
    def waste(self) -> float:
        """The share of positions that train nothing: those whose target is padding (the padding itself, and a
        padded document's last token, with nothing after it to predict), and the tokens dropped at the end."""
        idle = int((self.doc[:, 1:] < 0).sum())
        return (idle + self.dropped) / (self.tokens.size(0) * self.row_len + self.dropped)

    def batch(self, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(X, Y, doc) of the rows at index: targets of padding are IGNORE; doc is None unless the rows are masked."""
        t, d = self.tokens[index], self.doc[index]
        X, Y = t[:, :-1], t[:, 1:].clone()
        Y[d[:, 1:] < 0] = IGNORE
        return X, Y, d[:, :-1] if self.masked else None


def pack(docs: list[list[int]], row_len: int, how: Packing, end: int, pad: int = 0) -> Rows:
    """The documents (each a list of token ids, an end-of-text token `end` appended to each) packed `how` into rows
    of row_len inputs."""
    if not isinstance(row_len, int) or isinstance(row_len, bool) or row_len < 2:
        raise ValueError(f"row_len must be an int >= 2, got {row_len!r}")
    how = Packing(how)
    width = row_len + 1  # inputs and the next token
    rows, labels = [], []
    if how == Packing.PAD:
        for i, d in enumerate(docs):
            seq = list(d) + [end]
            for start in range(0, max(len(seq) - 1, 1), row_len):
                chunk = seq[start:start + width]
                rows.append(chunk + [pad] * (width - len(chunk)))
                labels.append([i] * len(chunk) + [-1] * (width - len(chunk)))
        dropped = 0
    else:
        stream, owner = [], []
        for i, d in enumerate(docs):
            stream += list(d) + [end]
            owner += [i] * (len(d) + 1)
        n = (len(stream) - 1) // row_len
        for r in range(n):
            rows.append(stream[r * row_len:r * row_len + width])
            labels.append(owner[r * row_len:r * row_len + width])
        dropped = len(stream) - 1 - n * row_len
    if not rows:
        raise ValueError(f"no row of {row_len} tokens can be made from {sum(map(len, docs)):,} tokens")
    return Rows(torch.tensor(rows, dtype=torch.long), torch.tensor(labels, dtype=torch.long), how == Packing.MASKED,
                dropped)
