"""Checkers for chapter 08, tokenization: the out-of-vocabulary rate of a whole-word vocabulary,
the four pieces of byte-pair encoding (pair counts, one merge, the training loop, encoding a
word), BERT's WordPiece encoder (longest match first, `##` continuations, `[UNK]` for a word it
cannot cover), and the embedding table read as a product of one-hot rows with the table.

References are the library's (transformer_lib.tokenization). The BPE references make exactly
the merges Hugging Face tokenizers' BpeTrainer makes, ties included, so a learner whose
trainer passes here can compare their merges with tokenizers' in the notebook and see them
equal. Each checker knows the wrong answers learners often write: distinct words counted
instead of running words, pairs counted across word boundaries or without the word counts,
overlapping merges ("a a a"), ties broken by strings or by first sight, counts never
recomputed, merges replayed in the wrong order, the shortest WordPiece first, [UNK] for one
character instead of the whole word, embeddings as columns... Properties name an error from a
trait of the output (a merge of a pair no word holds, tokens that do not spell the word, [UNK]
beside other pieces, a value above 1), so two mistakes made at once are still diagnosed.
WordPiece's hidden cases include the course's held-out words and a vocabulary of its frequent
pieces, on which the reference cuts exactly as tokenizers' WordPiece model does.

The embedding exercise asks for the product one_hot(ids) @ table, and plain indexing,
table[ids], gives exactly the same numbers. So its checker runs the answer under a PyTorch
dispatch mode that watches which operators touch the table: an answer that picks rows out
of it (indexing, index_select, F.embedding, nn.Embedding, a loop over table[i]) is refused
with that diagnosis, in the notebook and in the grader alike.
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from typing import Any

import torch
import torch.nn.functional as F

from transformer_lib import safe_ast
from transformer_lib.tokenization import (embedding_lookup, encode_word, merge_pair, oov_rate, pair_counts, train_bpe,
                                          word_counts, word_vocabulary, wordpiece_encode)

from . import properties
from .core import Case, Checker, Mistake, Property, randn, seeded

# Sennrich, Haddow and Birch's (2016) toy word table: "low" 5 times, "lower" twice, ...
TOY_COUNTS = {"low": 5, "lower": 2, "newest": 6, "widest": 3}


@functools.lru_cache(maxsize=1)
def _course_text() -> tuple[str, str]:
    from transformer_lib import corpus

    return corpus.char_splits()


def _course_words() -> tuple[list[str], list[str]]:
    from transformer_lib import corpus

    train, val = _course_text()
    return corpus.tokenize(train), corpus.tokenize(val)


def _spelled(word_table: dict) -> dict:
    """{word: count} with every word spelled as a tuple of characters."""
    return {tuple(word): count for word, count in word_table.items()}


# ---------------------------------------------------------------------------------------
# Exercise 1: oov_rate(vocab, words) -> the share of running words not in the vocabulary
# ---------------------------------------------------------------------------------------


def _oov_cases() -> list[Case]:
    train_words, val_words = _course_words()
    return [
        Case("two unknown words in six", ({"the", "cat", "sat"}, "the cat sat on the mat".split())),
        Case("an unknown word that repeats", ({"a", "b"}, ["a", "z", "z", "z", "b"])),
        Case("every word known", ({"x", "y", "z"}, ["x", "y", "x"])),
        Case("the vocabulary as a list", (["to", "be", "or", "not"], "to be or not to be that is the question".split()),
             hidden=True),
        Case("every word unknown", ({"a"}, ["b", "c", "b"]), hidden=True),
        Case("500 most frequent training words, 400 held-out words",
             (word_vocabulary(train_words, 500), val_words[:400]), hidden=True),
    ]


def _oov_distinct_words(vocab, words):
    unknown = {word for word in words if word not in vocab}
    return len(unknown) / len(set(words))


def _oov_percent(vocab, words):
    return 100 * oov_rate(vocab, words)


def _oov_known_share(vocab, words):
    return 1 - oov_rate(vocab, words)


def _oov_over_vocab_size(vocab, words):
    return sum(word not in vocab for word in words) / len(vocab)


def _number(value):
    if isinstance(value, bool):
        return None
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return value.item()
    return value if isinstance(value, (int, float)) else None


def _oov_above_one(case, expected, actual):
    a = _number(actual)
    return a is not None and a > 1 + 1e-9 and expected <= 1


def _oov_complement(case, expected, actual):
    a = _number(actual)
    return a is not None and abs(expected - 0.5) > 1e-6 and abs(a + expected - 1) < 1e-6


check_oov_rate = Checker(
    name="oov_rate",
    reference=oov_rate,
    make_cases=_oov_cases,
    mistakes=[
        Mistake(
            "distinct words counted instead of running words (an unknown word that occurs three times counted once)",
            "Count every word of `words` as it comes, repeats included: sum(w not in vocab for w in words) / len(words).",
            _oov_distinct_words,
        ),
        Mistake(
            "a percentage (0 to 100) instead of a fraction",
            "Return the share as a fraction between 0 and 1; format it as a percentage only when you print it.",
            _oov_percent,
        ),
        Mistake(
            "the share of known words (the in-vocabulary rate), 1 minus the answer",
            "Count the words that are NOT in the vocabulary.",
            _oov_known_share,
        ),
        Mistake(
            "unknown words divided by the vocabulary size instead of by the number of words",
            "Divide by len(words), the number of running words measured.",
            _oov_over_vocab_size,
        ),
    ],
    properties=[
        Property("a value above 1", "A rate is a fraction of the words: between 0 and 1, not a percentage or a count.",
                 _oov_above_one),
        Property("the share of known words (your value and the reference's add up to 1)",
                 "Count the words that are NOT in the vocabulary.", _oov_complement),
    ],
)


# ---------------------------------------------------------------------------------------
# Exercise 2: pair_counts(word_counts) -> {(a, b): count}, each word weighted by its count
# ---------------------------------------------------------------------------------------


def _pair_cases() -> list[Case]:
    train, _ = _course_text()
    corpus_words = dict(list(word_counts(train[:1500]).items())[:40])
    return [
        Case("the classic table low x5, lower x2, newest x6, widest x3", (_spelled(TOY_COUNTS),)),
        Case("a pair twice inside one word: a a a", ({("a", "a", "a"): 1, ("b", "a", "a"): 2},)),
        Case("symbols made by earlier merges", ({("lo", "w"): 5, ("lo", "w", "e", "r"): 2, ("n", "e", "w", "est"): 6},)),
        Case("one-symbol words have no pair", ({("a",): 4, ("a", "b"): 1, ("low",): 7},), hidden=True),
        Case("words that start with a space", ({(" ", "t", "h", "e"): 10, ("t", "h", "e"): 3, (" ", "a"): 4},),
             hidden=True),
        Case("an empty table", ({},), hidden=True),
        Case("40 words of the course text", (_spelled(corpus_words),), hidden=True),
    ]


def _pc_unweighted(word_counts):
    counts = Counter()
    for word in word_counts:
        for pair in zip(word, word[1:]):
            counts[pair] += 1
    return counts


def _pc_across_words(word_counts):
    sequence = [symbol for word, count in word_counts.items() for _ in range(count) for symbol in word]
    return Counter(zip(sequence, sequence[1:]))


def _pc_once_per_word(word_counts):
    counts = Counter()
    for word, count in word_counts.items():
        for pair in set(zip(word, word[1:])):
            counts[pair] += count
    return counts


def _pc_joined(word_counts):
    counts = Counter()
    for word, count in word_counts.items():
        for a, b in zip(word, word[1:]):
            counts[a + b] += count
    return counts


def _pc_last_pair_missing(word_counts):
    counts = Counter()
    for word, count in word_counts.items():
        for i in range(len(word) - 2):
            counts[(word[i], word[i + 1])] += count
    return counts


def _as_pairs(output) -> dict | None:
    """The learner's counts with their keys read back as (a, b) tuples (the grader's copy has
    them as strings); None when a key is not a pair of strings."""
    if not isinstance(output, dict):
        return None
    pairs = {}
    for key, value in output.items():
        try:
            pair = safe_ast.literal_eval(key) if isinstance(key, str) else key
        except (ValueError, SyntaxError):
            return None
        if not (isinstance(pair, tuple) and len(pair) == 2 and all(isinstance(s, str) for s in pair)):
            return None
        pairs[pair] = value
    return pairs


def _pairs_inside_words(word_counts) -> set:
    return {pair for word in word_counts for pair in zip(word, word[1:])}


def _pc_across(case, expected, actual):
    pairs = _as_pairs(actual)
    return pairs is not None and bool(set(pairs) - _pairs_inside_words(case.args[0]))


def _pc_not_pairs(case, expected, actual):
    return isinstance(actual, dict) and bool(actual) and _as_pairs(actual) is None


def _pc_not_weighted(case, expected, actual):
    pairs = _as_pairs(actual)
    if pairs is None:
        return False
    unweighted = _pc_unweighted(case.args[0])
    truth = pair_counts(case.args[0])
    return any(pairs.get(p) == unweighted[p] != truth[p] for p in truth)


check_pair_counts = Checker(
    name="pair_counts",
    reference=pair_counts,
    make_cases=_pair_cases,
    mistakes=[
        Mistake(
            "counts not weighted by word frequency (each distinct word counted once)",
            "Add the word's count, not 1, for every pair it holds: a word seen 5 times holds its pairs 5 times.",
            _pc_unweighted,
        ),
        Mistake(
            "pairs counted across word boundaries (the words read as one long sequence)",
            "Count the pairs inside each word separately: zip(word, word[1:]) for one word at a time.",
            _pc_across_words,
        ),
        Mistake(
            "a pair counted once per word even when the word holds it twice (a a a holds (a, a) twice)",
            "Count every position: loop over zip(word, word[1:]) itself, not over a set of it.",
            _pc_once_per_word,
        ),
        Mistake(
            "pairs stored as one joined string ('lo') instead of the tuple ('l', 'o')",
            "Use the tuple (a, b) as the key: 'l' + 'ow' and 'lo' + 'w' are different pairs with the same string.",
            _pc_joined,
        ),
        Mistake(
            "the last pair of every word left out (range(len(word) - 2))",
            "A word of n symbols holds n - 1 pairs: zip(word, word[1:]) gives them all.",
            _pc_last_pair_missing,
        ),
    ],
    properties=[
        Property("pairs that occur inside no word (counted across word boundaries)",
                 "Count the pairs inside each word separately: zip(word, word[1:]) for one word at a time.",
                 _pc_across),
        Property("keys that are not (a, b) tuples of two symbols",
                 "Key the counts by the pair itself, the tuple (a, b).", _pc_not_pairs),
        Property("counts that ignore how often each word occurs",
                 "Add the word's count for every pair it holds, not 1.", _pc_not_weighted),
    ],
)


# ---------------------------------------------------------------------------------------
# Exercise 3: merge_pair(symbols, pair) -> symbols with every occurrence merged, left to right
# ---------------------------------------------------------------------------------------

NOT_A_TUPLE = {"__type__": "a list: return a tuple (words are dictionary keys, and a list cannot be one)"}


def _invoke_tuple(fn, case: Case):
    out = fn(*case.args, **case.kwargs)
    return NOT_A_TUPLE if isinstance(out, list) else out


def _merge_cases() -> list[Case]:
    return [
        Case("l o w e r, merge (l, o)", (("l", "o", "w", "e", "r"), ("l", "o"))),
        Case("a a a, merge (a, a)", (("a", "a", "a"), ("a", "a"))),
        Case("two occurrences: l o w l o", (("l", "o", "w", "l", "o"), ("l", "o"))),
        Case("a symbol that merely ends with the pair's first half", (("h", "ab", "c", "bc"), ("b", "c"))),
        Case("a a a a", (("a", "a", "a", "a"), ("a", "a")), hidden=True),
        Case("b a a a", (("b", "a", "a", "a"), ("a", "a")), hidden=True),
        Case("an empty word", ((), ("a", "b")), hidden=True),
        Case("one symbol", (("x",), ("x", "y")), hidden=True),
        Case("a leading space", ((" ", "t", "h", "e"), (" ", "t")), hidden=True),
        Case("merged symbols merged again", (("ab", "ab", "ab"), ("ab", "ab")), hidden=True),
        Case("the pair does not occur", (("n", "e", "w", "est"), ("e", "s")), hidden=True),
    ]


def _mp_overlapping(symbols, pair):
    merged, i = [], 0
    while i < len(symbols):
        if i + 1 < len(symbols) and (symbols[i], symbols[i + 1]) == tuple(pair):
            merged.append(pair[0] + pair[1])
        else:
            merged.append(symbols[i])
        i += 1  # one step, even after a match: the second half is used twice
    return tuple(merged)


def _mp_right_to_left(symbols, pair):
    merged, i = [], len(symbols) - 1
    while i >= 0:
        if i >= 1 and (symbols[i - 1], symbols[i]) == tuple(pair):
            merged.append(pair[0] + pair[1])
            i -= 2
        else:
            merged.append(symbols[i])
            i -= 1
    return tuple(reversed(merged))


def _mp_first_only(symbols, pair):
    for i in range(len(symbols) - 1):
        if (symbols[i], symbols[i + 1]) == tuple(pair):
            return tuple(symbols[:i]) + (pair[0] + pair[1],) + tuple(symbols[i + 2:])
    return tuple(symbols)


def _mp_text_replace(symbols, pair):
    text = " ".join(symbols).replace(f"{pair[0]} {pair[1]}", pair[0] + pair[1])
    return tuple(text.split(" "))


def _mp_list(symbols, pair):
    return list(merge_pair(symbols, pair))


def _strings(output) -> list | None:
    if isinstance(output, (tuple, list)) and all(isinstance(s, str) for s in output):
        return list(output)
    return None


def _mp_misspelled(case, expected, actual):
    out = _strings(actual)
    return out is not None and "".join(out) != "".join(case.args[0])


def _mp_left_unmerged(case, expected, actual):
    out = _strings(actual)
    return out is not None and tuple(case.args[1]) in set(zip(out, out[1:]))


def _mp_foreign_symbol(case, expected, actual):
    out = _strings(actual)
    symbols, pair = case.args
    return out is not None and bool(set(out) - set(symbols) - {pair[0] + pair[1]})


check_merge_pair = Checker(
    name="merge_pair",
    reference=merge_pair,
    make_cases=_merge_cases,
    invoke=_invoke_tuple,
    mistakes=[
        Mistake(
            "overlapping merges: after a match the scan moves on by one symbol, so the second half is used again",
            "After a match, skip both halves (i += 2); only a non-match moves on by one.",
            _mp_overlapping,
        ),
        Mistake(
            "merged from right to left: a a a gives (a, aa) instead of (aa, a)",
            "Scan from the start of the word: the leftmost occurrence wins an overlap, as in tokenizers.",
            _mp_right_to_left,
        ),
        Mistake(
            "only the first occurrence merged",
            "Keep scanning after a match: every occurrence of the pair in the word is merged.",
            _mp_first_only,
        ),
        Mistake(
            "text replacement on the symbols joined with spaces: 'ab c' matches the pair (b, c) inside 'ab'",
            "Compare whole symbols, symbols[i] == first and symbols[i + 1] == second, not substrings of a joined text.",
            _mp_text_replace,
        ),
        Mistake(
            "a list returned instead of a tuple",
            "Return tuple(merged): the trainer uses words as dictionary keys, and a list cannot be one.",
            _mp_list,
        ),
    ],
    properties=[
        Property("symbols duplicated or lost (your output does not spell the input)",
                 "After a match, skip both halves (i += 2), and keep every symbol that is not part of a match.",
                 _mp_misspelled),
        Property("an occurrence of the pair left unmerged",
                 "Keep scanning to the end of the word: every occurrence of the pair is merged.", _mp_left_unmerged),
        Property("a symbol that is neither an input symbol nor the merged pair",
                 "Compare whole symbols, never substrings: only symbols[i] + symbols[i + 1] of a match is new.",
                 _mp_foreign_symbol),
    ],
)


# ---------------------------------------------------------------------------------------
# Exercise 4: train_bpe(word_counts, n_merges) -> the merges, in the order learned
# ---------------------------------------------------------------------------------------


def train_bpe_merges(word_counts, n_merges):
    """The library's trainer with the exercise's signature: {word: count}, n_merges -> merges."""
    return train_bpe(word_counts, n_merges)[0]


def _train_cases() -> list[Case]:
    train, _ = _course_text()
    return [
        Case("the classic table, 10 merges", (dict(TOY_COUNTS), 10)),
        Case("a tie between a merged symbol and a character", ({"abc": 2, "ab": 1, "bd": 2}, 3)),
        Case("a merged symbol in second place still wins a tie by its first symbol",
             ({"abc": 2, "bc": 1, "de": 2}, 3)),
        Case("ties between characters", ({"zy": 1, "ba": 1, "Ab": 1}, 3)),
        Case("no pair left before n_merges", ({"ab": 1, "c": 5}, 5)),
        Case("2,000 characters of the course text, 25 merges", (dict(word_counts(train[:2000])), 25), hidden=True),
        Case("words with a leading space", ({" the": 4, "the": 2, " then": 1}, 6), hidden=True),
        Case("no merges asked", (dict(TOY_COUNTS), 0), hidden=True),
        Case("a a a a", ({"aaaa": 3, "aa": 1}, 3), hidden=True),
    ]


def _ids(word_table) -> dict:
    return {ch: i for i, ch in enumerate(sorted({ch for word in word_table for ch in word}))}


def _train_with(word_counts, n_merges, choose):
    """The training loop with `choose(pairs, ids)` picking each merge."""
    words = _spelled(word_counts)
    ids = _ids(word_counts)
    merges = []
    for _ in range(n_merges):
        pairs = pair_counts(words)
        if not pairs:
            break
        best = choose(pairs, ids)
        merges.append(best)
        ids.setdefault(best[0] + best[1], len(ids))
        words = {merge_pair(word, best): count for word, count in words.items()}
    return merges


def _tb_first_seen(word_counts, n_merges):
    return _train_with(word_counts, n_merges, lambda pairs, ids: max(pairs, key=pairs.get))


def _tb_alphabetical(word_counts, n_merges):
    return _train_with(word_counts, n_merges, lambda pairs, ids: min(pairs, key=lambda p: (-pairs[p], p)))


def _tb_characters_first(word_counts, n_merges):
    """Ties to a pair of two characters first, then by ids: the rule 'a pair of two characters
    beats a pair with a merged symbol', which the ids do not follow (("a", "bc") beats ("d", "e"))."""
    n_characters = len(_ids(word_counts))

    def choose(pairs, ids):
        return max(pairs, key=lambda p: (pairs[p], ids[p[0]] < n_characters and ids[p[1]] < n_characters,
                                         -ids[p[0]], -ids[p[1]]))

    return _train_with(word_counts, n_merges, choose)


