# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Chapter 01 — From static word vectors to contextual ones · 从静态词向量到上下文表示
#
# A neural network computes with numbers, so the first thing any language model does is turn each
# word into a vector. For years the standard answer was a **static word vector** (word2vec, Mikolov
# et al. 2013; GloVe, Pennington et al. 2014): one fixed vector per word, learned once from a large
# text and then looked up. This chapter builds
# such vectors with your own hands, finds out what they are good at, and then finds out where they
# break: the word *apple* (苹果) is a fruit in "I ate an apple" and a company in "Apple held a launch
# event", but a static table gives it a single vector for both.
#
# The fix, and the idea behind the Transformer, is to treat the looked-up vector only as a starting
# point and to **mix in the context**: each word's final vector is a weighted combination of the
# vectors around it, with weights computed by *attention*. By the end of the chapter you will have
#
# 1. built word vectors from co-occurrence counts (counts → PPMI → SVD) on real English text;
# 2. measured how a single vector for *apple* blends its two senses;
# 3. made the vector of *apple* depend on its sentence with a few lines of attention;
# 4. toured the Transformer's architecture: encoder, decoder, encoder–decoder;
# 5. computed attention as **alignment** between a translation and its source;
# 6. seen, with a timer and with gradients, why recurrent networks (RNNs) were replaced.
#
# Five exercises are autograded: `cooccurrence_counts`, `ppmi`, `cosine_similarity`,
# `contextual_vectors` and `alignment`; together they take about 70 minutes. When an answer is wrong, the test cell tells you which common
# mistake it looks like. After each test, one line says whether the rest of the chapter runs on
# **your** function (once it passes) or on the library's reference (until then), so you can run the
# whole notebook at any time; your answers carry the chapter as soon as they are right.

# %%
import copy
import time

import matplotlib.pyplot as plt
import torch

from transformer_lib.attention import scaled_dot_product_attention
from transformer_lib.checks import exercise_summary, yours_or_reference
from transformer_lib.checks.ch01 import (
    check_alignment,
    check_contextual_vectors,
    check_cooccurrence_counts,
    check_cosine_similarity,
    check_ppmi,
)
from transformer_lib.corpus import (
    APPLE_COMPANY_SENTENCE,
    APPLE_FRUIT_SENTENCE,
    apple_corpus,
    pydoc_paragraphs,
    pydoc_tokens,
    pydoc_topics,
    tokenize,
)
from transformer_lib.diagrams.ch01 import draw_encoder_decoder, draw_model_families, draw_rnn_vs_attention
from transformer_lib.static_vectors import (
    StaticVectors,
    build_vocabulary,
    fit_static_vectors,
    nearest_neighbours,
    svd_vectors,
)

torch.manual_seed(0)
torch.set_printoptions(precision=4, sci_mode=False)

# %% [markdown]
# ## 1. One word, one vector · 一词一向量
#
# ### 1.1 You shall know a word by the company it keeps
#
# How can a program learn what a word means without a dictionary? The **distributional hypothesis**
# (Harris 1954, Firth 1957) says: look at its neighbours. Words that appear in similar contexts tend
# to have similar meanings. In a text about Python we would expect *list* and *tuple* to keep much
# the same company (items, brackets, empty, ...), and *true* and *false* too. Count the neighbours of
# every word and you have a description of it — a long vector of counts.
#
# We need English text, and we will not download anything. Every Python installation ships the
# text of its own `help()` pages in `pydoc_data.topics`: about half a million characters of
# reference prose about Python. Those pages change a little with each Python release, so the course keeps
# a copy of Python 3.11.7's (`corpus.pydoc_topics()`): every learner counts the same words. `transformer_lib.corpus`
# keeps the prose paragraphs (no code blocks, no grammar rules) and splits them into lowercase word tokens.

# %%
topics = pydoc_topics()
print(f"{len(topics)} help topics, {sum(len(text) for text in topics.values())} characters")
paragraphs = pydoc_paragraphs()
tokens = pydoc_tokens()
print(f"{len(paragraphs)} paragraphs, {len(tokens)} tokens, {len(set(tokens))} distinct words")
print(paragraphs[200][:160], "...")
print(tokenize(paragraphs[200])[:14])
seen, repeated_tokens = set(), 0
for paragraph in paragraphs:
    if paragraph in seen:  # the same paragraph in another help topic
        repeated_tokens += len(tokenize(paragraph))
    seen.add(paragraph)
print(f"{len(paragraphs) - len(seen)} paragraphs repeat an earlier one: {repeated_tokens / len(tokens):.0%} of the tokens")

# %% [markdown]
# The help text repeats itself: some paragraphs stand in several topics, so about a fifth of the tokens (printed
# above) are counted twice or more. And the text is one long list of tokens, so the windows of the next section run
# across paragraph boundaries, pairing the last words of one paragraph with the first words of the next. We keep
# both, for simplicity; each adds counts that say nothing about what the words mean.
#
# Words seen only once or twice have too few neighbours to say anything reliable about them, so the
# **vocabulary** keeps the words that occur at least 5 times. Each word gets an integer **id**; ids are
# ordered by frequency, and the text becomes a tensor of ids (words outside the vocabulary are dropped).

# %%
vocab = build_vocabulary(tokens, min_count=5)
token_ids = vocab.encode(tokens)  # [n]
print(f"vocabulary: {len(vocab)} words; the text is {len(token_ids)} ids long")
print("most frequent:", vocab.words[:12])
print("the id of 'exception':", vocab.id("exception"))

# %% [markdown]
# ### 1.2 Counting neighbours
#
# Slide a **window** over the text: for every position $i$, the words at positions $i-w, \dots, i-1$ and
# $i+1, \dots, i+w$ are its neighbours. The **co-occurrence matrix** $C$ has one row and one column per
# vocabulary word:
#
# $$C_{ab} = \#\{(i, j) : \mathrm{id}_i = a,\ \mathrm{id}_j = b,\ 1 \le |i - j| \le w\}.$$
#
# Every pair is seen from both sides (if *b* is near *a*, *a* is near *b*), so $C$ is symmetric. A
# position is never its own neighbour; but in "very very" the word *very* has itself as a neighbour,
# which lands on the diagonal.
#
# **Predict first:** in a text of $n$ tokens (with $n > w$), how many counts does $C$ hold in total, that
# is, what is `counts.sum()`? Write your guess down; a cell after the exercise prints it.

# %% [markdown]
# ### Exercise 1 — `cooccurrence_counts`
# > **Difficulty** ●●○ · **Importance** ●●● · about 20 minutes
#
# Write `cooccurrence_counts(token_ids, vocab_size, window)`.
#
# * `token_ids`: a 1-D `LongTensor` `[n]` of ids in `[0, vocab_size)`;
# * `window`: how many neighbours to look at **on each side**;
# * returns a `float32` tensor `[vocab_size, vocab_size]` with `counts[a, b]` as defined above.
#
# Worked example: the text "to be or not to be" with ids `to=0, be=1, or=2, not=3` is `[0, 1, 2, 3, 0, 1]`.
# With `window=1`, *to* has neighbours *be* (twice) and *not* (once), so row 0 is `[0, 2, 0, 1]`;
# the cell after the test prints the whole matrix.
#
# <details><summary>Hint 1 — the idea</summary>Every pair of positions at distance 1 to <code>window</code> adds 1 to one
# entry of the matrix: the row of the word at one position, the column of the word at the other. Visit each
# pair from both ends and the matrix comes out symmetric by itself.</details>
# <details><summary>Hint 2 — the plan</summary>Start from a <code>[vocab_size, vocab_size]</code> float32 matrix of zeros. The
# simplest plan is two nested loops: every position, then every neighbour within <code>window</code> on either side,
# skipping the position itself and the neighbours that fall outside the text; it takes several seconds on the whole
# help text below. The fast plan loops over the distance d = 1, 2, …, <code>window</code> only: the text without its last d
# ids and the text without its first d ids, lined up, are all the pairs at distance d, two id tensors of shape
# <code>[n - d]</code>; add 1 for each pair, once in each direction. Careful: adding 1 at positions given by index
# <em>tensors</em> with ordinary indexing counts a pair that occurs several times only once. The tensor method
# <code>index_put_</code>, with its <code>accumulate</code> option on, adds every occurrence.</details>
# <details><summary>Hint 3 — the key step</summary>On a toy, <code>m = torch.zeros(3, 3)</code> then
# <code>m.index_put_((torch.tensor([0, 0]), torch.tensor([2, 2])), torch.tensor([1., 1.]), accumulate=True)</code>
# leaves a 2 at <code>m[0, 2]</code>: the repeated pair counts twice. With <code>m[rows, cols] += 1</code> it would be
# 1. The page to read: torch.Tensor.index_put_.</details>

