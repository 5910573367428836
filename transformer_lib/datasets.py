"""Synthetic sequence-to-sequence tasks, generated on the spot so that nothing is downloaded:
human-written dates -> ISO 8601 dates (the classic attention demo of neural machine
translation courses), and copying or reversing digit strings.

Every generator takes a seed and uses its own `random.Random`, so the same seed gives the
same data on every machine. Text is split into characters; `CharVocab` maps them to ids,
with <pad> = 0, <bos> = 1, <eos> = 2 first.
"""

from __future__ import annotations

import datetime as dt
import random
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

PAD, BOS, EOS = "<pad>", "<bos>", "<eos>"

# ---------------------------------------------------------------------------------------
# The character vocabulary
# ---------------------------------------------------------------------------------------


class CharVocab:
    """One id per character, after three special tokens: <pad> 0, <bos> 1, <eos> 2."""

    def __init__(self, chars: Iterable[str]):
        chars = sorted(set(chars))
        for c in chars:
            if len(c) != 1:
                raise ValueError(f"CharVocab takes single characters, got {c!r}")
        self.itos: list[str] = [PAD, BOS, EOS, *chars]
        self.stoi: dict[str, int] = {s: i for i, s in enumerate(self.itos)}
        self.pad_id, self.bos_id, self.eos_id = 0, 1, 2

    def __len__(self) -> int:
        return len(self.itos)

    def __repr__(self) -> str:
        return f"CharVocab({len(self)} tokens: 3 specials + {''.join(self.itos[3:])!r})"

    def encode(self, text: str, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        unknown = sorted({c for c in text if c not in self.stoi or self.stoi[c] < 3})
        if unknown:
            raise ValueError(f"characters not in the vocabulary: {unknown} (in {text!r})")
        ids = [self.stoi[c] for c in text]
        return ([self.bos_id] if add_bos else []) + ids + ([self.eos_id] if add_eos else [])

    def decode(self, ids: Iterable[int] | torch.Tensor) -> str:
        """Ids -> text: stops at the first <eos>, skips <pad> and <bos>."""
        if isinstance(ids, torch.Tensor):
            if ids.dim() != 1:
                raise ValueError(f"decode takes one sequence of ids, got shape {list(ids.shape)}")
            ids = ids.tolist()
        out = []
        for i in ids:
            if not 0 <= i < len(self.itos):
                raise ValueError(f"id {i} is outside the vocabulary [0, {len(self.itos)})")
            if i == self.eos_id:
                break
            if i in (self.pad_id, self.bos_id):
                continue
            out.append(self.itos[i])
        return "".join(out)

    def pad_batch(self, sequences: Sequence[Sequence[int]]) -> torch.Tensor:
        """Right-pad lists of ids with <pad> into one [batch, longest] tensor."""
        if not sequences:
            raise ValueError("pad_batch needs at least one sequence")
        longest = max(len(s) for s in sequences)
        out = torch.full((len(sequences), longest), self.pad_id, dtype=torch.long)  # [batch, longest]
        for b, s in enumerate(sequences):
            out[b, : len(s)] = torch.as_tensor(list(s), dtype=torch.long)
        return out

    def encode_batch(self, texts: Sequence[str], add_bos: bool = False, add_eos: bool = False) -> torch.Tensor:
        return self.pad_batch([self.encode(t, add_bos, add_eos) for t in texts])

    def decode_batch(self, ids: torch.Tensor) -> list[str]:
        return [self.decode(row) for row in ids]


# ---------------------------------------------------------------------------------------
# Dates: many human formats -> one ISO format
# ---------------------------------------------------------------------------------------

MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August",
          "September", "October", "November", "December"]
WEEKDAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
# Two-digit years are read the way Python's strptime reads %y (69-99 -> 19xx, 00-68 -> 20xx),
# so every year in this range is unambiguous in every format.
FIRST_YEAR, LAST_YEAR = 1970, 2060


def _ordinal(day: int) -> str:
    if 11 <= day % 100 <= 13:
        return f"{day}th"
    suffix = {1: "st", 2: "nd", 3: "rd"}.get(day % 10, "th")
    return f"{day}{suffix}"


