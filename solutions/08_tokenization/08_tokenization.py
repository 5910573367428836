# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Chapter 08 — Tokenization: from text to vectors
#
# Every chapter so far started from vectors: token embeddings, one row per token, appeared out of nowhere.
# A real model starts from **text**, a string of characters, and has to turn it into those vectors. Simon
# Prince's *Understanding Deep Learning* (2023, section 12.5) describes the pipeline of every language model in
# three steps: a **tokenizer** cuts the text into pieces from a fixed vocabulary and gives each piece an id; an
# **embedding** table turns each id into a vector; then the stack of Transformer layers does the rest. This
# chapter is about the first two steps.
#
# The hard question is what a piece should be. Whole words? Single characters? Something in between? Each
# choice has a price you can measure, and we measure it:
#
# 1. **Whole words**: what fraction of new text a word vocabulary has never seen. *Exercise 1: `oov_rate`.*
# 2. **Characters**: nothing is unknown, but the sequences get long, and attention pays for length squared.
# 3. **Byte-pair encoding (BPE)**, the subword method of GPT-2 and many later models, built from scratch: count
#    pairs, merge one, train, encode. *Exercises 2 to 5: `pair_counts`, `merge_pair`, `train_bpe`, `encode_word`.*
#    Your trainer is then run on the course's text and compared, merge for merge, with Hugging Face
#    `tokenizers`.
# 4. **WordPiece**, BERT's encoder: the longest vocabulary piece first, `##` for the inside of a word, and
#    `[UNK]` for a word it cannot cover. *Exercise 6: `wordpiece_encode`*, then run on a vocabulary made from
#    your BPE and compared with it on the held-out text.
# 5. **Byte-level BPE in practice** with `tokenizers`: characters per token for vocabularies of 500 to 4,000,
#    words that share pieces, and why no text, Chinese included, is ever unknown.
# 6. **Why Chinese BERT predicts characters**, and what today's Chinese models do instead.
# 7. **The attention bill**: the cost of each tokenizer in pairs of tokens.
# 8. **The embedding table**, a lookup that is also a matrix product. *Exercise 7: `embedding_lookup`.*
# 9. **The sqrt(d_model) scale** of *Attention Is All You Need*, measured under three initialisations rather than
#    taken on trust.
#
# The seven exercises take about 105 minutes; `train_bpe` and `wordpiece_encode` are the long ones.
#
# The text throughout is the course's own: the English prose of Python's built-in help pages, split once into a
# training part and a held-out part (`corpus.char_splits()`). Nothing is downloaded.
#
# Later cells use your functions once they pass their checks, and the library's otherwise; a line after each
# test says which.

# %%
import math
import time
from collections import Counter

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from tokenizers import models, normalizers, pre_tokenizers

from transformer_lib import corpus
from transformer_lib.checks import exercise_summary, yours_or_reference
from transformer_lib.claims import claim, claim_between
from transformer_lib.checks.ch08 import (
    check_embedding_lookup,
    check_encode_word,
    check_merge_pair,
    check_oov_rate,
    check_pair_counts,
    check_train_bpe,
    check_wordpiece_encode,
)
from transformer_lib.diagrams.ch08 import draw_bpe_merge_step, draw_text_to_vectors
from transformer_lib.positional import sinusoidal_encoding
from transformer_lib.tokenization import (
    pre_tokenize,
    tokens_to_ids,
    train_bpe_with_tokenizers,
    train_byte_level_bpe,
    vocabulary_from_merges,
    word_counts,
    word_vocabulary,
)

torch.manual_seed(0)
torch.set_printoptions(precision=4, sci_mode=False)

# %% [markdown]
# Here is the road this chapter travels, on a made-up vocabulary of ten tokens. The tokenizer cuts the text into
# tokens (`␣` marks a space: it belongs to the token that follows it); the vocabulary maps each token to an id;
# the id picks one row of the embedding table. Section 8 shows that picking rows is the same as multiplying
# one-hot rows by the table, and section 9 what the final scale does.

# %%
draw_text_to_vectors(" lowest newer", [" low", "est", " new", "er"], [7, 5, 8, 2])
plt.show()

# %% [markdown]
# ## 1. Whole words, and the words you have never seen
#
# The obvious choice is one token per word: split on spaces, give every word of the training text an id. Our
# text is the prose of Python's help pages, about a quarter of a megabyte, split into a training part and a
# held-out part that stands for "text the model meets later":

# %%
train_text, val_text = corpus.char_splits()
train_words, val_words = corpus.tokenize(train_text), corpus.tokenize(val_text)
print(f"training text: {len(train_text):,} characters, {len(train_words):,} words, "
      f"{len(set(train_words)):,} distinct words")
print(f"held-out text: {len(val_text):,} characters, {len(val_words):,} words")
print("the held-out text starts:", repr(val_text[:160]))

# %% [markdown]
# (`corpus.tokenize` lower-cases the text and keeps runs of letters, so a "word" here is something like
# `iterator` or `don't`. It drops digits and punctuation: fine for asking which words are unknown, but a model
# must read those too, and section 2 counts them back in.)
#
# A model has a vocabulary of fixed size, chosen before training: say the $N$ most frequent training words.
# Every other word, in training or later, becomes one shared token, `<unk>` ("unknown"). The model cannot
# tell one unknown word from another. How much of new text ends up as `<unk>`? That share is the
# **out-of-vocabulary (OOV) rate**.

# %% [markdown]
# ### Exercise 1 — `oov_rate`
# > **Difficulty** ●○○ · **Importance** ●●○ · about 5 minutes
#
# Write `oov_rate(vocab, words)`: the fraction of the words of `words` that are not in `vocab`.
#
# * `vocab`: a set of words (a list works too: anything `in` can search).
# * `words`: a list of words, the text being measured, in order, repeats included.
# * returns a float between 0 and 1.
#
# Count **running words** (tokens), not distinct words: a model reading the text meets an unknown word every
# time it occurs. Worked example: `oov_rate({"the", "cat", "sat"}, "the cat sat on the mat".split())` is
# `2 / 6 = 0.333...` (*on* and *mat*).
#
# <details><summary>Hint 1 — the idea</summary>Every occurrence counts: an unknown word costs one unknown token each time it appears. The rate is the number of unknown occurrences over the number of occurrences.</details>
# <details><summary>Hint 2 — the plan</summary>One pass over <code>words</code> in their order, counting those the vocabulary lacks. Divide that count by the number of running words, the length of <code>words</code>: not the size of <code>vocab</code>, and not the number of distinct words. The result is a float between 0 and 1.</details>
# <details><summary>Hint 3 — the key step</summary>The question that unlocks the step: in the worked example, how
# many of the six running words are missing from the vocabulary, and what do you divide by? The page to read is
# Python's built-in <code>sum</code>: it adds up True as 1, so it can count the words a generator expression
# keeps.</details>

# %% nbgrader={"grade": false, "grade_id": "oov_rate", "locked": false, "schema_version": 3, "solution": true, "task": false}
def oov_rate(vocab, words) -> float:
    """The share of the running words of `words` that are not in `vocab` (a float in [0, 1])."""
    ### BEGIN SOLUTION
    unknown = sum(1 for word in words if word not in vocab)  # every occurrence counts
    return unknown / len(words)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "oov_rate_test", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false} tags=["raises-exception"]
check_oov_rate(oov_rate)
### BEGIN HIDDEN TESTS
check_oov_rate(oov_rate, hidden=True)
### END HIDDEN TESTS

# %%
oov_rate_impl = yours_or_reference(oov_rate, check_oov_rate)

# %% [markdown]
# Now the measurement. Vocabularies of the 1,000, 2,000 and 5,000 most frequent training words, each tested on the
# held-out words. **Predict** first: with 5,000 words, what share of the held-out text is unknown?

# %%
distinct_train = len(set(train_words))
print(f"{'asked for':>10} | {'vocabulary':>10} | {'OOV rate (running words)':>24} | {'distinct unknown words':>22}")
oov_by_size = {}
for size in [1000, 2000, 5000]:
    vocab = set(word_vocabulary(train_words, size))
    rate = oov_rate_impl(vocab, val_words)
    unknown_types = len({w for w in val_words if w not in vocab})
    oov_by_size[size] = rate
    print(f"{size:>10,} | {len(vocab):>10,} | {rate:>24.1%} | {unknown_types:>22,}")

# %% [markdown]
# Three lessons in four numbers. A 1,000-word vocabulary misses one held-out word in nine. Doubling it halves the
# misses, but not to zero. And 5,000 is more words than the training text holds: the vocabulary stops at
# its 2,788 distinct words, and still about one held-out word in 23 is unknown. More training text would
# shrink that share without ever ending it: names, numbers, new terms and typos keep coming.
#
# Which words are missing? Some are not really new: they are forms of words the vocabulary has.

# %%
full_vocab = set(train_words)
unknown = Counter(w for w in val_words if w not in full_vocab)


def known_stem(word):
    """A training word that `word` is a form of (plural, past tense, -ing...), or None."""
    for suffix in ["s", "es", "ed", "d", "ing"]:
        stem = word[: -len(suffix)]
        if word.endswith(suffix) and len(stem) > 2:
            for candidate in [stem, stem + "e"]:
                if candidate in full_vocab:
                    return candidate
    return None


forms = {w: known_stem(w) for w in unknown if known_stem(w)}
share = sum(unknown[w] for w in forms) / sum(unknown.values())
print(f"unknown running words that are a form of a known word: {share:.0%}")
print("for example:", ", ".join(f"{w} ({s})" for w, s in list(forms.items())[:8]))
print("forms of 'iterate' the training text has, each a separate vocabulary entry:",
      sorted(w for w in full_vocab if w.startswith("iterat")))

# %% [markdown]
# Even a crude suffix test finds that one unknown word in seven is a plural, a past tense or an *-ing* form of a
# training word. This is the problem Prince points out with *walk*, *walks*, *walked* and *walking*: a word vocabulary stores
# every form as an unrelated entry, learns each from its own few examples, and knows nothing about a form it has
# not seen, even when the stem is familiar. And then there is punctuation, which a word splitter must handle
# somehow, and which matters (a question mark changes a sentence).
#
# ## 2. Characters: nothing unknown, everything long
#
# The opposite extreme: one token per character. The vocabulary is tiny and (nearly) closed:

# %%
alphabet = sorted(set(train_text))
unseen_chars = set(val_text) - set(alphabet)
print(f"{len(alphabet)} distinct characters in the training text; held-out characters never seen: {len(unseen_chars)}")
val_pieces = pre_tokenize(val_text)  # words, numbers, runs of punctuation, line breaks: nothing dropped
chars_per_word = len(val_text) / len(val_pieces)
print(f"held-out text: {len(val_text):,} characters; {len(val_words):,} letter words (corpus.tokenize, "
      f"{len(val_text) / len(val_words):.2f} characters each if the rest were free)")
print(f"as words with punctuation and digits kept (pre_tokenize): {len(val_pieces):,} tokens, "
      f"{chars_per_word:.2f} characters each")
seen_pieces = set(pre_tokenize(train_text))
unknown_pieces = sum(piece not in seen_pieces for piece in val_pieces)
print(f"  of which never seen in the training text: {unknown_pieces} ({unknown_pieces / len(val_pieces):.1%})")
print(f"characters instead: {chars_per_word:.1f} times the tokens, {chars_per_word ** 2:.1f} times the pairs")

# %% [markdown]
# No held-out character is new, so nothing is `<unk>`. The price is length. A word-level model cannot simply
# drop the punctuation, digits and line breaks that `corpus.tokenize` left out: a question mark or a number is
# part of the text. Counted with the library's `pre_tokenize` (section 3), which makes each word (with the space
# before it), number, run of punctuation and line break a token of its own, the 25,885 held-out characters are
# 5,821 tokens, 4.45 characters each.
# (Dividing by the 3,917 letter words instead would give 6.61, as if the rest of the text cost nothing.) So the
# same text is 4.4 times longer as characters. Each character on its own means almost nothing, so the layers must
# first learn to spell before they can learn meaning. And length is expensive: self-attention compares every
# token with every token, $n^2$ pairs for $n$ tokens, so 4.4 times the tokens is about 20 times the pairs.
#
# ## 3. Byte-pair encoding: learn the pieces from the data
#
# The compromise keeps frequent words whole and spells rare ones from frequent pieces. **Byte-pair encoding**
# does it with one greedy rule. Sennrich, Haddow and Birch ("Neural Machine Translation of Rare Words with Subword
# Units", ACL 2016) adapted it to words from a 1994 compression algorithm of Philip Gage. It is one of three
# subword methods in wide use: GPT-2 uses BPE (section 5), BERT uses WordPiece (section 4), and T5, ALBERT and
# XLNet use the unigram language model of Kudo ("Subword Regularization", ACL 2018), which starts from a large
# vocabulary and prunes it, as implemented in the SentencePiece library of Kudo and Richardson (EMNLP 2018), a
# library that also offers BPE (Hugging Face's *Summary of the tokenizers* lists which model uses which). BPE's rule:
#
# 1. Cut the text into words and count them.
# 2. Spell every word as a sequence of symbols, one per character.
# 3. Count every pair of neighbouring symbols, **inside words only**, each word weighted by its count.
# 4. Merge the most frequent pair into one new symbol, everywhere; record the merge. Go back to 3.
#
# The vocabulary is the characters plus one new symbol per merge, so you choose its size by choosing the number
# of merges. To encode new text, replay the recorded merges in the order they were learned. A word seen often
# ends up as one token; a rare word is spelled from pieces; an unseen word is never unknown as long as its
# characters are not.
#
# Step 1 uses the library's `pre_tokenize`. Like GPT-2, it keeps a word's leading space inside the word, so
# that " the" (a word) and "the" inside "breathe" are different symbols, and decoding is just concatenation:

# %%
print(pre_tokenize("The cat, the hat.\nIt's 3.14!"))
train_word_counts = word_counts(train_text)  # {word: count} for the whole training text
print(f"{len(train_word_counts):,} distinct words; the most frequent:", train_word_counts.most_common(6))

# %% [markdown]
# Here is the first merge on the small word table of Sennrich et al.'s paper: *low* 5 times, *lower* twice,
# *newest* 6 times, *widest* 3 times. (e, s) and (s, t) both occur 9 times (6 in *newest*, 3 in *widest*). The
# tie goes to the pair whose first symbol has the smaller **id** (`e` before `s`): more on that rule in
# exercise 4.

# %%
draw_bpe_merge_step()
plt.show()

# %% [markdown]
# ### Exercise 2 — `pair_counts`
# > **Difficulty** ●○○ · **Importance** ●●● · about 10 minutes
#
# Write `pair_counts(word_counts)`: how often each pair of neighbouring symbols occurs.
#
# * `word_counts`: a dict `{word: count}` in which each word is a **tuple of symbols**, e.g.
#   `{("l", "o", "w"): 5, ("l", "o", "w", "e", "r"): 2}`. Symbols may be longer than one character once
#   merges have happened: `("lo", "w")`.
# * returns a dict (a `Counter` is fine) `{(a, b): count}`: the key is the pair as a tuple, the count is the
#   number of times `a` is directly followed by `b` inside a word, **each word weighted by its count**.
#
# Worked example: `pair_counts({("l", "o", "w"): 5, ("l", "o", "t"): 2})` is
# `{("l", "o"): 7, ("o", "w"): 5, ("o", "t"): 2}`. And `("a", "a", "a")` holds the pair `("a", "a")` twice.
#
# <details><summary>Hint 1 — the idea</summary>Look at each word on its own: a word of n symbols holds n − 1 neighbouring pairs, at positions (0, 1), (1, 2), and so on. A word that occurs 5 times contributes each of its pairs 5 times. Never pair the last symbol of one word with the first symbol of the next.</details>
# <details><summary>Hint 2 — the plan</summary>A counter in which every pair starts at 0. An outer loop over the words together with their counts; an inner loop over the neighbouring pairs of one word, which you get by walking the word side by side with itself shifted by one symbol. Each pair found adds the word's count, not 1, under the key (a, b), a tuple.</details>
# <details><summary>Hint 3 — the key step</summary>A smaller example on a list of numbers: the neighbouring pairs of
# <code>[1, 2, 3, 4]</code> are (1, 2), (2, 3), (3, 4). Which two sequences, walked side by side, give exactly those
# pairs? The page to read is Python's built-in <code>zip</code>, and what it does when one sequence is shorter than
# the other.</details>

# %% nbgrader={"grade": false, "grade_id": "pair_counts", "locked": false, "schema_version": 3, "solution": true, "task": false}
def pair_counts(word_counts: dict) -> dict:
    """{(a, b): count} of neighbouring symbols inside words, each word weighted by its count.

    word_counts: {tuple of symbols: count}.
    """
    ### BEGIN SOLUTION
    counts = Counter()
    for word, count in word_counts.items():
        for pair in zip(word, word[1:]):  # neighbours inside this word only
            counts[pair] += count  # the word occurs `count` times
    return counts
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "pair_counts_test", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false} tags=["raises-exception"]
check_pair_counts(pair_counts)
### BEGIN HIDDEN TESTS
check_pair_counts(pair_counts, hidden=True)
### END HIDDEN TESTS

# %%
pair_counts_impl = yours_or_reference(pair_counts, check_pair_counts)

# %%
toy_table = {tuple(word): count for word, count in {"low": 5, "lower": 2, "newest": 6, "widest": 3}.items()}
print(sorted(pair_counts_impl(toy_table).items(), key=lambda item: -item[1])[:6])

# %% [markdown]
# ### Exercise 3 — `merge_pair`
# > **Difficulty** ●●○ · **Importance** ●●● · about 15 minutes
#
# Write `merge_pair(symbols, pair)`: the word `symbols` (a tuple) with every occurrence of `pair` replaced by the
# single symbol `pair[0] + pair[1]`.
#
# * `symbols`: a tuple of strings; `pair`: a tuple `(first, second)`.
# * returns a **tuple** (the trainer uses words as dictionary keys, and a list cannot be one).
#
# Scan **left to right**, and never let two matches share a symbol. Worked examples:
#
# * `merge_pair(("l", "o", "w", "e", "r"), ("l", "o"))` is `("lo", "w", "e", "r")`;
# * `merge_pair(("a", "a", "a"), ("a", "a"))` is `("aa", "a")`: the first two merge, and the third `a` has no
#   partner left;
# * `merge_pair(("h", "ab", "c"), ("b", "c"))` changes nothing: `"ab"` is one symbol, not an `a` and a `b`.
#
# <details><summary>Hint 1 — the idea</summary>Walk along the word with an index. Where the symbol at the index and the next one are the pair's two halves, emit the merged symbol and jump over both; otherwise emit the symbol as it is and step by one. Jumping over both is what keeps two matches from sharing a symbol.</details>
# <details><summary>Hint 2 — the plan</summary>A <code>while</code> loop over the index that builds a new list. Before comparing, make sure there is a next symbol (the index is not the last one); then compare whole symbols with the two halves, never substrings of a joined text. The index moves on by 2 after a match and by 1 otherwise. Turn the list into a tuple at the end.</details>
# <details><summary>Hint 3 — the key step</summary>The question that unlocks the step: at index <code>i</code>, what
# must be true before you may look at the next symbol at all? And what do you compare with the pair's halves, whole
# symbols or characters? Try the test on <code>("h", "ab", "c")</code> with the pair <code>("b", "c")</code>: it
# must answer no at every index, the last one included.</details>

# %% nbgrader={"grade": false, "grade_id": "merge_pair", "locked": false, "schema_version": 3, "solution": true, "task": false}
def merge_pair(symbols: tuple, pair: tuple) -> tuple:
    """`symbols` with every occurrence of `pair` merged into one symbol, left to right, never overlapping."""
    ### BEGIN SOLUTION
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
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "merge_pair_test", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false} tags=["raises-exception"]
check_merge_pair(merge_pair)
### BEGIN HIDDEN TESTS
check_merge_pair(merge_pair, hidden=True)
### END HIDDEN TESTS

# %%
merge_pair_impl = yours_or_reference(merge_pair, check_merge_pair)

