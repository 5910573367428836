# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Chapter 11 — Long sequences: sparse, linear and flash attention
#
# Self-attention lets every token look at every other token. That is its strength, and for long inputs it is
# also its weakness: $n$ tokens make $n^2$ query–key pairs. A sentence of 50 tokens gives 2,500 pairs,
# nothing at all. A book chapter of 16,000 tokens gives 256 million pairs, for every head of every layer. Double
# the length and the cost is multiplied by four; double it again and it is multiplied by sixteen.
#
# This chapter measures that cost and then takes apart the main ways around it:
#
# 1. **The quadratic cost, measured**: time and memory of dense attention as $n$ doubles, on a log-log plot.
# 2. **Sparse interaction patterns**: let each token talk to a few others only. A sliding window, a dilated
#    window, selected positions that see everything, and extra global tokens, drawn as interaction matrices.
# 3. **The receptive field**: a window sees little in one layer, but stacked layers see further and further.
# 4. **Banded attention**: you write a sliding window computed block by block, in $O(n \cdot w)$ time and memory,
#    with the same result as dense attention under the window's mask, and time it against dense attention.
# 5. **Linear attention**: change the similarity so that the $n \times n$ matrix never has to exist, and
#    measure how different the result is from softmax attention. You write its causal form twice: as prefix sums,
#    and as a recurrent network that carries one state from position to position.
# 6. **The online softmax behind FlashAttention**: *exact* attention, keys taken block by block, never holding
#    the $n \times n$ matrix. It saves memory traffic, not arithmetic.
# 7. **All of them side by side**, with PyTorch's fused `scaled_dot_product_attention` measured on the CPU.
#
# Eight exercises are autograded: `sliding_window_mask`, `dilated_mask`, `global_token_mask`, `receptive_field`,
# `banded_attention`, `causal_linear_attention`, `recurrent_linear_attention` and `online_softmax_step`. Together
# they take about 150 minutes; `banded_attention`, the longest, about 40 of them. When your answer passes its check,
# the rest of the chapter runs on it: the cost curves time your banded attention and measure the memory of your
# recurrent form.
#
# The patterns follow Simon J. D. Prince, *Understanding Deep Learning* (MIT Press, 2023), section 12.9, and the
# papers that introduced them: Child et al., "Generating Long Sequences with Sparse Transformers" (2019); Beltagy
# et al., "Longformer: The Long-Document Transformer" (2020); Zaheer et al., "Big Bird: Transformers for Longer
# Sequences" (2020); Katharopoulos et al., "Transformers are RNNs: Fast Autoregressive Transformers with Linear
# Attention" (2020); and Dao et al., "FlashAttention: Fast and Memory-Efficient Exact Attention with
# IO-Awareness" (2022). The masks use the course's convention: boolean, **True = may attend**.

# %%
import math
import time

import matplotlib.pyplot as plt
import numpy as np
import torch
import torch.nn.functional as F

from transformer_lib import sparse
from transformer_lib.attention import scaled_dot_product_attention, softmax
from transformer_lib.checks import exercise_summary, yours_or_reference
from transformer_lib.claims import claim, claim_between
from transformer_lib.checks.ch11 import (
    check_banded_attention,
    check_causal_linear_attention,
    check_dilated_mask,
    check_global_token_mask,
    check_online_softmax_step,
    check_receptive_field,
    check_recurrent_linear_attention,
    check_sliding_window_mask,
)
from transformer_lib.diagrams.ch11 import draw_interaction_patterns, draw_online_softmax

torch.manual_seed(0)
torch.set_printoptions(precision=4, sci_mode=False)
D = 64  # the size of one attention head in most Transformers (BERT-base, GPT-2: 768 / 12 heads)


def random_qkv(n, d=D, seed=0):
    """Queries, keys and values of one head for a sequence of n tokens: three [1, n, d] tensors."""
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(1, n, d, generator=g) for _ in range(3))


# %% [markdown]
# ## 1. The quadratic cost, measured
#
# Dense attention for one head computes the score matrix $S = Q K^\top / \sqrt{d}$, of shape $n \times n$, turns
# every row into weights with a softmax, and multiplies the weights by $V$. Counting one multiply and one add
# as two floating-point operations (FLOPs), the two matrix products cost $2 n^2 d$ each, so **$4 n^2 d$ FLOPs**,
# and the score matrix alone holds **$n^2$ numbers**. Before measuring anything, here is what the formulas say
# for $d = 64$:

# %%
print(f"{'n':>6} | {'pairs n^2':>12} | {'one n x n float32 matrix':>24} | {'FLOPs 4 n^2 d':>16}")
for n in [512, 1024, 2048, 4096, 8192, 16384]:
    print(f"{n:>6} | {n * n:>12,} | {n * n * 4 / 2**20:>20,.0f} MiB | {4 * n * n * D:>16.3g}")
print(f"\n512 -> 1024: cost x {(1024 / 512) ** 2:.0f};  512 -> 2048: cost x {(2048 / 512) ** 2:.0f}")

# %% [markdown]
# Doubling the length quadruples the cost, and two doublings multiply it by sixteen. And this is per head and per
# layer: a model shaped like BERT-base, 12 heads in each of 12 layers, would compute 144 such one-gigabyte matrices
# in one forward pass at $n = 16{,}384$, and training keeps them for the backward pass.
#
# Now the measurement. The cell below times the library's `scaled_dot_product_attention` (the readable path of
# chapter 02) for $n$ from 256 to 4,096 and asks PyTorch's profiler for the peak memory of each call:
# `sparse.peak_memory` adds up every allocation and free of PyTorch's CPU allocator, in order, and reports the
# largest total (Python's own `tracemalloc` cannot see these allocations). The times are CPU times, and depend on
# your machine, so the numbers will differ from one computer to the next; the slopes should not.

# %% tags=["nbval-ignore-output", "timing", "skip-when-grading"]
def best_time(fn, repeats=3):
    """CPU seconds of one call: the fastest of `repeats` calls after a warm-up. CPU time
    (time.process_time) counts the work this program does, not the time it waits while other
    programs use the processor, so the numbers stay meaningful on a busy machine."""
    with torch.no_grad():
        start = time.process_time()
        fn()
        if time.process_time() - start > 0.1:
            repeats = 1  # a long call is hardly disturbed by warm-up effects: time it once more
        times = []
        for _ in range(repeats):
            start = time.process_time()
            fn()
            times.append(time.process_time() - start)
    return min(times)


def loglog_slope(values, from_n=1024):
    """Slope of log(value) against log(n), fitted on n >= from_n: 2 means 'doubling n quadruples it'."""
    ns = [n for n in values if n >= from_n]
    return np.polyfit(np.log(ns), np.log([values[n] for n in ns]), 1)[0]


SIZES = [256, 512, 1024, 2048, 4096]
measured = {"dense": ({}, {})}  # method -> ({n: seconds}, {n: peak bytes})
for n in SIZES:
    q, k, v = random_qkv(n)
    seconds, memory = measured["dense"]
    seconds[n] = best_time(lambda: scaled_dot_product_attention(q, k, v))
    memory[n] = sparse.peak_memory(scaled_dot_product_attention, q, k, v)
    print(f"n = {n:>5}: {1e3 * seconds[n]:>8.1f} ms, peak {memory[n] / 2**20:>6.1f} MiB "
          f"(= {memory[n] / (4 * n * n):.2f} n x n matrices)")
print(f"\nfitted on n >= 1024: time slope {loglog_slope(seconds):.2f}, memory slope {loglog_slope(memory):.2f}")
claim(all(memory[n] == 4 * (4 * n * n + n) for n in SIZES),
      "at every n the peak memory is four n x n float32 matrices (plus one number per row)",
      measured=str({n: memory[n] for n in SIZES}))

# %% tags=["nbval-ignore-output", "timing", "skip-when-grading"]
fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
for ax, values, unit, title in [(axes[0], seconds, 1e3, "time (ms)"), (axes[1], memory, 2**-20, "peak memory (MiB)")]:
    ns = np.array(SIZES)
    ax.loglog(ns, [values[n] * unit for n in SIZES], "o-", base=2, label=f"dense, slope {loglog_slope(values):.2f}")
    ref = values[SIZES[-1]] * unit
    ax.loglog(ns, ref * (ns / ns[-1]) ** 2, "--", color="grey", base=2, label="slope 2: x4 per doubling")
    ax.loglog(ns, ref * (ns / ns[-1]), ":", color="grey", base=2, label="slope 1: x2 per doubling")
    ax.set_xlabel("sequence length n")
    ax.set_title(title)
    ax.legend(fontsize=8)
fig.suptitle("dense attention, one head, d = 64 (log-log axes)")
fig.tight_layout()
plt.show()

# %% [markdown]
# On log-log axes a cost $c \cdot n^p$ is a straight line of slope $p$. The memory line sits on slope 2: at every
# size the peak is four $n \times n$ matrices (the scores, the shifted scores, their exponentials, the weights: the
# readable path keeps several alive at once), plus a vector with one number per row.
#
# The time line is not straight at its small end. Each call also pays a cost that does not grow with $n$: Python,
# and the dispatch of every operator the readable path calls. A constant added to $c \cdot n^2$ makes the line
# *flatter* where the $n^2$ part is still small, so from 256 to 512 tokens the time usually grows by less than the
# memory does, and the slope read there would understate the quadratic law. That is why the slopes are fitted on
# $n \ge 1024$ only. There the time slope comes out at about 2, often above. Why it can exceed 2, this notebook does
# not measure: the time it counts, `time.process_time`, adds up the CPU time of all of PyTorch's threads, and how
# well they share the work can change with $n$, as can how often a large matrix misses the processor's cache. The
# times depend on your processor and on what else it is doing; the memory does not.
#
# A decoder does not help much. Prince (section 12.9) draws the interaction matrix: an encoder's is full, a
# decoder's is the lower triangle, about half the pairs. Half of $n^2$ is still $n^2$ growth.