def _tb_unweighted(word_counts, n_merges):
    return train_bpe_merges({word: 1 for word in word_counts}, n_merges)


def _tb_counted_once(word_counts, n_merges):
    pairs, ids = pair_counts(_spelled(word_counts)), _ids(word_counts)
    return sorted(pairs, key=lambda p: (-pairs[p], ids[p[0]], ids[p[1]]))[:n_merges]


def _tb_table_not_updated(word_counts, n_merges):
    pairs, ids = pair_counts(_spelled(word_counts)), _ids(word_counts)
    if not pairs:
        return []
    return [max(pairs, key=lambda p: (pairs[p], -ids[p[0]], -ids[p[1]]))] * n_merges


def _tb_across_words(word_counts, n_merges):
    text = "".join(word * count for word, count in word_counts.items())
    return train_bpe_merges({text: 1}, n_merges)


def _merge_list(actual) -> list | None:
    if not isinstance(actual, (list, tuple)):
        return None
    merges = []
    for pair in actual:
        if not (isinstance(pair, (list, tuple)) and len(pair) == 2 and all(isinstance(s, str) for s in pair)):
            return None
        merges.append(tuple(pair))
    return merges


def _first_anomaly(case, actual) -> str | None:
    """Replay the learner's merges on the case's word table; the first thing that goes wrong:
    'absent' (the pair is in no word), 'not_top' (a pair with a higher count existed), 'tie'
    (tied at the top count, but not the smallest ids), 'count' (too few or too many merges)."""
    merges = _merge_list(actual)
    if merges is None:
        return None
    word_table, n_merges = case.args
    words, ids = _spelled(word_table), _ids(word_table)
    for pair in merges:
        counts = pair_counts(words)
        if pair not in counts:
            return "absent"
        if counts[pair] < max(counts.values()):
            return "not_top"
        if pair != max(counts, key=lambda p: (counts[p], -ids[p[0]], -ids[p[1]])):
            return "tie"
        ids.setdefault(pair[0] + pair[1], len(ids))
        words = {merge_pair(word, pair): count for word, count in words.items()}
    if len(merges) > n_merges or (len(merges) < n_merges and pair_counts(words)):
        return "count"
    return None


