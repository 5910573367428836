"""transformer_lib.datasets: the synthetic tasks are right (every date format reads back as
the same date with Python's own datetime), reproducible, and their test sets held out."""

import datetime as dt
import re

import pytest
import torch

from transformer_lib.datasets import (DATE_FORMATS, STRPTIME_FORMATS, WEEKDAYS, CharVocab, PairDataset, all_dates,
                                      date_vocab, dates_task, format_date, make_loader, sequence_task)

EVERY_37TH_DATE = all_dates()[::37]  # about 900 dates spread over every year, month and weekday


@pytest.fixture(scope="module")
def task():
    return dates_task(n_train=3000, n_test=300, seed=0)


# ---------------------------------------------------------------- the dates themselves


def test_each_format_is_named_by_how_it_writes_3_march_2021():
    for name in DATE_FORMATS:
        assert format_date(dt.date(2021, 3, 3), name) == name


@pytest.mark.parametrize("name", list(DATE_FORMATS))
def test_every_format_reads_back_as_the_same_date_with_strptime(name):
    for date in EVERY_37TH_DATE:
        text = format_date(date, name)
        readable = re.sub(r"(\d)(st|nd|rd|th)\b", r"\1", text)  # strptime has no code for "3rd"
        assert dt.datetime.strptime(readable, STRPTIME_FORMATS[name]).date() == date, (name, text)


def test_weekdays_are_the_dates_own():
    # strptime reads %a but does not check it against the date: check it here.
    for date in EVERY_37TH_DATE:
        assert format_date(date, "Wed, 3 Mar 2021").startswith(WEEKDAYS[date.weekday()][:3] + ",")


def test_ordinal_suffixes():
    got = [format_date(dt.date(2021, 1, d), "March 3rd, 2021").split()[1] for d in (1, 2, 3, 4, 11, 12, 13, 21, 22, 23, 31)]
    assert got == ["1st,", "2nd,", "3rd,", "4th,", "11th,", "12th,", "13th,", "21st,", "22nd,", "23rd,", "31st,"]


def test_targets_are_iso_dates(task):
    for source, target in task.train[:500] + task.test:
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", target)
        dt.date.fromisoformat(target)


def test_unknown_format_and_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="unknown date format"):
        format_date(dt.date(2021, 3, 3), "3rd of March")
    with pytest.raises(ValueError, match="unknown date format"):
        dates_task(n_train=10, n_test=5, formats=["3/3/21"])
    with pytest.raises(ValueError, match="n_test"):
        dates_task(n_train=10, n_test=0)
    with pytest.raises(ValueError, match="ambiguous"):
        all_dates(1900, 2000)


# ---------------------------------------------------------------- reproducible, held out


def test_same_seed_same_data_other_seed_other_data(task):
    again = dates_task(n_train=3000, n_test=300, seed=0)
    assert again.train == task.train and again.test == task.test
    other = dates_task(n_train=3000, n_test=300, seed=1)
    assert other.train != task.train and other.test != task.test


def test_test_dates_never_appear_in_training_in_any_format(task):
    test_dates = {target for _, target in task.test}
    train_dates = {target for _, target in task.train}
    assert len(test_dates) == len(task.test) == 300  # one example per held-out date
    assert test_dates == {d.isoformat() for d in task.held_out}
    assert not test_dates & train_dates


def test_every_format_is_used(task):
    # Each format's strptime pattern reads some training sources and not others: all are in use.
    used = set()
    for source, target in task.train:
        for name, pattern in STRPTIME_FORMATS.items():
            readable = re.sub(r"(\d)(st|nd|rd|th)\b", r"\1", source)
            try:
                if dt.datetime.strptime(readable, pattern).date().isoformat() == target:
                    used.add(name)
            except ValueError:
                pass
    assert used == set(DATE_FORMATS)


def test_a_subset_of_formats(task):
    small = dates_task(n_train=200, n_test=20, seed=0, formats=["2021/03/03"])
    assert all(s.replace("/", "-") == t for s, t in small.train + small.test)


# ---------------------------------------------------------------- the vocabulary


def test_special_tokens_come_first():
    vocab = date_vocab()
    assert (vocab.pad_id, vocab.bos_id, vocab.eos_id) == (0, 1, 2)
    assert vocab.itos[:3] == ["<pad>", "<bos>", "<eos>"]
    assert len(vocab) == len(set(vocab.itos))


def test_vocabulary_round_trip(task):
    vocab = task.vocab
    for source, target in task.train[:1000] + task.test:
        assert vocab.decode(vocab.encode(source)) == source
        assert vocab.decode(vocab.encode(target, add_bos=True, add_eos=True)) == target


def test_decode_stops_at_eos_and_skips_pad_and_bos():
    vocab = CharVocab("abc")
    a, b, c = (vocab.stoi[ch] for ch in "abc")
    assert vocab.decode([vocab.bos_id, a, vocab.pad_id, b, vocab.eos_id, c]) == "ab"
    assert vocab.decode(torch.tensor([c, a])) == "ca"
    assert vocab.decode_batch(torch.tensor([[a, vocab.eos_id], [b, c]])) == ["a", "bc"]


def test_unknown_characters_are_named():
    with pytest.raises(ValueError, match=r"\['x'\]"):
        date_vocab().encode("3 March 2021x")
    with pytest.raises(ValueError, match="outside the vocabulary"):
        CharVocab("ab").decode([7])


# ---------------------------------------------------------------- tensors and batches


def test_batches_are_padded_and_targets_end_with_eos(task):
    vocab = task.vocab
    loader = make_loader(task.train[:64], vocab, batch_size=16, seed=0)
    for src, tgt in loader:
        assert src.dtype == tgt.dtype == torch.long and src.shape[0] == tgt.shape[0] <= 16
        lengths = (src != vocab.pad_id).sum(1)
        assert lengths.max() == src.shape[1]  # padded to the longest, no further
        for row, n in zip(src, lengths):
            assert (row[:n] != vocab.pad_id).all() and (row[n:] == vocab.pad_id).all()
        assert (tgt[:, -1] == vocab.eos_id).all()  # ISO dates all have 10 characters, then <eos>
        assert (tgt != vocab.bos_id).all() and (src != vocab.eos_id).all()


def test_loader_order_follows_the_seed(task):
    def first_batch(seed):
        return next(iter(make_loader(task.train[:200], task.vocab, batch_size=8, seed=seed)))[0]

    assert torch.equal(first_batch(3), first_batch(3))
    assert not torch.equal(first_batch(3), first_batch(4))


def test_pair_dataset_encodes_source_plain_and_target_with_eos(task):
    ds = PairDataset(task.test[:3], task.vocab)
    src, tgt = ds[0]
    assert task.vocab.decode(src) == task.test[0][0]
    assert tgt[-1].item() == task.vocab.eos_id and task.vocab.decode(tgt) == task.test[0][1]


# ---------------------------------------------------------------- copy and reverse


@pytest.mark.parametrize("kind", ["copy", "reverse"])
def test_copy_and_reverse(kind):
    t = sequence_task(kind, n_train=500, n_test=50, min_len=2, max_len=6, seed=0)
    for source, target in t.train + t.test:
        assert target == (source if kind == "copy" else source[::-1]) and 2 <= len(source) <= 6
    assert not {s for s, _ in t.test} & {s for s, _ in t.train}
    assert sequence_task(kind, n_train=500, n_test=50, min_len=2, max_len=6, seed=0).train == t.train
    with pytest.raises(ValueError, match="kind"):
        sequence_task("sort")
