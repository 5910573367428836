"""Byte-pair encoding (BPE): a subword vocabulary learned by merging the most frequent pair.

The algorithm of Sennrich, Haddow and Birch (2016), "Neural Machine Translation of Rare Words
with Subword Units", which adapted Gage's (1994) compression scheme to words:

    1. pre-tokenise the text into words and count them;
    2. spell every word as a tuple of symbols, one character each;
    3. count every adjacent pair of symbols, each word weighted by its frequency;
    4. merge the most frequent pair into one new symbol everywhere (left to right,
       non-overlapping), record the merge, and go back to 3.

Encoding new text replays the recorded merges in the order they were learned. This readable
trainer makes exactly the merges that Hugging Face `tokenizers`' BpeTrainer makes on the same
words (tests/test_tokenization.py checks it), ties included. `train_bpe_with_tokenizers` runs
BpeTrainer set up the same way, to compare the two. `train_byte_level_bpe` trains the byte-level
BPE of GPT-2 (Radford et al., 2019) with `tokenizers` itself: what one uses in practice.

`wordpiece_encode` is BERT's encoder (Devlin et al., 2019): no merges, but the longest piece of
the vocabulary first, `##` on the pieces inside a word, and `[UNK]` for a word it cannot cover;
it cuts words as tokenizers' `WordPiece` model does (tests/test_tokenization.py).

Around them, what chapter 08 of the course measures: a whole-word vocabulary and its
out-of-vocabulary rate (`word_vocabulary`, `oov_rate`), and the step after tokenisation,
ids to vectors, written as the product of one-hot rows with the embedding table
(`embedding_lookup`; Prince, Understanding Deep Learning, 2023, section 12.5.2).
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping

# The pre-tokenisation rule. A word is
#   an optional single space and a run of letters, digits or underscores   " the", "x2"
#   | an optional single space and a run of other non-space characters     ",", " (\""
#   | a run of whitespace the first two alternatives did not take          "\n", "  "
# so every character of the text lands in exactly one word, and decoding is concatenation.
# Keeping the space in front of the word (as GPT-2 does) tells "the" at the start of a
# word from "the" inside one ("breathe"); merges never cross a word boundary.
PRE_TOKENIZE_PATTERN = r" ?\w+| ?[^\w\s]+|\s+"
_PRE_TOKENIZE = re.compile(PRE_TOKENIZE_PATTERN)

Pair = tuple[str, str]


def pre_tokenize(text: str) -> list[str]:
    """Split text into the words BPE works inside (see PRE_TOKENIZE_PATTERN).

    >>> pre_tokenize("The cat, the hat.")
    ['The', ' cat', ',', ' the', ' hat', '.']
    """
    if not isinstance(text, str):
        raise TypeError(f"pre_tokenize expects a str, got {type(text).__name__}")
    return _PRE_TOKENIZE.findall(text)


def word_counts(data: str | Iterable[str]) -> Counter:
    """How often each word (see pre_tokenize) occurs in a text or in an iterable of texts."""
    texts = [data] if isinstance(data, str) else data
    counts: Counter = Counter()
    for text in texts:
        counts.update(pre_tokenize(text))
    return counts


def pair_counts(word_counts: Mapping) -> Counter:
    """Count every adjacent pair of symbols, each word weighted by how often it occurs.

    word_counts: {word: count}, a word being a tuple of symbols (or a str, read as one symbol
    per character). Pairs overlap: ("a", "a", "a") holds the pair ("a", "a") twice.

    >>> pair_counts({("l", "o", "w"): 5, ("l", "o", "t"): 2})
    Counter({('l', 'o'): 7, ('o', 'w'): 5, ('o', 't'): 2})
    """
    counts: Counter = Counter()
    for word, count in word_counts.items():
        for pair in zip(word, word[1:]):
            counts[pair] += count
    return counts


def merge_pair(symbols: tuple[str, ...], pair: Pair) -> tuple[str, ...]:
    """Replace every occurrence of `pair` in `symbols` by the one symbol pair[0] + pair[1].

    Left to right, never overlapping: ("a", "a", "a") with ("a", "a") gives ("aa", "a").

    >>> merge_pair(("l", "o", "w", "e", "r"), ("l", "o"))
    ('lo', 'w', 'e', 'r')
    """
    first, second = pair
    merged, i = [], 0
    while i < len(symbols):
        if i + 1 < len(symbols) and symbols[i] == first and symbols[i + 1] == second:
            merged.append(first + second)
            i += 2  # both halves are used up: the next match starts after them
        else:
            merged.append(symbols[i])
            i += 1
    return tuple(merged)


def train_bpe(data, n_merges: int | None = None, *, vocab_size: int | None = None,
              alphabet: Iterable[str] = (), special_tokens: Iterable[str] = (),
              min_frequency: int = 0) -> tuple[list[Pair], list[str]]:
    """Learn BPE merges from `data`: a text, an iterable of texts, or a {word: count} mapping.

    Stop after `n_merges` merges, or once the vocabulary has `vocab_size` entries (give one),
    or earlier when no pair occurs at least max(min_frequency, 1) times.

    Returns (merges, vocab). merges: the pairs in the order they were learned, the order
    `encode` replays them. vocab: every token, its index being its id: the special tokens,
    then the alphabet (every character of the data, plus `alphabet`) sorted by code point,
    then each merge's new symbol in the order it was made. These are the ids `tokenizers`
    gives, and they break ties: among pairs with the same count, the one whose first symbol
    has the smaller id wins, then the one whose second symbol has the smaller id. (BpeTrainer
    keeps its candidates in a heap ordered by count, then by the pair of ids, smallest first.)
    The first symbols decide: every character's id is below every merged symbol's, so a pair
    that starts with a character wins a tie against one that starts with a merged symbol
    (("b", "d") beats ("ab", "c")), and the second symbols count only between pairs with the
    same first symbol. A merged symbol in second place loses nothing by itself: ("a", "bc")
    beats ("d", "e"), because "a" has the smaller id.
    """
    if (n_merges is None) == (vocab_size is None):
        raise ValueError("train_bpe needs exactly one of n_merges and vocab_size")
    for name, value in (("n_merges", n_merges), ("vocab_size", vocab_size)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise ValueError(f"{name} must be a non-negative int, got {value!r}")
    counts = data if isinstance(data, Mapping) else word_counts(data)

    vocab = list(dict.fromkeys(special_tokens))
    characters = {ch for word in counts for ch in word} | set(alphabet)
    vocab += sorted(characters - set(vocab))
    token_id = {token: i for i, token in enumerate(vocab)}

    # Every word as a tuple of symbols, with its count. Words are kept in a list so that
    # `where` can say, for every pair, which words hold it: a merge then touches only those.
    words = [tuple(word) for word in counts]
    freqs = [counts[word] for word in counts]
    pairs = pair_counts(dict(zip(words, freqs)))
    where: defaultdict[Pair, set[int]] = defaultdict(set)
    for i, word in enumerate(words):
        for pair in zip(word, word[1:]):
            where[pair].add(i)

    merges: list[Pair] = []
    while pairs:
        if n_merges is not None and len(merges) >= n_merges:
            break
        if vocab_size is not None and len(vocab) >= vocab_size:
            break
        # The most frequent pair; ties to the smaller (first id, second id), as tokenizers does.
        best = max(pairs, key=lambda p: (pairs[p], -token_id[p[0]], -token_id[p[1]]))
        if pairs[best] < max(min_frequency, 1):
            break
        merges.append(best)
        new_symbol = best[0] + best[1]
        if new_symbol not in token_id:  # "a"+"bc" after "ab"+"c" makes no new token
            token_id[new_symbol] = len(vocab)
            vocab.append(new_symbol)
        # Only the words holding the pair change: take their old pairs out of the counts and
        # put their new ones in. The result equals pair_counts() of all the words again.
        for i in where.pop(best):
            old, new = words[i], merge_pair(words[i], best)
            for pair in zip(old, old[1:]):
                pairs[pair] -= freqs[i]
                if pairs[pair] == 0:
                    del pairs[pair]
            for pair in zip(new, new[1:]):
                pairs[pair] += freqs[i]
                where[pair].add(i)
            words[i] = new
    return merges, vocab


def encode_word(word: str, ranks: Mapping[Pair, int] | Iterable[Pair]) -> list[str]:
    """Split one word into tokens: apply the learned merges in the order they were learned.

    ranks: {pair: its position in the merge list}, or the merge list itself. At every step the
    pair present in the word that was learned earliest is merged (everywhere in the word, left
    to right), as in training.

    >>> encode_word("lowest", [("e", "s"), ("es", "t"), ("l", "o"), ("lo", "w")])
    ['low', 'est']
    """
    if not isinstance(ranks, Mapping):
        ranks = _ranks(ranks)
    symbols = tuple(word)
    while len(symbols) > 1:
        present = [pair for pair in zip(symbols, symbols[1:]) if pair in ranks]
        if not present:
            break
        symbols = merge_pair(symbols, min(present, key=ranks.__getitem__))
    return list(symbols)


def encode(text: str, merges: Iterable[Pair]) -> list[str]:
    """Tokenise text with learned merges: pre-tokenise, then encode_word each word.

    Returns the tokens as strings; `tokens_to_ids` maps them to ids. A character never
    seen in training stays a token of its own (it has no id in the vocabulary).
    """
    ranks = _ranks(merges)
    cache: dict[str, list[str]] = {}  # words repeat a lot: "the" is encoded once
    tokens: list[str] = []
    for word in pre_tokenize(text):
        if word not in cache:
            cache[word] = encode_word(word, ranks)
        tokens += cache[word]
    return tokens


def _ranks(merges: Iterable[Pair]) -> dict[Pair, int]:
    """{pair: the position of its first occurrence in the merge list}."""
    ranks: dict[Pair, int] = {}
    for rank, pair in enumerate(merges):
        ranks.setdefault(tuple(pair), rank)
    return ranks


def vocabulary_from_merges(merges: Iterable[Pair], alphabet: Iterable[str],
                           special_tokens: Iterable[str] = ()) -> list[str]:
    """The vocabulary train_bpe returns, rebuilt from its merges: the special tokens, the
    alphabet sorted by code point, then each merge's new symbol in the order it was made.

    >>> vocabulary_from_merges([("l", "o"), ("lo", "w")], "low")
    ['l', 'o', 'w', 'lo', 'low']
    """
    vocab = list(dict.fromkeys(special_tokens))
    vocab += sorted(set(alphabet) - set(vocab))
    known = set(vocab)
    for first, second in merges:
        if first + second not in known:
            known.add(first + second)
            vocab.append(first + second)
    return vocab


def tokens_to_ids(tokens: Iterable[str], vocab: list[str]) -> list[int]:
    """Token strings -> ids (positions in `vocab`); a clear error for a token it lacks."""
    token_id = {token: i for i, token in enumerate(vocab)}
    ids = []
    for token in tokens:
        if token not in token_id:
            raise KeyError(f"token {token!r} is not in the vocabulary (a character never seen in training?)")
        ids.append(token_id[token])
    return ids


def decode(tokens: Iterable[str] | Iterable[int], vocab: list[str] | None = None) -> str:
    """Tokens (strings, or ids together with `vocab`) back to text: concatenation.

    Every character of the text belongs to exactly one pre-tokenised word and every word to
    its tokens, so decode(encode(text, merges)) == text for any text.
    """
    tokens = list(tokens)
    if tokens and not isinstance(tokens[0], str):
        if vocab is None:
            raise ValueError("decode needs the vocabulary to turn ids back into tokens: decode(ids, vocab)")
        tokens = [vocab[i] for i in tokens]
    return "".join(tokens)


# ---------------------------------------------------------------------------------------
# WordPiece: BERT's encoder, the longest vocabulary piece first
# ---------------------------------------------------------------------------------------

def wordpiece_encode(word: str, vocab, unk: str = "[UNK]", prefix: str = "##", max_chars: int = 100) -> list[str]:
    """Split one word into WordPiece tokens: greedy longest match first, left to right.

    The encoder of BERT (Devlin et al., 2019), as Google's released `WordpieceTokenizer`
    (google-research/bert, tokenization.py) and Hugging Face tokenizers' `WordPiece` model run it.
    From the start of the word, take the longest piece that is in `vocab`, then go on right after
    it; a piece that does not start the word is looked up with `prefix` in front ("##able"), so
    the vocabulary tells a word's beginning from its inside. When no piece fits at some position,
    the whole word becomes the one token `unk`: BERT never returns half a word. So does a word of
    more than `max_chars` characters, without a search (100 is tokenizers' default; Google's
    released code uses 200).

    vocab: anything `in` can search (a set of tokens, or BERT's {token: id}).

    >>> wordpiece_encode("unhashable", {"un", "##hash", "##able", "hash", "##h"})
    ['un', '##hash', '##able']
    >>> wordpiece_encode("unhashable!", {"un", "##hash", "##able"})
    ['[UNK]']
    """
    if len(word) > max_chars:
        return [unk]
    tokens, start = [], 0
    while start < len(word):
        for end in range(len(word), start, -1):  # the longest candidate first
            piece = word[start:end] if start == 0 else prefix + word[start:end]
            if piece in vocab:
                break
        else:
            return [unk]  # nothing in the vocabulary starts here: the whole word is unknown
        tokens.append(piece)
        start = end  # the next piece starts right after this one
    return tokens


# ---------------------------------------------------------------------------------------
# Whole words: a fixed vocabulary, and how much held-out text it misses
# ---------------------------------------------------------------------------------------

def word_vocabulary(words: Iterable[str], size: int) -> list[str]:
    """The `size` most frequent words of `words`, most frequent first (all of them if there
    are fewer); words with equal counts keep the order in which they first occur."""
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise ValueError(f"size must be a non-negative int, got {size!r}")
    return [word for word, _ in Counter(words).most_common(size)]


def oov_rate(vocab: Iterable[str], words: Iterable[str]) -> float:
    """The share of the running words of `words` that are not in `vocab` (out of vocabulary).

    Counted over tokens, not distinct words: an unknown word that occurs ten times costs ten
    unknown tokens, which is what a model fed this text would see.

    >>> oov_rate({"the", "cat"}, ["the", "cat", "sat", "the"])
    0.25
    """
    known = vocab if isinstance(vocab, (set, frozenset, dict)) else set(vocab)
    words = list(words)
    if not words:
        raise ValueError("oov_rate needs at least one word to measure")
    return sum(word not in known for word in words) / len(words)


# ---------------------------------------------------------------------------------------
# From ids to vectors: the embedding table
# ---------------------------------------------------------------------------------------

def embedding_lookup(ids, table):
    """The embeddings of `ids` as a product: one_hot(ids) @ table.

    ids: integer tensor [...] with values in [0, vocab); table: [vocab, d_model].
    Returns [..., d_model] in the table's dtype. Row i of the one-hot matrix has a single 1,
    at column ids[i], so the product copies row ids[i] of the table: it equals table[ids]
    (and nn.Embedding), which makes the same copy without the multiplications by zero.
    """
    import torch
    import torch.nn.functional as F

    if ids.is_floating_point() or ids.dtype == torch.bool:
        raise TypeError(f"embedding_lookup expects integer token ids, got dtype {ids.dtype}")
    if table.dim() != 2:
        raise ValueError(f"the table must be [vocab, d_model], got shape {list(table.shape)}")
    vocab = table.shape[0]
    if ids.numel() and (ids.min() < 0 or ids.max() >= vocab):
        raise ValueError(f"token ids must lie in [0, {vocab}), got min {ids.min().item()}, max {ids.max().item()}")
    one_hot = F.one_hot(ids.long(), vocab).to(table.dtype)  # [..., vocab]: a single 1 per row
    return one_hot @ table  # [..., d_model]


# ---------------------------------------------------------------------------------------
# The same trainer in tokenizers, to compare merge for merge
# ---------------------------------------------------------------------------------------

def train_bpe_with_tokenizers(texts: Iterable[str], n_merges: int, alphabet: Iterable[str],
                              pre_tokenizer=None):
    """tokenizers' BpeTrainer set up like train_bpe: no normaliser, the same word split
    (PRE_TOKENIZE_PATTERN, unless `pre_tokenizer` says otherwise), every merge allowed
    (min_frequency 0), the given alphabet, no special tokens, len(alphabet) + n_merges tokens.

    Returns (tokenizer, merges, vocab): merges as (first, second) pairs in the order learned,
    vocab as the tokens in id order. Pass the alphabet train_bpe saw (the characters of the
    words it trains on): the alphabet fixes the ids, and the ids break ties.
    """
    import json

    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers

    alphabet = sorted(set(alphabet))
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizer or pre_tokenizers.Split(Regex(PRE_TOKENIZE_PATTERN), behavior="isolated")
    trainer = trainers.BpeTrainer(vocab_size=len(alphabet) + n_merges, min_frequency=0, show_progress=False,
                                  initial_alphabet=alphabet, special_tokens=[])
    tokenizer.train_from_iterator(texts, trainer)
    model = json.loads(tokenizer.to_str())["model"]
    merges = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    vocab = sorted(model["vocab"], key=model["vocab"].get)  # tokens in id order
    return tokenizer, merges, vocab


# ---------------------------------------------------------------------------------------
# In practice: byte-level BPE with Hugging Face tokenizers
# ---------------------------------------------------------------------------------------

def train_byte_level_bpe(texts: Iterable[str], vocab_size: int,
                         special_tokens: Iterable[str] = ("<|endoftext|>", "<pad>"),
                         min_frequency: int = 2):
    """Train GPT-2's byte-level BPE with `tokenizers`; returns a `tokenizers.Tokenizer`.

    Byte-level: the alphabet is the 256 byte values (each shown as a printable character,
    a space as "Ġ"), so any text in any script is encodable and nothing is ever unknown.
    Words are split with GPT-2's regular expression. The special tokens take the first ids
    and are never split. Encode with `tokenizer.encode(text).ids`, decode with
    `tokenizer.decode(ids)`: the ByteLevel decoder turns the bytes back into the exact text.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    # add_prefix_space=False keeps decode(encode(text)) == text exactly.
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # all 256 bytes, seen or not
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer)
    return tokenizer


__all__ = [
    "PRE_TOKENIZE_PATTERN", "pre_tokenize", "word_counts", "pair_counts", "merge_pair", "train_bpe",
    "encode_word", "encode", "vocabulary_from_merges", "tokens_to_ids", "decode", "word_vocabulary", "oov_rate",
    "embedding_lookup", "train_bpe_with_tokenizers", "train_byte_level_bpe", "wordpiece_encode",
]