# %% [markdown]
# ## 2. Sparse interaction patterns
#
# The **interaction matrix** has one row per query and one column per key; a cell is on when that query may
# attend to that key. It is exactly a course mask. Dense attention switches every cell on. The cheapest fix is to
# switch most of them off, in a pattern chosen in advance, so that each row keeps a number of cells that does not
# grow with $n$. Then the pairs grow as $n$, not $n^2$.
#
# The first pattern is the one convolutional networks use: each token attends only to its neighbours.
#
# ### The sliding window
#
# A **sliding window** of half-width $w$ (the course's `window`) lets query $i$ attend to key $j$ when $|i - j| \le w$: the token itself and $w$
# neighbours on each side, a band of $2w + 1$ diagonals. In a decoder the window keeps only its past half,
# $0 \le i - j \le w$. Longformer (Beltagy et al., 2020) uses such a window in every layer, and the local heads of
# the Sparse Transformer (Child et al., 2019) do the same. Mind the convention when you read the Longformer paper:
# its window size $w$ counts the whole window, $\tfrac{1}{2} w$ tokens on each side, while the course's $w$ (the
# `window` argument below) counts one side. Longformer's pretrained model uses a window of 512, which is 256 on
# each side in the course's terms.
#
# ### Exercise 1 — `sliding_window_mask`
# > **Difficulty** ●○○ · **Importance** ●●● · about 10 minutes
#
# Write `sliding_window_mask(size, window, causal=False)` returning a boolean tensor `[size, size]`: True where
# query $i$ may attend to key $j$, that is where $|i - j| \le$ `window`; with `causal=True`, where
# $0 \le i - j \le$ `window`. `window = 0` leaves the diagonal only.
#
# Worked example: `sliding_window_mask(5, 1)` and `sliding_window_mask(5, 1, causal=True)` are
# ```
# tensor([[ True,  True, False, False, False],     tensor([[ True, False, False, False, False],
#         [ True,  True,  True, False, False],             [ True,  True, False, False, False],
#         [False,  True,  True,  True, False],             [False,  True,  True, False, False],
#         [False, False,  True,  True,  True],             [False, False,  True,  True, False],
#         [False, False, False,  True,  True]])            [False, False, False,  True,  True]])
# ```
# Watch for: the window's last neighbour left out (`<` instead of `<=`), the causal band on the future side, and
# `causal` ignored.
#
# <details><summary>Hint 1 — the idea</summary>Whether query i may see key j depends on one number only: the offset j − i, how far the key lies after the query (negative when it lies before). The symmetric window keeps the offsets from −window to +window; the causal one keeps those from −window to 0.</details>
# <details><summary>Hint 2 — the plan</summary>Build the <code>[size, size]</code> integer matrix of offsets at once, by broadcasting a row of positions, shape <code>[1, size]</code>, against a column of positions, shape <code>[size, 1]</code>. The mask is then a comparison of that matrix with the bounds: one comparison of its absolute value for the symmetric window, two joined by a logical "and" for the causal one. Print yours for size 5 and hold it against the worked example.</details>
# <details><summary>Hint 3 — the key step</summary>A smaller example: for the positions 0, 1, 2 the offsets j − i
# form the matrix <code>[[0, 1, 2], [-1, 0, 1], [-2, -1, 0]]</code>. Which two views of the position vector, one a
# row and one a column, give this matrix by broadcasting, and which of the two is subtracted? The page to read is
# PyTorch's broadcasting semantics.</details>

# %% nbgrader={"grade": false, "grade_id": "sliding_window_mask", "locked": false, "schema_version": 3, "solution": true, "task": false}
def sliding_window_mask(size: int, window: int, causal: bool = False) -> torch.Tensor:
    """True where query i may attend to key j: |i - j| <= window (causal: 0 <= i - j <= window).

    Returns a bool tensor [size, size].
    """
    ### BEGIN SOLUTION
    pos = torch.arange(size)
    offset = pos[None, :] - pos[:, None]  # [size, size]: j - i
    if causal:
        return (offset <= 0) & (offset >= -window)
    return offset.abs() <= window
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "sliding_window_mask_test", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false} tags=["raises-exception"]
check_sliding_window_mask(sliding_window_mask)
### BEGIN HIDDEN TESTS
check_sliding_window_mask(sliding_window_mask, hidden=True)
### END HIDDEN TESTS

# %%
sliding_window_mask_impl = yours_or_reference(sliding_window_mask, check_sliding_window_mask)

# %% [markdown]
# How many pairs does a window keep? Every row has at most $2w + 1$ cells on (fewer near the two ends), so the
# count grows like $n (2w + 1)$. For a window of 128 on each side:

# %% tags=["skip-when-grading"]
for n in [1024, 2048, 4096]:
    pairs = int(sliding_window_mask_impl(n, 128).sum())
    print(f"n = {n:>5}: {pairs:>11,} pairs of {n * n:>11,} ({100 * pairs / n**2:5.2f}%), "
          f"n (2w + 1) = {n * 257:>10,}")

# %% [markdown]
# ### Dilated windows
#
# A window of $w$ neighbours sees only $w$ positions away. A **dilated** window keeps the same number of keys but
# spreads them out, like a dilated convolution: query $i$ sees the keys $i + k \cdot r$ for $k = -w, \dots, w$,
# where $r$ is the dilation. The reach grows to $w \cdot r$ at the same cost. Beltagy et al. (2020) used dilation
# in Longformer's character-level language models only: none in the lower layers, and in the higher layers a small
# dilation on 2 heads, so that the other heads keep the close neighbours while these two reach further. Their
# pretrained model for documents uses plain windows: adding dilation to a few heads hurt there, probably, they
# write, because the RoBERTa weights it starts from were trained without it.
#
# ### Exercise 2 — `dilated_mask`
# > **Difficulty** ●●○ · **Importance** ●●○ · about 10 minutes
#
# Write `dilated_mask(size, window, dilation)` returning a boolean tensor `[size, size]`, True where $i - j$ is a
# multiple of `dilation` **and** $|i - j| \le$ `window * dilation`. `dilation = 1` is the plain sliding window.
#
# Worked example: `dilated_mask(7, 1, 2)[3]` (the row of query 3) is
# `tensor([False,  True, False,  True, False,  True, False])`: keys 1, 3 and 5, two steps apart.
# Count the gaps from the query, not from position 0: every query must see itself.
#
# <details><summary>Hint 1 — the idea</summary>Start again from the offset j − i. Two conditions must both hold: the offset lies on a grid that moves with the query (it is a multiple of the dilation), and it is not farther than <code>window</code> grid steps from the query.</details>
# <details><summary>Hint 2 — the plan</summary>Reuse the <code>[size, size]</code> offset matrix of exercise 1. The grid condition is a remainder test: offset modulo dilation is zero (Python's remainder of a negative number by a positive one is never negative, so offsets on both sides work). The reach condition compares the offset's absolute value with the reach counted in positions, window times dilation, not in keys. The mask is where both hold.</details>
# <details><summary>Hint 3 — the key step</summary>The question that unlocks the grid: in the worked example
# (dilation 2, query 3) the keys 1, 3 and 5 have the offsets −2, 0 and 2, the others odd offsets. Which arithmetic
# test answers "on the grid" for −2, 0 and 2 and "off" for −1 and 1? Check what PyTorch's remainder gives for −2 and
# 2 before you trust it.</details>

# %% nbgrader={"grade": false, "grade_id": "dilated_mask", "locked": false, "schema_version": 3, "solution": true, "task": false}
def dilated_mask(size: int, window: int, dilation: int) -> torch.Tensor:
    """True where query i may attend to key j: (i - j) % dilation == 0 and |i - j| <= window * dilation.

    Returns a bool tensor [size, size].
    """
    ### BEGIN SOLUTION
    pos = torch.arange(size)
    offset = pos[None, :] - pos[:, None]  # [size, size]: j - i
    on_grid = offset % dilation == 0  # the gaps are counted from the query itself
    return on_grid & (offset.abs() <= window * dilation)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "dilated_mask_test", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false} tags=["raises-exception"]
check_dilated_mask(dilated_mask)
### BEGIN HIDDEN TESTS
check_dilated_mask(dilated_mask, hidden=True)
### END HIDDEN TESTS

# %%
dilated_mask_impl = yours_or_reference(dilated_mask, check_dilated_mask)

# %% [markdown]
# Same number of keys per row as a window of the same $w$, a reach $r$ times longer:

# %%
plain, spread = sliding_window_mask_impl(64, 2), dilated_mask_impl(64, 2, 4)
print("keys per query (middle row): window", int(plain[32].sum()), "| dilated", int(spread[32].sum()))
print("farthest key seen from query 32: window", int((torch.arange(64) - 32)[plain[32]].abs().max()),
      "| dilated", int((torch.arange(64) - 32)[spread[32]].abs().max()))

# %% [markdown]
# ### Selected positions that attend globally
#
# Local patterns never let two distant tokens meet in one layer. Prince's second family fixes this: a few
# **selected positions** attend to every token, and every token attends to them. Their rows and their columns are
# switched on. In a decoder, "every token" becomes "every earlier token", so the rows and columns are cut to the
# lower triangle. Longformer chooses these positions by task: the `[CLS]` token for classification, the question's
# tokens for question answering. The library's `global_positions_mask` draws the pattern; OR it with a window:

# %%
window_plus_global = sliding_window_mask_impl(10, 1) | sparse.global_positions_mask(10, [0, 6])
print(window_plus_global.int())
print("decoder version, row 6 (sees every earlier token):",
      sparse.global_positions_mask(10, [0, 6], causal=True)[6].int().tolist())

# %% [markdown]
# ### Global tokens
#
# The third family adds **new** tokens instead of promoting existing ones. A few extra **global tokens** are put in
# front of the sequence. Like `[CLS]` they stand for no word: they exist only to carry information over long
# distances. They attend to every token and to each other, and every token attends to them. Big Bird (Zaheer et
# al., 2020) calls this variant ETC, and combines such tokens with a window and a few random connections.
#
# ### Exercise 3 — `global_token_mask`
# > **Difficulty** ●●○ · **Importance** ●●○ · about 10 minutes
#
# Write `global_token_mask(local_mask, n_global)`. `local_mask` is a boolean `[n, n]` pattern between the real
# tokens (a window, say); return a boolean `[n_global + n, n_global + n]` mask in which positions
# `0 .. n_global - 1` are the global tokens: their rows and their columns are all True (they see every position and
# every position sees them, including the other global tokens), and the block between the real tokens is
# `local_mask`, unchanged.
#
# Worked example: with the diagonal as the local pattern, `global_token_mask(sliding_window_mask(3, 0), 1)` is
# ```
# tensor([[ True,  True,  True,  True],
#         [ True,  True, False, False],
#         [ True, False,  True, False],
#         [ True, False, False,  True]])
# ```
#
# <details><summary>Hint 1 — the idea</summary>A global token is a two-way hub. If only its row were on, it would collect everything and give nothing back; if only its column were on, it would hand out what it never collected. Draw the matrix in four blocks: global–global, global–real, real–global, real–real.</details>
# <details><summary>Hint 2 — the plan</summary>Start from a <code>[g + n, g + n]</code> boolean matrix that is True everywhere: that already gives the hubs their rows and their columns, and links them to each other. Only the bottom-right <code>[n, n]</code> block, the real tokens among themselves, must change: it becomes <code>local_mask</code>, copied in from row g and column g on.</details>
# <details><summary>Hint 3 — the key step</summary>A smaller example on another tensor: after
# <code>x = torch.zeros(4, 4)</code>, one slice assignment writes 7 into the bottom-right <code>[2, 2]</code> block,
# rows 2 and 3, columns 2 and 3, and leaves the rest alone. In the worked example (one global token, three real
# ones), which rows and columns form the block that must equal <code>local_mask</code>?</details>