# %% [markdown]
# ### Exercise 4 — `train_bpe`
# > **Difficulty** ●●● · **Importance** ●●● · about 30 minutes
#
# Write `train_bpe(word_counts, n_merges)`: the training loop, returning the list of merges in the order they
# were learned.
#
# * `word_counts`: a dict `{word: count}` with each word a **string** (as `word_counts(text)` returns it).
# * `n_merges`: how many merges to make; stop earlier if no word has two symbols left.
# * returns a list of pairs `[(first, second), ...]`, at most `n_merges` long.
#
# The loop is steps 3 and 4 of section 3's rule, repeated. Count with `pair_counts_impl` and merge with
# `merge_pair_impl`: your functions once they pass their checks, the library's until then.
#
# **Ties.** Real text has many pairs with equal counts, and which one wins changes everything after it. To make
# exactly the merges Hugging Face `tokenizers` makes, break ties the way it does, by **ids**:
#
# * every character of the word table gets an id in code-point order: the ids of `sorted(characters)`;
# * each merge gives its new symbol the next free id (unless that symbol already has one);
# * among the pairs with the largest count, take the one whose **first** symbol has the smallest id; only
#   between pairs with the same first symbol, the one whose **second** symbol has the smallest id.
#
# The first symbols decide, and they are compared by ids, not strings. Every character's id is smaller than every
# merged symbol's, so a pair that *starts* with a character beats a tied pair that starts with a merged symbol:
# with `{"abc": 2, "ab": 1, "bd": 2}` the first merge is `("a", "b")`, and then `("b", "d")` beats `("ab", "c")`,
# although the string `"ab"` sorts before `"b"`. A merged symbol in *second* place loses nothing by itself: with
# `{"abc": 2, "bc": 1, "de": 2}` the first merge is `("b", "c")`, and then `("a", "bc")` beats `("d", "e")`,
# because `a` has a smaller id than `d`. (Hugging Face's `BpeTrainer` keeps its candidate pairs in a heap ordered
# by count, then by the pair of ids, smallest first: that is this rule.)
#
# Worked example: the table of the picture above, `{"low": 5, "lower": 2, "newest": 6, "widest": 3}`, gives the
# first four merges `[("e", "s"), ("es", "t"), ("l", "o"), ("lo", "w")]`.
#
# <details><summary>Hint 1 — the idea</summary>Keep two things up to date: the current word table (each word a tuple of symbols, with its count) and an id for every symbol. Each turn of the loop: count the pairs of the current table, pick the winner, record it, give its new symbol an id, rewrite every word. Recount at every turn, because each merge changes the pairs.</details>
# <details><summary>Hint 2 — the plan</summary>Before the loop: spell every word as a tuple of characters, and number the distinct characters 0, 1, 2, … in sorted order. Then at most <code>n_merges</code> turns. Stop early when the table has no pair left. The winner has the largest count, and among equal counts the smallest id of its first symbol, then of its second. Its new symbol (the two halves joined) takes the next free id, unless it already has one. The new table maps each word, rewritten by <code>merge_pair_impl</code>, to the same count.</details>
# <details><summary>Hint 3 — the key step</summary>A smaller ranking of the same kind: among the counts
# <code>{"x": 3, "y": 3, "z": 1}</code>, with ranks <code>{"x": 1, "y": 0, "z": 2}</code>, which key makes
# <code>max</code> pick <code>"y"</code>, the largest count with the smallest rank? The page to read is Python's
# built-in <code>max</code> and its <code>key</code> argument: a tuple key is compared item by item, and a minus
# sign turns "smallest" into "largest".</details>

# %% nbgrader={"grade": false, "grade_id": "train_bpe", "locked": false, "schema_version": 3, "solution": true, "task": false}
def train_bpe(word_counts: dict, n_merges: int) -> list:
    """BPE merges learned from {word (str): count}, in the order learned; ties to the smallest ids."""
    ### BEGIN SOLUTION
    words = {tuple(word): count for word, count in word_counts.items()}  # each word spelled as characters
    ids = {ch: i for i, ch in enumerate(sorted({ch for word in words for ch in word}))}
    merges = []
    for _ in range(n_merges):
        pairs = pair_counts_impl(words)
        if not pairs:
            break  # every word is a single symbol
        best = max(pairs, key=lambda p: (pairs[p], -ids[p[0]], -ids[p[1]]))
        merges.append(best)
        ids.setdefault(best[0] + best[1], len(ids))  # the new symbol takes the next id
        words = {merge_pair_impl(word, best): count for word, count in words.items()}
    return merges
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "train_bpe_test", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false} tags=["raises-exception"]
check_train_bpe(train_bpe)
### BEGIN HIDDEN TESTS
check_train_bpe(train_bpe, hidden=True)
### END HIDDEN TESTS

# %%
train_bpe_impl = yours_or_reference(train_bpe, check_train_bpe)

# %% [markdown]
# Now train on real text: 200 merges on the first 60,000 characters of the training text, about a quarter of
# it. (A plain Python trainer recounts every pair of every word at each merge, a few seconds here; the library's
# `train_bpe` only updates the counts of the words a merge touches, and `tokenizers` does the same in Rust.)

# %% tags=["nbval-ignore-output", "timing"]
BPE_TEXT, N_MERGES = train_text[:60_000], 200
bpe_word_counts = word_counts(BPE_TEXT)
start = time.perf_counter()
merges = train_bpe_impl(bpe_word_counts, N_MERGES)
print(f"{N_MERGES} merges on {len(bpe_word_counts):,} distinct words in {time.perf_counter() - start:.1f} s")

# %%
print(f"{len(merges)} merges; the first 12:")
print([a + b for a, b in merges[:12]])
print("merges 150 to 161:", [a + b for a, b in merges[150:162]])

# %% [markdown]
# The first merges are the glue of English: a space before a letter (`␣t`, `␣a`, `␣i`), *he*, and at merge 5 the
# most frequent word, ` the`, with its leading space; then *on*, *or*, *te*, *re*, *in*. By merge 150 the new
# symbols are pieces of the help pages' own vocabulary (`ation`, `unction`, `thod`, ` state`), and merge 200
# completes ` arguments`.
#
# **Does your trainer do what the real library does?** Train Hugging Face `tokenizers`' `BpeTrainer` on the
# same text, with the same word split, and compare the two merge lists one by one. (We give it every character
# of the whole training text as its alphabet, so that it has an id for every character of the held-out text.
# Characters come first in code-point order either way, so the ids compare the same and ties go the same way.)

# %%
hf_tokenizer, hf_merges, hf_vocab = train_bpe_with_tokenizers([BPE_TEXT], N_MERGES, alphabet=alphabet)
same = [a == b for a, b in zip(merges, hf_merges)]
print(f"merges learned: yours {len(merges)}, tokenizers {len(hf_merges)}; identical: {sum(same)} of {len(same)}")
print(f"{'#':>3} | {'yours':>16} | {'tokenizers':>16}")
for k in list(range(8)) + [99, 199]:
    print(f"{k + 1:>3} | {str(merges[k]):>16} | {str(hf_merges[k]):>16}")

# %% [markdown]
# All 200 merges are identical, in the same order. That is only possible because the tie rule matches: ties are
# common in real text, and a trainer with another rule parts ways with `tokenizers`. Where? The next cell replays
# the real merges on the word table and, before each one, looks at the pairs tied for the largest count: which of
# them would a trainer take that compares the pairs as strings, or one that takes the tied pair it meets first
# (words in the table's order, pairs from left to right)?

# %%
table = {tuple(word): count for word, count in bpe_word_counts.items()}
parts_ways = {}
merges_with_ties = 0
for step, real in enumerate(hf_merges, start=1):
    counts = pair_counts_impl(table)
    top = max(counts.values())
    tied = {pair for pair, count in counts.items() if count == top}
    merges_with_ties += len(tied) > 1
    met_first = next(pair for word in table for pair in zip(word, word[1:]) if pair in tied)
    for rule, choice in [("as strings", min(tied)), ("met first", met_first)]:
        if choice != real and rule not in parts_ways:
            parts_ways[rule] = (step, len(tied), choice, real)
    table = {merge_pair_impl(word, real): count for word, count in table.items()}
print(f"{merges_with_ties} of the {len(hf_merges)} merges are chosen among tied pairs")
for rule, (step, n_tied, choice, real) in parts_ways.items():
    print(f"ties broken {rule:<10}: merge {step} differs ({n_tied} pairs tied): it takes {choice}, tokenizers {real}")

# %% [markdown]
# Ties decide 83 of the 200 merges. Comparing strings takes `(' a', 'n')` at merge 26, where the ids prefer
# `('c', 'e')`: the string `" a"` sorts before `"c"`, but `c` is a character and `␣a` a merged symbol, with a
# larger id. Taking the pair met first goes wrong even earlier, at merge 20. From there on, each such trainer
# learns from another word table, and its later merges differ too.
#
# ### Exercise 5 — `encode_word`
# > **Difficulty** ●○○ · **Importance** ●●● · about 10 minutes
#
# Training produced a list of merges. Encoding a word replays them: start from its characters and apply the
# merges **in the order they were learned**, each one everywhere in the word.
#
# Write `encode_word(word, merges)`.
#
# * `word`: a string (a pre-tokenised word, possibly with its leading space).
# * `merges`: a list of pairs, as `train_bpe` returns it.
# * returns the list of tokens (strings); joined together, they spell the word.
#
# Worked examples: with the four merges of the worked example above, `encode_word("lowest", merges)` is
# `["low", "est"]`. With `[("b", "c"), ("a", "b")]`, `encode_word("abc", ...)` is `["a", "bc"]`: `(b, c)` was
# learned first, so it wins where the two overlap.
#
# <details><summary>Hint 1 — the idea</summary>The merges are a recipe to follow in order. Start from the word's characters; apply the first merge everywhere in the word, then the second, and so on to the last. Do not search the vocabulary for the longest piece that fits: that is WordPiece's rule (exercise 6), and it gives other tokens.</details>
# <details><summary>Hint 2 — the plan</summary>The symbols start as a tuple of one-character strings. One loop over <code>merges</code>, in their order; each turn replaces the symbols by what your <code>merge_pair_impl</code> makes of them and the current pair. Return the symbols as a list of strings.</details>
# <details><summary>Hint 3 — the key step</summary>The question that unlocks the step: with the merges
# <code>[("b", "c"), ("a", "b")]</code> and the word <code>"abc"</code>, what are the symbols after the first turn
# of the loop, and after the second? The second merge must see what the first one made, not the original
# characters.</details>