def _anomaly(kind):
    return lambda case, expected, actual: _first_anomaly(case, actual) == kind


check_train_bpe = Checker(
    name="train_bpe",
    reference=train_bpe_merges,
    make_cases=_train_cases,
    mistakes=[
        Mistake(
            "ties broken by which pair was seen first (max(pairs, key=pairs.get), or most_common)",
            "Among pairs with the same count, take the one whose first symbol has the smaller id, then the one whose "
            "second symbol has: characters in code-point order first, then each merge's new symbol in turn.",
            _tb_first_seen,
        ),
        Mistake(
            "ties broken by comparing the strings ('ab' < 'b') instead of the ids",
            "Compare ids, not strings: a character's id is below every merged symbol's, so ('b', 'd') beats "
            "('ab', 'c'). Key: (count, -id[first], -id[second]).",
            _tb_alphabetical,
        ),
        Mistake(
            "counts not weighted by word frequency (each distinct word counted once)",
            "Count each word's pairs as many times as the word occurs: pair_counts weights by the counts.",
            _tb_unweighted,
        ),
        Mistake(
            "pair counts computed once, before the loop, and never again (the merges are just the most frequent "
            "pairs of characters)",
            "Recount the pairs at the start of every iteration, on the word table as the last merge left it.",
            _tb_counted_once,
        ),
        Mistake(
            "the word table not updated after a merge: the same pair is merged again and again",
            "After choosing a pair, replace every word by merge_pair(word, pair) before counting again.",
            _tb_table_not_updated,
        ),
        Mistake(
            "the words glued into one long text, so pairs are counted across word boundaries",
            "Keep the words apart: spell each word as a tuple of characters, and count pairs inside each word.",
            _tb_across_words,
        ),
        Mistake(
            "ties given to pairs of two characters first, whatever their ids",
            "Compare the ids of the first symbols first, and the second symbols only when the first are the same: "
            "('a', 'bc') beats ('d', 'e') because 'a' has the smaller id. Key: (count, -id[first], -id[second]).",
            _tb_characters_first,
        ),
    ],
    properties=[
        Property("a merge of a pair that no word holds at that point (pairs counted across word boundaries, or the "
                 "word table not updated after a merge)",
                 "Count pairs inside each word, and after each merge replace every word by merge_pair(word, pair).",
                 _anomaly("absent")),
        Property("a merge that is not the most frequent pair at its turn (counts not weighted by the word counts, "
                 "or not recounted after a merge)",
                 "Recount the pairs at every iteration, each word's pairs weighted by its count.",
                 _anomaly("not_top")),
        Property("ties broken another way: your pair had the top count, but a pair with the same count has smaller ids",
                 "Break ties by (id of the first symbol, id of the second), smallest first; characters get ids in "
                 "code-point order, merged symbols the next free id.",
                 _anomaly("tie")),
        Property("a different number of merges",
                 "Make exactly n_merges merges, and stop early only when no word has a pair left.",
                 _anomaly("count")),
    ],
)