# %% nbgrader={"grade": false, "grade_id": "cooccurrence_counts", "locked": false, "schema_version": 3, "solution": true, "task": false}
def cooccurrence_counts(token_ids: torch.Tensor, vocab_size: int, window: int) -> torch.Tensor:
    """Co-occurrence counts within `window` positions on each side.

    token_ids: LongTensor [n]; returns float32 [vocab_size, vocab_size], symmetric.
    """
    ### BEGIN SOLUTION
    counts = torch.zeros(vocab_size, vocab_size)  # [V, V]
    n = len(token_ids)
    for offset in range(1, window + 1):
        if offset >= n:
            break
        left, right = token_ids[:-offset], token_ids[offset:]  # pairs (i, i + offset)
        ones = torch.ones(len(left))
        counts.index_put_((left, right), ones, accumulate=True)  # right neighbours
        counts.index_put_((right, left), ones, accumulate=True)  # left neighbours
    return counts
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "cooccurrence_counts_test", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false} tags=["raises-exception"]
check_cooccurrence_counts(cooccurrence_counts)
### BEGIN HIDDEN TESTS
check_cooccurrence_counts(cooccurrence_counts, hidden=True)
### END HIDDEN TESTS

# %%
cooccurrence_counts_impl = yours_or_reference(cooccurrence_counts, check_cooccurrence_counts)

# %%
print(cooccurrence_counts_impl(torch.tensor([0, 1, 2, 3, 0, 1]), vocab_size=4, window=1))

# %% [markdown]
# Now on the whole help text, with a window of 4 words on each side.

# %%
WINDOW = 4
counts = cooccurrence_counts_impl(token_ids, len(vocab), WINDOW)  # [V, V]
n = len(token_ids)
print("counts:", list(counts.shape), "| symmetric:", torch.equal(counts, counts.T))
print(f"total counts {counts.sum().item():.0f}  vs  2 * (w*n - w*(w+1)/2) = {2 * (WINDOW * n - WINDOW * (WINDOW + 1) // 2)}")
print(f"share of word pairs never seen together: {(counts == 0).float().mean().item():.1%}")
word_totals = counts.sum(dim=1)  # [V]; C is symmetric, so these are the column sums too
rare_pairs = torch.outer(word_totals, word_totals) < counts.sum()  # [V, V]: expected count C_a. C_.b / N below 1
print(f"share of word pairs expected to meet less than once by chance: {rare_pairs.float().mean().item():.1%}")
print("C[true, false] =", counts[vocab.id("true"), vocab.id("false")].item())

# %% [markdown]
# Each of the $n$ positions has up to $w$ neighbours on each side; only the first and last $w$ positions
# miss some, hence $2\,(wn - w(w+1)/2)$. Also note how sparse $C$ is: most pairs of words never meet.
#
# ### 1.3 From counts to association: PPMI
#
# Raw counts are dominated by frequent words. Here are the words that appear most often near
# *exception* and near *true*:

# %%
def top_contexts(matrix: torch.Tensor, word: str, k: int = 8) -> list[str]:
    """The k context words with the largest entries in `word`'s row."""
    return [vocab.words[i] for i in matrix[vocab.id(word)].topk(k).indices.tolist()]


for word in ["exception", "true"]:
    print(f"{word:>9}, by raw count:", top_contexts(counts, word))

# %% [markdown]
# *the*, *is*, *if*: true, and useless — they are near every word. What we want is "how much **more
# often** than chance do these two words meet?". If words were scattered at random, *a* and *b* would
# meet with probability $P(a)\,P(b)$. **Pointwise mutual information** compares that with what we saw:
#
# $$\mathrm{PMI}(a, b) = \log \frac{P(a, b)}{P(a)\,P(b)} = \log \frac{C_{ab}\, N}{C_{a\cdot}\; C_{\cdot b}},$$
#
# where $N = \sum_{ab} C_{ab}$ is the total count, $C_{a\cdot}$ the sum of row $a$ and $C_{\cdot b}$ the sum of
# column $b$. PMI is positive when the words meet more often than chance, near 0 when they meet about as
# often as chance predicts, negative when they meet less often, and $-\infty$ when they never met. The
# negative values are the ones a text of this size cannot back up: to show that a pair meets *less* often
# than chance, its expected count $C_{a\cdot} C_{\cdot b} / N$ must be large enough for a shortfall to stand
# out from bad luck, and for 96.1% of the pairs of our vocabulary it is below one meeting (printed above).
# Jurafsky and Martin (*Speech and Language Processing*, 3rd edition draft, section 6.6) give this reason for
# keeping only the positive part — **positive PMI**:
#
# $$\mathrm{PPMI}(a, b) = \max\big(\mathrm{PMI}(a, b),\ 0\big),$$
#
# and PPMI is 0 wherever $C_{ab} = 0$.

# %% [markdown]
# ### Exercise 2 — `ppmi`
# > **Difficulty** ●●○ · **Importance** ●●○ · about 20 minutes
#
# Write `ppmi(counts)`.
#
# * `counts`: a floating-point tensor `[V, C]` (rows: words, columns: contexts; it need not be symmetric);
# * returns a tensor of the same shape and dtype with the PPMI of every entry, natural log.
#
# Entries with `counts == 0` must come out as `0` — including whole rows or columns of zeros (a word
# that never occurs), where the formula reads $0/0$. No `inf`, no `NaN`.
#
# Worked example: `counts = [[2, 0], [0, 2]]` has $N = 4$ and all row and column sums 2, so
# $\mathrm{PPMI}_{00} = \log(2 \cdot 4 / (2 \cdot 2)) = \log 2 \approx 0.6931$ and the off-diagonal entries are 0.
#
# <details><summary>Hint 1 — the idea</summary>Three sums and broadcasting: the total $N$ is one number, the row sums
# form a column <code>[V, 1]</code> and the column sums a row <code>[1, C]</code>, so their product is <code>[V, C]</code> and
# hands every entry its pair of sums. The only difficulty is the zeros: never let a log or a division see them.</details>
# <details><summary>Hint 2 — the plan</summary>(1) The total, the row sums and the column sums, each reduction keeping the
# dimension it sums over so that the results broadcast. (2) The ratio inside the log, but wherever the count is 0 put 1
# instead, <em>before</em> the log: log 1 = 0. The expected count (row sum times column sum) is 0 only where the count is 0
# as well; guard that division too, or the zeros turn into NaN. (3) Keep the positive part: clip the log below at 0.
# Picking between two tensors entry by entry is what <code>torch.where</code> does.</details>
# <details><summary>Hint 3 — the key step</summary>The question that unlocks it: which value of the ratio makes its log
# exactly 0, and how do you put that value in only where the count is 0? <code>torch.where</code> picks entry by entry,
# but it computes both of its branches everywhere first, so a division in one branch still sees the zeros: give its
# denominator a guard of its own.</details>