# %% nbgrader={"grade": false, "grade_id": "global_token_mask", "locked": false, "schema_version": 3, "solution": true, "task": false}
def global_token_mask(local_mask: torch.Tensor, n_global: int) -> torch.Tensor:
    """n_global hub tokens put in front of the sequence: rows and columns all True; local_mask between the
    real tokens. local_mask: bool [n, n]. Returns a bool tensor [n_global + n, n_global + n].
    """
    ### BEGIN SOLUTION
    n = local_mask.shape[-1]
    mask = torch.ones(n_global + n, n_global + n, dtype=torch.bool)
    mask[n_global:, n_global:] = local_mask  # only the real tokens keep their local pattern
    return mask
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "global_token_mask_test", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false} tags=["raises-exception"]
check_global_token_mask(global_token_mask)
### BEGIN HIDDEN TESTS
check_global_token_mask(global_token_mask, hidden=True)
### END HIDDEN TESTS

# %%
global_token_mask_impl = yours_or_reference(global_token_mask, check_global_token_mask)

# %% [markdown]
# ### Six interaction matrices
#
# Here are the patterns side by side for 12 positions, drawn with your functions (or the reference where they do
# not pass yet). Dark cells are the pairs that get a score; every light cell is work saved. Under each matrix is
# the number of pairs: for the sparse patterns it grows as $n$ times a constant, for the first two as $n^2$.

# %%
n = 12
patterns = {
    "dense (encoder)": torch.ones(n, n, dtype=torch.bool),
    "causal (decoder)": torch.ones(n, n, dtype=torch.bool).tril(),
    "sliding window, w = 2": sliding_window_mask_impl(n, 2),
    "dilated, w = 2, dilation 2": dilated_mask_impl(n, 2, 2),
    "global positions 0, 6 + window 1": sliding_window_mask_impl(n, 1) | sparse.global_positions_mask(n, [0, 6]),
    "1 global token + window 1": global_token_mask_impl(sliding_window_mask_impl(n - 1, 1), 1),
}
fig = draw_interaction_patterns(patterns, marks={"global positions 0, 6 + window 1": [0, 6],
                                                 "1 global token + window 1": [0]})
plt.show()
for name, mask in patterns.items():
    print(f"{name:<36} {int(mask.sum()):>4} pairs")

# %% [markdown]
# ## 3. The receptive field grows with depth
#
# In one layer, a window of $w$ lets token $i$ read tokens $i - w \dots i + w$ only. But layers are stacked: in the
# second layer, token $i$ reads tokens that have themselves read their neighbours, so information from $2w$ steps
# away has arrived. This is the **receptive field** of convolutional networks, and Prince (section 12.9) makes the
# same point for windowed attention: stack enough layers and distant tokens interact after all.
#
# Which inputs can reach which outputs? If $M$ is the mask of one layer ($M_{ij}$ true when output $i$ reads input
# $j$), two layers connect $i$ to $j$ when some $k$ has $M_{ik}$ and $M_{kj}$: a matrix product in which "+" is
# "or" and "×" is "and". $L$ layers give the boolean matrix power $M^L$.
#
# ### Exercise 4 — `receptive_field`
# > **Difficulty** ●●○ · **Importance** ●●○ · about 15 minutes
#
# Write `receptive_field(mask, n_layers)`: `mask` is a boolean `[n, n]` (or `[..., n, n]`) pattern used by every
# layer; return a boolean tensor of the same shape, True where input position $j$ can influence output position $i$
# after `n_layers` layers ($\ge 1$): the boolean matrix power $M^{L}$.
#
# Worked example: for `sliding_window_mask(5, 1)` and 2 layers, each position reaches 2 steps on each side:
# `receptive_field(sliding_window_mask(5, 1), 2)` equals `sliding_window_mask(5, 2)`.
#
# <details><summary>Hint 1 — the idea</summary>One more layer on top: output i reads the positions k its mask allows, and each of those already reached some inputs j. So the new reach is "mask times old reach". Start from the reach of zero layers: each position reaches only itself.</details>
# <details><summary>Hint 2 — the plan</summary>Keep a boolean reach matrix of the mask's shape, <code>[..., n, n]</code>, starting from the identity (zero layers), and replace it <code>n_layers</code> times by "mask times reach" in the boolean sense. PyTorch's matrix product does not take booleans: multiply as floats, then turn the path counts back into booleans by asking which are positive. Powers of one matrix commute, so the order of the two factors does not matter; a transpose does, since row i is the output and column j the input.</details>
# <details><summary>Hint 3 — the key step</summary>A smaller example: on the chain 0 – 1 – 2 with every position
# seeing itself and its neighbours, <code>M = [[1, 1, 0], [1, 1, 1], [0, 1, 1]]</code>, and the product of M with
# itself has a positive entry at row 0, column 2: a path of two steps. Which dtypes does PyTorch's matrix product
# accept, and how do you turn path counts back into "reachable or not"? The page to read is
# <code>torch.matmul</code>.</details>

# %% nbgrader={"grade": false, "grade_id": "receptive_field", "locked": false, "schema_version": 3, "solution": true, "task": false}
def receptive_field(mask: torch.Tensor, n_layers: int) -> torch.Tensor:
    """True where input j reaches output i after n_layers layers using mask: the boolean power mask^n_layers.

    mask: bool [..., n, n]. Returns a bool tensor of the same shape.
    """
    ### BEGIN SOLUTION
    reach = torch.eye(mask.shape[-1], dtype=torch.bool).expand(mask.shape)  # 0 layers: itself only
    for _ in range(n_layers):
        reach = (mask.float() @ reach.float()) > 0  # [..., n, n]: i reads k, k already reached j
    return reach
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "receptive_field_test", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false} tags=["raises-exception"]
check_receptive_field(receptive_field)
### BEGIN HIDDEN TESTS
check_receptive_field(receptive_field, hidden=True)
### END HIDDEN TESTS

# %%
receptive_field_impl = yours_or_reference(receptive_field, check_receptive_field)

# %% [markdown]
# For 64 positions, how many inputs reach the output in the middle (position 32) after 1, 2, 3... layers? A window
# grows by $w$ on each side per layer, linearly. A dilated window's reach grows $r$ times faster; count what it
# reaches, though. The Sparse Transformer's
# trick (Child et al., 2019) is to give one head a local window and another a strided pattern (every 8th token
# here): one hop along the window then one along the stride reaches *every* position in two layers. A global token
# does the same: any token reaches any other through the hub.
#
# **Predict** before running: after how many layers does a window of 2 reach all 64 positions from the middle?