# %% nbgrader={"grade": false, "grade_id": "encode_word", "locked": false, "schema_version": 3, "solution": true, "task": false}
def encode_word(word: str, merges: list) -> list:
    """The tokens of one word: its characters with every merge applied, in the order learned."""
    ### BEGIN SOLUTION
    symbols = tuple(word)
    for pair in merges:  # the order of training
        symbols = merge_pair_impl(symbols, pair)
    return list(symbols)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "encode_word_test", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false} tags=["raises-exception"]
check_encode_word(encode_word)
### BEGIN HIDDEN TESTS
check_encode_word(encode_word, hidden=True)
### END HIDDEN TESTS

# %%
encode_word_impl = yours_or_reference(encode_word, check_encode_word)

# %% [markdown]
# A whole text is encoded word by word: pre-tokenise, encode each word, concatenate. Words repeat a lot, so each
# distinct word is encoded once:

# %%
def bpe_encode(text, merges):
    """Tokens of a whole text: pre_tokenize, then encode_word_impl each word (each distinct word once)."""
    cache, tokens = {}, []
    for word in pre_tokenize(text):
        if word not in cache:
            cache[word] = encode_word_impl(word, merges)
        tokens += cache[word]
    return tokens


for word in [" the", " function", " tokenization", " walked", " walking", " iterating"]:
    print(f"{word!r:>16} -> {encode_word_impl(word, merges)}")

# %% [markdown]
# Frequent words are single tokens; rarer ones are spelled from pieces the text uses often. Now the whole
# held-out text, compared with `tokenizers`' encoder, and decoded back:

# %%
val_tokens = bpe_encode(val_text, merges)
hf_encoding = hf_tokenizer.encode(val_text)
bpe_vocab = vocabulary_from_merges(merges, alphabet)  # the characters, then one symbol per merge
val_ids = tokens_to_ids(val_tokens, bpe_vocab)
print(f"held-out text: {len(val_text):,} characters -> {len(val_tokens):,} tokens, "
      f"{len(val_text) / len(val_tokens):.2f} characters per token; vocabulary of {len(bpe_vocab)}")
print("same tokens as tokenizers:", val_tokens == hf_encoding.tokens, "| same ids:", val_ids == hf_encoding.ids)
print("decoded text == original:", "".join(val_tokens) == val_text)

# %% [markdown]
# Your tokenizer and `tokenizers` agree token for token and id for id on 25,885 characters of text neither saw
# in training. With only 200 merges learned on a quarter of the training text (a vocabulary of 103 characters
# + 200 merges = 303 tokens), the text already takes 1.83 characters per token, and nothing is unknown.
# Notice *walked* and *walking* above: the same three pieces, then `ed` or `ing`.
#
# ## 4. WordPiece: the longest piece first
#
# BERT does not use BPE. Its tokenizer, **WordPiece**, was built for Japanese and Korean voice search by Schuster
# and Nakajima ("Japanese and Korean Voice Search", ICASSP 2012), used for translation by Wu et al. ("Google's
# Neural Machine Translation System", 2016), and taken over by Devlin et al. for BERT (2019). Its vocabulary is a
# list of pieces of words, like BPE's, but it differs from BPE in three ways:
#
# * **Where a piece sits.** Text is split into words at spaces and punctuation, and the spaces are thrown away.
#   A piece that continues a word carries a mark, `##`: `able` can start a word, `##able` ends *unhashable*. The
#   two are different tokens, so the vocabulary knows whether a piece starts a word, as BPE's leading space did.
# * **How a word is cut.** There are no merges to replay. The encoder reads the word from the left and takes the
#   **longest** piece of the vocabulary that fits, then the longest that fits right after it, and so on to the end
#   of the word: *greedy longest-match-first*.
# * **What is unknown.** If at some point of the word no piece fits, not even a single character, the encoder
#   gives up on the **whole word**: it becomes the one token `[UNK]`, and the pieces already found are dropped.
#   It also gives up, without searching, on a "word" longer than a limit: 100 characters in Hugging Face
#   `tokenizers`, 200 in Google's released code.
#
# That is the `WordpieceTokenizer` of Google's released BERT code (`tokenization.py` in the `google-research/bert`
# repository), and the `WordPiece` model of `tokenizers`. Where the vocabulary comes from is another matter.
# Schuster and Nakajima grow it like BPE, but choose each merge by how much it raises the likelihood of the
# training text under a language model of the pieces, not by its count; Google did not release that trainer (the
# repository's README: the code "was implemented in C++ with dependencies on Google's internal libraries").
# Hugging Face's `WordPieceTrainer` runs its BPE trainer with `##` on the pieces inside words and hands the
# vocabulary to the WordPiece encoder. We will do the same with *your* BPE after the exercise.

# %% [markdown]
# ### Exercise 6 — `wordpiece_encode`
# > **Difficulty** ●●○ · **Importance** ●●○ · about 25 minutes
#
# Write `wordpiece_encode(word, vocab, unk="[UNK]", prefix="##", max_chars=100)`: the WordPiece tokens of one word.
#
# * `word`: one word, a string without spaces (it may be empty).
# * `vocab`: the vocabulary, anything `in` can search: a set of tokens, or BERT's dict `{token: id}`.
# * `unk`: the unknown token; `prefix`: the mark of a piece that does not start the word; `max_chars`: the longest
#   word the encoder will search.
# * returns a list of tokens (strings): the pieces in order, every piece after the first written with `prefix`
#   in front, exactly as the vocabulary holds it; or `[unk]` alone, for a word longer than `max_chars` or a word
#   the vocabulary cannot cover.
#
# Worked examples, with `vocab = {"un", "hash", "able", "##hash", "##able", "##h", "##a", "##s", "##es"}`:
#
# * `wordpiece_encode("unhashable", vocab)` is `["un", "##hash", "##able"]`. At the start, `un` is the longest
#   piece in the vocabulary (`unhashable`, `unhashabl`, … `unh` are not). From the third character on, a piece is
#   looked up as `##hash`, never as `hash`; and `##hash` wins over `##h` because it is longer.
# * `wordpiece_encode("hashes", vocab)` is `["hash", "##es"]`.
# * `wordpiece_encode("unhash?able", vocab)` is `["[UNK]"]`: no piece covers the `?`, so the whole word is
#   unknown, although `un` and `##hash` were found before it.
# * `wordpiece_encode("unhashable", vocab, max_chars=9)` is `["[UNK]"]`: ten characters, one too many.
#
# <details><summary>Hint 1 — the idea</summary>Keep two positions: where the current piece starts and where it ends. For a given start, try the longest candidate first, the whole rest of the word, and shorten it one character at a time from the right until the vocabulary has it (looked up with the prefix, unless the start is the beginning of the word). The next piece starts where this one ended. If even the one-character candidate is missing, the word is unknown as a whole.</details>
# <details><summary>Hint 2 — the plan</summary>First compare the word's length with <code>max_chars</code>. Then an outer loop while the start is inside the word, and an inner loop that moves the end from the length of the word down to one past the start. For each end, build the candidate: the characters from start to end, with <code>prefix</code> in front unless the start is 0. The first candidate found in <code>vocab</code> is the piece: append it and move the start to its end. If the inner loop finishes without a match, return a list holding only <code>unk</code> (a <code>for</code> loop's <code>else</code> branch runs exactly then; a flag that stays None works too).</details>
# <details><summary>Hint 3 — the key step</summary>The question that unlocks the step: in the worked example
# <code>unhashable</code>, which candidates does the inner loop try for the piece that starts at position 2, in
# which order, and which one does the vocabulary hold? The page to read is the Python tutorial's section on
# <code>break</code> and the <code>else</code> clause of loops.</details>

# %% nbgrader={"grade": false, "grade_id": "wordpiece_encode", "locked": false, "schema_version": 3, "solution": true, "task": false}
def wordpiece_encode(word: str, vocab, unk: str = "[UNK]", prefix: str = "##", max_chars: int = 100) -> list:
    """The WordPiece tokens of one word: the longest piece of `vocab` first, `prefix` on every piece after the
    first, and [unk] alone for a word longer than `max_chars` or one the vocabulary cannot cover."""
    ### BEGIN SOLUTION
    if len(word) > max_chars:
        return [unk]  # too long to be a word: no search
    tokens, start = [], 0
    while start < len(word):
        for end in range(len(word), start, -1):  # the longest candidate first
            piece = word[start:end] if start == 0 else prefix + word[start:end]
            if piece in vocab:
                break
        else:  # the loop ran out: not even one character fits here
            return [unk]  # the whole word is unknown, not just this part of it
        tokens.append(piece)
        start = end  # the next piece starts right after this one
    return tokens
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "wordpiece_encode_test", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false} tags=["raises-exception"]
check_wordpiece_encode(wordpiece_encode)
### BEGIN HIDDEN TESTS
check_wordpiece_encode(wordpiece_encode, hidden=True)
### END HIDDEN TESTS

# %%
wordpiece_encode_impl = yours_or_reference(wordpiece_encode, check_wordpiece_encode)

# %% [markdown]
# **A WordPiece vocabulary from your BPE.** Encode every distinct word of the text your merges were trained on
# with your `encode_word`, and keep its pieces the WordPiece way: the first piece without its leading space, every
# later piece with `##` in front. (A word whose space no merge absorbed starts with a lone `" "` token; the word
# then starts at the next piece.) The two tokenizers then share their pieces, and what differs is the rule that
# cuts a word. A piece seen both at the start and inside words, such as `in` and `##in`, is now two tokens:

# %%
def as_wordpieces(bpe_tokens):
    """One word's BPE tokens written the WordPiece way: no leading space, `##` on every piece after the first."""
    if bpe_tokens[0] == " ":
        bpe_tokens = bpe_tokens[1:]  # no merge took the space: the word starts at the next token
    return [bpe_tokens[0].lstrip(" ")] + ["##" + token for token in bpe_tokens[1:]]


wp_vocab = {"[UNK]"}
for word in bpe_word_counts:  # the distinct words of BPE_TEXT
    if not word.isspace():
        wp_vocab.update(as_wordpieces(encode_word_impl(word, merges)))