# %% nbgrader={"grade": false, "grade_id": "ppmi", "locked": false, "schema_version": 3, "solution": true, "task": false}
def ppmi(counts: torch.Tensor) -> torch.Tensor:
    """Positive pointwise mutual information of a [V, C] count matrix (same shape and dtype)."""
    ### BEGIN SOLUTION
    total = counts.sum()  # N
    row = counts.sum(dim=1, keepdim=True)  # [V, 1]
    col = counts.sum(dim=0, keepdim=True)  # [1, C]
    expected = row * col  # [V, C], zero only where the count is zero too
    ratio = torch.where(counts > 0, counts * total / torch.where(expected > 0, expected, 1.0), 1.0)
    return torch.log(ratio).clamp_min(0.0)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "ppmi_test", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false} tags=["raises-exception"]
check_ppmi(ppmi)
### BEGIN HIDDEN TESTS
check_ppmi(ppmi, hidden=True)
### END HIDDEN TESTS

# %%
ppmi_impl = yours_or_reference(ppmi, check_ppmi)

# %%
print(ppmi_impl(torch.tensor([[2.0, 0.0], [0.0, 2.0]])))

# %%
association = ppmi_impl(counts)  # [V, V]
for word in ["exception", "true"]:
    print(f"{word:>9}, by PPMI:", top_contexts(association, word))

# %% [markdown]
# The function words are gone. What rises to the top are words that occur *mostly* near the word:
# *handlers* and *occurred* for *exception*, *evaluates*, *false* and *boolean* for *true*. Some rare
# words sneak in too, after meeting the word only a few times (PPMI is known to overrate rare
# words); the next step, which keeps only the strongest patterns of the whole matrix, is less
# sensitive to such accidents.
#
# ### 1.4 Short, dense vectors: the SVD
#
# A row of the PPMI matrix already describes a word, but it is long (one entry per vocabulary word)
# and mostly zeros. The **singular value decomposition** writes the matrix as $M = U S V^\top$, with
# orthonormal columns in $U$ and $V$ and the singular values in $S$ sorted from largest to smallest.
# Keeping only the first $k$ columns gives the best rank-$k$ approximation of $M$, and the rows of
# $U_k S_k^{1/2}$ are $k$-dimensional word vectors. (The exponent $1/2$ instead of 1 is a choice made by
# experiment, not derived: Levy et al., 2015, section 3.3, treat the exponent as a setting to tune; in their
# tests 1, the "correct" SVD, did worse than $1/2$ and 0, and they advise against it.)
# `svd_vectors` in the library does this with `torch.linalg.svd`.
#
# One variant of word2vec is closely related: **skip-gram with negative sampling** (SGNS). Levy and
# Goldberg (2014) showed that, at its optimum, SGNS factorises a word–context PMI matrix shifted down by
# $\log k$ ($k$ negative samples per pair). The result is about SGNS, not every variant of word2vec, and SGNS
# reaches its factorisation by a weighted, stochastic optimisation rather than an exact SVD.

# %%
DIM = 50
vectors = svd_vectors(association, DIM)  # [V, 50]
static = StaticVectors(vocab, vectors)
print("word vectors:", list(vectors.shape))
print("the vector of 'list' starts with", vectors[vocab.id("list"), :5])
lengths = vectors.norm(dim=-1)  # [V]
log_frequency = torch.tensor([vocab.counts[i] for i in range(len(vocab))], dtype=torch.float32).log()  # [V]
print(f"correlation of a vector's length with the log of its word's frequency: "
      f"{torch.corrcoef(torch.stack([lengths, log_frequency]))[0, 1].item():.2f}")

# %% [markdown]
# ### 1.5 Comparing vectors: cosine similarity
#
# Two word vectors are similar when they point in the same direction. Their lengths carry something else:
# here they rise with the word's frequency, a correlation of 0.57 with its log (printed above), clear but
# far from complete. Whatever the length holds, two words with the same neighbours should count as similar
# even when one is much rarer than the other, so we compare directions only, with the **cosine** of the angle:
#
# $$\cos(a, b) = \frac{a \cdot b}{\lVert a \rVert\, \lVert b \rVert} \in [-1, 1].$$
#
# ### Exercise 3 — `cosine_similarity`
# > **Difficulty** ●○○ · **Importance** ●●● · about 10 minutes
#
# Write `cosine_similarity(a, b)` returning the cosine of **every** row of `a` with **every** row of `b`.
#
# * `a`: `[..., N, d]`, `b`: `[..., M, d]` (possibly with the same leading batch dimensions);
# * returns `[..., N, M]`.
#
# A zero vector has no direction: clamp each norm to at least `1e-8` before dividing, so that its
# cosine with anything is `0` (not `NaN`).
#
# Worked example: `a = [[1, 0], [1, 1]]`, `b = [[2, 0], [0, 3], [0, 0]]` gives
# `[[1, 0, 0], [0.7071, 0.7071, 0]]`.
#
# <details><summary>Hint 1 — the idea</summary>Normalise first: once every row has length 1, the cosine is just the dot
# product, and all $N \times M$ dot products are one matrix product.</details>
# <details><summary>Hint 2 — the plan</summary>Divide each row of <code>a</code> by its length: the norm over the last dimension,
# kept as a column <code>[..., N, 1]</code> and clamped to at least <code>1e-8</code> so a zero row gives 0, not NaN. The same
# for <code>b</code>. Then multiply the unit rows of <code>a</code>, <code>[..., N, d]</code>, by those of <code>b</code> with only
# their last two dimensions swapped, <code>[..., d, M]</code> (the <code>.T</code> attribute would also reverse the batch
# dimensions).</details>
# <details><summary>Hint 3 — the key step</summary>On other numbers: for <code>x = torch.tensor([[3., 4.], [0.,
# 0.]])</code> the length of each row, kept as a column, is <code>[[5.], [0.]]</code>; dividing <code>x</code> by it
# broadcasts over each row. What must happen to that 0 before you divide by it? The page to read:
# torch.linalg.vector_norm (its <code>keepdim</code> argument).</details>