# %%
n = 64
stack = {
    "window w = 2": sliding_window_mask_impl(n, 2),
    "dilated w = 2, dilation 4": dilated_mask_impl(n, 2, 4),
    "window 4 OR stride 8 (Sparse Transformer)": sliding_window_mask_impl(n, 4) | dilated_mask_impl(n, 8, 8),
    "1 global token + window 1": global_token_mask_impl(sliding_window_mask_impl(n - 1, 1), 1),
}
layers = list(range(1, 17))
reached = {name: [int(receptive_field_impl(mask, L)[mask.shape[-1] // 2].sum()) for L in layers]
           for name, mask in stack.items()}
for name, counts in reached.items():
    print(f"{name:<42} after 1, 2, 4, 8, 16 layers: {[counts[L - 1] for L in (1, 2, 4, 8, 16)]}")

fig, axes = plt.subplots(1, 2, figsize=(11, 3.8), gridspec_kw={"width_ratios": [1.3, 1]})
for name, counts in reached.items():
    axes[0].plot(layers, counts, "o-", markersize=3, label=name)
axes[0].set_xlabel("layers")
axes[0].set_ylabel("inputs reaching position 32")
axes[0].legend(fontsize=8)
axes[0].set_title("the receptive field grows with depth")
field = receptive_field_impl(sliding_window_mask_impl(24, 1), 1).int() + receptive_field_impl(
    sliding_window_mask_impl(24, 1), 3).int() + receptive_field_impl(sliding_window_mask_impl(24, 1), 6).int()
axes[1].imshow(field, cmap="Blues", vmin=0, vmax=3)
axes[1].set_title("window 1, 24 positions:\nreached after 1 (dark), 3, 6 (light) layers", fontsize=9)
axes[1].set_xlabel("input position j")
axes[1].set_ylabel("output position i")
fig.tight_layout()
plt.show()

# %% [markdown]
# The window of 2 needs 16 layers to cover all 64 positions from the middle: its field grows by 4 positions per
# layer. The dilated window never gets there: every hop is a multiple of 4 positions, so it reaches the 16
# positions a multiple of 4 away and not one more, however deep the stack. Its gaps are never filled. A stack
# needs plain windows beside the dilated ones, and Longformer's character-level models have them: a dilation on
# 2 heads of their higher layers only, so that the other heads keep the close neighbours. The window-plus-stride
# pair and the global token reach all 64 positions in 2 layers. And a field that *can* reach far is not yet a
# model that *uses* it well: information
# relayed through 16 layers is mixed at every step. That is why the long-range models combine the patterns: a
# window for the local detail, global tokens or strides for the long hops.

# %% [markdown]
# ## 4. Banded attention in O(n · w)
#
# So far the patterns are only masks. Passed to dense attention they change the *result*, but not the *cost*: the
# full $n \times n$ score matrix is computed first, and then most of it is thrown away. To profit, the
# computation itself must skip the hidden pairs.
#
# For a window this is simple, because the pattern is a band. Cut the queries into blocks of $b$ consecutive
# positions. The block that starts at position $s$ holds the queries $s \dots s + b - 1$, and every key their band
# can reach lies between $s - w$ and $s + b - 1 + w$ (in a decoder, $s + b - 1$): a **span** of at most $b + 2w$
# keys. So score each block of queries against its span only: $n / b$ small products of
# $[b, d] \times [d, b + 2w]$ instead of one $[n, d] \times [d, n]$. With $b = w$ that is $3 n w$ scores instead of
# $n^2$. Longformer's own implementation calls this "sliding chunks".
#
# A span is a rectangle and the band is not: the first query of a block cannot see the last $b - 1$ keys of its
# span, the last query cannot see the first $b - 1$. So each block still needs a mask, a small one of shape
# $[b, \ell]$, where $\ell \le b + 2w$ is the length of the block's span, built from the *real* positions of its
# queries and keys, exactly as `sliding_window_mask` builds the big one.
#
# ### Exercise 5 — `banded_attention`
# > **Difficulty** ●●● · **Importance** ●●● · about 40 minutes
#
# Write `banded_attention(q, k, v, window, causal=False)`: self-attention in which query $i$ sees key $j$ when
# $|i - j| \le$ `window` (with `causal=True`, when $0 \le i - j \le$ `window`). The result is the same as dense
# attention under your `sliding_window_mask`, scores scaled by $1/\sqrt{d_k}$ as usual, but it is computed block by
# block, so that no tensor with $n \times n$ entries ever exists.
#
# * `q`, `k`: `[..., n, d_k]`; `v`: `[..., n, d_v]` (any leading batch and head dimensions); returns `[..., n, d_v]`.
# * Take the queries in blocks of `max(window, 16)` (the last block may be shorter). Any block size gives the same
#   result; this one is the library's, and it keeps the loop short when the window is small.
# * The check also runs your function on a sequence of 2,048 tokens and refuses an answer that allocates a tensor
#   of $n \times n$ entries there: the whole score matrix, or a mask of the whole sequence.
#
# Worked example: with `window = 1` and blocks of 2 queries (too small for real use, but easy to draw), the block of
# queries 2 and 3 spans the keys 1 to 4, and its mask is
# ```
#             key 1   key 2   key 3   key 4
# query 2:    True    True    True    False
# query 3:    False   True    True    True
# ```
# The first block, queries 0 and 1, spans only the keys 0 to 2: there is no key before position 0. If you pad the
# keys instead, so that every span has the same length, remember that the padding positions are not keys: hide
# them in the mask too.
#
# <details><summary>Hint 1 — the idea</summary>Treat each block as a small attention problem of its own: its queries against the keys of its span, the span clamped to the real positions 0 .. n − 1. The band is then a small mask over that rectangle, computed from the offsets j − i of the real positions, not of the positions inside the block. A block's output is exactly the rows of the full answer for its queries, so the blocks' outputs only need to be joined.</details>
# <details><summary>Hint 2 — the plan</summary>Loop over the block starts. For each block: the queries <code>[..., b, d_k]</code>, the keys <code>[..., span, d_k]</code> and values <code>[..., span, d_v]</code> of its span; the scaled scores <code>[..., b, span]</code>; a <code>[b, span]</code> grid of offsets, key position minus query position, and from it the band test; the scores outside the band set to minus infinity before the softmax over the keys; the weighted values <code>[..., b, d_v]</code>. Collect the blocks' outputs and join them along the sequence axis into <code>[..., n, d_v]</code>.</details>
# <details><summary>Hint 3 — the key step</summary>A smaller example from the worked example (window 1, blocks of
# 2): the block of queries 2 and 3 spans the keys 1 to 4, and its offsets, key position minus query position, are
# <code>[[-1, 0, 1, 2], [-2, -1, 0, 1]]</code>; the band keeps those from −1 to 1. The question that unlocks the
# step: which slice of the positions gives the block's queries as a column, and which gives the span's keys as a
# row?</details>

# %% nbgrader={"grade": false, "grade_id": "banded_attention", "locked": false, "schema_version": 3, "solution": true, "task": false}
def banded_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int,
                     causal: bool = False) -> torch.Tensor:
    """Self-attention of each query over the keys at most `window` positions away (causal: only the
    keys before it), computed block by block so that no n x n tensor ever exists.

    q, k: [..., n, d_k]; v: [..., n, d_v]. Returns [..., n, d_v].
    """
    ### BEGIN SOLUTION
    n = q.shape[-2]
    b = max(window, 16)  # queries per block
    right = 0 if causal else window  # how far after itself a query may look
    pos = torch.arange(n)
    blocks = []
    for start in range(0, n, b):
        end = min(start + b, n)
        lo, hi = max(0, start - window), min(n, end + right)  # the span of keys this block's band reaches
        scores = q[..., start:end, :] @ k[..., lo:hi, :].transpose(-2, -1) / math.sqrt(q.shape[-1])  # [..., b, span]
        offset = pos[None, lo:hi] - pos[start:end, None]  # [b, span]: j - i, in real positions
        in_band = (offset >= -window) & (offset <= right)
        weights = torch.softmax(scores.masked_fill(~in_band, float("-inf")), dim=-1)  # [..., b, span]
        blocks.append(weights @ v[..., lo:hi, :])  # [..., b, d_v]
    return torch.cat(blocks, dim=-2)  # [..., n, d_v]
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "banded_attention_test", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false} tags=["raises-exception"]
check_banded_attention(banded_attention)
### BEGIN HIDDEN TESTS
check_banded_attention(banded_attention, hidden=True)
### END HIDDEN TESTS

# %%
banded_attention_impl = yours_or_reference(banded_attention, check_banded_attention)

# %% [markdown]
# Same result as dense attention under the window's mask (built with your `sliding_window_mask`), encoder and
# decoder, and a count of the scores each computes:

# %%
n, w = 1024, 32
q, k, v = random_qkv(n, seed=4)
for causal in (False, True):
    dense_out, _ = scaled_dot_product_attention(q, k, v, mask=sliding_window_mask_impl(n, w, causal=causal))
    banded_out = banded_attention_impl(q, k, v, w, causal=causal)
    print(f"causal={causal!s:<5}: output {list(banded_out.shape)}, equal to dense attention under the mask "
          f"(to 1e-5): {torch.allclose(banded_out, dense_out, atol=1e-5)}")
b = max(w, 16)  # the block size of the exercise
computed, in_band = (n // b) * b * (b + 2 * w), int(sliding_window_mask_impl(n, w).sum())
print(f"scores computed: dense {n * n:,}, banded at most {computed:,} (n / b blocks of b x (b + 2w)), "
      f"of which in the band {in_band:,}: {computed / in_band:.1f} x the band")

# %% [markdown]
# Banded attention computes about $1.5\times$ more scores than the band holds (the corners of each block's span
# fall outside the band), but that overhead is a constant factor: double $n$ and the work doubles. Measured, your
# `banded_attention` (or the reference, if yours does not pass yet) with a window of 64 on each side:

# %% tags=["nbval-ignore-output", "timing", "skip-when-grading"]
measured["banded"] = ({}, {})
for n in SIZES:
    q, k, v = random_qkv(n)
    seconds, memory = measured["banded"]
    seconds[n] = best_time(lambda: banded_attention_impl(q, k, v, 64))
    memory[n] = sparse.peak_memory(banded_attention_impl, q, k, v, 64)
    print(f"n = {n:>5}: {1e3 * seconds[n]:>7.1f} ms, peak {memory[n] / 2**20:>6.2f} MiB "
          f"(dense: {1e3 * measured['dense'][0][n]:>7.1f} ms, {measured['dense'][1][n] / 2**20:>6.1f} MiB)")
print(f"\nfitted on n >= 1024: time slope {loglog_slope(seconds):.2f}, memory slope {loglog_slope(memory):.2f}")
claim(all(seconds[n] < measured["dense"][0][n] for n in SIZES if n >= 1024),
      "from n = 1024 on, banded attention is faster than dense attention",
      measured=", ".join(f"n = {n}: {1e3 * seconds[n]:.1f} vs {1e3 * measured['dense'][0][n]:.1f} ms" for n in SIZES))

# %% [markdown]
# The time slope is close to 1 now: doubling the length doubles the work. The memory grows no faster than $n$
# either: the output and its blocks, $n \times d_v$ numbers each, plus the temporaries of one block, whose size does
# not depend on $n$ at all (that fixed part is why the memory slope can come out below 1). From $n = 1{,}024$ on,
# the band is faster than dense attention, and its lead widens with $n$, since dense attention's time grows as
# $n^2$. Look at the smallest lengths of your table too: on the machine that built this notebook the band was
# ahead there as well, by its smallest margin. There the window of 64 on each side covers a large part of each row,
# and one big matrix product competes with many small ones and a Python loop, so on another processor the order
# may go either way. The library's `banded_attention` does the same arithmetic without the Python
# loop: it cuts the padded keys into overlapping spans with `Tensor.unfold`, a view that copies nothing, and scores
# many blocks in one product. The benchmark script `benchmarks/bench_long_attention.py` times it up to
# $n = 16{,}384$.

# %% [markdown]
# ## 5. Linear attention
#
# Sparse patterns keep softmax attention and drop pairs. **Linear attention** (Katharopoulos et al., 2020) keeps
# every pair and changes the similarity instead. Softmax attention weighs key $j$ for query $i$ by
# $\exp(q_i \cdot k_j / \sqrt{d})$. Replace that by $\phi(q_i) \cdot \phi(k_j)$ for a feature map $\phi$ that
# makes every number positive; Katharopoulos et al. use $\phi(x) = \mathrm{elu}(x) + 1$. The output is
#
# $$o_i = \frac{\sum_j \phi(q_i)^\top \phi(k_j)\, v_j}{\sum_j \phi(q_i)^\top \phi(k_j)}
#       = \frac{\phi(q_i)^\top \left(\sum_j \phi(k_j) v_j^\top\right)}{\phi(q_i)^\top \left(\sum_j \phi(k_j)\right)}
#       = \frac{\phi(q_i)^\top S}{\phi(q_i)^\top z}.$$
#
# The second form is the same number computed in another order (the matrix product is associative), and its two
# sums, $S$ of shape $[d, d_v]$ and $z$ of shape $[d]$, do not depend on $i$. Compute them once, and each query
# costs $O(d \, d_v)$: $O(n \, d \, d_v)$ in all, linear in $n$. The $n \times n$ matrix
# $\phi(Q)\phi(K)^\top$ is never formed. The library has both orders; they agree:

# %%
q, k, v = random_qkv(512, seed=5)
fast = sparse.linear_attention(q, k, v)  # phi(Q) (phi(K)^T V): never n x n
slow, weights = sparse.linear_attention_quadratic(q, k, v)  # (phi(Q) phi(K)^T) V: the n x n weights written out
print("same output (to 1e-5):", torch.allclose(fast, slow, atol=1e-5), "| weights", list(weights.shape),
      "all positive:", bool((weights > 0).all()), "| rows sum to 1:", torch.allclose(weights.sum(-1), torch.ones(1, 512)))
print(f"largest intermediate: n x n = {512 * 512:,} numbers the slow way, d x d_v = {D * D:,} the fast way")

# %% [markdown]
# ### The causal form is a prefix sum
#
# In a decoder, position $i$ may only sum over $j \le i$. Then $S$ and $z$ depend on $i$ after all, but only as
# running totals: $S_i = S_{i-1} + \phi(k_i) v_i^\top$ and $z_i = z_{i-1} + \phi(k_i)$. A running total along the
# sequence is a **prefix sum**, `torch.cumsum`. Read one step at a time, it is a recurrent network whose state is
# $(S_i, z_i)$: that is the "Transformers are RNNs" of the paper's title. Generating a token updates a state of fixed
# size $d \times d_v$, where softmax attention's KV cache (chapter 07) grows with every token. (The prefix sums you
# are about to write compute every $S_i$ at once and keep them all; the exercise after this one writes the
# recurrent form, and then we count what each costs.)
#
# ### Exercise 6 — `causal_linear_attention`
# > **Difficulty** ●●● · **Importance** ●●○ · about 25 minutes
#
# Write `causal_linear_attention(q, k, v)` with $\phi(x) = \mathrm{elu}(x) + 1$ (`F.elu(x) + 1`):
# $o_i = \phi(q_i)^\top S_i \,/\, \phi(q_i)^\top z_i$ with $S_i = \sum_{j \le i} \phi(k_j) v_j^\top$ and
# $z_i = \sum_{j \le i} \phi(k_j)$.
#
# * `q`, `k`: `[..., n, d_k]`; `v`: `[..., n, d_v]` (any leading batch and head dimensions).
# * returns `[..., n, d_v]`. No $1/\sqrt{d_k}$ here: the feature map replaces the softmax and its temperature.
#
# Worked example: with `q` and `k` all zeros, $\phi = 1$ everywhere, every weight is equal, and output $i$ is the
# mean of the values $v_0 \dots v_i$: for `v = [[1.], [2.], [6.]]` the output is `[[1.0], [1.5], [3.0]]`.
#
# <details><summary>Hint 1 — the idea</summary>Form the outer product φ(k_j) v_jᵀ for every position j, a <code>[d_k, d_v]</code> matrix each, then take running sums along the sequence so that position i holds the sum over j ≤ i (itself included). Do the same for φ(k_j) to get the normaliser.</details>
# <details><summary>Hint 2 — the plan</summary>All the outer products at once make one <code>[..., n, d_k, d_v]</code> tensor: φ(k) with a new axis at the end times v with a new axis before its last one. The running sums go along the sequence axis, the third from the end of that tensor and the second from the end of the <code>[..., n, d_k]</code> normaliser. For the numerator, treat φ(q_i) as a row <code>[1, d_k]</code> times S_i <code>[d_k, d_v]</code>, for every position at once; keep the denominator as <code>[..., n, 1]</code> so that it divides every value feature.</details>
# <details><summary>Hint 3 — the key step</summary>A smaller example on other tensors: for <code>a = [1, 2]</code>
# and <code>b = [3, 4, 5]</code>, the outer product <code>[[3, 4, 5], [6, 8, 10]]</code> is <code>a</code> with a
# new last axis times <code>b</code> with a new axis in front. A running sum turns <code>[x0, x1, x2]</code> into
# <code>[x0, x0 + x1, x0 + x1 + x2]</code>: which axis of <code>[..., n, d_k, d_v]</code> is the sequence axis? The
# page to read is <code>torch.cumsum</code>.</details>

# %% nbgrader={"grade": false, "grade_id": "causal_linear_attention", "locked": false, "schema_version": 3, "solution": true, "task": false}
def causal_linear_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Linear attention with phi = elu + 1, position i summing over keys j <= i (prefix sums).

    q, k: [..., n, d_k]; v: [..., n, d_v]. Returns [..., n, d_v].
    """
    ### BEGIN SOLUTION
    phi_q, phi_k = F.elu(q) + 1, F.elu(k) + 1  # [..., n, d_k], positive
    S = (phi_k.unsqueeze(-1) * v.unsqueeze(-2)).cumsum(dim=-3)  # [..., n, d_k, d_v]: sum over j <= i
    z = phi_k.cumsum(dim=-2)  # [..., n, d_k]
    numerator = (phi_q.unsqueeze(-2) @ S).squeeze(-2)  # [..., n, d_v]
    denominator = (phi_q * z).sum(dim=-1, keepdim=True)  # [..., n, 1]
    return numerator / denominator
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "causal_linear_attention_test", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false} tags=["raises-exception"]
check_causal_linear_attention(causal_linear_attention)
### BEGIN HIDDEN TESTS
check_causal_linear_attention(causal_linear_attention, hidden=True)
### END HIDDEN TESTS

# %%
causal_linear_attention_impl = yours_or_reference(causal_linear_attention, check_causal_linear_attention)

# %% [markdown]
# Two checks on your function: it equals the explicit $O(n^2)$ formula (the lower triangle of the weight matrix
# kept, rows renormalised), and it is causal, since changing the future changes no earlier output.

# %%
q, k, v = random_qkv(256, seed=6)
explicit, _ = sparse.linear_attention_quadratic(q, k, v, causal=True)
ours = causal_linear_attention_impl(q, k, v)
print("prefix sums == explicit O(n^2) formula (to 1e-5):", torch.allclose(ours, explicit, atol=1e-5))
k2, v2 = k.clone(), v.clone()
k2[:, 200:], v2[:, 200:] = torch.randn(1, 56, D), torch.randn(1, 56, D)  # a different future
changed = causal_linear_attention_impl(q, k2, v2)
print("outputs 0..199 unchanged when positions 200.. change:", torch.equal(ours[:, :200], changed[:, :200]))


# %% [markdown]
# ### One state, or one per position?
#
# `cumsum` returns every running total, so the prefix-sum form holds $S_i$ for every position: a tensor
# `[n, d, d_v]`, $d_v$ times larger than the queries themselves. At $n = 4{,}096$ and $d = d_v = 64$ that is as much
# memory as one dense $n \times n$ score matrix, the very thing linear attention set out to avoid, and the outer
# products it sums take as much again. Katharopoulos et al. (2020, section 3.3.1) point this out: a naive
# implementation keeps every $S_i$ for the backward pass, which multiplies the memory by the larger of the key and
# value sizes. They write the gradients as cumulative sums as well, so that neither pass has to store the $S_i$,
# and at generation time their model keeps only $S$ and $z$ (their section 3.4).
#
# The **recurrent form** does the same arithmetic position after position and keeps one state only. It is how a
# linear-attention decoder generates text: each new token updates $S$ and $z$ and reads its output from them, and
# the memory never grows, where softmax attention's KV cache grows with every token.
#
# ### Exercise 7 — `recurrent_linear_attention`
# > **Difficulty** ●●○ · **Importance** ●●○ · about 20 minutes
#
# Write `recurrent_linear_attention(q, k, v)`: the same output as `causal_linear_attention` (to 1e-5), computed
# as a recurrent network. Keep one state $S$ of shape `[..., d_k, d_v]` and one normaliser $z$ of shape `[..., d_k]`,
# both zero at the start, and go through the positions in order. At position $i$, first add $\phi(k_i) v_i^\top$ to
# $S$ and $\phi(k_i)$ to $z$ (position $i$ attends to its own key), then read its output
# $o_i = \phi(q_i)^\top S \,/\, \phi(q_i)^\top z$. The feature map is $\phi(x) = \mathrm{elu}(x) + 1$ as before.
#
# * `q`, `k`: `[..., n, d_k]`; `v`: `[..., n, d_v]`; returns `[..., n, d_v]`.
# * One state, not one per position: the check also runs your function on 256 positions and refuses an answer that
#   allocates a tensor of $n \times d_k \times d_v$ entries there (the prefix sums of exercise 6) or of $n \times n$.
#
# Worked example: exercise 6's, one step at a time. With `q` and `k` all zeros, $\phi = 1$; for
# `v = [[1.], [2.], [6.]]` and $d_k = 1$, the state $S$ goes 1, 3, 9 and $z$ goes 1, 2, 3, so the outputs are
# 1, 1.5 and 3.
#
# <details><summary>Hint 1 — the idea</summary>This is exercise 6 read one position at a time: the running totals S_i and z_i are not stored for every i, they are one pair of tensors that grows by one term per step. Because position i must see key i, the term of position i goes in before position i reads.</details>
# <details><summary>Hint 2 — the plan</summary>Before the loop: the features φ(q) and φ(k), <code>[..., n, d_k]</code>, and the zero state S <code>[..., d_k, d_v]</code> and z <code>[..., d_k]</code>, in the inputs' dtype and with their leading dimensions. In the loop over the positions: the outer product of φ(k_i) <code>[..., d_k]</code> and v_i <code>[..., d_v]</code> added to S, φ(k_i) added to z; then the output of position i, <code>[..., d_v]</code>, from φ(q_i), S and z. After the loop, stack the n outputs along the sequence axis.</details>
# <details><summary>Hint 3 — the key step</summary>A smaller example: for one position with φ(k_i) =
# <code>[1, 2]</code> and v_i = <code>[3, 4, 5]</code>, its term of S is the <code>[2, 3]</code> outer product
# <code>[[3, 4, 5], [6, 8, 10]]</code>. The question that unlocks the step: in <code>[..., n, d_k]</code> and
# <code>[..., n, d_v]</code>, which index picks position i, and where must each of the two factors get a new axis?
# The page to read is PyTorch's indexing with <code>None</code>.</details>

# %% nbgrader={"grade": false, "grade_id": "recurrent_linear_attention", "locked": false, "schema_version": 3, "solution": true, "task": false}
def recurrent_linear_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal linear attention as a recurrent network: one state S [..., d_k, d_v] and one normaliser
    z [..., d_k], carried from position to position. q, k: [..., n, d_k]; v: [..., n, d_v].
    Returns [..., n, d_v].
    """
    ### BEGIN SOLUTION
    phi_q, phi_k = F.elu(q) + 1, F.elu(k) + 1  # [..., n, d_k]
    S = q.new_zeros(*q.shape[:-2], q.shape[-1], v.shape[-1])  # [..., d_k, d_v]: all of the past it keeps
    z = q.new_zeros(*q.shape[:-2], q.shape[-1])  # [..., d_k]
    outputs = []
    for i in range(q.shape[-2]):
        S = S + phi_k[..., i, :, None] * v[..., i, None, :]  # position i first adds its own key ...
        z = z + phi_k[..., i, :]
        numerator = (phi_q[..., i, None, :] @ S).squeeze(-2)  # ... then reads: [..., d_v]
        outputs.append(numerator / (phi_q[..., i, :] * z).sum(dim=-1, keepdim=True))
    return torch.stack(outputs, dim=-2)  # [..., n, d_v]
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "recurrent_linear_attention_test", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false} tags=["raises-exception"]
check_recurrent_linear_attention(recurrent_linear_attention)
### BEGIN HIDDEN TESTS
check_recurrent_linear_attention(recurrent_linear_attention, hidden=True)
### END HIDDEN TESTS

# %%
recurrent_linear_attention_impl = yours_or_reference(recurrent_linear_attention, check_recurrent_linear_attention)

# %% [markdown]
# The two forms side by side at $n = 4{,}096$, $d = d_v = 64$: the same outputs, and the memory each holds at its
# peak (counted by `sparse.peak_memory`, in bytes), with your functions or the references:

# %%
n = 4096
q, k, v = random_qkv(n, seed=6)
prefix_out, recurrent_out = causal_linear_attention_impl(q, k, v), recurrent_linear_attention_impl(q, k, v)
print("recurrent form == prefix sums (to 1e-5):", torch.allclose(recurrent_out, prefix_out, atol=1e-5))
print(f"S_i for every position, [n, d, d_v] float32: {n * D * D * 4:>11,} bytes "
      f"(one dense n x n float32 matrix: {n * n * 4:,} bytes)")
print(f"one state, S [d, d_v] and z [d]:            {(D * D + D) * 4:>11,} bytes")
features = n * D * 4  # one [n, 64] float32 tensor: phi(Q), phi(K) or the output
prefix_peak = sparse.peak_memory(causal_linear_attention_impl, q, k, v)
recurrent_peak = sparse.peak_memory(recurrent_linear_attention_impl, q, k, v)
print(f"\npeak memory of one call at n = {n}:")
print(f"  prefix sums: {prefix_peak:>11,} bytes = {prefix_peak / features:6.1f} x one [n, d] tensor")
print(f"  recurrent:   {recurrent_peak:>11,} bytes = {recurrent_peak / features:6.1f} x one [n, d] tensor")
claim(recurrent_peak * 16 < prefix_peak,
      "the recurrent form holds less than a sixteenth of the memory the prefix sums hold",
      measured=f"{recurrent_peak:,} and {prefix_peak:,} bytes")

# %% [markdown]
# Read the peaks in units of one `[n, d]` tensor. The prefix sums need about $2 d_v$ of them: the outer products and
# their running sums, each `[n, d, d_v]`, plus the features. The recurrent form needs a handful: the features
# $\phi(Q)$ and $\phi(K)$, the outputs (as they are collected, and once more stacked), and beyond them only the state
# and one outer product, $2 \cdot d \cdot d_v + d$ numbers, whatever $n$ is. Its cost is time: a Python loop of $n$
# small steps. In a real implementation the loop runs inside one compiled kernel (Katharopoulos et al. implemented
# their constant-memory version in CUDA), and during generation there is no loop at all: one step per new token.

# %% [markdown]
# ### How far is linear attention from softmax attention?
#
# With $\phi = \mathrm{elu} + 1$, linear attention is not an approximation of softmax attention: it is a different
# similarity, and a model has to be trained with it. Other feature maps do approximate softmax. Performer
# (Choromanski et al., 2021, "Rethinking Attention with Performers") draws random features whose dot product is an
# unbiased estimate of $\exp(q \cdot k)$, and the estimate gets better as the number of random features, and the
# cost, grows. How different is elu + 1? The exponential can make one key dominate a row; $\phi(q)\cdot\phi(k)$
# grows only linearly in each feature. The cell below scales the queries up, which sharpens softmax attention, and
# compares the two on the same $q, k, v$ (256 tokens, $d = 64$): the relative error of the output, and the largest
# weight in a row, on average.
#
# **Predict**: as softmax attention gets sharper, does linear attention follow?

# %%
q, k, v = random_qkv(256, seed=7)
print(f"{'query scale':>11} | {'relative error':>14} | {'largest weight: softmax':>23} | {'linear':>7}")
for scale in [0.25, 0.5, 1.0, 2.0, 4.0]:
    soft, w_soft = scaled_dot_product_attention(q * scale, k, v)
    lin, w_lin = sparse.linear_attention_quadratic(q * scale, k, v)
    error = ((lin - soft).norm() / soft.norm()).item()
    print(f"{scale:>11} | {error:>14.2f} | {w_soft.amax(-1).mean().item():>23.3f} | {w_lin.amax(-1).mean().item():>7.4f}")

# %%
fig, ax = plt.subplots(figsize=(8, 3))
_, w_soft = scaled_dot_product_attention(q[:, :64] * 2.0, k[:, :64], v[:, :64])
_, w_lin = sparse.linear_attention_quadratic(q[:, :64] * 2.0, k[:, :64], v[:, :64])
ax.bar(np.arange(64) - 0.2, w_soft[0, 10], width=0.4, label="softmax attention")
ax.bar(np.arange(64) + 0.2, w_lin[0, 10], width=0.4, label="linear attention (elu + 1)")
ax.set_xlabel("key position")
ax.set_ylabel("weight")
ax.set_title("the weights of query 10 over 64 keys (queries scaled by 2)")
ax.legend()
plt.show()

# %% [markdown]
# On these random inputs linear attention stays close to a uniform average (its largest weight, about 0.005, is
# barely above $1/256 \approx 0.004$), while at a query scale of 4 softmax attention gives a row's largest key 0.48 of
# its weight on average. At that scale the outputs are almost unrelated: the relative error is close to 1.
#
# Scaling further would not help linear attention, and the formula says why. For a large factor $c$, each feature
# of $\phi(c\,x)$ is $c\,x + 1$ where $x > 0$, and $e^{c\,x}$, which tends to 0, where $x < 0$; so $\phi(c\,q) / c$
# tends to $\mathrm{relu}(q)$. The factor $c$ cancels between numerator and denominator, and the weights of query
# $q$ tend to a fixed row, $\mathrm{relu}(q) \cdot \phi(k_j) / \sum_{j'} \mathrm{relu}(q) \cdot \phi(k_{j'})$,
# instead of to a one-hot row as softmax's do. Whatever features a model learns, there is a second limit. If $\phi$
# maps a vector to $m$ features ($m = d$ for elu + 1; random-feature methods such as Performer choose their own
# $m$), the matrix $\phi(Q)\phi(K)^\top$ is an $n \times m$ matrix times an $m \times n$ one, so its rank is at
# most $m$, and dividing each row by its sum keeps it so. A weight matrix in which $n > m$ queries each put nearly
# all their weight on a different key is close to a permutation matrix, and no matrix of rank at most $m$ comes
# close to a permutation matrix of size $n > m$: in the Frobenius norm it stays at least $\sqrt{n - m}$ away, out
# of the permutation's own $\sqrt{n}$ (Eckart & Young, 1936, "The approximation of one matrix by another of lower rank").
# Softmax takes the exponential of each score separately, which does not keep the rank of $Q K^\top$. Both limits,
# measured on the same 256 tokens:

# %% tags=["nbval-ignore-output"]
q, k, v = random_qkv(256, seed=7)  # the same tokens as above
limit = F.relu(q) @ (F.elu(k) + 1).transpose(-2, -1)  # [1, 256, 256]: where the linear weights go as c grows
limit = limit / limit.sum(-1, keepdim=True)
print(f"{'query scale':>11} | {'largest weight: softmax':>23} | {'linear':>7} | {'linear, distance to its limit':>29}")
for scale in [1.0, 10.0, 100.0, 1000.0]:
    _, w_soft = scaled_dot_product_attention(q * scale, k, v)
    _, w_lin = sparse.linear_attention_quadratic(q * scale, k, v)
    print(f"{scale:>11} | {w_soft.amax(-1).mean().item():>23.3f} | {w_lin.amax(-1).mean().item():>7.4f} | "
          f"{(w_lin - limit).abs().max().item():>29.1e}")
claim(w_soft.amax(-1).mean() > 0.99 and w_lin.amax(-1).mean() < 0.01,
      "queries scaled by 1000: softmax gives a row's largest key more than 0.99 of its weight on average, "
      "linear attention less than 0.01", measured=f"{w_soft.amax(-1).mean():.4f}, {w_lin.amax(-1).mean():.4f}")
claim((w_lin - limit).abs().max() < 1e-4, "and the linear weights are within 1e-4 of their limit row",
      measured=f"{(w_lin - limit).abs().max():.1e}")

_, w_soft = scaled_dot_product_attention(q, k, v)
_, w_lin = sparse.linear_attention_quadratic(q, k, v)
rank_soft, rank_lin = (int(torch.linalg.matrix_rank(w[0])) for w in (w_soft, w_lin))
print(f"\nrank of the [256, 256] weight matrix: softmax {rank_soft}, linear {rank_lin}")
claim(rank_lin <= D < rank_soft, f"the linear weights have rank at most d = {D}, the softmax weights more",
      measured=f"softmax {rank_soft}, linear {rank_lin}")

# %% [markdown]
# A trained linear-attention model learns features that make its similarity useful, and on some tasks it does
# well: Katharopoulos et al. (2020) report image generation about as good as with softmax attention, and speech
# recognition better than their recurrent and Reformer baselines, though behind softmax attention. The limits above
# are what it pays for its linear cost: a query cannot be sharpened by scaling it, and more than $m$ queries (here
# $m = d$) cannot each attend sharply to a different key at once.
#
# Measured cost (the non-causal form):

# %% tags=["nbval-ignore-output", "timing", "skip-when-grading"]
measured["linear"] = ({}, {})
for n in SIZES:
    q, k, v = random_qkv(n)
    seconds, memory = measured["linear"]
    seconds[n] = best_time(lambda: sparse.linear_attention(q, k, v))
    memory[n] = sparse.peak_memory(sparse.linear_attention, q, k, v)
    print(f"n = {n:>5}: {1e3 * seconds[n]:>7.2f} ms, peak {memory[n] / 2**20:>6.2f} MiB")
print(f"\nfitted on n >= 1024: time slope {loglog_slope(seconds):.2f}, memory slope {loglog_slope(memory):.2f}")

# %% [markdown]
# ## 6. The online softmax: FlashAttention's idea
#
# The last method changes nothing about the result: it is **exact** softmax attention. What it changes is the
# order of the work, so that the $n \times n$ matrix never has to be stored.
#
# Why would one store it at all? Because softmax needs a whole row before it can produce a single weight: first
# the maximum of the row (to subtract it, so that `exp` does not overflow, chapter 02), then the sum of the
# exponentials, and only then each weight. The obvious program computes all scores, stores them, and reads them
# back twice. On a GPU that storage lives in the large, slow memory (HBM); reading and writing $n^2$ numbers there
# costs more time than the arithmetic. FlashAttention (Dao et al., 2022) removes the round trip: it takes the keys
# in **blocks** small enough for the fast on-chip memory (SRAM), and keeps, for every query, two running numbers and
# one running vector:
#
# * $m$, the largest score seen so far;
# * $\ell$, the sum of $\exp(s - m)$ over the keys seen so far;
# * $a$, the sum of $\exp(s - m)\, v$, a vector of size $d_v$ (the accumulator).
#
# When a new block arrives with a larger maximum $m'$, everything already in $\ell$ and $a$ was measured against
# the old $m$. Multiplying both by $\exp(m - m') \le 1$ re-expresses them against $m'$, and the new block's terms
# are added. After the last block, $a / \ell$ is exactly softmax$(s)\,v$. This running normaliser is the "online
# softmax" of Milakov & Gimelshein (2018). The arithmetic is the same as dense attention's, about $4 n^2 d$ FLOPs;
# only the memory traffic and the memory held shrink.

# %%
fig = draw_online_softmax()
plt.show()

# %% [markdown]
# One row of eight scores, taken three at a time. Watch $m$ jump at the block holding the 8 and $\ell$ shrink
# with it (the rescaling), then the result match the ordinary softmax:

# %%
row = torch.tensor([3.0, 1.0, 5.0, 2.0, 8.0, 0.5, 7.0, 4.0])
m, l = torch.tensor(float("-inf")), torch.tensor(0.0)
for start in range(0, 8, 3):
    block = row[start:start + 3]
    m_new = torch.maximum(m, block.max())
    l = l * torch.exp(m - m_new) + torch.exp(block - m_new).sum()  # old terms rescaled, new ones added
    print(f"block {block.tolist()}: m {m.item():>4} -> {m_new.item()}, l = {l.item():.4f}")
    m = m_new
print("online: exp(row - m) / l =", torch.exp(row - m) / l)
print("softmax(row)             =", softmax(row, dim=-1))

# %% [markdown]
# ### Exercise 8 — `online_softmax_step`
# > **Difficulty** ●●● · **Importance** ●●● · about 20 minutes
#
# Write `online_softmax_step(m, l, acc, scores, v_block)`: fold one block of keys into the running state and
# return the new `(m, l, acc)`.
#
# * `m`, `l`: `[..., L_q, 1]`, the running maximum and running sum (at the start `m = -inf`, `l = 0`);
# * `acc`: `[..., L_q, d_v]`, the running sum of $\exp(s - m)\,v$ (zeros at the start);
# * `scores`: `[..., L_q, B]`, this block's scores (finite numbers); `v_block`: `[..., B, d_v]`, its values.
#
# Worked example (one query): `m = [[2.]]`, `l = [[1.5]]`, `acc = [[3.]]`, `scores = [[4., 1.]]`,
# `v_block = [[1.], [2.]]` give `m = [[4.]]`, `l = [[1.2528]]`, `acc = [[1.5056]]`: the old sum and accumulator are
# multiplied by $e^{2-4} = 0.1353$ before the new terms $e^{0} = 1$ and $e^{-3} = 0.0498$ are added.
#
# <details><summary>Hint 1 — the idea</summary>Three steps: the new maximum covers the old one and this block; a rescale factor brings the old sums from the old maximum to the new one (it is at most 1, and exactly 0 at the start); then this block's exponentials, taken relative to the new maximum, are added to both sums.</details>
# <details><summary>Hint 2 — the plan</summary>Every quantity keeps the query axis. The new maximum, <code>[..., L_q, 1]</code>, is the larger of the old one and this block's largest score. The rescale factor, the exponential of the old maximum minus the new one, is <code>[..., L_q, 1]</code>. This block's exponentials, taken relative to the new maximum, are <code>[..., L_q, B]</code>: their sum over the keys goes into l, their product with the block's values, <code>[..., L_q, d_v]</code>, into acc, each after the old l and acc were multiplied by the rescale factor.</details>
# <details><summary>Hint 3 — the key step</summary>The page to read is <code>torch.maximum</code>, the elementwise
# larger of two tensors, as opposed to a maximum over one dimension (<code>torch.amax</code>). The question that
# unlocks the step: the old maximum is <code>[..., L_q, 1]</code> and this block's scores
# <code>[..., L_q, B]</code>; which reduction, keeping which dimension, brings the block to the old maximum's
# shape?</details>

# %% nbgrader={"grade": false, "grade_id": "online_softmax_step", "locked": false, "schema_version": 3, "solution": true, "task": false}
def online_softmax_step(m, l, acc, scores, v_block):
    """Fold one block into the online softmax state. m, l: [..., L_q, 1]; acc: [..., L_q, d_v];
    scores: [..., L_q, B]; v_block: [..., B, d_v]. Returns the new (m, l, acc).
    """
    ### BEGIN SOLUTION
    m_new = torch.maximum(m, scores.amax(dim=-1, keepdim=True))  # [..., L_q, 1]
    rescale = torch.exp(m - m_new)  # [..., L_q, 1]: <= 1, and 0 at the start
    p = torch.exp(scores - m_new)  # [..., L_q, B]
    l_new = rescale * l + p.sum(dim=-1, keepdim=True)
    acc_new = rescale * acc + p @ v_block  # [..., L_q, d_v]
    return m_new, l_new, acc_new
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "online_softmax_step_test", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false} tags=["raises-exception"]
check_online_softmax_step(online_softmax_step)
### BEGIN HIDDEN TESTS
check_online_softmax_step(online_softmax_step, hidden=True)
### END HIDDEN TESTS