print(f"WordPiece vocabulary: {len(wp_vocab)} tokens, {sum(t.startswith('##') for t in wp_vocab)} of them with ##"
      f" (your BPE: {len(bpe_vocab)} tokens)")
both_forms = sorted(t for t in wp_vocab if "##" + t in wp_vocab and t.isalpha() and len(t) > 1)
print("pieces kept in both forms, for example:", both_forms)
for word in ["iterator", "tokenization", "unhashable"]:
    print(f"{word!r:>15} -> {wordpiece_encode_impl(word, wp_vocab)}")

# %% [markdown]
# Now both tokenizers on the held-out text. A word is a piece of `pre_tokenize` that is not white space: BPE reads
# it with its leading space, WordPiece without. First, the same check as for BPE: `tokenizers`' own `WordPiece`
# model, given the same vocabulary, must cut every held-out word as your function does.

# %%
held_out = [word for word in pre_tokenize(val_text) if not word.isspace()]
distinct = list(dict.fromkeys(held_out))
bpe_of = {word: encode_word_impl(word, merges) for word in distinct}  # with the leading space
wp_of = {word: wordpiece_encode_impl(word.lstrip(" "), wp_vocab) for word in distinct}
hf_wordpiece = models.WordPiece({token: i for i, token in enumerate(sorted(wp_vocab))}, unk_token="[UNK]")
agree = sum(wp_of[word] == [t.value for t in hf_wordpiece.tokenize(word.lstrip(" "))] for word in distinct)
print(f"held-out words: {len(held_out):,} ({len(distinct):,} distinct), and "
      f"{sum(word.isspace() for word in pre_tokenize(val_text))} runs of white space that WordPiece drops")
print(f"your wordpiece_encode and tokenizers' WordPiece agree on {agree:,} of the {len(distinct):,} distinct words")

# %%
unknown_words = [word for word in held_out if wp_of[word] == ["[UNK]"]]
covered = [word for word in held_out if wp_of[word] != ["[UNK]"]]
known_to_bpe = set(bpe_vocab)
bpe_unknown = sum(any(t not in known_to_bpe for t in bpe_of[word]) for word in held_out)
lone_spaces = sum(bpe_of[word][0] == " " for word in covered)


def tokens_per_word(encoded, words):
    return sum(len(encoded[word]) for word in words) / len(words)


print(f"{'':>41} | {'BPE (yours)':>11} | {'WordPiece':>9}")
print(f"{'words with an unknown token':>41} | {bpe_unknown:>11} | {len(unknown_words):>9}")
print(f"{'share of the held-out words':>41} | {bpe_unknown / len(held_out):>11.1%} | "
      f"{len(unknown_words) / len(held_out):>9.1%}")
print(f"{'tokens per word, all ([UNK] is one)':>41} | {tokens_per_word(bpe_of, held_out):>11.2f} | "
      f"{tokens_per_word(wp_of, held_out):>9.2f}")
print(f"{f'tokens per word, the {len(covered):,} covered words':>41} | "
      f"{tokens_per_word(bpe_of, covered):>11.2f} | {tokens_per_word(wp_of, covered):>9.2f}")
print(f"{'the same, BPE lone-space tokens left out':>41} | "
      f"{tokens_per_word(bpe_of, covered) - lone_spaces / len(covered):>11.2f} | {tokens_per_word(wp_of, covered):>9.2f}")
bpe_pieces = {word: len(bpe_of[word]) - (bpe_of[word][0] == " ") for word in covered}  # lone space not counted
print(f"covered words that WordPiece cuts into fewer pieces than BPE: "
      f"{sum(len(wp_of[w]) < bpe_pieces[w] for w in covered):,}; into more: "
      f"{sum(len(wp_of[w]) > bpe_pieces[w] for w in covered):,}")

# %% [markdown]
# A few words both ways:

# %%
for word in [" objects", " documentation", " calling", " single", " guaranteed", " ABC", "KeyError"]:
    print(f"{word!r:>16}  BPE {bpe_of[word]}\n{'':>16}  WordPiece {wp_of[word]}")
print("the most frequent unknown words:", Counter(unknown_words).most_common(4))

# %% [markdown]
# Your function and `tokenizers` agree on every one of the 1,055 distinct held-out words. What the comparison
# shows:
#
# * **About the same length.** On the 5,540 words WordPiece covers, it needs 2.36 tokens per word; BPE needs 2.45,
#   or 2.38 with its lone-space tokens left out (WordPiece has no spaces to pay for). The pieces are the same, so
#   the small gap comes from the rule, and longest-first is greedy, not the fewest pieces. It wins on
#   *documentation*, where it reaches `##ment` and `##ation`, pieces the order of your merges never builds inside
#   this word. It loses on *calling*: after `cal` the longest piece is `##li`, which leaves `ng`, and with no `##ng`
#   in the vocabulary `n` and `g` come one by one, where BPE had `l` and `ing`. *single* goes the same way.
# * **Unknown words.** Your BPE's vocabulary holds every character of the held-out text, and no held-out word has
#   a token outside it. The WordPiece vocabulary holds a piece only in the position where your BPE produced it: in
#   the text your merges were trained on, `K` never started a word and `B` never stood inside one, so *KeyError*
#   and *ABC* become `[UNK]`, whole; so does every table border ` |`, because `|` appeared there only inside a
#   word. That is 2.6% of the held-out words, each one replaced by a token that says nothing about it.
# * **The text cannot come back.** WordPiece drops the spaces, and with them the 133 runs of white space (line
#   breaks, indentation) of the held-out text: `##` says that a piece continues a word, not how many spaces or
#   which line break came before the next word. Your BPE's tokens concatenate back to the exact text.
#
# The unknown words have a cheap remedy: give the vocabulary every character in both forms, `a` and `##a`. Then
# any word can at worst be spelled one character at a time, and only a character never seen in training makes a
# word unknown:

# %%
letters = [ch for ch in alphabet if not ch.isspace()]
full_vocab = wp_vocab | set(letters) | {"##" + ch for ch in letters}
full_of = {word: wordpiece_encode_impl(word.lstrip(" "), full_vocab) for word in distinct}
print(f"every character of the training text added in both forms: {len(full_vocab)} tokens, "
      f"{sum(full_of[word] == ['[UNK]'] for word in held_out)} unknown words, "
      f"{tokens_per_word(full_of, held_out):.2f} tokens per word")

# %% [markdown]
# No unknown word is left on this text, at the same 2.36 tokens per word. A character never seen in training still
# turns its whole word into `[UNK]`; on text in another script that can be most of the words. GPT-2 removed the
# problem at the root, with an alphabet of bytes.
#
# ## 5. Byte-level BPE in practice, with `tokenizers`
#
# Real models train their tokenizer with a fast library. GPT-2 (Radford et al., "Language Models are
# Unsupervised Multitask Learners", 2019) made one more change: BPE over **bytes** instead of characters. Text is
# first encoded as UTF-8, and the starting alphabet is the 256 possible byte values. Every string in every script
# is a sequence of bytes, so nothing can ever be unknown, with an alphabet of only 256 symbols. (`tokenizers`
# shows each byte as a printable character: a space is `Ġ`.)
#
# `train_byte_level_bpe` trains one with `tokenizers` (two special tokens, `<|endoftext|>` and `<pad>`, take the
# first ids). How much does a larger vocabulary shorten the text? **Predict**: from 500 to 4,000 tokens, eight
# times the vocabulary, how many times fewer tokens?

# %%
VOCAB_SIZES = [500, 1000, 2000, 4000]
byte_tokenizers = {size: train_byte_level_bpe([train_text], vocab_size=size) for size in VOCAB_SIZES}
chars_per_token = {}
print(f"{'vocabulary':>10} | {'held-out tokens':>15} | {'characters per token':>20}")
for size, tokenizer in byte_tokenizers.items():
    n_tokens = len(tokenizer.encode(val_text).ids)
    chars_per_token[size] = len(val_text) / n_tokens
    print(f"{size:>10,} | {n_tokens:>15,} | {chars_per_token[size]:>20.2f}")
print(f"8 times the vocabulary (500 -> 4,000): {chars_per_token[4000] / chars_per_token[500]:.2f} times fewer tokens")

# %%
fig, ax = plt.subplots(figsize=(5.5, 3.4))
ax.semilogx(VOCAB_SIZES, [chars_per_token[s] for s in VOCAB_SIZES], "o-", label="byte-level BPE (tokenizers)")
ax.semilogx([len(bpe_vocab)], [len(val_text) / len(val_tokens)], "s", label="your BPE (200 merges, 1/4 of the text)")
ax.axhline(chars_per_word, color="grey", ls="--", lw=1, label="whole words and punctuation (with unknowns)")
ax.axhline(1.0, color="grey", ls=":", lw=1, label="characters")
ax.set_xlabel("vocabulary size")
ax.set_ylabel("characters per token (held-out)")
ax.set_xticks([len(bpe_vocab)] + VOCAB_SIZES, [str(s) for s in [len(bpe_vocab)] + VOCAB_SIZES])
ax.set_xticks([], minor=True)
ax.legend(fontsize=7)
fig.tight_layout()
plt.show()

# %% [markdown]
# The returns diminish: each doubling of the vocabulary buys less. Eight times the vocabulary gives 1.8 times
# fewer tokens, and even 4,000 tokens stay short of whole words with their punctuation (4.45 characters per token
# on this text, section 2), which pay for their length with unknown tokens: 4.3% of the held-out letter words even
# with every training word in the vocabulary (section 1), and 5.9% of the held-out pieces once case, the leading
# space and punctuation are kept (section 2).
# A larger table also costs parameters (section 8) and leaves rare tokens with few training examples. Published
# models trained on far more text use larger vocabularies: about 30,000 tokens for BERT, 50,257 for GPT-2.
#
# **Shared pieces.** *Walk* never occurs in the help pages. How do two vocabularies cut the forms of a word?

# %%
for size in [1000, 4000]:
    tokenizer = byte_tokenizers[size]
    for word in [" walked", " walking", " iterated", " iterating"]:
        print(f"vocabulary {size:>5}: {word!r:>12} -> {tokenizer.encode(word).tokens}")

