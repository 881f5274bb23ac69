"""Lesson 00's plateau claim: the loss stalls at the entropy given only the last token. The measure must tell a
stall from a steady descent, and the level must be that of a first-order model of the source."""

import math

import numpy as np
import torch

from labtools import data
from labtools.train import History
from lessons import training_loop as lesson
from lessons.training_loop import training


def history(loss) -> History:
    return History(step=list(range(len(loss))), loss=[float(x) for x in loss])


def test_the_plateau_measure_tells_a_stall_from_a_steady_descent():
    level, steps = 2.5, 500
    steady = np.linspace(2.8, 1.2, steps)
    stall = np.concatenate([np.linspace(2.8, 2.55, 40), np.linspace(2.55, 2.45, 160), np.linspace(2.45, 1.2, 300)])
    at, below = training.plateau_ratio(history(steady), level)
    assert at / max(1, below) < 1.5  # the claim's bound is 3
    at, below = training.plateau_ratio(history(stall), level)
    assert at / max(1, below) > 3
    at, below = training.plateau_ratio(history(stall), level + 0.4)  # a stall elsewhere is not one at this level
    assert at / max(1, below) < 3


def test_the_last_token_entropy_lies_between_the_entropy_rate_and_the_unigram_entropy():
    corpus = training.synthetic_corpus(lesson.settings("smoke"))
    h1 = training.last_token_entropy(corpus)
    assert corpus.entropy_rate < h1 < training.unigram_entropy(corpus) <= math.log(corpus.vocab_size)


def test_the_last_token_entropy_of_a_first_order_sequence():
    """A sequence where each token fixes the next (a cycle): nothing is left to guess given the last token."""
    rows = torch.arange(64).remainder(4).reshape(2, 32)
    cycle = data.Corpus("cycle", train_data=rows, val_data=rows, itos=list("abcd"))
    assert training.last_token_entropy(cycle) == 0.0