# %% nbgrader={"grade": false, "grade_id": "cosine_similarity", "locked": false, "schema_version": 3, "solution": true, "task": false}
def cosine_similarity(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Pairwise cosine similarity: a [..., N, d], b [..., M, d] -> [..., N, M]."""
    ### BEGIN SOLUTION
    a_unit = a / a.norm(dim=-1, keepdim=True).clamp_min(1e-8)  # [..., N, d]
    b_unit = b / b.norm(dim=-1, keepdim=True).clamp_min(1e-8)  # [..., M, d]
    return a_unit @ b_unit.transpose(-2, -1)  # [..., N, M]
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "cosine_similarity_test", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false} tags=["raises-exception"]
check_cosine_similarity(cosine_similarity)
### BEGIN HIDDEN TESTS
check_cosine_similarity(cosine_similarity, hidden=True)
### END HIDDEN TESTS

# %%
cosine_similarity_impl = yours_or_reference(cosine_similarity, check_cosine_similarity)

# %%
print(cosine_similarity_impl(torch.tensor([[1.0, 0.0], [1.0, 1.0]]), torch.tensor([[2.0, 0.0], [0.0, 3.0], [0.0, 0.0]])))

# %% [markdown]
# ### 1.6 What did the vectors learn?
#
# The **nearest neighbours** of a word are the words with the highest cosine to it. **Predict:** which
# words will be nearest to *true*? To *class*?

# %%
def nearest(table: StaticVectors, word: str, k: int) -> list[tuple[str, float]]:
    """The k words with the highest cosine to `word` (itself excluded), by cosine_similarity_impl."""
    return nearest_neighbours(table.vectors, table.vocab, word, k, similarity=cosine_similarity_impl)


for word in ["true", "class", "list", "exception", "loop", "dictionary"]:
    neighbours = ", ".join(f"{w} {s:.2f}" for w, s in nearest(static, word, 5))
    print(f"{word:>11}: {neighbours}")

# %% [markdown]
# Not bad for counting: *true* finds *false*, *class* finds *instance*, *method*, *base* and *derived*,
# *loop* finds *break*. Nobody told the program any of this; it came from the company the words keep.
#
# A picture helps. Below, 20 words from four groups are projected from 50 dimensions to 2 (we take
# the two main directions of just these 20 vectors, principal component analysis, once more with an SVD).

# %%
GROUPS = {
    "numbers": ["integer", "float", "complex", "decimal", "number"],
    "errors": ["typeerror", "attributeerror", "valueerror", "keyerror", "indexerror"],
    "classes": ["class", "instance", "method", "base", "derived"],
    "control flow": ["while", "break", "continue", "loop", "else"],
}


def plot_2d(words_by_group: dict, table: StaticVectors, ax, title: str):
    """Scatter the words' vectors projected on their two main directions (PCA)."""
    words = [w for group in words_by_group.values() for w in group]
    points = torch.stack([table[w] for w in words])  # [n, d]
    # PCA = the SVD of the centred points; U S holds each point's coordinates.
    coords = svd_vectors(points - points.mean(dim=0), 2, power=1.0)  # [n, 2]
    start = 0
    for group, members in words_by_group.items():
        xy = coords[start:start + len(members)]
        ax.scatter(xy[:, 0], xy[:, 1], label=group, s=25)
        for (x, y), w in zip(xy.tolist(), members):
            ax.annotate(w, (x, y), fontsize=8, xytext=(3, 3), textcoords="offset points")
        start += len(members)
    ax.set_title(title, fontsize=10)
    ax.set_xticks([])
    ax.set_yticks([])


fig, ax = plt.subplots(figsize=(7, 4))
plot_2d(GROUPS, static, ax, "Static word vectors from Python's help text (PCA to 2-D)")
ax.legend(fontsize=8, loc="best")
plt.show()

# %% [markdown]
# Numbers and control flow stand apart; errors and classes overlap, and *while* lands near the errors. Before
# reading that as "the vectors confuse errors with classes", ask how much of the 50 dimensions the picture keeps,
# and whether the groups still overlap in all 50:

# %%
group_words = [w for group in GROUPS.values() for w in group]
group_of = {w: group for group, members in GROUPS.items() for w in members}
points = torch.stack([static[w] for w in group_words])  # [20, 50]
spread = torch.linalg.svdvals(points - points.mean(dim=0)) ** 2  # variance along each main direction
print(f"share of the 20 points' variance the two plotted directions keep: {(spread[:2].sum() / spread.sum()).item():.0%}")
similarity = cosine_similarity_impl(points, points).fill_diagonal_(-2.0)  # [20, 20], a word is not its own neighbour
closest = [group_words[j] for j in similarity.argmax(dim=-1).tolist()]
same = sum(group_of[w] == group_of[c] for w, c in zip(group_words, closest))
print(f"words whose nearest of the other 19, by cosine in 50 dimensions, is in their own group: {same} of 20")

# %% [markdown]
# The two plotted directions keep 43% of the variance, less than half. A projection can only bring points closer,
# never push them apart, so groups that stand apart in the picture are apart in the 50 dimensions too; an
# overlap, on the other hand, may be the projection's doing. Here it is: by the cosine this chapter compares
# words with, in all 50 dimensions, every one of the 20 words has a word of its own group as its nearest
# neighbour. Read a 2-D projection for the separations it shows, and check an overlap in the full space before
# believing it.
#
# ## 2. One vector, two meanings: 苹果 · 一词多义
#
# Static vectors have a hard limit built in: **one word, one vector**, fixed once training is over,
# whatever sentence the word appears in. Consider *apple* (苹果): in "she ate a ripe apple" it is a
# fruit (吃苹果), in "Apple announced a new phone" it is a company (苹果发布会). One vector has to
# serve both.
#
# Python's help pages say nothing about fruit, so for this experiment the library generates a small
# corpus from hand-written templates: half the sentences are about fruit, half about companies.
# *apple* fills some of the fruit slots and some of the company slots; the other fruits (*pear*,
# *banana*, ...) and the other companies (*microsoft*, *google*, ...) each keep to their own side.

# %%
sentences = apple_corpus()
fruit_sentences, company_sentences = sentences[0::2], sentences[1::2]  # the corpus alternates
for s in sentences[:6]:
    print("  ", s)
print(f"{len(fruit_sentences)} fruit sentences, {sum('apple' in tokenize(s) for s in fruit_sentences)} of them with 'apple'")
print(f"{len(company_sentences)} company sentences, {sum('apple' in tokenize(s) for s in company_sentences)} of them with 'apple'")

# %% [markdown]
# The same pipeline as in section 1 (counts in a window of 3 words, inside each sentence; PPMI;
# SVD to 16 dimensions) is wrapped in one library function, `fit_static_vectors`. We hand it the
# counting and PPMI functions to use: yours, once they pass their checks.

# %%
apple_table = fit_static_vectors([tokenize(s) for s in sentences], dim=16, window=3,
                                 counts_fn=cooccurrence_counts_impl, ppmi_fn=ppmi_impl)
print(f"{len(apple_table.vocab)} words; 'apple' occurs {apple_table.vocab.counts[apple_table.vocab.id('apple')]} times")

FRUIT = ["banana", "peach", "cherry", "plum"]
COMPANY = ["google", "samsung", "intel", "nokia"]


def sense_table(table: StaticVectors, words: list[str]):
    """Cosine of each word with the fruit words and with the company words."""
    probes = torch.stack([table[w] for w in FRUIT + COMPANY])  # [8, 16]
    print(f"{'':>10} | " + " ".join(f"{w:>8}" for w in FRUIT + COMPANY))
    for word in words:
        sims = cosine_similarity_impl(table[word][None], probes)[0]  # [8]
        print(f"{word:>10} | " + " ".join(f"{s:8.2f}" for s in sims.tolist()))


sense_table(apple_table, ["pear", "microsoft", "apple"])

# %% [markdown]
# *pear* is close to every fruit and unrelated to every company; *microsoft* the opposite. *apple* sits in
# between: moderately similar to both groups, and close to neither. Its nearest neighbours mix the
# two senses:

# %%
print(", ".join(f"{w} {s:.2f}" for w, s in nearest(apple_table, "apple", 8)))

# %% [markdown]
# A map makes this visible. Its two axes are meanings: the horizontal position of a word is its
# cosine with the **fruit centre** (the average vector of *banana, peach, cherry, plum*), the vertical
# position its cosine with the **company centre** (*google, samsung, intel, nokia*).
# **Predict:** where on this map will *apple* be?

# %%
fruit_centre = torch.stack([apple_table[w] for w in FRUIT]).mean(dim=0)  # [16]
company_centre = torch.stack([apple_table[w] for w in COMPANY]).mean(dim=0)  # [16]
centres = torch.stack([fruit_centre, company_centre])  # [2, 16]


def sense_coordinates(v: torch.Tensor) -> list[float]:
    """[cosine with the fruit centre, cosine with the company centre] of a vector [16]."""
    return cosine_similarity_impl(v[None], centres)[0].tolist()


def sense_map(ax, title: str):
    for group, words, colour in [("fruit", ["pear", "grape", "mango"] + FRUIT, "tab:green"),
                                 ("company", ["microsoft", "amazon", "ibm"] + COMPANY, "tab:blue")]:
        xy = torch.tensor([sense_coordinates(apple_table[w]) for w in words])
        ax.scatter(xy[:, 0], xy[:, 1], color=colour, s=20, label=f"{group} words")
    x, y = sense_coordinates(apple_table["apple"])
    ax.scatter([x], [y], color="tab:red", s=40, label="apple (static)")
    ax.set_xlabel("cosine with the fruit centre")
    ax.set_ylabel("cosine with the company centre")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, loc="upper center")


fig, ax = plt.subplots(figsize=(6, 4))
sense_map(ax, "One static vector for 'apple' has to serve both senses")
plt.show()