# %% [markdown]
# With 1,000 tokens, *walked* and *walking* are `Ġw al k` followed by `ed` and `ing`, and *iterated* and
# *iterating* share `Ġiter`: there the cut falls where a grammar book would put it. With 4,000 tokens it moves:
# *walked* becomes `Ġw al ked`, and its three pieces are no longer a stem and an ending. BPE's pieces are
# frequent strings, not stems and endings: a cut falls where an ending starts only when the frequencies put it
# there, and a larger vocabulary, whose later merges go on joining frequent strings, can join an ending to part of
# the stem. What a
# word vocabulary hides entirely, that *walked* and *walking* are related, a subword vocabulary shows only where
# the two share a piece (`Ġw al` here, at both sizes).
#
# **No unknowns, exact round trips.** Any string goes in, and decoding gives back exactly the string:

# %%
tokenizer = byte_tokenizers[4000]
for text in ["Tokenizers split text.", "naïve café, 3.14 ≥ π", "苹果公司发布了新手机", "emoji 🍎\tand\ttabs\n"]:
    ids = tokenizer.encode(text).ids
    print(f"{len(text):>3} characters -> {len(ids):>3} tokens, round trip exact: {tokenizer.decode(ids) == text}   {text!r}")
print("whole held-out text, round trip exact:", tokenizer.decode(tokenizer.encode(val_text).ids) == val_text)

# %% [markdown]
# ## 6. Why Chinese BERT predicts characters
#
# The Chinese sentence above, *苹果公司发布了新手机* ("Apple released a new phone"), is 10 characters and came out
# as 30 tokens. Look at them:

# %%
zh = "苹果公司发布了新手机"
print("tokens:", tokenizer.encode(zh).tokens)
print("UTF-8 bytes per character:", [len(ch.encode("utf-8")) for ch in zh])

# %% [markdown]
# Each Chinese character is three bytes in UTF-8, and our tokenizer, trained on English, learned no merge for
# them: every byte is a token, and the tokens are meaningless fragments (`è`, `ĭ`, `¹` are bytes shown as
# characters). It works, since nothing is unknown and decoding is exact, but the sequence is three times longer
# than the characters, and attention pays nine times the pairs.
#
# A tokenizer trained on Chinese text would merge those bytes back into characters. The Chinese encoders of the
# BERT era stopped there and made the **character** the token, for two reasons. Chinese has no spaces, so there are no words to
# pre-tokenise: finding word boundaries is itself an ambiguous task that needs a model. And the set of
# characters in use is small enough (a few thousand cover almost all text) to be the vocabulary itself, while
# words, as section 1 showed, never run out. BERT does exactly this. Its encoder is the WordPiece of section 4,
# and before WordPiece runs, BERT's tokenizer puts a space around every CJK character (the function
# `_tokenize_chinese_chars` in the `tokenization.py` of Google's `google-research/bert` repository "adds
# whitespace around any CJK character"),
# so that, in the words of that repository's notes on its multilingual models (`multilingual.md`, section
# "Tokenization"), Chinese is "effectively character-tokenized". `tokenizers` ships the same normaliser:

# %%
bert_normalizer = normalizers.BertNormalizer(handle_chinese_chars=True, lowercase=True)
spaced = bert_normalizer.normalize_str(zh + " Apple")
print(repr(spaced))
print([piece for piece, _ in pre_tokenizers.BertPreTokenizer().pre_tokenize_str(spaced)])

# %% [markdown]
# Every character is its own word, and WordPiece cannot merge across words, so the Chinese part of the
# vocabulary is characters. Google's Chinese BERT (`bert-base-chinese`) has 21,128 tokens (`vocab_size` in the
# model's `bert_config.json`), and its masked language model predicts one character out of them. Cui et al. ("Pre-Training with Whole Word Masking for
# Chinese BERT", 2021) keep that character vocabulary: they only choose which characters to hide by words, hiding
# all the characters of a word at once, and the model still predicts characters.
#
# That is the BERT era's choice, not a rule for Chinese. Today's Chinese large language models cut their text
# with subword vocabularies learned from a great deal of Chinese text and several times the size of Chinese BERT's
# (Baichuan 2's has 125,696 tokens: Yang et al., 2023, "Baichuan 2: Open Large-scale Language Models"), and such a
# vocabulary can hold a word of two or more characters as a single token. Finding word boundaries is still
# ambiguous, but a subword tokenizer does not need to find them: it merges whatever strings are frequent,
# as BPE does in English, and every merge shortens the text the model reads (section 7 counts what that saves).
#
# ## 7. The attention bill
#
# Self-attention compares every token with every token: for a text of $C$ characters cut into $n = C / r$ tokens,
# where $r$ is the number of characters per token, the scores matrix has
#
# $$n^2 = \frac{C^2}{r^2}$$
#
# entries, per head and per layer. The tokenizer divides the score matrix by $r^2$: the scores, and the work of
# computing them and of weighting the values with them. That is not the whole cost of a layer. Its projections and
# its feed-forward network work once per token, so their cost falls only by $r$, and chapter 07 counted that they
# do most of the work until the context is several times $d_{model}$ long (a decoder-only layer: about
# $12\, d_{model}^2$ multiply-adds per token for the weight matrices against $2\, n\, d_{model}$ for attention, equal
# at $n = 6\, d_{model}$). Below that crossover, the total compute falls by about $r$; only beyond it does the $r^2$
# of the score matrix dominate. For each tokenizer of this chapter, the number of tokens of a 1,000-character
# paragraph and its score matrix relative to characters:

# %%
rows = [("characters", 1.0)]
rows += [(f"byte-level BPE, vocabulary {s:,}", chars_per_token[s]) for s in VOCAB_SIZES]
rows += [("whole words and punctuation", chars_per_word)]
rows += [("Chinese through the English BPE", len(zh) / len(tokenizer.encode(zh).ids))]
print(f"{'tokenizer':>32} | {'chars/token r':>13} | {'tokens per 1,000 chars':>22} | {'pairs vs characters 1/r^2':>25}")
for name, r in rows:
    print(f"{name:>32} | {r:>13.2f} | {1000 / r:>22.0f} | {1 / r ** 2:>25.3f}")
print(f"score matrix divided by {chars_per_token[4000] ** 2:.1f} from characters to BPE 4,000, by "
      f"{(chars_per_token[4000] / chars_per_token[500]) ** 2:.1f} from BPE 500 to BPE 4,000, by "
      f"{chars_per_word ** 2:.1f} from characters to whole words and punctuation")

# %% [markdown]
# Going from characters to a 4,000-token BPE divides the score matrix by 14.7 and the number of tokens, hence the
# work of the weight matrices, by 3.83; the step from 500 to 4,000 tokens alone divides the score matrix by 3.3.
# Whole words with their punctuation would divide it by 19.8, at the price of the unknown words. For a context
# shorter than the crossover, the total compute of a layer falls by close to the smaller factor, the number of
# tokens. A context window is counted in tokens, so the same model also *reads* 3.8 times more text at once. And
# the last row is the bill for a script the tokenizer was not trained on: 3 times the tokens and 9 times the pairs
# of a character vocabulary.
#
# ## 8. The embedding table
#
# The tokenizer's job ends with a list of ids. The model's first layer turns each id into a vector of size
# $d_{model}$ by looking it up in a table $E$ of shape `[vocab, d_model]`: token $i$ gets row $i$. Prince writes
# the same thing as a matrix product (with vectors as columns, $X = \Omega_e T$): encode each token as a
# **one-hot** vector, all zeros except a 1 at its id, and multiply by the table. The one-hot row selects one row
# of the table; the table is a parameter like any other, learned by gradient descent.

# %% [markdown]
# ### Exercise 7 — `embedding_lookup`
# > **Difficulty** ●○○ · **Importance** ●●○ · about 10 minutes
#
# Write `embedding_lookup(ids, table)` **as a matrix product**: one-hot rows times the table.
#
# Plain indexing, `table[ids]`, gives exactly the same numbers, and that is the point: this exercise writes the
# lookup as a product. So do not index the table (no `table[ids]`, `index_select`, `F.embedding`,
# `nn.Embedding`, or a loop over `table[i]`): the check watches which PyTorch operations touch the table and
# refuses an answer that picks rows out of it.
#
# * `ids`: an integer (int64) tensor of any shape `[...]`, values in `[0, vocab)`.
# * `table`: `[vocab, d_model]`, float32 or float64.
# * returns `[..., d_model]` in the table's dtype: one row per id.
#
# Worked example: with `table = torch.arange(12.).reshape(4, 3)` (4 tokens, $d_{model} = 3$),
# `embedding_lookup(torch.tensor([2, 0]), table)` is `[[6., 7., 8.], [0., 1., 2.]]`: rows 2 and 0.
#
# <details><summary>Hint 1 — the idea</summary>Build the one-hot matrix of the ids: one row per id, one column per token of the vocabulary, a single 1 per row. A row with its 1 in column i, times the table, is row i of the table.</details>
# <details><summary>Hint 2 — the plan</summary>The one-hot matrix has shape <code>[..., vocab]</code>: one row per
# id, as many columns as the table has rows (not the largest id + 1, which may be smaller). Built from integer ids
# it comes out as integers, and a matrix product needs both sides in the table's dtype. Then the product with the
# table, <code>[vocab, d_model]</code>, gives <code>[..., d_model]</code>.</details>
# <details><summary>Hint 3 — the key step</summary>The page to read is <code>torch.nn.functional.one_hot</code>: its
# second argument, and the dtype it returns. A smaller example on other numbers: the one-hot rows of the ids
# <code>[1, 0]</code> over 3 classes are <code>[[0, 1, 0], [1, 0, 0]]</code>; times the column
# <code>[[10], [20], [30]]</code> they give <code>[[20], [10]]</code>.</details>

# %% nbgrader={"grade": false, "grade_id": "embedding_lookup", "locked": false, "schema_version": 3, "solution": true, "task": false}
def embedding_lookup(ids: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """one_hot(ids) @ table: ids [...] (int64) and table [vocab, d_model] -> [..., d_model]."""
    ### BEGIN SOLUTION
    one_hot = F.one_hot(ids, table.shape[0]).to(table.dtype)  # [..., vocab]: one 1 per row
    return one_hot @ table  # [..., d_model]
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "embedding_lookup_test", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false} tags=["raises-exception"]
check_embedding_lookup(embedding_lookup)
### BEGIN HIDDEN TESTS
check_embedding_lookup(embedding_lookup, hidden=True)
### END HIDDEN TESTS