# %%
online_softmax_step_impl = yours_or_reference(online_softmax_step, check_online_softmax_step)

# %% [markdown]
# The library's `online_softmax_attention` runs the block loop of the diagram and accepts the step to use: here it
# is yours. It must equal dense attention: without a mask, with the causal mask, and with your sliding window.
# Then with **large scores** (queries multiplied by 100): a softmax that exponentiates raw scores overflows to
# `inf` there, the online one does not, because every exponent it takes is $\le 0$.

# %%
q, k, v = random_qkv(300, seed=8)
for name, kwargs, mask in [("no mask", {}, None),
                           ("causal", {"causal": True}, torch.ones(300, 300, dtype=torch.bool).tril()),
                           ("sliding window 16", {"mask": sliding_window_mask_impl(300, 16)}, sliding_window_mask_impl(300, 16))]:
    online = sparse.online_softmax_attention(q, k, v, block=64, step=online_softmax_step_impl, **kwargs)
    dense_out, _ = scaled_dot_product_attention(q, k, v, mask=mask)
    print(f"{name:<18}: equal to dense attention (to 1e-5): {torch.allclose(online, dense_out, atol=1e-5)}")

big_q = q * 100.0  # scores in the hundreds
raw = torch.exp(big_q @ k.transpose(-2, -1) / math.sqrt(D))
print(f"\nlargest score {(big_q @ k.transpose(-2, -1) / math.sqrt(D)).max().item():.0f}: exp of the raw scores has "
      f"{int(torch.isinf(raw).sum()):,} infs, so a naive softmax gives NaN: {bool(torch.isnan(raw / raw.sum(-1, keepdim=True)).any())}")