# Month names are written out here rather than with strftime("%B"), which follows the
# machine's locale: the data must be the same everywhere.
DATE_FORMATS: dict[str, Callable[[dt.date], str]] = {
    "3 March 2021": lambda d: f"{d.day} {MONTHS[d.month - 1]} {d.year}",
    "3 MARCH 2021": lambda d: f"{d.day} {MONTHS[d.month - 1].upper()} {d.year}",
    "March 3, 2021": lambda d: f"{MONTHS[d.month - 1]} {d.day}, {d.year}",
    "March 3rd, 2021": lambda d: f"{MONTHS[d.month - 1]} {_ordinal(d.day)}, {d.year}",
    "Wed, 3 Mar 2021": lambda d: f"{WEEKDAYS[d.weekday()][:3]}, {d.day} {MONTHS[d.month - 1][:3]} {d.year}",
    "03-Mar-2021": lambda d: f"{d.day:02d}-{MONTHS[d.month - 1][:3]}-{d.year}",
    "Mar 3 '21": lambda d: f"{MONTHS[d.month - 1][:3]} {d.day} '{d.year % 100:02d}",
    "03/03/21": lambda d: f"{d.month:02d}/{d.day:02d}/{d.year % 100:02d}",  # US: month first
    "3/3/2021": lambda d: f"{d.month}/{d.day}/{d.year}",  # US: month first
    "3.3.2021": lambda d: f"{d.day}.{d.month}.{d.year}",  # European: day first
    "2021/03/03": lambda d: f"{d.year}/{d.month:02d}/{d.day:02d}",
    "2021年3月3日": lambda d: f"{d.year}年{d.month}月{d.day}日",
}

# How Python's datetime reads each format back (the tests use these to prove the data right).
# The ordinal format has no strptime code: its suffix (st/nd/rd/th) is removed first.
STRPTIME_FORMATS: dict[str, str] = {
    "3 March 2021": "%d %B %Y",
    "3 MARCH 2021": "%d %B %Y",
    "March 3, 2021": "%B %d, %Y",
    "March 3rd, 2021": "%B %d, %Y",
    "Wed, 3 Mar 2021": "%a, %d %b %Y",
    "03-Mar-2021": "%d-%b-%Y",
    "Mar 3 '21": "%b %d '%y",
    "03/03/21": "%m/%d/%y",
    "3/3/2021": "%m/%d/%Y",
    "3.3.2021": "%d.%m.%Y",
    "2021/03/03": "%Y/%m/%d",
    "2021年3月3日": "%Y年%m月%d日",
}


def format_date(date: dt.date, fmt: str) -> str:
    """Write `date` in one of DATE_FORMATS (named by how it writes 3 March 2021)."""
    if fmt not in DATE_FORMATS:
        raise ValueError(f"unknown date format {fmt!r}; choose one of {list(DATE_FORMATS)}")
    return DATE_FORMATS[fmt](date)


def date_vocab() -> CharVocab:
    """Every character any date format can produce (the ISO targets need only digits and '-')."""
    chars = set("0123456789 ,./-'年月日")
    for name in MONTHS + WEEKDAYS:
        chars |= set(name) | set(name.upper())
    for day in range(1, 32):
        chars |= set(_ordinal(day))
    return CharVocab(chars)


def all_dates(first_year: int = FIRST_YEAR, last_year: int = LAST_YEAR) -> list[dt.date]:
    if not FIRST_YEAR <= first_year <= last_year <= LAST_YEAR:
        raise ValueError(f"years must satisfy {FIRST_YEAR} <= first_year <= last_year <= {LAST_YEAR}, "
                         f"got {first_year}, {last_year} (two-digit years are ambiguous outside)")
    day, last = dt.date(first_year, 1, 1), dt.date(last_year, 12, 31)
    return [day + dt.timedelta(days=i) for i in range((last - day).days + 1)]


@dataclass
class Seq2SeqTask:
    """A task as (source text, target text) pairs, its vocabulary, and what the test set holds out."""

    vocab: CharVocab
    train: list[tuple[str, str]]
    test: list[tuple[str, str]]
    held_out: set = field(default_factory=set)  # what the test set is disjoint from the training set by

    @property
    def max_src_len(self) -> int:
        return max(len(s) for s, _ in self.train + self.test)

    @property
    def max_tgt_len(self) -> int:
        return max(len(t) for _, t in self.train + self.test)