# ---------------------------------------------------------------------------------------
# Exercise 5: encode_word(word, merges) -> tokens, the merges applied in the order learned
# ---------------------------------------------------------------------------------------

TOY_MERGES = [("e", "s"), ("es", "t"), ("l", "o"), ("lo", "w")]
# What train_bpe learns, written out: the grader runs the whole chapter with every exercise's reference
# hidden (train_bpe and pair_counts among them), so a case may not call them. tests/test_checkers.py
# keeps these equal to train_bpe(dict(TOY_COUNTS), 100) and train_bpe(<the first 6,000 characters of the
# course text>, 60).
TOY_MERGES_ALL = TOY_MERGES + [("e", "w"), ("n", "ew"), ("new", "est"), ("d", "est"), ("i", "dest"), ("w", "idest"),
                               ("e", "r"), ("low", "er")]
COURSE_MERGES_60 = [
    (" ", "t"), (" ", "a"), ("h", "e"), (" ", "i"), (" t", "he"), ("r", "e"), (" ", "o"), ("t", "e"), ("s", "s"),
    ("a", "r"), (" ", "s"), ("l", "e"), ("o", "n"), ("i", "n"), ("r", "i"), (" i", "s"), ("m", "e"), ("c", "e"),
    (" t", "o"), ("ss", "i"), (" ", "c"), ("d", "e"), ("s", "t"), (" ", "e"), ("c", "t"), ("g", "e"), ("n", "t"),
    (" ", "n"), ("a", "l"), ("e", "ct"), (" i", "n"), (" o", "b"), ("j", "ect"), (" t", "ar"), (" a", "n"),
    ("ge", "t"), (" ob", "ject"), (" tar", "get"), ("e", "d"), ("t", "i"), ("b", "u"), ("e", "r"), ("g", "n"),
    ("ssi", "gn"), ("o", "r"), ("in", "g"), (" ", "m"), (" ", "re"), ("a", "n"), (" ", "w"), (" ", '"'), (" a", "s"),
    (" e", "x"), (" ", "b"), (" a", "ssign"), ("me", "nt"), (" ", "("), (" ", "T"), (" ", "p"), ("b", "le"),
]