# %%
embedding_lookup_impl = yours_or_reference(embedding_lookup, check_embedding_lookup)

# %% [markdown]
# Now the first sentence of the held-out text, through your tokenizer and into a table of our BPE's size.
# The product equals plain indexing, `table[ids]`, and PyTorch's `nn.Embedding` holding the same table:

# %%
sentence = val_text[: val_text.index(".") + 1]
ids = torch.tensor(tokens_to_ids(bpe_encode(sentence, merges), bpe_vocab))  # [seq]
d_model = 8
embedding = torch.nn.Embedding(len(bpe_vocab), d_model)
table = embedding.weight.detach()  # [vocab, d_model]
x = embedding_lookup_impl(ids, table)  # [seq, d_model]
print(f"{sentence!r}\n-> {len(ids)} ids -> embeddings of shape {list(x.shape)}")
print("one-hot @ table == table[ids]:", torch.equal(x, table[ids]), "| == nn.Embedding(ids):",
      torch.equal(x, embedding(ids).detach()))

# %% [markdown]
# Two consequences of "the lookup is a product". First, its gradient: the derivative of $\mathrm{onehot} \cdot E$
# with respect to $E$ is non-zero only in the rows of tokens that occur (`nn.Embedding` uses exactly that and
# never builds the one-hot matrix). Second, the same matrix read the other way, a vector times $E^\top$, gives
# one score per token of the vocabulary: exactly what the output layer computes. That is why many models
# **share** one matrix between the embedding and the output layer (*Attention Is All You Need*, section 3.4,
# shares it between both embeddings and the pre-softmax linear layer).

# %%
table_param = table.clone().requires_grad_(True)
embedding_lookup_impl(ids, table_param).sum().backward()
rows_with_gradient = table_param.grad.abs().sum(dim=-1).nonzero().flatten()
print(f"rows with a non-zero gradient: {len(rows_with_gradient)} of {len(bpe_vocab)}; "
      f"distinct ids in the sentence: {len(set(ids.tolist()))}")

# %% [markdown]
# A zero gradient does not mean an unchanged row: that depends on the optimiser. Plain SGD moves each weight by
# its gradient alone, so a step changes only the rows of the tokens in the batch. Adam (Kingma and Ba, "Adam: A
# Method for Stochastic Optimization", ICLR 2015) moves each weight by running averages of its past gradients, so
# a row keeps moving for many steps after its token last appeared. AdamW (Loshchilov and Hutter, "Decoupled
# Weight Decay Regularization", ICLR 2019) adds weight decay as a step of its own: every weight shrinks a little
# at every step, whatever its gradient. PyTorch has `torch.optim.SparseAdam` (used with
# `nn.Embedding(sparse=True)`) for models that want Adam to touch only the rows in the batch.
#
# Three copies of the table above, one per optimiser: one step on the sentence above (the first held-out
# paragraph), then one step on the second paragraph; we count the rows that the **second** step changed.
# Chapters 09 and 10 train with AdamW, weight decay on the embedding tables included.

# %%
paragraphs = val_text.splitlines()[:2]  # the sentence above, then the next paragraph
batches = [torch.tensor(tokens_to_ids(bpe_encode(text, merges), bpe_vocab)) for text in paragraphs]  # [seq] each
OPTIMISERS = {
    "SGD": lambda params: torch.optim.SGD(params, lr=0.1),
    "Adam": lambda params: torch.optim.Adam(params, lr=1e-3),
    "AdamW, weight decay 0.01": lambda params: torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01),
}
rows_moved = {}
for name, make in OPTIMISERS.items():
    weights = torch.nn.Parameter(table.clone())  # [vocab, d_model], the same start for each optimiser
    optimiser = make([weights])
    for batch in batches:
        before = weights.detach().clone()
        optimiser.zero_grad()
        embedding_lookup_impl(batch, weights).pow(2).sum().backward()  # any loss of the batch's rows
        optimiser.step()
    rows_moved[name] = int((weights.detach() != before).any(dim=-1).sum())
print(f"distinct ids: first paragraph {len(set(batches[0].tolist()))}, second {len(set(batches[1].tolist()))}, "
      f"either {len(set(batches[0].tolist()) | set(batches[1].tolist()))}; vocabulary {len(bpe_vocab)}")
for name, moved in rows_moved.items():
    print(f"{name:>25}: the second step changed {moved:>3} rows")
first_ids, second_ids = (set(batch.tolist()) for batch in batches)
claim(rows_moved["SGD"] == len(second_ids) and rows_moved["Adam"] == len(first_ids | second_ids)
      and rows_moved["AdamW, weight decay 0.01"] == len(bpe_vocab),
      "SGD: the second paragraph's rows; Adam: the rows of either paragraph; AdamW: every row", measured=rows_moved)

# %% [markdown]
# SGD changes exactly the rows of the second paragraph's tokens. Adam also moves the rows that only the first
# paragraph used, although the second step gives them a zero gradient: their running averages still remember
# the first step. AdamW changes every row of the table. So "a step updates only the embeddings of the tokens in
# the batch" holds for plain SGD (and for `SparseAdam`), not for the optimiser of chapters 09 and 10.

# %% [markdown]
# The table is also big. It has vocab × $d_{model}$ parameters. Prince quotes a typical $|V| = 30{,}000$ with
# $D = 1{,}024$, about 31 million parameters, before any Transformer layer:

# %%
for vocab_size, width in [(4000, 512), (30000, 1024), (50257, 768)]:
    print(f"vocabulary {vocab_size:>6,} x d_model {width:>5,} = {vocab_size * width / 1e6:>5.1f} M parameters")

# %% [markdown]
# (50,257 × 768 is GPT-2 small's table: 39 M of its 124 M parameters.)
#
# ## 9. The sqrt(d_model) scale, measured
#
# *Attention Is All You Need* (section 3.4) multiplies the embedding weights by $\sqrt{d_{model}}$ before adding
# the positional encoding, and the library's `TokenEmbedding` does the same. The usual explanation: so that the
# token embedding is not drowned by the positions. Whether that is true depends on how big the embeddings are in
# the first place, which depends on how the table was **initialised**. Three common choices:
#
# * `nn.Embedding`'s default: every entry $\mathcal{N}(0, 1)$;
# * $\mathcal{N}(0, 1/d_{model})$, the choice of the paper's own code, tensor2tensor (whose `SymbolModality` draws
#   every embedding table so, shared with the output layer or not), and of fairseq's Transformer;
# * Xavier (Glorot) uniform, which the library's `EncoderDecoder` applies to every matrix, embeddings included.
#
# The sinusoidal positional encoding (chapter 04) has a fixed size: each (sin, cos) pair contributes
# $\sin^2 + \cos^2 = 1$, so every position vector has norm exactly $\sqrt{d_{model}/2}$.
#
# We measure three things for $d_{model} = 64$ and $512$ and a vocabulary of 4,000: the average norm of a token's
# vector, with and without the scale, against the positional norm; and a probe of what survives in the sum
# $x = s\,e_{token} + p_{pos}$. The probe asks a dot product to find the token back (the row of the table most
# aligned with $x$) and the position back (the most aligned positional vector), for 1,000 random tokens at random
# positions out of 256. Chance is 1 in 4,000 for the token and 1 in 256 for the position. **Predict** before
# running: with `nn.Embedding`'s default, does the scale help or hurt?

# %% tags=["nbval-ignore-output"]
def sum_probe(table, pe, scale, n=1000, seed=8):
    """Share of tokens and of positions a dot product recovers from scale * table[id] + pe[pos]."""
    g = torch.Generator().manual_seed(seed)
    token_ids = torch.randint(table.shape[0], (n,), generator=g)
    positions = torch.randint(pe.shape[0], (n,), generator=g)
    x = scale * table[token_ids] + pe[positions]  # [n, d_model]
    token_found = ((x @ table.T).argmax(-1) == token_ids).float().mean().item()
    position_found = ((x @ pe.T).argmax(-1) == positions).float().mean().item()
    return token_found, position_found


INITS = {
    "N(0, 1), nn.Embedding": lambda t: torch.nn.init.normal_(t, 0.0, 1.0),
    "N(0, 1/d_model)": lambda t: torch.nn.init.normal_(t, 0.0, t.shape[1] ** -0.5),
    "Xavier uniform": torch.nn.init.xavier_uniform_,
}
VOCAB, MAX_LEN = 4000, 256
scale_results = []
for d in [64, 512]:
    pe = sinusoidal_encoding(MAX_LEN, d)  # [256, d], every row of norm sqrt(d / 2)
    for name, init in INITS.items():
        torch.manual_seed(d)
        emb_table = init(torch.empty(VOCAB, d))  # [vocab, d]
        norm = emb_table.norm(dim=-1).mean().item()
        for scale in [1.0, math.sqrt(d)]:
            token_found, position_found = sum_probe(emb_table, pe, scale)
            scale_results.append((d, name, scale, scale * norm, pe.norm(dim=-1).mean().item(), token_found,
                                  position_found))

print(f"{'d':>3} | {'init':>22} | {'scale':>6} | {'|token|':>8} | {'|position|':>10} | {'token found':>11} | "
      f"{'position found':>14}")
for d, name, scale, token_norm, pe_norm, token_found, position_found in scale_results:
    print(f"{d:>3} | {name:>22} | {scale:>6.2f} | {token_norm:>8.2f} | {pe_norm:>10.2f} | {token_found:>11.1%} | "
          f"{position_found:>14.1%}")

# %% [markdown]
# The norms and the dot products are sums of floats, whose last digits depend on the processor, so the table above
# is your machine's. What the text below reads from it holds on any machine:

# %%
found = {(d, name, scale > 1): (token_norm / pe_norm, token_found, position_found)
         for d, name, scale, token_norm, pe_norm, token_found, position_found in scale_results}
normal, small, xavier = INITS  # the three names, in the table's order
measured = "; ".join(f"d={d} {name} {'scaled' if scaled else 'unscaled'}: token {t:.1%}, position {p:.1%}"
                     for (d, name, scaled), (_, t, p) in found.items())  # shown if a claim fails