online = sparse.online_softmax_attention(big_q, k, v, block=64, step=online_softmax_step_impl)
print("online softmax with large scores: finite:", bool(online.isfinite().all()),
      "| equal to dense (to 1e-5):", torch.allclose(online, scaled_dot_product_attention(big_q, k, v)[0], atol=1e-5))
print(f"largest score matrix held: [300, 64] = {300 * 64:,} numbers, not [300, 300] = {300 * 300:,}")

# %% [markdown]
# This Python loop does the same arithmetic as dense attention, plus some bookkeeping. What it changes on any
# machine is the memory: one block of $n \times B$ scores at a time (and temporaries of that size), never
# $n \times n$. Any difference in speed comes from memory traffic, the very thing FlashAttention optimises: the
# readable dense path streams four $n \times n$ matrices through main memory, while a block of scores is $n / B$
# times smaller and more likely to stay in the processor's cache. Measured, with blocks of 256 keys and your
# `online_softmax_step` (or the reference) folding them in:

# %% tags=["nbval-ignore-output", "timing"]
measured["online"] = ({}, {})
for n in SIZES:
    q, k, v = random_qkv(n)
    seconds, memory = measured["online"]
    seconds[n] = best_time(lambda: sparse.online_softmax_attention(q, k, v, 256, step=online_softmax_step_impl))
    memory[n] = sparse.peak_memory(sparse.online_softmax_attention, q, k, v, 256, step=online_softmax_step_impl)
    print(f"n = {n:>5}: {1e3 * seconds[n]:>7.1f} ms, peak {memory[n] / 2**20:>6.1f} MiB "
          f"(dense: {1e3 * measured['dense'][0][n]:>7.1f} ms, {measured['dense'][1][n] / 2**20:>6.1f} MiB)")