# %% [markdown]
# The static *apple* is a compromise: a point halfway between the fruit cluster and the company cluster.
# A model that receives this vector for "she ate a ripe apple" is handed something half company; for
# "Apple hired engineers" something half fruit. The information needed to tell the senses apart is
# right there in the sentence, but a lookup table cannot use it.
#
# ## 3. Contextual vectors: the same word, a different vector in each sentence · 上下文表示
#
# The Transformer keeps the lookup table, but treats its vectors as **initial** representations. Each
# word then looks at the other words of its sentence and takes in some of their vectors:
#
# $$x'_i = \sum_j a_{ij}\, x_j, \qquad a_{ij} = \frac{\exp(s \cdot \cos(x_i, x_j))}{\sum_{j'} \exp(s \cdot \cos(x_i, x_{j'}))}.$$
#
# The weights $a_{ij}$ — **attention weights** — are a softmax over the sentence: positive, summing to
# one, larger for the words most similar to word $i$. The *sharpness* $s$ sets how strongly the weights
# prefer the most similar words (we use $s = 2$). The same word in two sentences sees two different
# sets of neighbours, so it gets two different vectors.
#
# This is self-attention in its simplest form: no learned parameters yet (chapter 02 adds them).

# %% [markdown]
# ### Exercise 4 — `contextual_vectors`
# > **Difficulty** ●○○ · **Importance** ●●● · about 10 minutes
#
# Write `contextual_vectors(vectors, sharpness)`: every word of a sentence takes in the static vectors of
# the sentence, weighted by attention.
#
# * `vectors`: `[..., L, d]`, the static vectors of the $L$ words of a sentence (possibly a batch of sentences);
# * `sharpness`: the number $s$ that multiplies the cosines;
# * returns `[..., L, d]`: row $i$ is $x'_i = \sum_j a_{ij} x_j$, with the weights $a_{ij}$ of the formula above.
#
# The cosines only *choose* the weights; the average is taken of the static vectors themselves. The
# softmax must be stable for a large sharpness (subtract each row's maximum before `exp`, or use
# `torch.softmax`). You may call `cosine_similarity_impl`, the cosine of exercise 3 (yours, or the reference
# until yours passes).
#
# Worked example: three words with vectors `[[1, 0], [0, 1], [1, 0]]` and `sharpness = 1`. The cosines of
# word 0 with the sentence are `[1, 0, 1]`, whose softmax is `[0.4223, 0.1554, 0.4223]`, so word 0 becomes
# `0.4223·[1, 0] + 0.1554·[0, 1] + 0.4223·[1, 0] = [0.8446, 0.1554]`. The whole answer is
# `[[0.8446, 0.1554], [0.4239, 0.5761], [0.8446, 0.1554]]`.
#
# <details><summary>Hint 1 — the idea</summary>Three steps: how similar every word is to every word of its sentence, a
# softmax that turns each word's row of similarities into weights, and a weighted average of the static vectors with
# those weights.</details>
# <details><summary>Hint 2 — the plan</summary>Scores: $s$ times the cosines of the sentence with itself, shape
# <code>[..., L, L]</code> (row $i$: how similar word $i$ is to each word). Weights: a softmax over the last dimension, so each
# row sums to 1. Output: the weights <code>[..., L, L]</code> times the static vectors <code>[..., L, d]</code>, which is
# <code>[..., L, d]</code>.</details>
# <details><summary>Hint 3 — the key step</summary>Two questions. Which function you already wrote gives every pair's
# cosine, and what do you hand it to compare a sentence with itself? And over which dimension must each word's weights
# sum to 1: the one that indexes the word, or the one that indexes the words it looks at?</details>

# %% nbgrader={"grade": false, "grade_id": "contextual_vectors", "locked": false, "schema_version": 3, "solution": true, "task": false}
def contextual_vectors(vectors: torch.Tensor, sharpness: float) -> torch.Tensor:
    """Attention-weighted averages of a sentence's static vectors: [..., L, d] -> [..., L, d]."""
    ### BEGIN SOLUTION
    scores = sharpness * cosine_similarity_impl(vectors, vectors)  # [..., L, L]
    weights = torch.softmax(scores, dim=-1)  # [..., L, L], each row sums to 1
    return weights @ vectors  # [..., L, d]
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "contextual_vectors_test", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false} tags=["raises-exception"]
check_contextual_vectors(contextual_vectors)
### BEGIN HIDDEN TESTS
check_contextual_vectors(contextual_vectors, hidden=True)
### END HIDDEN TESTS

# %%
contextual_vectors_impl = yours_or_reference(contextual_vectors, check_contextual_vectors)

# %%
example = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]])  # the worked example's three words
print("weights of word 0:", torch.softmax(cosine_similarity_impl(example, example)[0], dim=-1))
print(contextual_vectors_impl(example, 1.0))

# %% [markdown]
# Now *apple* in two sentences it has never seen. For each sentence we print the weights with which
# *apple* takes in the words around it (row *apple* of the softmax), and keep its contextual vector:

# %%
SHARPNESS = 2.0
contextual_apple = {}
for sentence in [APPLE_FRUIT_SENTENCE, APPLE_COMPANY_SENTENCE]:
    words = tokenize(sentence)
    x = torch.stack([apple_table[w] for w in words])  # [L, 16] static vectors
    weights = torch.softmax(SHARPNESS * cosine_similarity_impl(x, x), dim=-1)  # [L, L], for display
    mixed = contextual_vectors_impl(x, SHARPNESS)  # [L, 16]
    i = words.index("apple")
    print(" ".join(f"{w}:{a:.2f}" for w, a in zip(words, weights[i].tolist())))
    contextual_apple[sentence] = mixed[i]  # [16]

# %% [markdown]
# *apple* keeps a good part of its own vector (0.36 and 0.42). In the second sentence *microsoft* stands out
# (0.20); in the first, no single word does: *pear* gets 0.13, but each *a* gets 0.12, so whatever moves
# *apple* there comes from the whole sentence, not from one word. Does that move it toward the right sense? We compare each
# vector with the average vector of the fruit words and of the company words (the probe words
# *banana, peach, cherry, plum* and *google, samsung, intel, nokia* do not occur in either sentence):

# %%
rows = [("static 'apple'", apple_table["apple"])] + [(f"'apple' in: {s}", v) for s, v in contextual_apple.items()]
print(f"{'':>52} fruit centre  company centre")
for label, v in rows:
    fruit_sim, company_sim = sense_coordinates(v)
    print(f"{label:>52} {fruit_sim:12.2f}  {company_sim:14.2f}")

# %% [markdown]
# The static vector is about equally close to both senses. After one round of attention, *apple* in the
# fruit sentence has moved toward the fruits and away from the companies, and *apple* in the company
# sentence the other way. Same word, same lookup table — two different vectors. On the map:

# %%
fig, ax = plt.subplots(figsize=(6, 4))
sense_map(ax, "Attention moves 'apple' toward the sense of its sentence")
start = sense_coordinates(apple_table["apple"])
labels = [("in the fruit sentence", (4, -8), "left"), ("in the company sentence", (-4, 4), "right")]
for v, (label, offset, align) in zip(contextual_apple.values(), labels):
    end = sense_coordinates(v)
    ax.annotate("", xy=end, xytext=start, arrowprops=dict(arrowstyle="->", color="tab:red"))
    ax.annotate(label, end, fontsize=8, color="tab:red", xytext=offset, textcoords="offset points", ha=align)
plt.show()

# %% [markdown]
# Real models go much further: the vectors pass through many such layers, and the similarities that
# decide the weights are computed from *learned* projections (queries and keys, chapter 02). BERT's
# "dynamic word vectors" (chapter 09) are this idea at full scale: many layers of learned attention,
# trained on billions of words.
#
# ## 4. The big picture: the Transformer's architecture · 整体架构
#
# Before the details of the next chapters, a look at the whole building. The original Transformer
# (Vaswani et al., 2017) was built for translation and has two halves. The **encoder** (理解, understanding)
# reads the source sentence; the **decoder** (生成, generation) writes the translation one word at a time.
# Each half is a stack of $N$ identical layers ($N = 6$ in the paper), and every decoder layer reads the
# encoder's output through **cross-attention**. Below, with this chapter's translation example:

# %%
draw_encoder_decoder()
plt.show()