def _encode_cases() -> list[Case]:
    course_merges = list(COURSE_MERGES_60)
    return [
        Case("lowest, the first 4 merges of the classic table", ("lowest", TOY_MERGES)),
        Case("abc: two merges overlap, the earlier one wins", ("abc", [("b", "c"), ("a", "b")])),
        Case("a pair that occurs twice: lolol", ("lolol", [("l", "o")])),
        Case("the course's word ' statement', 60 merges", (" statement", course_merges), hidden=True),
        Case("the course's word ' functions', 60 merges", (" functions", course_merges), hidden=True),
        Case("no merges at all", ("newest", []), hidden=True),
        Case("one character", ("a", TOY_MERGES), hidden=True),
        Case("characters no merge knows", ("zq", TOY_MERGES), hidden=True),
        Case("every merge of the classic table", ("slowest", list(TOY_MERGES_ALL)), hidden=True),
    ]


def _ew_reversed(word, merges):
    symbols = tuple(word)
    for pair in reversed(merges):
        symbols = merge_pair(symbols, pair)
    return list(symbols)


def _ew_longest_match(word, merges):
    vocab = set(word) | {a + b for a, b in merges}
    tokens, i = [], 0
    while i < len(word):
        end = next(j for j in range(len(word), i, -1) if word[i:j] in vocab)
        tokens.append(word[i:end])
        i = end
    return tokens


def _ew_first_occurrence(word, merges):
    symbols = list(word)
    for a, b in merges:
        for i in range(len(symbols) - 1):
            if symbols[i] == a and symbols[i + 1] == b:
                symbols[i:i + 2] = [a + b]
                break
    return symbols


def _ew_misspelled(case, expected, actual):
    out = _strings(actual)
    return out is not None and "".join(out) != case.args[0]


def _ew_unknown_token(case, expected, actual):
    out = _strings(actual)
    word, merges = case.args
    return out is not None and bool(set(out) - set(word) - {a + b for a, b in merges})


def _ew_merge_skipped(case, expected, actual):
    out = _strings(actual)
    return out is not None and bool(set(zip(out, out[1:])) & {tuple(m) for m in case.args[1]})


check_encode_word = Checker(
    name="encode_word",
    reference=encode_word,
    make_cases=_encode_cases,
    mistakes=[
        Mistake(
            "merges applied in the wrong order (the last learned first)",
            "Replay the merges in the order they were learned: merges[0] first, as training made them.",
            _ew_reversed,
        ),
        Mistake(
            "longest match first against the vocabulary (that is how WordPiece encodes, not BPE)",
            "BPE replays its merges: start from the characters and apply each merge in turn; never search the "
            "vocabulary for the longest piece.",
            _ew_longest_match,
        ),
        Mistake(
            "each merge applied to its first occurrence only",
            "Merge every occurrence of the pair (merge_pair does), not just the first.",
            _ew_first_occurrence,
        ),
    ],
    properties=[
        Property("tokens that do not spell the word", "Merging only glues neighbours: ''.join(tokens) must be the word.",
                 _ew_misspelled),
        Property("a token that is neither a character of the word nor the result of a merge",
                 "Every token is a character of the word or first + second of some merge.", _ew_unknown_token),
        Property("two neighbouring tokens that one of the merges joins (a merge skipped)",
                 "Apply every merge, in order, to every occurrence.", _ew_merge_skipped),
    ],
)


# ---------------------------------------------------------------------------------------
# Exercise 6: wordpiece_encode(word, vocab, unk, prefix, max_chars) -> WordPiece tokens
# ---------------------------------------------------------------------------------------

# A vocabulary in which the longest piece, the shortest piece, a bare piece and its "##" form
# all lead to different answers: "unhashable" is un ##hash ##able; shortest first it is
# u ##n ##h ...; looked up without "##" it is un hash able.
TOY_WORDPIECE = frozenset({
    "[UNK]", "u", "un", "h", "hash", "a", "able", "s",
    "##n", "##h", "##has", "##hash", "##a", "##ab", "##able", "##s", "##l", "##e", "##es", "##b",
})


@functools.lru_cache(maxsize=1)
def _course_wordpiece() -> tuple[tuple[str, ...], dict]:
    """Held-out words of the course text (BERT's split at spaces and punctuation), and a vocabulary
    {token: id}, as BERT's vocab.txt reads, of the 150 most frequent word starts and the 150 most
    frequent pieces inside words (with ##) of a piece of the training text, up to 6 characters each.

    Built by counting, not with tokenizers' WordPieceTrainer: that trainer numbers the "##"
    characters in the order of a hash map, so its ties, and its vocabulary, change from one process
    to the next, and the grader builds the cases once in the learner's process and once in its own."""
    from tokenizers import pre_tokenizers

    train, val = _course_text()
    split = pre_tokenizers.BertPreTokenizer().pre_tokenize_str
    starts, inside = Counter(), Counter()
    for word, count in Counter(w for w, _ in split(train[:20000])).items():
        for end in range(1, min(len(word), 6) + 1):
            starts[word[:end]] += count
        for i in range(1, len(word)):
            for end in range(i + 1, min(len(word), i + 6) + 1):
                inside[word[i:end]] += count

    def top(counts):  # the 150 most frequent, ties in string order
        return sorted(counts, key=lambda piece: (-counts[piece], piece))[:150]

    tokens = ["[UNK]"] + top(starts) + ["##" + piece for piece in top(inside)]
    words = dict.fromkeys(w for w, _ in split(val[:3000]))
    return tuple(words), {token: i for i, token in enumerate(tokens)}


