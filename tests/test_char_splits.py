"""corpus.char_splits(): one fixed 90/10 split of the help prose, the same for every chapter."""


import pytest

from transformer_lib import corpus


@pytest.fixture(scope="module")
def splits():
    return corpus.char_splits()


def test_the_split_is_deterministic(splits):
    assert corpus.char_splits() == splits


def test_train_then_val_is_every_distinct_paragraph_once_in_order(splits):
    train, val = splits
    paragraphs = corpus.pydoc_paragraphs()
    # Nothing lost, nothing reordered: the split is one cut through the distinct paragraphs.
    assert train.split("\n") + val.split("\n") == list(dict.fromkeys(paragraphs))
    assert set(train.split("\n")) | set(val.split("\n")) == set(paragraphs)


def test_the_two_parts_are_disjoint_and_ten_percent_is_validation(splits):
    train, val = splits
    train_paragraphs, val_paragraphs = train.split("\n"), val.split("\n")
    n = len(train_paragraphs) + len(val_paragraphs)
    assert len(val_paragraphs) == -(-n // 10)  # ceil(10%)
    # Disjoint as sets of paragraphs, not only as positions: no validation paragraph was seen in training.
    assert not set(train_paragraphs) & set(val_paragraphs)
    assert 0.08 < len(val) / (len(train) + len(val)) < 0.12


def test_sizes_on_every_python(splits):
    """The course reads a frozen copy of CPython 3.11.7's help text, so these hold on 3.12 and 3.13 too."""
    train, val = splits
    assert (train.count("\n") + 1, val.count("\n") + 1) == (1197, 134)
    assert (len(train), len(val)) == (264_147, 25_885)
    assert f"{len(train):,}" in corpus.char_splits.__doc__ and f"{len(val):,}" in corpus.char_splits.__doc__


def test_the_source_repeats_paragraphs_and_the_split_removes_the_leak(splits):
    # Whole help sections appear under two topics ("while" inside "compound"); a plain cut
    # through the raw paragraphs would put training paragraphs into validation.
    paragraphs = corpus.pydoc_paragraphs()
    n_val = -(-len(paragraphs) // 10)
    assert set(paragraphs[:-n_val]) & set(paragraphs[-n_val:]), "the source no longer repeats itself"
    train, val = splits
    assert not set(train.split("\n")) & set(val.split("\n"))


def test_every_validation_character_occurs_in_training(splits):
    # A character-level model can then read the validation text with the training vocabulary.
    train, val = splits
    assert set(val) <= set(train)