# %% [markdown]
# (Each sub-layer is also wrapped in a residual connection and a layer normalisation, chapter 05.)
# The figure splits into four questions, which the next chapters answer one by one:
#
# 1. **How is the input encoded?** Word vectors plus a position signal (chapters 04, 08).
# 2. **What does attention do?** Lets each word re-weight the whole sequence by relevance (chapters 02, 03).
# 3. **How are the parts combined?** Multi-head attention, residual connections, normalisation and a
#    feed-forward network, stacked $N$ times (chapters 03, 05).
# 4. **What comes out?** The decoder produces one word at a time; a linear layer and a softmax turn its
#    last vector into a probability for each vocabulary word (chapters 06, 07).
#
# Later models kept one half or both (Prince, *Understanding Deep Learning*, 2023, chapter 12, walks
# through all three). Three families:

# %%
draw_model_families()
plt.show()

# %% [markdown]
# | family | attention inside | typical use | examples |
# |---|---|---|---|
# | encoder-only | self-attention over the whole input | understanding: classify, tag, find an answer span | BERT (ch. 09), ViT (ch. 12) |
# | decoder-only | masked self-attention (only the past) | generation: continue a text | GPT (ch. 10) |
# | encoder–decoder | both, plus cross-attention | turn one sequence into another: translate, summarise | the original Transformer; T5 (Raffel et al., 2020); the small model trained in chapter 07 has this shape |
#
# Inside these stacks, attention comes in three kinds, which differ in where the queries, keys and
# values come from, and which positions may be seen (chapter 06 builds the masks):
#
# | attention | where | queries from | keys and values from | may see |
# |---|---|---|---|---|
# | encoder self-attention | encoder layers | the encoder's input | the encoder's input | every input position |
# | masked self-attention | decoder layers | the decoder's input | the decoder's input | the current and earlier positions |
# | cross-attention (encoder–decoder attention) | decoder layers | the decoder | the encoder's output | every input position |
#
# The last kind is the oldest: it is how attention entered machine translation, as **alignment**.
#
# ## 5. Attention as alignment · 注意力即对齐
#
# Translate *she is eating a green apple* into French, *elle mange une pomme verte* (in Chinese,
# 她在吃一个绿苹果). An **encoder** reads the source and produces one vector per source word, the
# **encoder states** $h_1, \dots, h_S$. A **decoder** writes the translation one word at a time; before
# writing each word it is in some **decoder state** $s_t$.
#
# The early encoder–decoder networks (Cho et al., 2014; Sutskever et al., 2014) squeezed the whole source into
# a single vector of fixed size, however long the sentence. Sutskever et al.'s large LSTMs coped well with long
# sentences, but in Cho et al.'s study ("On the Properties of Neural Machine Translation", 2014) and in Bahdanau
# et al.'s (2015, Fig. 2) such models translated long sentences much worse than short ones. Attention (Bahdanau et al., 2015)
# lets the decoder look back at *all* encoder states, each time it writes a word, and focus on the
# ones that matter now: to write *verte* it should look at *green*. In the simple **dot-product** form
# (Luong et al., 2015):
#
# $$e_{tj} = s_t \cdot h_j, \qquad a_{tj} = \frac{\exp(e_{tj})}{\sum_{j'} \exp(e_{tj'})}, \qquad c_t = \sum_j a_{tj}\, h_j:$$
#
# first a **score** $e_{tj}$ for every source word, then the **weights** $a_{tj}$, then the **context vector** $c_t$.
# The weights $a_{t\cdot}$ say *where the decoder looks* while writing word $t$: a soft **alignment**
# between target and source words. The context vector $c_t$ is what it reads there. (Bahdanau et al. write these
# weights $\alpha_{tj}$ and Luong et al. $a_t(s)$; this course writes attention weights $a$ in every chapter.)

# %% [markdown]
# ### Exercise 5 — `alignment`
# > **Difficulty** ●○○ · **Importance** ●●● · about 10 minutes
#
# Write `alignment(decoder_states, encoder_states)` returning the tuple `(context, weights)`.
#
# * `decoder_states`: `[..., T, d]`, one row per target position;
# * `encoder_states`: `[..., S, d]`, one row per source position;
# * `weights`: `[..., T, S]`, the softmax of the dot-product scores over the **source** positions
#   (each row sums to 1); no $1/\sqrt{d}$ scaling in this exercise;
# * `context`: `[..., T, d]`, the weighted sums of the encoder states.
#
# Worked example: one decoder state `[[1, 0]]` and encoder states `[[1, 0], [0, 1]]` give scores
# `[1, 0]`, weights `[[0.7311, 0.2689]]` and context `[[0.7311, 0.2689]]`.
#
# Scores can be large: compute the softmax stably (subtract each row's maximum before `exp`, or use
# `torch.softmax`).
#
# <details><summary>Hint 1 — the idea</summary>The same three steps as in exercise 4, now between two sentences: scores
# of every target position against every source position, a softmax per target position, a weighted sum of
# the encoder states.</details>
# <details><summary>Hint 2 — the plan</summary>Scores <code>[..., T, S]</code>: every decoder state against every encoder state,
# one matrix product with the encoder states' last two dimensions swapped. Weights: a softmax over the source positions,
# the last dimension, stabilised by each row's maximum. Contexts: the weights <code>[..., T, S]</code> times the encoder
# states <code>[..., S, d]</code>, which is <code>[..., T, d]</code>. Return the contexts first, the weights second.</details>
# <details><summary>Hint 3 — the key step</summary>Shapes first: a <code>[2, 3]</code> tensor times a <code>[3,
# 4]</code> one is <code>[2, 4]</code>. The decoder states are <code>[..., T, d]</code> and the encoder states
# <code>[..., S, d]</code>: which of the two must be transposed, and on which two dimensions, for the product to be
# <code>[..., T, S]</code>? The page to read: torch.Tensor.transpose.</details>

# %% nbgrader={"grade": false, "grade_id": "alignment", "locked": false, "schema_version": 3, "solution": true, "task": false}
def alignment(decoder_states: torch.Tensor, encoder_states: torch.Tensor):
    """Dot-product attention of decoder states over encoder states.

    decoder_states [..., T, d], encoder_states [..., S, d] -> (context [..., T, d], weights [..., T, S]).
    """
    ### BEGIN SOLUTION
    scores = decoder_states @ encoder_states.transpose(-2, -1)  # [..., T, S]
    scores = scores - scores.amax(dim=-1, keepdim=True)  # stable: exp never overflows
    weights = scores.exp() / scores.exp().sum(dim=-1, keepdim=True)  # [..., T, S]
    context = weights @ encoder_states  # [..., T, d]
    return context, weights
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "alignment_test", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false} tags=["raises-exception"]
check_alignment(alignment)
### BEGIN HIDDEN TESTS
check_alignment(alignment, hidden=True)
### END HIDDEN TESTS

# %%
alignment_impl = yours_or_reference(alignment, check_alignment)

# %%
context, weights = alignment_impl(torch.tensor([[1.0, 0.0]]), torch.tensor([[1.0, 0.0], [0.0, 1.0]]))
print("weights", weights, "\ncontext", context)

# %% [markdown]
# This is the core of the Transformer's attention, with the decoder states as queries and the encoder states
# as both keys and values: the library's reference `alignment` is one line,
# `scaled_dot_product_attention(decoder_states, encoder_states, encoder_states, scale=1.0)`. Three parts of the
# Transformer's version are still missing: the $1/\sqrt{d}$ scale and the learned matrices $W^Q$, $W^K$, $W^V$ that
# turn states into queries, keys and values (chapter 02), and the several heads that run side by side
# (chapter 03).
#
# To see an alignment we need encoder and decoder states that mean something. A trained translation
# model would learn them; here we build them by hand. Each of 5 dimensions stands for one meaning
# (*person, eat, article, green, apple*); each English word gets the meaning it carries (*is* is
# mostly part of "eating", a little of "she"), and the decoder state for each French word points to
# the meaning it is about to express, times 3 to make the weights clear-cut: that list of meanings,
# `target_meaning`, is where we write down which French word expresses which meaning. A little noise keeps
# it honest.