print(f"\nfitted on n >= 1024: time slope {loglog_slope(seconds):.2f}, memory slope {loglog_slope(memory):.2f}")

# %% [markdown]
# Time still grows with slope about 2, memory with slope about 1: the online softmax attacks memory, not
# arithmetic. Why slope 1 and not a flat line? The loop tiles the keys only, so every block of scores spans all $n$
# queries, `[n, B]`, and at its peak it holds three such tensors: a block of scores and the temporaries computed
# from it. Memory is exact, so here is the peak in bytes:

# %%
for n in SIZES[2:]:
    peak, block, acc = measured["online"][1][n], 4 * n * 256, 4 * n * D  # float32: 4 bytes a number
    print(f"n = {n:>5}: peak {peak:>10,} bytes ({peak / 2**20:4.1f} MiB) = 3 x {block:>9,} ([n, 256] blocks) "
          f"+ {acc:>9,} (the accumulator, [n, 64]) + {peak - 3 * block - acc:>6,}")

# %% [markdown]
# The remainder is a few vectors with one number per query ($m$, $\ell$ and their updates) and a one-byte flag.
# Everything grows in proportion to $n$: far less than dense attention's $n^2$, but not the fixed working memory of
# FlashAttention, which also tiles the queries. FlashAttention (Dao et al., 2022) takes a block of queries and a block of keys at a
# time, both sized to fit on the chip, so only its output and two numbers per query ($m$ and $\ell$) grow with $n$.
# It also recomputes the blocks in the backward pass instead of storing them, and fuses everything into one GPU
# kernel. On a GPU the saved memory traffic is what makes it faster: its forward pass does the same arithmetic as
# dense attention, and its backward pass does *more*, because it recomputes the scores, yet it still runs faster.