def _wordpiece_cases() -> list[Case]:
    words, course_vocab = _course_wordpiece()
    toy = set(TOY_WORDPIECE)
    at_signs = {"[UNK]", "un", "@@hash", "@@able", "##hash", "##able", "hash", "able"}
    return [
        Case("unhashable", ("unhashable", toy)),
        Case("hashes", ("hashes", toy)),
        Case("a character no piece covers: unhash?able", ("unhash?able", toy)),
        Case("a word that starts with a piece known only inside words: bash", ("bash", toy)),
        Case("a word of exactly max_chars characters", ("aaaa", {"a", "##a"}), {"max_chars": 4}),
        Case("a word longer than max_chars", ("unhashables", toy), {"max_chars": 10}),
        Case("an empty word", ("", toy), hidden=True),
        Case("a one-character word", ("a", toy), hidden=True),
        Case("BERT's vocabulary as a dict {token: id}", ("unhashables", {t: i for i, t in enumerate(sorted(toy))}),
             hidden=True),
        Case("another prefix and unknown token", ("unhashable", at_signs), {"unk": "<unk>", "prefix": "@@"},
             hidden=True),
        Case("another unknown token, a word it cannot cover", ("unhashed", at_signs), {"unk": "<unk>", "prefix": "@@"},
             hidden=True),
        Case("non-ASCII characters", ("naïve", {"na", "##ï", "##ve", "##v", "##e", "n"}), hidden=True),
        Case(f"{len(words)} held-out words of the course text, a vocabulary of 300 frequent pieces",
             (list(words), course_vocab), hidden=True),
    ]


def _invoke_each_word(fn, case: Case):
    """A case holds one word, or a list of words encoded one by one (a list of token lists)."""
    first, *rest = case.args
    if isinstance(first, list):
        return [fn(word, *rest, **case.kwargs) for word in first]
    return fn(first, *rest, **case.kwargs)


def _wp_options(kwargs) -> tuple[str, str, int]:
    return kwargs.get("unk", "[UNK]"), kwargs.get("prefix", "##"), kwargs.get("max_chars", 100)


def _wp_shortest_first(word, vocab, unk="[UNK]", prefix="##", max_chars=100):
    if len(word) > max_chars:
        return [unk]
    tokens, start = [], 0
    while start < len(word):
        for end in range(start + 1, len(word) + 1):  # the shortest candidate first
            piece = word[start:end] if start == 0 else prefix + word[start:end]
            if piece in vocab:
                break
        else:
            return [unk]
        tokens.append(piece)
        start = end
    return tokens


def _wp_no_prefix(word, vocab, unk="[UNK]", prefix="##", max_chars=100):
    return wordpiece_encode(word, vocab, unk, "", max_chars)


def _wp_unk_per_gap(word, vocab, unk="[UNK]", prefix="##", max_chars=100):
    if len(word) > max_chars:
        return [unk]
    tokens, start = [], 0
    while start < len(word):
        for end in range(len(word), start, -1):
            piece = word[start:end] if start == 0 else prefix + word[start:end]
            if piece in vocab:
                tokens.append(piece)
                start = end
                break
        else:
            tokens.append(unk)  # only the uncovered character is unknown, and the search goes on
            start += 1
    return tokens


def _wp_pieces_then_unk(word, vocab, unk="[UNK]", prefix="##", max_chars=100):
    if len(word) > max_chars:
        return [unk]
    tokens, start = [], 0
    while start < len(word):
        for end in range(len(word), start, -1):
            piece = word[start:end] if start == 0 else prefix + word[start:end]
            if piece in vocab:
                break
        else:
            return tokens + [unk]  # the pieces found so far are kept
        tokens.append(piece)
        start = end
    return tokens


def _wp_one_step(word, vocab, unk="[UNK]", prefix="##", max_chars=100):
    if len(word) > max_chars:
        return [unk]
    tokens, start = [], 0
    while start < len(word):
        for end in range(len(word), start, -1):
            piece = word[start:end] if start == 0 else prefix + word[start:end]
            if piece in vocab:
                break
        else:
            return [unk]
        tokens.append(piece)
        start += 1  # one character on, not past the piece: the next piece overlaps this one
    return tokens


def _wp_prefix_everywhere(word, vocab, unk="[UNK]", prefix="##", max_chars=100):
    if len(word) > max_chars:
        return [unk]
    tokens, start = [], 0
    while start < len(word):
        for end in range(len(word), start, -1):
            piece = prefix + word[start:end]  # the first piece marked as a continuation too
            if piece in vocab:
                break
        else:
            return [unk]
        tokens.append(piece)
        start = end
    return tokens


def _wp_limit_off_by_one(word, vocab, unk="[UNK]", prefix="##", max_chars=100):
    return [unk] if len(word) >= max_chars else wordpiece_encode(word, vocab, unk, prefix, max_chars)


def _wp_no_limit(word, vocab, unk="[UNK]", prefix="##", max_chars=100):
    return wordpiece_encode(word, vocab, unk, prefix, max_chars=math.inf)


def _wp_unk_as_string(word, vocab, unk="[UNK]", prefix="##", max_chars=100):
    tokens = wordpiece_encode(word, vocab, unk, prefix, max_chars)
    return unk if tokens == [unk] else tokens


def _wp_unknown_dropped(word, vocab, unk="[UNK]", prefix="##", max_chars=100):
    tokens = wordpiece_encode(word, vocab, unk, prefix, max_chars)
    return [] if tokens == [unk] else tokens


def _wp_results(case, expected, actual):
    """(word, vocab, expected tokens, actual tokens) for each word of a case; nothing when the
    output is not a list of strings (or, for a case of many words, a list of such lists)."""
    first, vocab = case.args
    words = first if isinstance(first, list) else [first]
    exp = expected if isinstance(first, list) else [expected]
    act = actual if isinstance(first, list) else [actual]
    if not isinstance(act, (list, tuple)) or len(act) != len(words):
        return []
    return [(w, vocab, e, list(a)) for w, e, a in zip(words, exp, act)
            if isinstance(a, (list, tuple)) and all(isinstance(t, str) for t in a)]


def _wp_unk_beside_pieces(case, expected, actual):
    unk, _, _ = _wp_options(case.kwargs)
    return any(unk in a and len(a) > 1 for _, _, _, a in _wp_results(case, expected, actual))


def _wp_bare_continuation(case, expected, actual):
    unk, prefix, _ = _wp_options(case.kwargs)
    return any(t != unk and not t.startswith(prefix) for _, _, _, a in _wp_results(case, expected, actual)
               for t in a[1:])


def _wp_prefixed_first(case, expected, actual):
    _, prefix, _ = _wp_options(case.kwargs)
    return any(a and a[0].startswith(prefix) and not w.startswith(prefix)
               for w, _, _, a in _wp_results(case, expected, actual))


