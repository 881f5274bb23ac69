"""labtools.tokenizer and labtools.packing: the lab's BPE against tiktoken's own trainer and encoder, bits per byte,
the three ways of packing documents, and the model's document mask against each document alone."""

import math

import pytest
import torch
from tiktoken._educational import bpe_train

from labtools import tokenizer
from labtools.data import stdlib_documents, stdlib_text
from labtools.model import GPT, GPTConfig, document_positions
from labtools.packing import IGNORE, Packing, pack


@pytest.mark.parametrize("start, chars, merges", [(0, 3_000, 80), (50_000, 12_000, 150)])
def test_the_labs_trainer_learns_tiktokens_merges_in_the_same_order(start, chars, merges):
    text = stdlib_text(start + chars)[start:]
    ours = tokenizer.ranks(tokenizer.train_bpe(text, merges))
    assert ours == bpe_train(text, tokenizer.BYTES + merges, tokenizer.GPT2_PATTERN, visualise=None)


def test_a_tie_goes_to_the_pair_met_first_and_overlaps_merge_left_to_right():
    assert tokenizer.train_bpe("xyab abxy", 1) == [(b"x", b"y")]  # x y and a b twice each: x y is met first
    assert tokenizer.merge_pair((b"a", b"a", b"a"), (b"a", b"a")) == (b"aa", b"a")
    assert tokenizer.train_bpe("ab", 5) == [(b"a", b"b")]  # stops when no pair is left


def test_encoding_round_trips_every_byte_and_the_python_encoder_gives_tiktokens_ids():
    merges = tokenizer.train_bpe(stdlib_text(30_000), 200)
    enc, table = tokenizer.encoding(merges), tokenizer.ranks(merges)
    text = stdlib_text(60_000)[30_000:] + " naïve café 東京 🙂"  # unseen text, and bytes outside ASCII
    ids = enc.encode(text, disallowed_special=())
    assert enc.decode(ids) == text
    assert tokenizer.encode_python(text, table) == ids
    assert enc.eot_token == tokenizer.BYTES + len(merges) and enc.n_vocab == tokenizer.BYTES + len(merges) + 1


def test_bits_per_byte_converts_nats_per_token_and_refuses_empty_text():
    assert tokenizer.bits_per_byte(math.log(2), 10, 10) == pytest.approx(1.0)
    assert tokenizer.bits_per_byte(math.log(2), 10, 20) == pytest.approx(0.5)  # two bytes a token: half a bit each
    with pytest.raises(ValueError, match="n_bytes"):
        tokenizer.bits_per_byte(1.0, 10, 0)


def test_packing_wastes_what_it_pads_and_concatenation_wastes_only_its_tail():
    docs = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10], [11]]
    padded = pack(docs, 4, Packing.PAD, end=99)
    # [1 2 3 99 pad], [4 5 6 7 8], [8 9 10 99 pad], [11 99 pad pad pad]: 5 of the 16 targets are padding
    assert padded.tokens.tolist()[0] == [1, 2, 3, 99, 0] and padded.waste == pytest.approx(5 / 16)
    X, Y, doc = padded.batch(torch.arange(4))
    assert doc is None and (Y == IGNORE).sum() == 5 and Y[0].tolist() == [2, 3, 99, IGNORE]
    joined = pack(docs, 4, Packing.CONCAT, end=99)  # 14 tokens: 3 rows of 4 inputs, 1 token left over
    assert joined.tokens.size(0) == 3 and joined.dropped == 1 and joined.waste == pytest.approx(1 / 13)
    masked = pack(docs, 4, Packing.MASKED, end=99)
    assert masked.batch(torch.arange(1))[2].tolist() == [[0, 0, 0, 0]] and masked.doc[1].tolist()[:3] == [1, 1, 1]
    with pytest.raises(ValueError, match="row_len"):
        pack(docs, 1, Packing.PAD, end=99)


def test_the_document_mask_makes_each_document_what_it_would_be_alone():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=40, block_size=16, n_layer=2, n_head=2, n_embd=32))
    x = torch.randint(40, (2, 16))
    doc = torch.tensor([[0] * 5 + [1] * 11, [0] * 16])
    assert document_positions(doc)[0].tolist() == list(range(5)) + list(range(11))
    logits, _ = model(x, doc=doc)
    alone = model(x[:1, 5:])[0]
    assert (logits[0, 5:] - alone[0]).abs().max() < 1e-5  # the second document, as if it were alone
    assert (logits[1] - model(x[1:])[0][0]).abs().max() < 1e-5  # one document: the plain causal model
    unmasked = model(x)[0]
    assert (unmasked[0, 5:] - alone[0]).abs().max() > 1e-3  # without the mask it sees the first document


def test_the_standard_librarys_documents_are_its_text():
    docs = stdlib_documents(200_000)
    assert "".join(t for _, t in docs) == stdlib_text(200_000) and all(n.endswith(".py") for n, _ in docs)