# %% [markdown]
# ## 7. All of them side by side, and PyTorch's fused kernel
#
# PyTorch's `torch.nn.functional.scaled_dot_product_attention` is such a fused kernel. On a GPU it picks a
# FlashAttention implementation when it can; on a CPU it has a blocked, FlashAttention-style kernel of its own,
# which it uses for inputs shaped like multi-head attention's, `[batch, heads, n, d]`. (Given 3-D inputs it quietly
# falls back to the plain math path, $n \times n$ matrix included: the cell below measures both.) It computes
# exactly dense attention:

# %%
q, k, v = random_qkv(512, seed=9)
print("F.scaled_dot_product_attention == the course's attention (to 1e-5):",
      torch.allclose(F.scaled_dot_product_attention(q, k, v), scaled_dot_product_attention(q, k, v)[0], atol=1e-5))

# %% tags=["nbval-ignore-output", "timing"]
measured["PyTorch fused"] = ({}, {})
for n in SIZES:
    q, k, v = (t.unsqueeze(1) for t in random_qkv(n))  # [batch=1, heads=1, n, d]: the fused kernel's shape
    seconds, memory = measured["PyTorch fused"]
    seconds[n] = best_time(lambda: F.scaled_dot_product_attention(q, k, v))
    memory[n] = sparse.peak_memory(F.scaled_dot_product_attention, q, k, v)
q3, k3, v3 = random_qkv(SIZES[-1])  # [1, n, d]: 3-D
print(f"PyTorch's scaled_dot_product_attention at n = {SIZES[-1]}: peak {memory[SIZES[-1]] / 2**20:.1f} MiB with "
      f"[1, 1, n, d] inputs, {sparse.peak_memory(F.scaled_dot_product_attention, q3, k3, v3) / 2**20:.1f} MiB "
      f"with [1, n, d] inputs (the math fallback)\n")

fig, axes = plt.subplots(1, 2, figsize=(11, 4))
print(f"{'method':<14} {'time slope':>10} {'memory slope':>12}   (fitted on n >= 1024)")
for name, (seconds, memory) in measured.items():
    axes[0].loglog(SIZES, [1e3 * seconds[n] for n in SIZES], "o-", base=2, label=name)
    axes[1].loglog(SIZES, [memory[n] / 2**20 for n in SIZES], "o-", base=2, label=name)
    print(f"{name:<14} {loglog_slope(seconds):>10.2f} {loglog_slope(memory):>12.2f}")
for ax, title in [(axes[0], "time per call (ms)"), (axes[1], "peak memory (MiB)")]:
    ax.set_xlabel("sequence length n")
    ax.set_title(title)
    ax.legend(fontsize=8)
fig.suptitle("one head, d = 64, on this CPU (log-log axes)")
print(f"\nat n = {SIZES[-1]}: " + ", ".join(f"{name} {1e3 * s[SIZES[-1]]:.0f} ms" for name, (s, _) in measured.items()))
fig.tight_layout()
plt.show()
online_slope, fused_slope = loglog_slope(measured["online"][1]), loglog_slope(measured["PyTorch fused"][1])
others = min(loglog_slope(memory) for name, (_, memory) in measured.items() if name != "PyTorch fused")
slopes = f"online {online_slope:.2f}, fused {fused_slope:.2f}, lowest of the others {others:.2f}"
claim(abs(online_slope - 1) < 0.05, "memory slopes: the online softmax's is 1 (within 0.05)", measured=slopes)
claim_between(fused_slope, None, 0.9, "the fused kernel's is below 0.9", measured=slopes)
claim(fused_slope < others, "and the lowest of all", measured=slopes)

# %% [markdown]
# Read the two panels together. Dense attention is quadratic in both. The fused kernel does the same arithmetic
# (its time slope is about 2, like dense attention's) faster than the readable path, and its memory stays at a
# few megabytes: it never stores the score matrix. Its memory slope is the lowest of all, about 0.5 here (the
# claim asks only that it stay below 0.9): PyTorch's CPU
# kernel works on tiles of a fixed number of queries and keys, with one set of tile buffers per thread, so its
# working memory does not depend on $n$; only its output, $n \times d$ numbers, and one number per query grow. The
# library's online softmax does not share that profile. Its memory grows with slope 1 (13.1 MiB at $n = 4{,}096$,
# counted in bytes in section 6), because its Python loop tiles the keys only and every block spans all $n$
# queries. Banded and linear attention are the only ones whose *time* grows linearly, because they compute less:
# banded attention by dropping pairs, linear attention by changing what is computed. (The banded curve is your
# function's, when it passes; the others are the library's.)
#
# The same comparison as counts, exact for each method's algorithm ($d = d_v = 64$, window $w = 64$, block
# $B = 256$):

# %%
def cost(method, n, d=D, w=64, block=256):
    """(FLOPs of the products, numbers held in the largest score-like buffer) for one head. Banded: the
    exercise's loop, one block of b queries against its b + 2w keys at a time."""
    if method == "dense":
        return 4 * n * n * d, n * n
    if method == "banded":
        b = max(w, 16)
        return 4 * n * (b + 2 * w) * d, b * (b + 2 * w)
    if method == "linear":
        return 4 * n * d * d, d * d
    if method == "online":
        return 4 * n * n * d, n * block
    raise ValueError(method)


for method in ["dense", "banded", "linear", "online"]:
    f1, m1 = cost(method, 4096)
    f2, m2 = cost(method, 8192)
    print(f"{method:<7} n = 4096: {f1:.2e} FLOPs, {m1:>10,} numbers held | n -> 2n: FLOPs x {f2 / f1:.0f}, "
          f"held x {m2 / m1:.0f}")

# %% [markdown]
# ## Summary
#
# * Dense attention costs $4 n^2 d$ FLOPs and holds an $n \times n$ matrix per head: doubling $n$ quadruples both.
#   Measured on a log-log plot, the memory slope was 2 and the time slope about 2 or more at large $n$.
# * **Sparse patterns** (Prince, section 12.9) keep a constant number of keys per query: a **sliding window**
#   ($|i - j| \le w$; causal: $0 \le i - j \le w$), a **dilated** window (gaps counted from the query, reach
#   $w \cdot r$), **selected global positions** (rows and columns on), and **global tokens** (new hub tokens in
#   front, rows and columns on). Longformer, Big Bird and the Sparse Transformer combine them.
# * The **receptive field** after $L$ layers is the boolean power $M^L$: a window grows by $w$ per layer; strides and
#   global tokens connect everything in two layers.
# * **Banded attention**, which you wrote, computes only the band, block by block: each block of queries against
#   the span of keys its band reaches, with a small mask built from the real positions. It equals dense attention
#   under the window mask, its time grows with slope near 1, and no $n \times n$ tensor ever exists.
# * **Linear attention** with $\phi = \mathrm{elu} + 1$ reorders $(\phi(Q)\phi(K)^\top)V$ as
#   $\phi(Q)(\phi(K)^\top V)$: $O(n d^2)$. Its causal form is a prefix sum, which stores a $d \times d_v$ state per
#   position; run as an RNN, the recurrent form you wrote, it keeps one state $(S, z)$ and updates it before each
#   read. It is a different model, not an approximation of softmax attention (random
#   features, as in Performer, would approximate it): on random inputs its weights stay close to uniform where
#   softmax attention is sharp, scaling a query does not sharpen them, and its weight matrix has rank at most its
#   number of features $m$ ($d$ for elu + 1).
# * The **online softmax** keeps a running maximum and sum and rescales when the maximum grows. It is exact, never
#   holds the $n \times n$ matrix, and does the same arithmetic: FlashAttention wins on memory traffic. Tiling
#   the keys only, as the course's loop does, leaves memory growing like $n$; FlashAttention and PyTorch's fused
#   `scaled_dot_product_attention` tile the queries too, and only their output and a number or two per query grow
#   with $n$.
#
# ## What's next
#
# Chapter 12 brings Transformers to images, where the sequences are long from the start: a 224 × 224 image cut
# into 16 × 16 patches is 196 tokens, into pixels 50,176. The Swin Transformer's answer is a window again:
# attention inside local windows of patches, shifted from one layer to the next so that the receptive field grows.

# %% [markdown]
# ## Where you stand
#
# Which of this chapter's exercises pass, as last checked (run the test cells again after a change):

# %%
exercise_summary(check_sliding_window_mask, check_dilated_mask, check_global_token_mask, check_receptive_field,
                 check_banded_attention, check_causal_linear_attention, check_recurrent_linear_attention,
                 check_online_softmax_step)

# %% [markdown]
# ## Glossary · 术语表
#
# | English | 中文 | Meaning |
# |---|---|---|
# | quadratic complexity | 平方复杂度 | cost growing as $n^2$: doubling the length quadruples time and memory |
# | interaction matrix | 交互矩阵 | the $n \times n$ grid of which query may attend to which key; a mask |
# | sparse attention | 稀疏注意力 | attention over a fixed pattern of pairs, a constant number per query |
# | sliding-window attention | 滑动窗口注意力（局部注意力） | each token attends to its neighbours within $w$ positions |
# | dilated window | 膨胀（空洞）窗口 | a window with gaps: keys $r$ positions apart, reach $w \cdot r$ |
# | global attention | 全局注意力 | selected positions whose rows and columns are all on |
# | global token | 全局词元 | an extra token, standing for no word, connected to every token |
# | receptive field | 感受野 | the inputs that can influence an output after $L$ layers |
# | banded attention | 带状注意力 | the sliding window computed only inside the band, $O(n w)$ |
# | block, span | 分块，键区间 | a run of consecutive queries, and the keys its band can reach |
# | linear attention | 线性注意力 | similarity $\phi(q) \cdot \phi(k)$, computed as $\phi(Q)(\phi(K)^\top V)$ in $O(n)$ |
# | feature map | 特征映射（核函数） | $\phi(x) = \mathrm{elu}(x) + 1$: positive features replacing $\exp$ |
# | prefix sum | 前缀和 | running totals along the sequence (`cumsum`): the causal form of linear attention |
# | recurrent form | 循环（RNN）形式 | the same sums carried as one state $(S, z)$, updated position by position |
# | online softmax | 在线 softmax | softmax computed block by block with a running maximum and sum |
# | FlashAttention | FlashAttention（IO 感知的精确注意力） | exact attention in on-chip blocks: less memory traffic, same FLOPs |
# | fused kernel | 融合算子 | one GPU/CPU routine doing several steps without storing the intermediates |
# | memory traffic | 访存量 / 显存读写 | bytes moved between slow and fast memory; often the real bottleneck |