def _lengths(word, tokens, prefix) -> list[int]:
    """How many characters of the word each token stands for: its length without the prefix (a first
    token that carries one, wrongly, included, unless the word itself starts with the prefix)."""
    return [len(t) - len(prefix) if t.startswith(prefix) and (i or not word.startswith(prefix)) else len(t)
            for i, t in enumerate(tokens)]


def _spelling(word, tokens, unk, prefix):
    """The word the tokens spell, the prefixes taken off; None when a token is unknown."""
    if unk in tokens:
        return None
    return "".join(t[len(t) - n:] for t, n in zip(tokens, _lengths(word, tokens, prefix)))


def _wp_misspelled(case, expected, actual):
    unk, prefix, _ = _wp_options(case.kwargs)
    return any(a and _spelling(w, a, unk, prefix) not in (None, w) for w, _, _, a in _wp_results(case, expected, actual))


def _wp_shorter_than_longest(case, expected, actual):
    """A piece that is shorter than the longest vocabulary piece at the same place."""
    unk, prefix, _ = _wp_options(case.kwargs)
    for word, vocab, _, tokens in _wp_results(case, expected, actual):
        marked_right = not tokens[0].startswith(prefix) and all(t.startswith(prefix) for t in tokens[1:])
        if not marked_right or _spelling(word, tokens, unk, prefix) != word:
            continue  # the marks or the cover are wrong: other properties say so
        start = 0
        for length in _lengths(word, tokens, prefix):
            mark = "" if start == 0 else prefix
            if any(mark + word[start:end] in vocab for end in range(start + length + 1, len(word) + 1)):
                return True
            start += length
    return False


def _wp_too_long_encoded(case, expected, actual):
    unk, _, max_chars = _wp_options(case.kwargs)
    return any(len(w) > max_chars and a and unk not in a for w, _, _, a in _wp_results(case, expected, actual))


def _wp_unk_for_covered(case, expected, actual):
    unk, _, max_chars = _wp_options(case.kwargs)
    return any(len(w) < max_chars and e != [unk] and a == [unk] for w, _, e, a in _wp_results(case, expected, actual))


def _wp_unknown_left_out(case, expected, actual):
    unk, _, _ = _wp_options(case.kwargs)
    return any(e == [unk] and a == [] for _, _, e, a in _wp_results(case, expected, actual))


def _wp_limit_reached_unk(case, expected, actual):
    unk, _, max_chars = _wp_options(case.kwargs)
    return any(len(w) == max_chars and e != [unk] and a == [unk] for w, _, e, a in _wp_results(case, expected, actual))


check_wordpiece_encode = Checker(
    name="wordpiece_encode",
    reference=wordpiece_encode,
    make_cases=_wordpiece_cases,
    invoke=_invoke_each_word,
    forbidden=("tokenizers.models.WordPiece",),
    mistakes=[
        Mistake(
            "the shortest piece first (u ##n ##h ... instead of un ##hash ##able)",
            "At each position try the longest candidate first: let the end run from the end of the word down "
            "towards the start, and take the first piece the vocabulary has.",
            _wp_shortest_first,
        ),
        Mistake(
            "pieces after the first looked up and returned without the ## prefix (the rest of the word treated as "
            "a new word)",
            "A piece that does not start the word is looked up, and returned, as prefix + piece ('##hash'): the "
            "vocabulary keeps the two forms apart.",
            _wp_no_prefix,
        ),
        Mistake(
            "[UNK] for the uncovered character only, and the search carried on after it",
            "When no piece fits at some position, the whole word is unknown: return [unk] alone, and drop the pieces "
            "found before it.",
            _wp_unk_per_gap,
        ),
        Mistake(
            "the pieces found so far kept, with [UNK] after them, when the word cannot be covered",
            "When no piece fits at some position, return [unk] alone: BERT never returns part of a word.",
            _wp_pieces_then_unk,
        ),
        Mistake(
            "the next search started one character after the previous piece's start, not right after the piece "
            "(the pieces overlap)",
            "After a match, the next piece starts where this one ended: start = end.",
            _wp_one_step,
        ),
        Mistake(
            "the ## prefix put on the first piece too",
            "Only pieces that do not start the word carry the prefix; the first piece is looked up as it is.",
            _wp_prefix_everywhere,
        ),
        Mistake(
            "a word of exactly max_chars characters counted as too long (>= instead of >)",
            "Only a word longer than max_chars becomes [unk] at once: len(word) > max_chars.",
            _wp_limit_off_by_one,
        ),
        Mistake(
            "max_chars ignored: a word longer than it is encoded anyway",
            "Check the length first: a word of more than max_chars characters is [unk], without a search.",
            _wp_no_limit,
        ),
        Mistake(
            "the unknown token returned as a string, not as a list holding it",
            "Return [unk], a list of one token, like every other answer: a text's tokens are the words' lists "
            "joined together.",
            _wp_unk_as_string,
        ),
        Mistake(
            "an unknown word left out (an empty list) instead of [UNK]",
            "A word the vocabulary cannot cover still takes one token: return [unk], so that the model knows a word "
            "was there.",
            _wp_unknown_dropped,
        ),
    ],
    properties=[
        Property("[UNK] next to other pieces", "A word the vocabulary cannot cover is the single token [unk].",
                 _wp_unk_beside_pieces),
        Property("a piece after the first without the ## prefix",
                 "Every piece after the first is looked up and returned as prefix + piece.", _wp_bare_continuation),
        Property("a first piece that carries the ## prefix",
                 "The first piece is looked up as it is; only later pieces carry the prefix.", _wp_prefixed_first),
        Property("tokens that do not spell the word (with the prefixes taken off)",
                 "Each piece starts right after the previous one ended, and together they cover the word once.",
                 _wp_misspelled),
        Property("a shorter piece where the vocabulary holds a longer one",
                 "Try the longest candidate first at each position.", _wp_shorter_than_longest),
        Property("[UNK] for a word the vocabulary can cover",
                 "Look the first piece up as it is and every later piece with the prefix, the longest first; a word "
                 "is unknown only when no piece at all fits at some position.", _wp_unk_for_covered),
        Property("an empty list for a word the vocabulary cannot cover",
                 "An unknown word still takes one token: return [unk].", _wp_unknown_left_out),
        Property("a word longer than max_chars encoded instead of [UNK]",
                 "A word of more than max_chars characters is [unk], without a search.", _wp_too_long_encoded),
        Property("a word of exactly max_chars characters turned into [UNK]",
                 "Only a word longer than max_chars is too long: len(word) > max_chars.", _wp_limit_reached_unk),
    ],
)