claim(all(found[512, init, scaled][1] >= 0.99 for init, scaled in [(normal, False), (small, True)])
      and found[512, small, True][2] >= 0.9,
      "at d = 512, N(0, 1) unscaled and N(0, 1/d) scaled: at least 99% of the tokens found back, and N(0, 1/d) "
      "scaled at least 90% of the positions", measured=measured)
claim_between(found[512, normal, False][2], 0.9, None,
              "at d = 512, N(0, 1) unscaled: at least 90% of the positions found back too")
claim(31 < found[512, normal, True][0] < 33, "N(0, 1) scaled at d = 512: the token is about 32 times the position",
      measured=measured)
claim_between(found[512, normal, True][2], None, 0.03,
              "N(0, 1) scaled at d = 512: at most 3% of the positions are found (chance: 1/256 = 0.4%)")
claim(found[512, small, False][1] <= 0.05 and found[64, small, False][1] <= 0.05,
      "N(0, 1/d) unscaled: at most 5% of the tokens are found back, at both sizes", measured=measured)
claim(found[512, xavier, False][1] <= 0.01 and found[512, xavier, True][1] >= 0.99,
      "Xavier at d = 512: at most 1% of the tokens unscaled, at least 99% scaled", measured=measured)
claim_between(found[64, xavier, True][1], None, 0.1, "Xavier at d = 64, scaled: still at most 10% of the tokens")

# %%
SHORT = {"N(0, 1), nn.Embedding": "N(0, 1)", "N(0, 1/d_model)": "N(0, 1/d)", "Xavier uniform": "Xavier"}
fig, axes = plt.subplots(1, 2, figsize=(9, 3.2), sharey=True)
for ax, d in zip(axes, [64, 512]):
    mine = [r for r in scale_results if r[0] == d]
    labels = [f"{SHORT[r[1]]}\n{'x sqrt(d)' if r[2] > 1 else 'unscaled'}" for r in mine]
    ax.bar(range(len(mine)), [r[3] for r in mine], color=["#9ecae1" if r[2] == 1 else "#3182bd" for r in mine])
    ax.axhline(mine[0][4], color="#e6550d", lw=1.5, label=f"|position| = sqrt(d/2) = {mine[0][4]:.1f}")
    ax.set_yscale("log")
    ax.set_xticks(range(len(mine)), labels, fontsize=6.5)
    ax.set_title(f"d_model = {d}: norm of a token's vector", fontsize=9)
    ax.legend(fontsize=7)
fig.tight_layout()
plt.show()

# %% [markdown]
# The scale is right for one initialisation and wrong for another:
#
# * **$\mathcal{N}(0, 1)$, `nn.Embedding`'s default.** The token vector already has norm $\approx\sqrt{d}$, larger
#   than the position's $\sqrt{d/2}$, and both are found back at $d = 512$: at least 99% of the tokens and 90%
#   of the positions on every CPU we tried (about 94% of the positions here). Multiplying by $\sqrt{d}$ makes the
#   token 32 times the position at $d = 512$, and the position is lost: about 1% found here, at most 3% on every
#   CPU we tried, where chance is 0.4%. Here the scale **hurts**, and the model would have to learn to shrink its
#   embeddings to see word order.
# * **$\mathcal{N}(0, 1/d)$.** The token vector has norm $\approx 1$ against the position's 16, and the token
#   drowns (at most 5% found). The scale brings it to $\sqrt{d}$, $\sqrt{2}$ times the position's $\sqrt{d/2}$
#   (at $d = 512$, $\sqrt{512}$ against $\sqrt{256} = 16$), and both survive: exactly the $\mathcal{N}(0, 1)$ row without scale. The
#   paper gives no reason for the scale, but this is the pairing its code uses: tensor2tensor draws its embedding
#   tables from $\mathcal{N}(0, 1/d_{model})$ and multiplies them by $\sqrt{d_{model}}$ when the hyperparameter
#   `multiply_embedding_mode` is `"sqrt_depth"`, its default.
# * **Xavier uniform** on a `[4000, d]` table gives entries of variance $2/(4000 + d)$, smaller still, and the
#   scale again rescues the token (from at most 1% to at least 99% at $d = 512$). At $d = 64$ it is not enough:
#   about 4% of the tokens are found here, at most 10% on every CPU we tried. The Xavier table shrinks as the
#   vocabulary grows.
#
# So "multiply by $\sqrt{d_{model}}$" is not a law of nature but a correction that pairs with a small
# initialisation. Training moves the norms anyway; what the scale sets is the balance at the start. The library's
# `EncoderDecoder` re-initialises its embedding tables with Xavier, so for it the scale is the rescue of the last
# row, not the harm of the first.

# %% [markdown]
# ## Summary
#
# * **Whole words** leave part of new text unknown, whatever the vocabulary: 11.4% of held-out words with 1,000
#   words, 5.9% with 2,000, and 4.3% with all 2,788 words of the training text. Many of the missing words are forms
#   of known ones (plurals, past tenses).
# * **Characters** leave nothing unknown but make the text 4.4 times longer than words with their punctuation,
#   about 20 times the attention pairs.
# * **BPE** learns its vocabulary by merging the most frequent pair of neighbouring symbols, inside words,
#   weighted by word counts, and encodes by replaying the merges in order. Your trainer, with ties broken by ids
#   (first symbol first, then second), made the same 200 merges as `tokenizers` and encoded the held-out text to
#   the same tokens and ids. The unigram model of T5, ALBERT and XLNet is another subword method in wide use.
# * **WordPiece** (BERT) cuts a word by the longest vocabulary piece first, marks the pieces inside a word with `##`,
#   and turns a word it cannot cover into one `[UNK]`. With a vocabulary made from your BPE's pieces, your encoder
#   agreed with `tokenizers` on all 1,055 distinct held-out words and cut them about as finely as BPE (2.36 tokens
#   per covered word, against 2.38 for BPE without its lone spaces), but lost 2.6% of the words to `[UNK]`, and the
#   spaces for good; every character in both forms brings the unknown words to none.
# * **Byte-level BPE** (GPT-2) starts from the 256 bytes, so any string is encodable and decodes exactly. On this
#   text, 500 to 4,000 tokens give 2.1 to 3.8 characters per token. Its pieces are frequent strings, which
#   sometimes cut a word where its ending starts (`k ed` in *walked* with 1,000 tokens) and sometimes not
#   (`ked` with 4,000).
# * **Chinese** through an English byte-level BPE costs 3 tokens per character. Chinese BERT
#   (`bert-base-chinese`, 21,128 tokens) uses the character as the token; today's Chinese large language models
#   use subword vocabularies several times larger, learned from Chinese text, which can hold a word of several
#   characters as one token.
# * The **embedding table** is a lookup that equals one-hot rows times the table; only the rows of the tokens
#   present get a gradient, but Adam's running averages and AdamW's weight decay move other rows too.
# * The **sqrt(d_model) scale** balances the token against the position when the table starts small
#   ($\mathcal{N}(0, 1/d)$, Xavier) and swamps the position when it starts at $\mathcal{N}(0, 1)$.
#
# ## What's next
#
# Chapter 09 builds **BERT** (Devlin et al., "BERT: Pre-training of Deep Bidirectional Transformers for Language
# Understanding", NAACL 2019), an encoder-only Transformer. Its input starts where this chapter ends, with an
# embedding table read at the token ids, and adds two more tables to it: a **segment** table (first or second
# sentence) and a table of **learned positions**, one row per position (chapter 04). Unlike section 9's
# Transformer, BERT does not multiply the token embeddings by $\sqrt{d_{model}}$; a LayerNorm follows the sum of
# the three. Two special tokens, `[CLS]` and `[SEP]`, frame the sentences. Devlin et al. cut their text with a
# WordPiece vocabulary of about 30,000 tokens (section 4 above); chapter 09 trains on a small made-up corpus whose
# words all fit in a whole-word vocabulary, so nothing there is unknown. The model learns by hiding 15% of the
# tokens and predicting them.

# %% [markdown]
# ## Where you stand
#
# The seven exercises of this chapter, and whether their last check passed. Fix an exercise, run its test cell
# again, then run this cell.

# %%
exercise_summary(check_oov_rate, check_pair_counts, check_merge_pair, check_train_bpe, check_encode_word,
                 check_wordpiece_encode, check_embedding_lookup)

# %% [markdown]
# ## Glossary · 术语表
#
# | English | 中文 | Meaning |
# |---|---|---|
# | tokenizer | 分词器 | cuts text into tokens from a fixed vocabulary and maps them to ids |
# | token | 词元 | one piece of text the model reads: a word, a subword, a character or a byte |
# | vocabulary | 词表 | the fixed list of tokens; a token's position in it is its id |
# | out-of-vocabulary (OOV) | 未登录词 / 词表外词 | a word the vocabulary lacks, replaced by `<unk>` in a word-level model |
# | subword | 子词 | a piece of a word, e.g. `ing`; frequent words stay whole, rare ones are spelled from subwords |
# | byte-pair encoding (BPE) | 字节对编码 | learns merges of the most frequent neighbouring pair; encodes by replaying them |
# | merge | 合并（规则） | one learned rule: the pair (a, b) becomes the symbol ab, everywhere, left to right |
# | pre-tokenization | 预分词 | the split into words that BPE's merges never cross |
# | byte-level BPE | 字节级 BPE | BPE over the 256 UTF-8 byte values (GPT-2): no string is ever unknown |
# | WordPiece | WordPiece | BERT's subword method (Schuster & Nakajima 2012; Wu et al. 2016); encodes by longest match |
# | greedy longest-match-first | 贪心最长匹配 | take the longest vocabulary piece that fits, then go on right after it |
# | continuation piece (`##`) | 词内后续词片（`##` 前缀） | a WordPiece token that continues a word, marked `##` |
# | unknown token `[UNK]` | 未知词元 `[UNK]` | the one token for what the vocabulary cannot cover; WordPiece gives it to the whole word |
# | character-level tokenization | 按字切分 / 字级别分词 | one token per character, as Chinese BERT does for Chinese |
# | embedding table / matrix | 嵌入矩阵 / 词嵌入表 | `[vocab, d_model]` parameters; token i's vector is row i |
# | one-hot vector | 独热向量 | all zeros except a 1 at the token's id; times the table, it picks one row |
# | weight tying | 权重共享 | one matrix for the input embedding and the output layer |