# %%
english = ["she", "is", "eating", "a", "green", "apple"]
french = ["elle", "mange", "une", "pomme", "verte"]
#                        person  eat  article  green  apple
meanings = torch.tensor([[1.0,   0.0, 0.0,     0.0,   0.0],   # she
                         [0.3,   0.6, 0.0,     0.0,   0.0],   # is
                         [0.0,   1.0, 0.0,     0.0,   0.0],   # eating
                         [0.0,   0.0, 1.0,     0.0,   0.0],   # a
                         [0.0,   0.0, 0.0,     1.0,   0.0],   # green
                         [0.0,   0.0, 0.0,     0.0,   1.0]])  # apple
g = torch.Generator().manual_seed(0)
encoder_states = meanings + 0.05 * torch.randn(6, 5, generator=g)  # [S=6, 5]
target_meaning = [0, 1, 2, 4, 3]  # elle=person, mange=eat, une=article, pomme=apple, verte=green
decoder_states = 3.0 * torch.eye(5)[target_meaning] + 0.05 * torch.randn(5, 5, generator=g)  # [T=5, 5]

context, weights = alignment_impl(decoder_states, encoder_states)  # [5, 5], [5, 6]
print("weights (rows: French words, columns: English words):")
print(weights)
print("each row sums to", weights.sum(dim=-1))

# %% [markdown]
# **Predict** before you look at the picture: French puts the adjective after the noun. What shape will
# the bright cells make in the last two rows?

# %%
fig, ax = plt.subplots(figsize=(5, 3.6))
image = ax.imshow(weights, cmap="viridis", vmin=0, vmax=1)
ax.set_xticks(range(len(english)), english)
ax.set_yticks(range(len(french)), french)
ax.set_xlabel("source (encoder states)")
ax.set_ylabel("target (decoder states)")
ax.set_title("Dot-product attention as alignment", fontsize=10)
for t in range(len(french)):
    for j in range(len(english)):
        ax.text(j, t, f"{weights[t, j]:.2f}", ha="center", va="center", fontsize=7,
                color="black" if weights[t, j] > 0.5 else "white")
fig.colorbar(image, ax=ax, fraction=0.046)
plt.show()

# %% [markdown]
# The bright diagonal bends where the languages disagree: *pomme* looks at *apple* and *verte* at *green*,
# crossing over. *mange* gives most of its weight to *eating* and some to *is* — one French word for two
# English words. Be clear about what was built in and what was computed. We built in the meanings: the
# crossing is in `target_meaning = [0, 1, 2, 4, 3]`, which has *pomme* express the apple meaning and *verte*
# the green one, and *mange* shares *is* because we gave *is* part of the eating meaning. What the
# computation adds is the step from meanings to positions: the weights are a softmax of dot products, which
# know nothing about word order, so each French word finds the English word that carries its meaning wherever
# that word stands, and a crossing in meaning becomes a crossing in the picture. In a trained translation
# model the states themselves are learned, and the alignment is learned with them (chapter 07 trains an
# encoder–decoder model, on dates rather than sentences).
#
# ## 6. Why not a recurrent network? Slow and forgetful · RNN 的两个短板
#
# Before the Transformer, sequences were read by **recurrent neural networks** (RNNs, Elman 1990, and their
# gated versions LSTM, Hochreiter & Schmidhuber 1997, and GRU, Cho et al. 2014). An RNN reads one token at a
# time and keeps a **hidden state** $h_t$, updated by
#
# $$h_t = \tanh(W_x x_t + W_h h_{t-1} + b).$$
#
# Two problems follow from that one equation. The picture shows both: on the left, the chain of states
# the RNN must walk through; on the right, one layer of self-attention, where every output is wired
# directly to every input.

# %%
draw_rnn_vs_attention()
plt.show()

# %% [markdown]
# ### 6.1 Slow: each step waits for the one before
#
# $h_t$ needs $h_{t-1}$, which needs $h_{t-2}$, ...: a chain of $L$ steps that cannot run in parallel, however
# many processor cores are available. Self-attention compares every position with every other in one
# matrix product, $X X^\top$, in which all $L^2$ comparisons are independent. Count the operations that must
# happen one after the other, and the number of steps information needs to travel from the first token
# to the last. Vaswani et al. (2017, Table 1) write both as $O(n)$ for a recurrent layer and $O(1)$ for
# self-attention: a fixed number of matrix products, whatever the length.

# %%
print(f"{'length L':>9} | {'RNN: sequential steps':>21} | {'attention: sequential operations':>32} | path first -> last: RNN, attention")
for L in [8, 64, 512, 4096]:
    print(f"{L:>9} | {L:>21} | {'O(1)':>32} | {L - 1:>5}, 1")

# %% [markdown]
# A small timing on this machine's CPU (the numbers vary from run to run and from machine to machine). We time
# two RNNs that compute the same $L$ steps: a Python loop that calls `torch.nn.RNNCell` once per step, and
# `torch.nn.RNN`, which runs the loop inside PyTorch's C++ code:

# %% tags=["nbval-ignore-output", "timing"]
rnn_cell = torch.nn.RNNCell(64, 64)
rnn_layer = torch.nn.RNN(64, 64)  # the same recurrence, its loop in C++


def run_rnn(x):  # x: [L, 64]
    h = torch.zeros(64)
    for t in range(len(x)):  # L steps, one after the other
        h = rnn_cell(x[t], h)
    return h


def run_rnn_layer(x):  # x: [L, 64]
    return rnn_layer(x)[0][-1]  # still L steps one after the other, without Python between them


def run_attention(x):  # all L x L pairs in one go
    return scaled_dot_product_attention(x, x, x)[0]


def best_time_ms(f, x, repeats=5):
    """The fastest of a few runs: the least disturbed by whatever else the machine is doing."""
    f(x)  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        f(x)
        times.append(time.perf_counter() - start)
    return 1000 * min(times)


with torch.no_grad():
    for L in [128, 512]:
        x = torch.randn(L, 64)
        loop_ms = best_time_ms(run_rnn, x)
        print(f"L = {L:4}: Python loop of RNNCell {loop_ms:6.2f} ms ({1000 * loop_ms / L:4.1f} µs a step), "
              f"nn.RNN {best_time_ms(run_rnn_layer, x):6.2f} ms, self-attention {best_time_ms(run_attention, x):6.2f} ms")

# %% [markdown]
# Compare the two RNN columns first. They compute the same steps; what the loop adds is a call from Python into
# PyTorch at every step, and for matrices this small that call costs more than the arithmetic, so most of the
# loop's time is overhead. A fixed cost per call makes the loop's time per step the same at both lengths; if your
# two per-step times differ much, something else was using the CPU while the cell ran (run it again).
# `nn.RNN` takes the same $L$ steps without returning to Python between them, but it
# still takes them one after the other. A CPU timing like this one therefore measures overheads as much as
# parallelism; what holds on any hardware is the count above: however many cores a machine has, an RNN cannot
# use them to take its steps at once, while attention's $L^2$ comparisons can all run at the same time.
#
# (Attention pays for its parallelism with memory and arithmetic that grow as $L^2$; chapter 11 measures
# that and looks at the remedies.)
#
# ### 6.2 Forgetful: the first token fades away
#
# Everything the RNN knows about token 1 must survive $L-1$ updates to reach $h_L$; each update multiplies
# it by $W_h$ and squashes it through $\tanh$. How much does $h_L$ still depend on $x_t$? We measure the size
# of the gradient $\lVert \partial h_L / \partial x_t \rVert$ for every $t$ in a randomly initialised RNN,
# and do the same for the last output of one self-attention layer with random projections.
#
# **Predict:** plotted against the distance $L - t$, what shape will each curve have?