# ---------------------------------------------------------------------------------------
# Exercise 7: embedding_lookup(ids, table) -> one_hot(ids) @ table, [..., d_model]
# ---------------------------------------------------------------------------------------


def _embedding_cases() -> list[Case]:
    g = seeded(801)
    return [
        Case("5 ids, vocabulary 10, d_model 4", (torch.tensor([3, 0, 9, 3, 7]), randn(g, 10, 4))),
        Case("a batch of 2 sequences of 3 ids, the largest ids unused",
             (torch.randint(0, 5, (2, 3), generator=g), randn(g, 7, 6))),
        Case("a float64 table", (torch.tensor([4, 1, 4]), randn(g, 6, 3, dtype=torch.float64))),
        Case("[2, 3, 4] ids, vocabulary 50, d_model 8", (torch.randint(0, 50, (2, 3, 4), generator=g), randn(g, 50, 8)),
             hidden=True),
        Case("a single id", (torch.tensor([2]), randn(g, 3, 5)), hidden=True),
        Case("d_model 16, vocabulary 13", (torch.tensor([[1, 5, 12, 0]]), randn(g, 13, 16)), hidden=True),
    ]


# The operators that copy rows (or entries) out of a tensor by position: what table[ids],
# table.index_select, F.embedding, nn.Embedding, torch.gather and a loop over table[i] reach.
_ROW_PICKING_OPS = frozenset({
    "index", "index_select", "embedding", "embedding_bag", "_embedding_bag", "gather", "take", "take_along_dim",
    "select", "unbind", "slice", "narrow", "split", "split_with_sizes", "chunk", "masked_select",
})
INDEXED = {"__type__": "rows picked out of the table by indexing (table[ids], index_select, F.embedding, "
                       "nn.Embedding or a loop over table[i]) instead of one_hot(ids) @ table"}


def _table_rows_picked(fn, ids, table) -> tuple[Any, list[str]]:
    """Run fn(ids, table); also return the row-picking operators it applied to the table (or to
    a copy of it: a tensor of the table's shape or its transpose's; no case has a square table,
    so a one-hot or identity matrix is never taken for it)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    storage = table.untyped_storage().data_ptr()
    shapes = {tuple(table.shape), tuple(table.shape[::-1])}
    seen: list[str] = []

    def is_table(x) -> bool:
        if not isinstance(x, torch.Tensor):
            return False
        try:
            return x.untyped_storage().data_ptr() == storage or tuple(x.shape) in shapes
        except Exception:
            return tuple(x.shape) in shapes

    class Watch(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = getattr(getattr(func, "overloadpacket", None), "__name__", "")
            if name in _ROW_PICKING_OPS and args and is_table(args[0]):
                seen.append(name)
            return func(*args, **(kwargs or {}))

    with Watch():
        out = fn(ids, table)
    return out, seen


def _invoke_as_a_product(fn, case: Case):
    """The exercise asks for the product, and indexing gives the same numbers: an answer that
    picks rows out of the table is answered with INDEXED instead of its output."""
    ids, table = case.args
    out, picked = _table_rows_picked(fn, ids, table)
    return INDEXED if picked else out


def _el_indexed(ids, table):
    return table[ids]  # [..., d_model]: the lookup itself, not the product


def _one_hot(ids, table):
    return F.one_hot(ids, table.shape[0]).to(table.dtype)  # [..., vocab]


def _el_columns(ids, table):
    return (_one_hot(ids, table) @ table).transpose(-2, -1)  # [..., d_model, seq]


def _el_scaled(ids, table):
    return _one_hot(ids, table) @ table * math.sqrt(table.shape[1])


def _el_float32(ids, table):
    return F.one_hot(ids, table.shape[0]).float() @ table.float()


def _el_bag_of_words(ids, table):
    return _one_hot(ids, table).sum(dim=-2) @ table  # [..., d_model]: the sequence axis summed away


def _el_constant_multiple(case, expected, actual):
    if not (isinstance(actual, torch.Tensor) and actual.shape == expected.shape and actual.is_floating_point()):
        return False
    e, a = expected.double(), actual.double()
    big = e.abs() > 1e-3
    if not big.any():
        return False
    ratio = a[big] / e[big]
    return bool((ratio - ratio[0]).abs().max() < 1e-4 and (ratio[0] - 1).abs() > 1e-3)


check_embedding_lookup = Checker(
    name="embedding_lookup",
    reference=embedding_lookup,
    make_cases=_embedding_cases,
    invoke=_invoke_as_a_product,
    mistakes=[
        Mistake(
            "rows picked out of the table by indexing (table[ids], index_select, F.embedding, nn.Embedding, or a "
            "loop over table[i]): the right numbers, but not the product this exercise asks for",
            "Build the one-hot matrix, F.one_hot(ids, table.shape[0]).to(table.dtype), and multiply it by the "
            "table with @; never index the table itself.",
            _el_indexed,
        ),
        Mistake(
            "embeddings as columns, [..., d_model, seq] (the textbook's X = Omega T layout) instead of rows",
            "One row per token: one_hot(ids) is [..., seq, vocab], and one_hot @ table is [..., seq, d_model].",
            _el_columns,
        ),
        Mistake(
            "the result multiplied by sqrt(d_model)",
            "Return the plain rows of the table; the sqrt(d_model) scale is a separate step of the model.",
            _el_scaled,
        ),
        Mistake(
            "computed in float32 whatever the table's dtype (.float())",
            "Make the one-hot matrix in the table's dtype, .to(table.dtype), and leave the table as it is.",
            _el_float32,
        ),
        Mistake(
            "the one-hot rows summed over the sequence into one bag-of-words vector",
            "Keep one row per token: multiply the [..., seq, vocab] one-hot matrix by the table without summing.",
            _el_bag_of_words,
        ),
    ],
    properties=[
        properties.transposed("One row per token: one_hot(ids) @ table is [..., seq, d_model], not its transpose."),
        properties.shape_permuted("The output is [..., seq, d_model]: ids' shape with d_model added at the end."),
        Property("the reference's rows multiplied by a constant",
                 "Return the rows of the table as they are: no scale, no normalisation.", _el_constant_multiple),
    ],
)


CHECKERS = [check_oov_rate, check_pair_counts, check_merge_pair, check_train_bpe, check_encode_word,
            check_wordpiece_encode, check_embedding_lookup]