def dates_task(n_train: int = 50_000, n_test: int = 1_000, seed: int = 0,
               formats: Sequence[str] | None = None) -> Seq2SeqTask:
    """Human-written dates -> ISO dates ("3 March 2021" -> "2021-03-03").

    `n_test` dates are drawn once and held out: the test set writes each of them in one
    random format, and no training example uses any of them, in any format. So a correct
    answer on the test set is generalisation, not recall.
    """
    formats = list(DATE_FORMATS) if formats is None else list(formats)
    for f in formats:
        if f not in DATE_FORMATS:
            raise ValueError(f"unknown date format {f!r}; choose among {list(DATE_FORMATS)}")
    dates = all_dates()
    if not 0 < n_test < len(dates):
        raise ValueError(f"n_test must be between 1 and {len(dates) - 1}, got {n_test}")
    rng = random.Random(seed)
    test_dates = rng.sample(dates, n_test)
    held_out = set(test_dates)
    train_dates = [d for d in dates if d not in held_out]
    train = []
    for _ in range(n_train):
        d = rng.choice(train_dates)
        train.append((format_date(d, rng.choice(formats)), d.isoformat()))
    test = [(format_date(d, rng.choice(formats)), d.isoformat()) for d in test_dates]
    return Seq2SeqTask(date_vocab(), train, test, held_out)


# ---------------------------------------------------------------------------------------
# Copy and reverse: the smallest sanity checks for a sequence-to-sequence model
# ---------------------------------------------------------------------------------------


def _digit_strings(n: int, min_len: int, max_len: int, rng: random.Random) -> list[str]:
    return ["".join(rng.choice("0123456789") for _ in range(rng.randint(min_len, max_len))) for _ in range(n)]


def sequence_task(kind: str, n_train: int = 20_000, n_test: int = 500, min_len: int = 3, max_len: int = 12,
                  seed: int = 0) -> Seq2SeqTask:
    """kind="copy": the target is the source; kind="reverse": the source read backwards.

    The test strings never occur in the training set.
    """
    transform = {"copy": lambda s: s, "reverse": lambda s: s[::-1]}.get(kind)
    if transform is None:
        raise ValueError(f"kind must be 'copy' or 'reverse', got {kind!r}")
    if not 1 <= min_len <= max_len:
        raise ValueError(f"need 1 <= min_len <= max_len, got {min_len}, {max_len}")
    rng = random.Random(seed)
    test_strings = list(dict.fromkeys(_digit_strings(n_test, min_len, max_len, rng)))
    held_out = set(test_strings)
    train_strings = [s for s in _digit_strings(n_train + n_test, min_len, max_len, rng) if s not in held_out][:n_train]
    pair = lambda s: (s, transform(s))  # noqa: E731
    return Seq2SeqTask(CharVocab("0123456789"), [pair(s) for s in train_strings], [pair(s) for s in test_strings],
                       held_out)


# ---------------------------------------------------------------------------------------
# Tensors and batches
# ---------------------------------------------------------------------------------------


class PairDataset(Dataset):
    """Encoded (source, target) pairs. Sources carry no special tokens; targets end in <eos>
    (the decoder's input gets its <bos> from shift_right, in training.py)."""

    def __init__(self, pairs: Sequence[tuple[str, str]], vocab: CharVocab):
        self.vocab = vocab
        self.items = [(torch.tensor(vocab.encode(s), dtype=torch.long),
                       torch.tensor(vocab.encode(t, add_eos=True), dtype=torch.long)) for s, t in pairs]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.items[i]

    def collate(self, batch: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
        """A list of pairs -> (src [batch, S], tgt [batch, T]), right-padded with <pad>."""
        src = self.vocab.pad_batch([s.tolist() for s, _ in batch])  # [batch, S]
        tgt = self.vocab.pad_batch([t.tolist() for _, t in batch])  # [batch, T]
        return src, tgt


def make_loader(pairs: Sequence[tuple[str, str]], vocab: CharVocab, batch_size: int, shuffle: bool = True,
                seed: int = 0, sampler: Sampler | None = None, drop_last: bool = False) -> DataLoader:
    """A DataLoader of padded (src, tgt) batches. With `sampler` (e.g. a DistributedSampler,
    which shuffles by itself) `shuffle` is ignored; otherwise shuffling follows `seed`."""
    dataset = PairDataset(pairs, vocab)
    if sampler is not None:
        return DataLoader(dataset, batch_size=batch_size, sampler=sampler, collate_fn=dataset.collate,
                          drop_last=drop_last)
    generator = torch.Generator().manual_seed(seed)
    return DataLoader(dataset, batch_size=batch_size, shuffle=shuffle, generator=generator,
                      collate_fn=dataset.collate, drop_last=drop_last)