# %%
torch.manual_seed(0)
L, D, H = 40, 8, 32
rnn = torch.nn.RNN(D, H, nonlinearity="tanh", batch_first=True)
w_q, w_k, w_v = (torch.randn(D, H) / D**0.5 for _ in range(3))


def last_rnn_state(x):  # x: [L, D] -> h_L: [H]
    states, _ = rnn(x[None])  # [1, L, H]
    return states[0, -1]


def last_attention_output(x):  # x: [L, D] -> output at position L: [H]
    out, _ = scaled_dot_product_attention(x @ w_q, x @ w_k, x @ w_v)  # [L, H]
    return out[-1]


x = torch.randn(L, D)
influence = {}
for name, f in [("RNN", last_rnn_state), ("self-attention", last_attention_output)]:
    jacobian = torch.autograd.functional.jacobian(f, x)  # [H, L, D]: d output / d x_t
    influence[name] = jacobian.pow(2).sum(dim=(0, 2)).sqrt()  # [L], one norm per input position
distance = torch.arange(L - 1, -1, -1)  # L - t for t = 1..L
for name, values in influence.items():
    print(f"{name:>15}: influence of the last token {values[-1]:.3g}, of the first token {values[0]:.3g}")
per_step = (influence["RNN"][0] / influence["RNN"][-1]) ** (1 / (L - 1))
print(f"RNN: on average the influence is multiplied by {per_step:.2f} per step of distance")

# %%
fig, ax = plt.subplots(figsize=(6, 3.4))
for name, values in influence.items():
    ax.semilogy(distance, values, marker="o", markersize=3, label=name)
ax.set_xlabel("distance from the last position (L - t)")
ax.set_ylabel("|| d output_L / d x_t ||")
ax.set_title("How much the last output still depends on each input", fontsize=10)
ax.legend(fontsize=8)
plt.show()

# %% [markdown]
# On a logarithmic axis the RNN's curve is close to a straight line going down: the influence of a token
# shrinks by roughly a constant factor per step (printed above), exponentially in the distance. The first token has all
# but vanished from $h_L$, and during training the gradient that should teach the network to use it
# vanishes with it (the *vanishing gradient* problem). LSTMs and GRUs add gates that slow the fading, but
# everything still travels along the same chain. In self-attention every position is **one step** from
# every other: apart from the last token itself (which also asks the question, as the query), its curve
# has no trend with distance.
#
# How much of the printed factor, 0.53, is "the RNN" and how much the numbers it started from? It belongs to
# this particular, untrained network. PyTorch initialises every weight of `torch.nn.RNN` uniformly in
# $\pm 1/\sqrt{H}$, here $\pm 1/\sqrt{32} \approx \pm 0.18$; such a small $W_h$ shrinks the signal at every step.
# Another initialisation, or the weights that training arrives at, decay at a different rate, and can even
# make the influence grow with distance (the *exploding gradient* problem; Bengio et al. 1994 and Pascanu
# et al. 2013 analyse both). The same network, with only $W_h$ changed:

# %%
def per_step_factor(network: torch.nn.RNN) -> float:
    """The average factor by which the influence of x_t on h_L changes per step of distance."""
    def last_state(x):  # [L, D] -> [H]
        return network(x[None])[0][0, -1]

    norms = torch.autograd.functional.jacobian(last_state, x).pow(2).sum(dim=(0, 2)).sqrt()  # [L]
    return ((norms[0] / norms[-1]) ** (1 / (L - 1))).item()


variants = {}
for label, scale in [("PyTorch's default: uniform in ±1/sqrt(H)", 1.0), ("the same W_h times 2", 2.0),
                     ("the same W_h times 4", 4.0)]:
    variants[label] = copy.deepcopy(rnn)
    with torch.no_grad():
        variants[label].weight_hh_l0.mul_(scale)
variants["a random orthogonal W_h"] = copy.deepcopy(rnn)
torch.nn.init.orthogonal_(variants["a random orthogonal W_h"].weight_hh_l0, generator=torch.Generator().manual_seed(0))
for label, network in variants.items():
    print(f"{label:>42}: influence multiplied by {per_step_factor(network):.2f} per step")

# %% [markdown]
# Below 1 the early tokens fade, above 1 they swamp the rest, and training has to find its way between the
# two. Gated networks (LSTM, GRU) were designed to keep that factor near 1, but a single chain of steps
# remains the only road from the first token to the last.
#
# This is the deal the Transformer makes: drop recurrence entirely, let attention connect any two positions
# directly, compute all positions in parallel — and give back the word order that recurrence provided for
# free with **positional encodings** (chapter 04).

# %% [markdown]
# ## Summary
#
# * A static embedding gives every word **one fixed vector**. You built one from scratch: co-occurrence
#   counts in a window → PPMI → SVD; its nearest neighbours already capture much of a word's meaning.
# * One vector cannot hold two meanings: the static *apple* is a compromise between fruit and company.
# * A **contextual** vector mixes in the vectors of the surrounding words with attention weights (a
#   softmax over similarities); the same word then gets a different vector in each sentence.
# * The Transformer is built from encoder and decoder stacks; BERT keeps the encoder, GPT the decoder,
#   translation models both, linked by cross-attention.
# * Attention started as **alignment**: score each encoder state against the decoder state, softmax,
#   and read a weighted average, the context vector.
# * RNNs are **slow** ($L$ sequential steps, $O(1)$ for attention) and **forgetful**: the influence of a token
#   changes exponentially with distance, fading or exploding at a rate set by the weights (here it is multiplied by
#   0.53 per step, with PyTorch's default initialisation); attention connects any two positions in one hop.
#
# ## What's next
#
# In this chapter, attention compared raw word vectors. Chapter 02 gives every token three learned roles —
# **query, key and value** — scales the scores by $1/\sqrt{d_k}$ and finds out why, and writes self-attention
# for a whole sentence in five matrix products.

# %% [markdown]
# ## Where you stand
#
# Which of this chapter's exercises pass (the line for an exercise you have not checked yet says so):

# %%
exercise_summary(check_cooccurrence_counts, check_ppmi, check_cosine_similarity, check_contextual_vectors,
                 check_alignment)

# %% [markdown]
# ## Glossary · 术语表
#
# | English | 中文 | meaning |
# |---|---|---|
# | static word vector (embedding) | 静态词向量 | one fixed vector per word, whatever the sentence |
# | distributional hypothesis | 分布假设 | words in similar contexts have similar meanings |
# | vocabulary | 词表 | the words a model knows, each with an integer id |
# | co-occurrence matrix | 共现矩阵 | how often each word appears within a window of each other word |
# | pointwise mutual information (PMI, PPMI) | 点互信息（正点互信息） | log of how much more often two words meet than chance; PPMI keeps the positive part |
# | singular value decomposition (SVD) | 奇异值分解 | $M = USV^\top$; its first $k$ components give the best rank-$k$ approximation |
# | cosine similarity | 余弦相似度 | the cosine of the angle between two vectors, ignoring their lengths |
# | nearest neighbours | 最近邻 | the words whose vectors are most similar to a given word's |
# | polysemy | 一词多义 | one word form with several meanings (苹果: fruit or company) |
# | contextual representation | 上下文表示（动态词向量） | a word vector that depends on the sentence it is in |
# | attention weights | 注意力权重 | softmax of scores: how much each position contributes to a mix |
# | encoder / decoder | 编码器 / 解码器 | the stack that reads the input / the stack that generates the output |
# | cross-attention (encoder–decoder attention) | 交叉注意力（编码器-解码器注意力） | decoder queries attending to the encoder's states |
# | alignment | 对齐 | which source words a target word attends to |
# | context vector | 上下文向量 | the attention-weighted average of the encoder states |
# | recurrent neural network (RNN) | 循环神经网络 | reads a sequence one step at a time through a hidden state |
# | vanishing gradient | 梯度消失 | gradients that shrink exponentially over many steps, so early inputs stop being learned from |
# | exploding gradient | 梯度爆炸 | gradients that grow exponentially over many steps, so training becomes unstable |
