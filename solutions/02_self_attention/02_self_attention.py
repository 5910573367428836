# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Chapter 02 — Self-attention, one step at a time
#
# Chapter 01 showed why one fixed vector per word is not enough: a word's vector should depend on the
# sentence around it, so that "apple" in *eat an apple* and in *Apple's product launch* end up in different
# places. **Self-attention** is the mechanism the Transformer uses to get there. Every token looks at
# every token of its own sentence (itself included), decides how relevant each one is, and replaces
# its vector by a relevance-weighted mix of what the others offer.
#
# In this chapter you build it from scratch, in the order the computation happens:
#
# 1. **Queries, keys and values** — three roles for each token, made by three learned matrices.
# 2. **Scores** — a dot product says how well a query matches a key.
# 3. **The $\sqrt{d_k}$ scale** — why the scores are divided, *measured* rather than asserted.
# 4. **Softmax** — scores become weights that sum to one (and how to compute it without overflow).
# 5. **The weighted sum** — and the mask that hides keys a query must not see.
# 6. **A worked toy example** (Raimi Karim's, 2019), checked number by number.
# 7. **The matrix form** — the whole sentence in five matrix products.
# 8. **Permutation equivariance** — what attention does *not* know about word order.
# 9. **An attention heatmap** of a small sentence.
# 10. **A self-attention layer** that owns its $W^Q, W^K, W^V$ and reads a batch of sentences of different lengths.
#
# Six exercises are autograded: `project_qkv`, `attention_scores`, `softmax`, `scaled_attention`,
# `self_attention` and the layer `SelfAttention`. The exercises take about 85 minutes in all. Each test cell
# tells you, when your answer is wrong, which common mistake it looks like.
#
# The whole computation fits in one line, the equation of *Attention Is All You Need* (Vaswani et al., 2017):
#
# $$\mathrm{Attention}(Q, K, V) = \mathrm{softmax}\!\left(\frac{Q K^\top}{\sqrt{d_k}}\right) V$$
#
# By the end of the chapter every symbol in it will be something you have computed yourself.
#
# Later cells use your functions once they pass their checks. Until then, the cell after each test says
# so and hands the rest of the chapter the library's version, so you can run everything top to bottom
# whatever you have finished.

# %%
import math

import matplotlib.pyplot as plt
import torch
import torch.nn as nn

from transformer_lib.checks import exercise_summary, yours_or_reference
from transformer_lib.checks.ch02 import (
    check_attention_scores,
    check_project_qkv,
    check_scaled_attention,
    check_self_attention,
    check_self_attention_layer,
    check_softmax,
)
from transformer_lib.claims import claim
from transformer_lib.diagrams.ch02 import draw_qkv_flow

torch.manual_seed(0)
torch.set_printoptions(precision=4, sci_mode=False)

# %% [markdown]
# Here is the whole computation for one token $i$, as a map of the chapter. Its embedding $x_i$ is projected
# three ways, into a query $q_i$, a key $k_i$ and a value $v_i$. Every other token $j$ makes its key and value the
# same way. The query is compared with every key (one dot product per key), the scores are divided by
# $\sqrt{d_k}$, and a softmax turns them into weights that sum to one. The new vector $z_i$ is the weighted sum
# of all the values. Sections 1 to 5 build these boxes one at a time.

# %%
draw_qkv_flow()
plt.show()

# %% [markdown]
# ## 1. Three roles for every token: query, key, value
#
# Think of a search engine. You type a **query** ("what am I looking for?"); every document carries
# **keys**, the labels it can be found by ("what do I offer?"); when a query matches a key, you read
# that document's **content**, its **value** ("what I hand over if chosen").
#
# Self-attention gives every token all three roles at once. Starting from the token's embedding
# $x_i$ (a row vector of size $d_{model}$), three learned matrices produce
#
# $$q_i = x_i W^Q, \qquad k_i = x_i W^K, \qquad v_i = x_i W^V,$$
#
# with $W^Q, W^K \in \mathbb{R}^{d_{model} \times d_k}$ and $W^V \in \mathbb{R}^{d_{model} \times d_v}$.
# Queries and keys must have the same size $d_k$, because we will compare them with a dot product;
# the values may have a different size $d_v$.
#
# Why not compare the embeddings directly? Because then "relevance" would be fixed by whatever the
# embeddings happen to be. With $W^Q$ and $W^K$ the model *learns* which aspects of a word to ask
# about and which to advertise. And note that all three come from **the same input** $X$: that is the
# "self" in self-attention (the sentence attends to itself).
#
# Stacking the tokens of a sentence as rows of a matrix $X$ of shape `[seq, d_model]`, the three
# projections are three matrix products: $Q = XW^Q$, $K = XW^K$, $V = XW^V$.

# %% [markdown]
# ### Exercise 1 — `project_qkv`
# > **Difficulty** ●○○ · **Importance** ●●● · about 5 minutes
#
# Write `project_qkv(x, w_q, w_k, w_v)` returning the tuple `(q, k, v)`.
#
# * `x`: `[..., seq, d_model]` — any number of leading batch dimensions.
# * `w_q`, `w_k`: `[d_model, d_k]`; `w_v`: `[d_model, d_v]`.
# * returns `q`, `k`: `[..., seq, d_k]` and `v`: `[..., seq, d_v]`.
#
# Worked example: with the toy matrices of section 6, the first token $x_1 = [1, 0, 1, 0]$ gets the query
# $x_1 W^Q = [1, 0, 2]$.
#
# <details><summary>Hint 1 — the idea</summary>Each role is one matrix product of the same input with its own matrix. PyTorch's matrix product multiplies the last two dimensions and broadcasts the leading ones, so batch dimensions take care of themselves.</details>
# <details><summary>Hint 2 — the plan</summary>Three products, one per matrix: <code>[..., seq, d_model]</code> times <code>[d_model, d_k]</code> gives <code>[..., seq, d_k]</code> (and <code>d_v</code> columns for the values). Return the three results as one tuple, in the order queries, keys, values.</details>
# <details><summary>Hint 3 — the key step</summary>On a toy: <code>torch.ones(5, 2, 4) @ torch.ones(4, 3)</code> has
# shape <code>[5, 2, 3]</code>; the leading 5 rides along untouched. Which of the three matrices makes the values, and
# how many columns does it have?</details>

# %% nbgrader={"grade": false, "grade_id": "project_qkv", "locked": false, "schema_version": 3, "solution": true, "task": false}
def project_qkv(x: torch.Tensor, w_q: torch.Tensor, w_k: torch.Tensor, w_v: torch.Tensor):
    """Queries, keys and values of every token.

    x: [..., seq, d_model]; w_q, w_k: [d_model, d_k]; w_v: [d_model, d_v].
    Returns (q [..., seq, d_k], k [..., seq, d_k], v [..., seq, d_v]).
    """
    ### BEGIN SOLUTION
    q = x @ w_q  # [..., seq, d_k]
    k = x @ w_k  # [..., seq, d_k]
    v = x @ w_v  # [..., seq, d_v]
    return q, k, v
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "project_qkv_test", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false} tags=["raises-exception"]
check_project_qkv(project_qkv)
### BEGIN HIDDEN TESTS
check_project_qkv(project_qkv, hidden=True)
### END HIDDEN TESTS

# %%
project_qkv_impl = yours_or_reference(project_qkv, check_project_qkv)

# %% [markdown]
# Here are the matrices of the toy example we will work through in section 6, from Raimi Karim's article
# "Illustrated: Self-Attention" (Towards Data Science, 2019): three tokens with $d_{model} = 4$ features,
# projected to $d_k = d_v = 3$. The three inputs and all three matrices, $W^Q$, $W^K$ and $W^V$, are the article's
# (Karim prints them as `w_query`, `w_key` and `w_value`), and section 6 reproduces the article's result with them.

# %%
x_toy = torch.tensor([[1.0, 0.0, 1.0, 0.0],   # token 1
                      [0.0, 2.0, 0.0, 2.0],   # token 2
                      [1.0, 1.0, 1.0, 1.0]])  # token 3      [seq=3, d_model=4]
w_q_toy = torch.tensor([[1.0, 0.0, 1.0], [1.0, 0.0, 0.0], [0.0, 0.0, 1.0], [0.0, 1.0, 1.0]])  # [4, 3]
w_k_toy = torch.tensor([[0.0, 0.0, 1.0], [1.0, 1.0, 0.0], [0.0, 1.0, 0.0], [1.0, 1.0, 0.0]])  # [4, 3]
w_v_toy = torch.tensor([[0.0, 2.0, 0.0], [0.0, 3.0, 0.0], [1.0, 0.0, 3.0], [1.0, 1.0, 0.0]])  # [4, 3]

Q_toy, K_toy, V_toy = project_qkv_impl(x_toy, w_q_toy, w_k_toy, w_v_toy)
print("queries Q =\n", Q_toy)
print("keys    K =\n", K_toy)
print("values  V =\n", V_toy)

# %% [markdown]
# ## 2. Scores: how well does a query match a key?
#
# The match between query $q_i$ and key $k_j$ is their dot product
#
# $$s_{ij} = q_i \cdot k_j = \sum_{m=1}^{d_k} q_{i,m}\, k_{j,m}.$$
#
# It is large when the two vectors point the same way, near zero when they are unrelated, negative when
# they disagree. For a whole sentence, all the pairs at once form a matrix product, $S = Q K^\top$, of shape
# `[L_q, L_k]`: row $i$ holds how query $i$ rates every key.
#
# Jay Alammar's article "The Illustrated Transformer" (2018) follows the word *Thinking* in the two-word
# sentence *Thinking Machines*, with $d_k = 64$. Its query scores 112 against its own key and 96 against the
# key of *Machines*. The article doesn't print the vectors, so we build a pair that gives exactly those scores:

# %%
d_k = 64
q1 = torch.full((d_k,), 2.0)          # the query of "Thinking"
k1 = torch.full((d_k,), 112 / 128)    # the key of "Thinking"
k2 = torch.full((d_k,), 96 / 128)     # the key of "Machines"
print(f"q1 . k1 = {q1 @ k1:.0f}")
print(f"q1 . k2 = {q1 @ k2:.0f}")

# %% [markdown]
# Before turning scores into weights, there is a catch — the scores are too big.
#
# ## 3. Why divide by sqrt(d_k)? Measure it
#
# The argument is the one Vaswani et al. give in *Attention Is All You Need* (2017, footnote 4). Suppose the
# entries of $q$ and $k$ are independent, with mean 0 and variance 1. (That is the paper's idealisation, not what a
# freshly initialised model produces: PyTorch's default `nn.Linear` draws its weights uniformly in
# $\pm 1/\sqrt{d_{in}}$, of variance $1/(3 d_{in})$, so from unit-variance inputs each entry of $q$ and $k$ has a
# variance of about $1/3$, and $\mathrm{Var}(q \cdot k) \approx d_k / 9$. Only the factor $d_k$ matters below.) Each product $q_m k_m$ then has mean 0 and variance
# $\mathbb{E}[q_m^2]\,\mathbb{E}[k_m^2] = 1$, and the dot product adds $d_k$ independent such terms:
#
# $$\mathrm{Var}(q \cdot k) = d_k,$$
#
# so the typical size of a score is $\sqrt{d_k}$.
#
# Large scores are bad news for the softmax that comes next: when one score is far above the others,
# softmax gives it (almost) all the weight — a near one-hot vector — and its gradient almost vanishes,
# so the model stops learning which keys matter. Dividing by $\sqrt{d_k}$ brings the variance back to 1,
# whatever $d_k$ is.
#
# **Predict** before running the next cell: for $d_k = 1024$, what variance will the raw dot products have?
# And how close to one-hot will the softmax over 8 keys be?
#
# The cell draws random unit-variance queries and keys for several $d_k$ and measures, with and without
# the scale: the variance of the scores, the average largest softmax weight (1.0 would be one-hot; with
# 8 keys, uniform is 0.125), and the size of the gradient that flows back through the softmax (for a fixed
# random training signal on the weights).

# %%
gen = torch.Generator().manual_seed(1)
d_ks = [4, 16, 64, 256, 1024]
n_queries, n_keys = 2000, 8
signal = torch.randn(n_queries, n_keys, generator=gen)  # some gradient arriving at the weights


def saturation(z: torch.Tensor):
    """Mean largest softmax weight, and mean norm of the gradient reaching the softmax input z."""
    z = z.clone().requires_grad_(True)
    weights = torch.softmax(z, dim=-1)  # [n_queries, n_keys]
    (weights * signal).sum().backward()
    return weights.max(dim=-1).values.mean().item(), z.grad.norm(dim=-1).mean().item()


results = []
for d in d_ks:
    q = torch.randn(n_queries, 1, d, generator=gen)       # [n_queries, 1, d_k]
    k = torch.randn(n_queries, n_keys, d, generator=gen)  # [n_queries, n_keys, d_k]
    raw = (q @ k.transpose(-2, -1)).squeeze(1)            # [n_queries, n_keys]
    scaled = raw / math.sqrt(d)
    results.append((d, raw.var().item(), scaled.var().item(), *saturation(raw), *saturation(scaled)))

print(f"{n_keys} keys: a uniform softmax would give each key weight 1/{n_keys} = {1 / n_keys}")
print(f"{'d_k':>5} | {'Var raw':>8} {'Var scaled':>10} | {'max w raw':>9} {'max w scaled':>12} | {'grad raw':>8} {'grad scaled':>11}")
for d, v_raw, v_scaled, w_raw, g_raw, w_scaled, g_scaled in results:
    print(f"{d:>5} | {v_raw:>8.1f} {v_scaled:>10.2f} | {w_raw:>9.3f} {w_scaled:>12.3f} | {g_raw:>8.4f} {g_scaled:>11.4f}")

# %% [markdown]
# The raw variance tracks $d_k$ (the first column is close to 4, 16, 64, 256, 1024), while the scaled one
# stays near 1. Without the scale, the largest weight creeps towards 1 as $d_k$ grows and the gradient
# shrinks; with it, both stay put, whatever the size. The same numbers as a picture:

# %%
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(8, 3.2))
ax1.loglog(d_ks, [r[1] for r in results], "o-", label="raw q.k")
ax1.loglog(d_ks, [r[2] for r in results], "s-", label="q.k / sqrt(d_k)")
ax1.set_xlabel("d_k")
ax1.set_ylabel("variance of the scores")
ax1.legend()
ax2.semilogx(d_ks, [r[3] for r in results], "o-", label="raw: max weight")
ax2.semilogx(d_ks, [r[5] for r in results], "s-", label="scaled: max weight")
ax2.semilogx(d_ks, [r[4] for r in results], "o--", label="raw: gradient norm")
ax2.semilogx(d_ks, [r[6] for r in results], "s--", label="scaled: gradient norm")
ax2.set_xlabel("d_k")
ax2.set_ylabel("mean over the queries")
ax2.legend(fontsize=7)
fig.tight_layout()
plt.show()

# %% [markdown]
# Alammar's example shows the same thing in miniature. Its scores 112 and 96 differ by 16; fed to
# softmax as they are, *Machines* would get almost nothing:

# %%
raw_weights = torch.softmax(torch.tensor([112.0, 96.0]), dim=-1)
print(f"softmax([112, 96]) = [{raw_weights[0]:.7f}, {raw_weights[1]:.2e}]   (no scaling: nearly one-hot)")

# %% [markdown]
# ### Exercise 2 — `attention_scores`
# > **Difficulty** ●○○ · **Importance** ●●● · about 10 minutes
#
# Write `attention_scores(q, k)` returning the scaled scores $Q K^\top / \sqrt{d_k}$.
#
# * `q`: `[..., L_q, d_k]`, `k`: `[..., L_k, d_k]` (leading dimensions broadcast).
# * returns `[..., L_q, L_k]`: row $i$, column $j$ is query $i$ against key $j$.
#
# Worked example: the *Thinking Machines* query and keys above, `q1[None]` of shape `[1, 64]` and
# `torch.stack([k1, k2])` of shape `[2, 64]`, give `[[14., 12.]]` (that is, 112/8 and 96/8).
#
# <details><summary>Hint 1 — the idea</summary>All the dot products at once are one matrix product: the queries times the keys turned on their side. Then one division by $\sqrt{d_k}$, where $d_k$ is the size of one query vector.</details>
# <details><summary>Hint 2 — the plan</summary>Shapes: <code>[..., L_q, d_k]</code> times <code>[..., d_k, L_k]</code> gives <code>[..., L_q, L_k]</code>. Turning the keys on their side means swapping only their last two dimensions; the batch dimensions stay where they are (the <code>.T</code> attribute would reverse them all). $d_k$ is the last entry of <code>q.shape</code>, and the square root comes from the <code>math</code> module.</details>
# <details><summary>Hint 3 — the key step</summary>On other shapes: a tensor <code>a</code> of shape <code>[2, 7, 4,
# 8]</code> with its last two dimensions swapped is <code>[2, 7, 8, 4]</code>; <code>a.mT</code> does that, and so does
# torch.Tensor.transpose given those two dimensions. Which tensor must be swapped so that the product is <code>[...,
# L_q, L_k]</code>, and the square root of which size divides it?</details>

# %% nbgrader={"grade": false, "grade_id": "attention_scores", "locked": false, "schema_version": 3, "solution": true, "task": false}
def attention_scores(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Scaled dot products of every query with every key.

    q: [..., L_q, d_k], k: [..., L_k, d_k] -> scores [..., L_q, L_k].
    """
    ### BEGIN SOLUTION
    d_k = q.shape[-1]
    return q @ k.transpose(-2, -1) / math.sqrt(d_k)  # [..., L_q, L_k]
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "attention_scores_test", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false} tags=["raises-exception"]
check_attention_scores(attention_scores)
### BEGIN HIDDEN TESTS
check_attention_scores(attention_scores, hidden=True)
### END HIDDEN TESTS

# %%
attention_scores_impl = yours_or_reference(attention_scores, check_attention_scores)

# %% [markdown]
# With the scale, Alammar's scores become 14 and 12 (here $\sqrt{64} = 8$):

# %%
thinking_scores = attention_scores_impl(q1[None], torch.stack([k1, k2]))  # [1, 2]
print(f"sqrt(d_k) = {math.sqrt(d_k):.0f}")
print("scaled scores of 'Thinking':", thinking_scores)

# %% [markdown]
# ## 4. Softmax: from scores to weights
#
# Softmax turns any row of real numbers into positive weights that sum to one:
#
# $$\mathrm{softmax}(s)_j = \frac{e^{s_j}}{\sum_{j'} e^{s_{j'}}}.$$
#
# It keeps the order of the scores and exaggerates their gaps (the exponential grows fast), which is
# exactly why it saturates when the scores are large.
#
# Written literally, the formula has a trap. `float32` can hold numbers up to about $3.4 \times 10^{38}$, so
# $e^{s}$ overflows to `inf` as soon as $s$ exceeds about 88.7 — and then the ratio is `inf / inf`.
# **Predict**: what does the literal formula give for the scores `[1000, 1001, 1002]`?

# %%
f32_max = torch.finfo(torch.float32).max
mantissa, exponent = f"{f32_max:.1e}".split("e")
print(f"largest float32: about {mantissa} x 10^{int(exponent)}, so exp(s) overflows above s = {math.log(f32_max):.1f}")

big = torch.tensor([1000.0, 1001.0, 1002.0])
naive = big.exp() / big.exp().sum()
print("exp(s)             :", big.exp())
print("literal softmax    :", naive)

# %% [markdown]
# Not a number. The cure costs one subtraction: for any constant $c$,
# $\dfrac{e^{s_j - c}}{\sum_{j'} e^{s_{j'} - c}} = \dfrac{e^{-c}\, e^{s_j}}{e^{-c} \sum_{j'} e^{s_{j'}}}$
# is the same softmax. Choosing $c = \max_j s_j$ makes the largest exponent $e^0 = 1$: nothing overflows,
# and at least one term of the sum is 1, so we never divide by zero either.

# %% [markdown]
# ### Exercise 3 — `softmax`
# > **Difficulty** ●●○ · **Importance** ●●● · about 15 minutes
#
# Write a numerically stable `softmax(x)` over the **last** dimension.
#
# * `x`: `[..., n]`, any number of leading dimensions, any float dtype.
# * returns a tensor of the same shape; every slice along the last dimension is positive and sums to 1.
#
# Worked example (the scores an image classifier gives the classes *cat*, *car* and *frog*, a classic of
# Stanford's CS231n course): `softmax(torch.tensor([3.2, 5.1, -1.7]))` is about `[0.13, 0.87, 0.00]`. And
# `softmax(torch.tensor([1000., 1001., 1002.]))` must not be `nan`.
#
# Don't call `torch.softmax`, `torch.nn.functional.softmax` or any other PyTorch softmax: the point is to write
# it, and the grader gives an answer that calls one 0 points for this exercise.
#
# <details><summary>Hint 1 — the idea</summary>Softmax does not change when the same number is subtracted from every score of a row (it cancels in the ratio). Subtract the row's own largest score: then every exponential is at most 1 and nothing overflows. Every maximum and every sum runs over the last dimension, one row at a time, never over the whole tensor or the first dimension.</details>
# <details><summary>Hint 2 — the plan</summary>Three steps, all of shape <code>[..., n]</code>: shift each row by its
# maximum, exponentiate, divide by the row's total. A row's maximum and total have shape <code>[..., 1]</code> when the
# reduction keeps the reduced dimension (the reductions' <code>keepdim</code> option), so they broadcast back against
# the row.</details>
# <details><summary>Hint 3 — the key step</summary>Try one row by hand: for <code>[1000., 1001.]</code> the exponentials
# overflow to inf, and inf / inf is NaN. Shifted by the row's maximum it is <code>[-1., 0.]</code>, whose exponentials
# are $e^{-1}$ and 1, and the softmax is $1/(1+e)$ and $e/(1+e)$. For a <code>[..., n]</code> tensor, what shape must
# the maximum have to be subtracted from every entry of its own row? The page to read: torch.amax.</details>

# %% nbgrader={"grade": false, "grade_id": "softmax", "locked": false, "schema_version": 3, "solution": true, "task": false}
def softmax(x: torch.Tensor) -> torch.Tensor:
    """Numerically stable softmax over the last dimension.

    x: [..., n] -> [..., n], positive, each row sums to 1.
    """
    ### BEGIN SOLUTION
    shifted = x - x.amax(dim=-1, keepdim=True)  # the largest entry of each row becomes 0
    e = shifted.exp()  # in (0, 1]: no overflow
    return e / e.sum(dim=-1, keepdim=True)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "softmax_test", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false} tags=["raises-exception"]
check_softmax(softmax)
### BEGIN HIDDEN TESTS
check_softmax(softmax, hidden=True)
### END HIDDEN TESTS

# %%
softmax_impl = yours_or_reference(softmax, check_softmax)

# %% [markdown]
# Now the worked example's numbers. For the *cat / car / frog* scores the exponentials are 24.5, 164.0 and
# 0.18, and dividing by their sum gives 0.13, 0.87 and 0.00. The largest score takes an even larger share of
# the weight, and the weights add up to exactly one:

# %%
cat_car_frog = torch.tensor([3.2, 5.1, -1.7])
print("exp(scores)     :", [f"{e:.2f}" for e in cat_car_frog.exp().tolist()])
print("softmax(scores) :", [f"{w:.2f}" for w in softmax_impl(cat_car_frog).tolist()])
print(f"sum of weights  : {softmax_impl(cat_car_frog).sum():.4f}")
print("stable softmax of [1000, 1001, 1002]:", softmax_impl(big))

# %% [markdown]
# And *Thinking Machines*: the scaled scores 14 and 12 become the weights 0.88 and 0.12 — a clear
# preference for *Thinking* itself, but nothing like the nearly one-hot weights of the unscaled scores 112 and 96 (section 3).

# %%
thinking_weights = softmax_impl(thinking_scores)
print("scaled scores :", [f"{s:.0f}" for s in thinking_scores[0].tolist()])
print("weights       :", [f"{w:.2f}" for w in thinking_weights[0].tolist()])

# %% [markdown]
# ## 5. The weighted sum, and masks
#
# The weights decide how much of each value the query takes home. The output for token $i$ is
#
# $$z_i = \sum_j a_{ij}\, v_j, \qquad a_{ij} = \mathrm{softmax}_j\!\left(\frac{q_i \cdot k_j}{\sqrt{d_k}}\right).$$
#
# For *Thinking*, $z_1 = 0.88\, v_1 + 0.12\, v_2$. Alammar's article doesn't give the values, so take any two, say
# $v_1 = [1, 0, 2]$ and $v_2 = [0, 4, 1]$:

# %%
v_thinking, v_machines = torch.tensor([1.0, 0.0, 2.0]), torch.tensor([0.0, 4.0, 1.0])
z1 = thinking_weights[0, 0] * v_thinking + thinking_weights[0, 1] * v_machines
print("z1 =", z1)

# %% [markdown]
# The new vector for *Thinking* is mostly its own value with a bit of *Machines* mixed in: a contextual
# representation.
#
# **Masks.** Sometimes a query must not see some keys: padding tokens that only fill up a batch, or, in a
# decoder, the words that come later (chapter 06). In this course a mask is a boolean tensor that broadcasts
# to the scores `[..., L_q, L_k]`, and **`True` means "may attend"** (the same convention as PyTorch's
# `scaled_dot_product_attention`). The mask acts on the *scores*, **before** the softmax: hidden scores are
# replaced by a huge negative number, so their exponential is 0 and the visible weights still sum to one.
# Zeroing weights *after* the softmax would leave rows that no longer sum to one:

# %%
scores = torch.tensor([[2.0, 1.0, 0.5]])
mask = torch.tensor([[True, True, False]])  # the third key is hidden
before = softmax_impl(scores.masked_fill(~mask, torch.finfo(scores.dtype).min))
after = softmax_impl(scores).masked_fill(~mask, 0.0)
print("masked before softmax:", before, " row sum", f"{before.sum():.4f}")
print("zeroed after softmax :", after, " row sum", f"{after.sum():.4f}")

# %% [markdown]
# ### Exercise 4 — `scaled_attention`
# > **Difficulty** ●●○ · **Importance** ●●● · about 20 minutes
#
# Write `scaled_attention(q, k, v, mask=None)`: scaled dot-product attention, returning the tuple
# `(output, weights)`.
#
# * `q`: `[..., L_q, d_k]`, `k`: `[..., L_k, d_k]`, `v`: `[..., L_k, d_v]`.
# * `mask`: `None`, or a bool tensor broadcastable to `[..., L_q, L_k]`, `True` = may attend. Every query
#   in the tests can see at least one key.
# * returns `output` `[..., L_q, d_v]` and `weights` `[..., L_q, L_k]` (each row sums to 1).
#
# Worked example: `q = torch.tensor([[1., 0.]])`, `k = torch.tensor([[1., 0.], [0., 1.]])`,
# `v = torch.tensor([[10., 0.], [0., 10.]])`, no mask: the scores are $[1, 0]/\sqrt{2}$, the weights about
# `[0.67, 0.33]` and the output about `[6.70, 3.30]`. With `mask = torch.tensor([[False, True]])` the weights
# are `[0., 1.]` and the output `[0., 10.]`.
#
# You may use your `softmax` and `attention_scores`, or `torch.softmax`. The tests include scores in the hundreds,
# so the softmax must be the stable kind.
#
# <details><summary>Hint 1 — the idea</summary>Four steps: the scaled scores of exercise 2; then hide the keys the mask forbids <em>in the scores</em>, by giving them a hugely negative score; then a softmax over the keys; then the weighted sum of the values. Hiding before the softmax is what makes a hidden key get exactly 0 weight while the visible weights still sum to 1.</details>
# <details><summary>Hint 2 — the plan</summary>Shapes: scores <code>[..., L_q, L_k]</code> → masked scores, the same shape (only when a mask is given: where the mask is False, the score becomes the most negative number the dtype can hold, or minus infinity) → weights, the same shape, softmax over the last dimension → weights times <code>v</code> <code>[..., L_k, d_v]</code> gives the output <code>[..., L_q, d_v]</code>. Return the output and the weights.</details>
# <details><summary>Hint 3 — the key step</summary>The page to read: torch.Tensor.masked_fill. It fills where
# <em>its</em> mask is True, and here the mask is True where a key is visible. On a toy, <code>torch.tensor([1., 2.,
# 3.]).masked_fill(torch.tensor([True, False, False]), -100.)</code> is <code>[-100., 2., 3.]</code>. So which mask do
# you hand it, and which value does torch.finfo give as the most negative number of a dtype?</details>

# %% nbgrader={"grade": false, "grade_id": "scaled_attention", "locked": false, "schema_version": 3, "solution": true, "task": false}
def scaled_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None):
    """Scaled dot-product attention.

    q: [..., L_q, d_k], k: [..., L_k, d_k], v: [..., L_k, d_v];
    mask: bool, broadcastable to [..., L_q, L_k], True = may attend.
    Returns (output [..., L_q, d_v], weights [..., L_q, L_k]).
    """
    ### BEGIN SOLUTION
    d_k = q.shape[-1]
    scores = q @ k.transpose(-2, -1) / math.sqrt(d_k)  # [..., L_q, L_k]
    if mask is not None:
        # before the softmax, so the visible weights still sum to one
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    weights = torch.softmax(scores, dim=-1)  # [..., L_q, L_k]
    output = weights @ v  # [..., L_q, d_v]
    return output, weights
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "scaled_attention_test", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false} tags=["raises-exception"]
check_scaled_attention(scaled_attention)
### BEGIN HIDDEN TESTS
check_scaled_attention(scaled_attention, hidden=True)
### END HIDDEN TESTS

# %%
scaled_attention_impl = yours_or_reference(scaled_attention, check_scaled_attention)

# %% [markdown]
# The worked example of the exercise:

# %%
q_ex, k_ex = torch.tensor([[1.0, 0.0]]), torch.tensor([[1.0, 0.0], [0.0, 1.0]])
v_ex = torch.tensor([[10.0, 0.0], [0.0, 10.0]])
out, w = scaled_attention_impl(q_ex, k_ex, v_ex)
print("no mask  : weights", w, " output", out)
out, w = scaled_attention_impl(q_ex, k_ex, v_ex, mask=torch.tensor([[False, True]]))
print("key 1 hid: weights", w, " output", out)

# %% [markdown]
# ## 6. A toy example, number by number
#
# Raimi Karim's "Illustrated: Self-Attention" (2019) walks through self-attention by hand for the three tokens
# of section 1. We follow token 1. One thing to know first: **the article does not divide by $\sqrt{d_k}$**:
# its scores are the plain products `queries @ keys.T`. To reproduce its numbers we do the same; at the end we
# see what the scale would change.
#
# Step 1, the scores of token 1 against the three keys:

# %%
scores_1 = Q_toy[0] @ K_toy.T  # [3], no sqrt(d_k) scale, as in the article
print("scores of token 1:", scores_1)
print("all scores Q K^T =\n", Q_toy @ K_toy.T)

# %% [markdown]
# Step 2, softmax. The article writes the weights as 0.0, 0.5 and 0.5: rounded to the nearest half.

# %%
weights_1 = softmax_impl(scores_1)
rounded_1 = (weights_1 * 2).round() / 2  # to the nearest 0.5, as the article does
print("exact weights  :", weights_1)
print("rounded weights:", rounded_1)

# %% [markdown]
# Step 3, scale each value by its weight and add them up. With the rounded weights we get the article's
# result, $[2.0, 7.0, 1.5]$:

# %%
weighted = rounded_1[:, None] * V_toy  # [3 keys, d_v]: row j is (rounded weight j) * v_j
print("rounded weight x value, one row per key:\n", weighted)
print("sum (the article's output):", weighted.sum(dim=0))

# %% [markdown]
# With the exact weights the output is $\approx [1.94, 6.68, 1.60]$ instead. The whole difference comes from the
# rounding: token 1's own value $v_1 = [1, 2, 3]$ really gets weight 0.063, not 0, and $v_2$, $v_3$ get 0.468
# each, not 0.5. The rounded result equals the exact one plus $\sum_j (\tilde a_j - a_j)\, v_j$, where
# $\tilde a$ are the rounded weights:

# %%
out_exact = softmax_impl(Q_toy @ K_toy.T) @ V_toy  # [3, d_v], every token, unscaled like the article
delta = rounded_1 - weights_1
print("exact output of token 1       :", [f"{z:.2f}" for z in out_exact[0].tolist()])
print("weight changes from rounding  :", delta)
print("their effect, sum (da_j * v_j):", delta @ V_toy)
print("exact + effect                :", out_exact[0] + delta @ V_toy)

# %% [markdown]
# Rounding 0.063 down to 0 and 0.468 up to 0.5 moves the output —
# enough to change the printed numbers (by up to about 0.3 here), not the story: token 1 listens mostly to tokens 2 and 3.
#
# And with the $\sqrt{d_k}$ scale ($d_k = 3$) the scores shrink by $\sqrt{3}$, the weights are flatter, and the
# output moves again:

# %%
out_scaled, w_scaled = scaled_attention_impl(Q_toy, K_toy, V_toy)  # scaled by 1/sqrt(d_k) = 1/sqrt(3)
print("scaled weights of token 1:", w_scaled[0])
print("scaled output of token 1 :", [f"{z:.2f}" for z in out_scaled[0].tolist()])

# %% [markdown]
# ## 7. The matrix form: the whole sentence at once
#
# Nothing in sections 2–6 was special to token 1. Stack all queries into $Q$, and the same three steps
# work for every token simultaneously:
#
# $$Z = \mathrm{softmax}\!\left(\frac{(XW^Q)(XW^K)^\top}{\sqrt{d_k}}\right) XW^V,$$
#
# with the softmax taken along each row. Each row of $Z$ is one token's new, context-aware vector. Count the
# matrix products: three projections ($XW^Q$, $XW^K$, $XW^V$), the scores $QK^\top$, and the weights times $V$ —
# five in all, and none of them loops over the tokens, which is what lets a GPU process a whole sentence in
# parallel (an RNN must go word by word).

# %% [markdown]
# ### Exercise 5 — `self_attention`
# > **Difficulty** ●●○ · **Importance** ●●● · about 10 minutes
#
# Write `self_attention(x, w_q, w_k, w_v)` in matrix form, returning `(output, weights)`.
#
# * `x`: `[..., seq, d_model]`; `w_q`, `w_k`: `[d_model, d_k]`; `w_v`: `[d_model, d_v]`.
# * returns `output` `[..., seq, d_v]` and `weights` `[..., seq, seq]`. No mask.
#
# Worked example: the toy example of section 6 (with the scale, $d_k = 3$) gives token 1 the output printed
# in the last cell above.
#
# Write it with matrix products, without a Python loop over tokens. You may use your earlier functions or
# write the steps out.
#
# <details><summary>Hint 1 — the idea</summary>Project, score, softmax, mix: the four steps of sections 1 to 5, on whole matrices, with no loop over the tokens. The scale uses $d_k$, the number of columns of $W^Q$, not the embedding size $d_{model}$.</details>
# <details><summary>Hint 2 — the plan</summary>Shapes: <code>x</code> <code>[..., seq, d_model]</code> → queries and keys <code>[..., seq, d_k]</code>, values <code>[..., seq, d_v]</code> → scaled scores <code>[..., seq, seq]</code> → weights, a softmax over the last dimension (the keys) → output <code>[..., seq, d_v]</code>. Each step is one of your earlier functions; return the output and the weights, in that order.</details>
# <details><summary>Hint 3 — the key step</summary>Two questions. Which of your earlier exercises already turn
# <code>x</code> into queries, keys and values, and scores into an output? And which size does the scale use: the
# embedding size, or the number of columns of the query matrix (the last entry of the queries' shape)?</details>

# %% nbgrader={"grade": false, "grade_id": "self_attention", "locked": false, "schema_version": 3, "solution": true, "task": false}
def self_attention(x: torch.Tensor, w_q: torch.Tensor, w_k: torch.Tensor, w_v: torch.Tensor):
    """Single-head self-attention in matrix form.

    x: [..., seq, d_model]; w_q, w_k: [d_model, d_k]; w_v: [d_model, d_v].
    Returns (output [..., seq, d_v], weights [..., seq, seq]).
    """
    ### BEGIN SOLUTION
    q, k, v = x @ w_q, x @ w_k, x @ w_v  # [..., seq, d_k], [..., seq, d_k], [..., seq, d_v]
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # [..., seq, seq]
    weights = torch.softmax(scores, dim=-1)  # each row sums to 1 over the keys
    return weights @ v, weights  # [..., seq, d_v], [..., seq, seq]
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "self_attention_test", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false} tags=["raises-exception"]
check_self_attention(self_attention)
### BEGIN HIDDEN TESTS
check_self_attention(self_attention, hidden=True)
### END HIDDEN TESTS

# %%
self_attention_impl = yours_or_reference(self_attention, check_self_attention)

# %% [markdown]
# Is the matrix form really the same as doing one token at a time? Compare it with a plain loop over the
# tokens of a random sentence:

# %%
d_model, d_head, seq = 8, 4, 6
x = torch.randn(seq, d_model)
w_q, w_k, w_v = (torch.randn(d_model, d_head) for _ in range(3))

Z, A = self_attention_impl(x, w_q, w_k, w_v)  # [seq, d_head], [seq, seq]

rows = []
for i in range(seq):  # one token at a time: its query against every key
    q_i = x[i] @ w_q                                       # [d_head]
    a_i = softmax_impl((x @ w_k) @ q_i / math.sqrt(d_head))  # [seq]
    rows.append(a_i @ (x @ w_v))                           # [d_head]
Z_loop = torch.stack(rows)
print("output shape:", tuple(Z.shape), " weights shape:", tuple(A.shape))
loop_error = (Z - Z_loop).abs().max().item()
row_sum_error = (A.sum(dim=-1) - 1).abs().max().item()
claim(loop_error < 1e-5, "the matrix form and the loop agree to 1e-5: they differ only by float rounding",
      measured=f"{loop_error:.1e}")
claim(row_sum_error < 1e-5, "every row of the weights sums to 1 (to 1e-5)", measured=f"{row_sum_error:.1e}")

# %% [markdown]
# ## 8. Permutation equivariance: attention does not know the order
#
# **Predict** before running: shuffle the tokens of the sentence (same embeddings, new order) and run the
# same self-attention. What happens to the outputs?
#
# * (a) they all change;
# * (b) they are the same vectors, shuffled in the same way as the inputs;
# * (c) they don't change at all.

# %%
perm = torch.tensor([3, 0, 5, 1, 4, 2])  # new position i holds old token perm[i]
Z_perm, A_perm = self_attention_impl(x[perm], w_q, w_k, w_v)
print("outputs of the shuffled sentence == shuffled outputs:      ", torch.allclose(Z_perm, Z[perm], atol=1e-6))
print("weights == old weights with rows and columns shuffled:     ", torch.allclose(A_perm, A[perm][:, perm], atol=1e-6))
print("outputs unchanged in place:                                ", torch.allclose(Z_perm, Z, atol=1e-6))

# %% [markdown]
# Answer (b). Each output depends on its own query and on the *set* of keys and values; a sum over the keys
# does not care in which order they come. Self-attention is **permutation equivariant**: permute the inputs
# and the outputs are permuted the same way. So "dog bites man" and "man bites dog" give each word exactly the
# same vector. Language needs order, and chapter 04 adds it back with **positional encodings**.

# %% [markdown]
# ## 9. An attention heatmap
#
# The weight matrix $A$ is easiest to read as a picture: one row per query token, one column per key token,
# darker = more attention. Take the sentence Jay Alammar uses in "The Illustrated Transformer" (2018), *The animal
# didn't cross the street because it was too tired*, without its *too*: *the animal didn't cross the street because
# it was tired*.
#
# A trained model learns $W^Q$ and $W^K$ from data (chapter 07 trains one). To see how a heatmap reads,
# we build them **by hand** here. Each word gets a few interpretable features, its key advertises those
# features, and its query asks for features it "wants": a pronoun looks for an animate noun, a verb for
# nouns, the state *tired* for something animate that can be tired. Nouns and function words ask for nothing.

# %%
features = ["noun", "animate", "place", "pronoun", "verb", "function", "state"]
column = {f: i for i, f in enumerate(features)}
lexicon = {  # word -> its features (all 1 unless given)
    "the": {"function": 1}, "animal": {"noun": 1, "animate": 1}, "didn't": {"verb": 0.5, "function": 0.5},
    "cross": {"verb": 1}, "street": {"noun": 1, "place": 1}, "because": {"function": 1},
    "it": {"pronoun": 1}, "was": {"verb": 0.5, "function": 0.5}, "tired": {"state": 1},
}


def sentence_vectors(words: list[str]) -> torch.Tensor:
    """The hand-made feature vectors of a sentence: [seq, d_model]."""
    x = torch.zeros(len(words), len(features))
    for i, word in enumerate(words):
        for f, value in lexicon[word].items():
            x[i, column[f]] = value
    return x


tokens = "the animal didn't cross the street because it was tired".split()
x_sent = sentence_vectors(tokens)  # [seq, d_model]

# What each feature asks for (rows of W^Q): a query is the sum of the wishes of its token's features.
w_q_sent = torch.zeros(len(features), len(features))
w_q_sent[column["pronoun"], column["noun"]] = 1.0     # "it" looks for a noun ...
w_q_sent[column["pronoun"], column["animate"]] = 1.0  # ... that is animate
w_q_sent[column["verb"], column["noun"]] = 1.0        # verbs look for their nouns
w_q_sent[column["state"], column["animate"]] = 1.0    # "tired": who is tired?
w_q_sent *= 4.0  # sharper preferences
w_k_sent = torch.eye(len(features))  # a key simply advertises the token's features
w_v_sent = torch.eye(len(features))  # (the values don't matter for the picture)

_, A_sent = self_attention_impl(x_sent, w_q_sent, w_k_sent, w_v_sent)  # [seq, seq]

fig, ax = plt.subplots(figsize=(6, 5))
im = ax.imshow(A_sent, cmap="Blues", vmin=0, vmax=1)
ax.set_xticks(range(len(tokens)), tokens, rotation=45, ha="right")
ax.set_yticks(range(len(tokens)), tokens)
ax.set_xlabel("key (attended to)")
ax.set_ylabel("query (attending)")
ax.set_title("Self-attention weights, hand-made W^Q and W^K")
fig.colorbar(im, ax=ax, fraction=0.046)
fig.tight_layout()
plt.show()

it = tokens.index("it")
print("row of 'it':", "  ".join(f"{t} {w:.2f}" for t, w in zip(tokens, A_sent[it].tolist())))
print(f"sum of the row: {A_sent[it].sum():.2f}")

# %% [markdown]
# Reading the picture:
#
# * The row of *it* puts 0.62 of its weight on *animal* and 0.14 on *street* (the printed row above, one entry per
#   token, summing to 1): with these matrices the pronoun resolves to the animate noun — the kind of relation
#   Alammar's article shows a trained model learning.
# * *tired* gives its largest weight to *animal* too, and the verbs spread their attention over the two nouns.
# * The nouns and the function words (*the*, *because*) have a zero query, so every score in their row is 0
#   and softmax gives a **uniform** row: no preference is not the same as no attention.
# * The two *the* tokens have identical rows and identical columns: they are the same vector, and with no
#   position information attention cannot tell them apart (section 8 again).
#
# One caveat keeps us honest: here the query of *it* depends only on the word *it*, so it would pick *animal*
# even in "… because it was too **wide**". In a trained Transformer, the layers below have already mixed
# context into each token's vector, which is how the same pronoun can end up pointing at *street* instead.


# %% [markdown]
# ## 10. A self-attention layer, for a batch of sentences
#
# So far $W^Q$, $W^K$ and $W^V$ were tensors we handed to a function. In a model they are **parameters**,
# numbers that training adjusts, and a layer owns them. PyTorch's way to own parameters is an `nn.Module`, and its
# standard container for a weight matrix is `nn.Linear`. Two facts about `nn.Linear(d_in, d_out, bias=False)`:
# calling it on `x` computes `x @ weight.T`, and its `weight` is stored as `[d_out, d_in]`. So a layer `w_q` holds
# our $W^Q$ transposed: $W^Q$ is `w_q.weight.T`, and `w_q(x)` is $XW^Q$.
#
# A model also reads many sentences at once, and a batch is one rectangular tensor `[batch, seq, d_model]`.
# Sentences shorter than the longest one are filled up at the end with **padding** positions, and a tensor
# `lengths` says how many positions of each sentence are real: sentence $b$ holds its tokens at positions
# 0 to `lengths[b] - 1`. Padding means nothing, so no real token may attend to it. Otherwise a word's
# vector would depend on how long the *other* sentences of its batch happen to be, and the same sentence would
# come out differently in a different batch.
#
# So padding is hidden as a **key**: its column of the scores, in every row. A padding position still has a
# query, and its row is computed like any other, over the real tokens of its sentence; nothing downstream uses
# it. The mask of section 5 does the hiding, once you know which keys are real.

# %% [markdown]
# ### Exercise 6 — `SelfAttention`
# > **Difficulty** ●●● · **Importance** ●●● · about 25 minutes
#
# The class below is an `nn.Module` whose constructor is written for you: it creates the layers `w_q` and `w_k`,
# each `nn.Linear(d_model, d_k, bias=False)`, and `w_v`, `nn.Linear(d_model, d_v, bias=False)`, and keeps `d_k`.
# Write its `forward(x, lengths=None)`.
#
# * `x`: `[batch, seq, d_model]`, a batch of sentences padded to the same length `seq`.
# * `lengths`: `None` (no padding), or an integer tensor `[batch]`: sentence `b`'s real tokens are its first
#   `lengths[b]` positions (every length is at least 1).
# * returns `(output, weights)`, with `output` `[batch, seq, d_v]` and `weights` `[batch, seq, seq]`: the scaled
#   dot-product attention of every position over the real tokens of its own sentence. Every row of the
#   weights sums to 1 and gives exactly 0 to the padding.
#
# Worked example: for `x` of shape `[2, 10, 7]` and `lengths = torch.tensor([10, 4])`, the columns 4 to 9 of
# sentence 1's weights are 0, and the first four rows of its output equal what the layer gives for that
# sentence alone, a batch of one of shape `[1, 4, 7]` with no lengths. The cells after the test check both
# on two sentences of section 9.
#
# You may call your earlier functions (yours, or the library's until yours pass) or write the steps out. The
# decisions are yours: which positions are real, which axis of the scores the padding hides, and what to
# divide the scores by.
#
# <details><summary>Hint 1 — the idea</summary>The four steps of <code>self_attention</code>, with the layers doing the projections, plus the padding. A position is real when its number is smaller than its sentence's length. A padding token must never be attended <em>to</em>, so it is hidden as a key: its column of the scores, in every row of its sentence. Its own row stays as it is.</details>
# <details><summary>Hint 2 — the plan</summary>Shapes: queries and keys <code>[batch, seq, d_k]</code>, values <code>[batch, seq, d_v]</code> → scores <code>[batch, seq, seq]</code>, divided by $\sqrt{d_k}$ (the layer keeps <code>d_k</code>). The positions 0 … seq − 1 as a row <code>[1, seq]</code>, compared with the lengths as a column <code>[batch, 1]</code>, give a boolean <code>[batch, seq]</code> that is True for the real tokens. With a middle axis of size 1 it becomes <code>[batch, 1, seq]</code>: one row of visible keys that every query of the sentence shares. Then hide, softmax and mix exactly as in exercise 4, and return the output and the weights.</details>
# <details><summary>Hint 3 — the key step</summary>The question that unlocks it: from the lengths <code>[2, 3]</code>
# and seq = 4, how do you get the table <code>[[True, True, False, False], [True, True, True, False]]</code> with a
# single comparison? (A row of positions against a column of lengths: torch.arange, and <code>None</code> as an index to
# add an axis.) Then: which axis of the <code>[batch, seq, seq]</code> scores does that table hide, and where must its
# axis of size 1 go?</details>

# %% nbgrader={"grade": false, "grade_id": "self_attention_layer", "locked": false, "schema_version": 3, "solution": true, "task": false}
class SelfAttention(nn.Module):
    """Single-head self-attention with learned W^Q, W^K, W^V, for a batch of padded sentences."""

    def __init__(self, d_model: int, d_k: int, d_v: int | None = None):
        super().__init__()
        d_v = d_k if d_v is None else d_v
        self.d_k = d_k
        self.w_q = nn.Linear(d_model, d_k, bias=False)  # w_q(x) is x W^Q: the layer stores W^Q transposed
        self.w_k = nn.Linear(d_model, d_k, bias=False)
        self.w_v = nn.Linear(d_model, d_v, bias=False)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor | None = None):
        """x: [batch, seq, d_model]; lengths: None, or int [batch], the number of real tokens of each sentence.

        Returns (output [batch, seq, d_v], weights [batch, seq, seq]); no position gives weight to padding.
        """
        ### BEGIN SOLUTION
        q, k, v = self.w_q(x), self.w_k(x), self.w_v(x)  # [batch, seq, d_k], [batch, seq, d_k], [batch, seq, d_v]
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_k)  # [batch, seq, seq]
        if lengths is not None:
            real = torch.arange(x.shape[1]) < lengths[:, None]  # [batch, seq]: True = a real token
            # [batch, 1, seq]: hide the padded *keys*, the same columns for every query
            scores = scores.masked_fill(~real[:, None, :], torch.finfo(scores.dtype).min)
        weights = torch.softmax(scores, dim=-1)  # [batch, seq, seq]
        return weights @ v, weights  # [batch, seq, d_v], [batch, seq, seq]
        ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "self_attention_layer_test", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false} tags=["raises-exception"]
check_self_attention_layer(SelfAttention)
### BEGIN HIDDEN TESTS
check_self_attention_layer(SelfAttention, hidden=True)
### END HIDDEN TESTS

# %%
SelfAttention_impl = yours_or_reference(SelfAttention, check_self_attention_layer)

# %% [markdown]
# Now the layer on the chapter's running example. We copy section 9's hand-made matrices into a fresh layer
# (transposed, the way `nn.Linear` stores them) and read the animal sentence together with a shorter one,
# *the animal was tired*, as one batch padded to the longer length. The padding positions hold zero vectors
# here; any vector would do, since no real token can see them.

# %%
layer = SelfAttention_impl(len(features), len(features))  # d_model = d_k = d_v = 7
with torch.no_grad():
    for linear, w in ((layer.w_q, w_q_sent), (layer.w_k, w_k_sent), (layer.w_v, w_v_sent)):
        linear.weight.copy_(w.T)  # nn.Linear keeps W^T: [d_out, d_in]
print("parameters of the layer:", sum(p.numel() for p in layer.parameters()), "= 3 matrices of 7 x 7")

short = "the animal was tired".split()
batch = torch.zeros(2, len(tokens), len(features))  # [batch, seq, d_model], zeros = padding
batch[0] = x_sent
batch[1, : len(short)] = sentence_vectors(short)
lengths = torch.tensor([len(tokens), len(short)])

with torch.no_grad():
    Z_batch, A_batch = layer(batch, lengths)  # [2, 10, 7], [2, 10, 10]
    Z_alone, A_alone = layer(batch[1:, : len(short)])  # the short sentence on its own, [1, 4, 7]
    Z_seen, A_seen = layer(batch)  # the same batch with the lengths forgotten

n = len(short)
print("sentence 0 gets section 9's weights:", torch.allclose(A_batch[0], A_sent, atol=1e-6))
print(f"weight the {n} real tokens of sentence 1 give to padding: with lengths "
      f"{A_batch[1, :n, n:].sum():.3f}, without {A_seen[1, :n, n:].sum():.3f}")
alone_error = (Z_batch[1, :n] - Z_alone[0]).abs().max().item()
seen_error = (Z_seen[1, :n] - Z_alone[0]).abs().max().item()
claim(alone_error < 1e-6, "with the lengths, the short sentence's real tokens get the same outputs in the batch as "
      "alone (to 1e-6)", measured=f"{alone_error:.1e}")
print(f"without the lengths, their outputs move by up to {seen_error:.2f}")

# %% [markdown]
# The same 147 parameters served a sentence of ten tokens and one of four. They are the three matrices, and each
# acts on one token's vector at a time, so their number depends on $d_{model}$, $d_k$ and $d_v$ and not on the
# length of the sequence (Prince, *Understanding Deep Learning*, 2023, section 12.2.3): one layer reads sentences
# of any length.
#
# With the lengths, the real tokens of *the animal was tired* get exactly the vectors they get alone: padding
# the batch changed nothing. Without them, the zero vectors of the padding soak up attention: *the* has a zero
# query, so its scores are all equal and its weight spreads evenly over all ten positions, six of them
# padding. The two grids of the short sentence show it; the top-left 4 × 4 block is the sentence itself:

# %%
fig, axes = plt.subplots(1, 2, figsize=(10, 4.2), layout="constrained")
labels = short + ["pad"] * (len(tokens) - n)
for ax, weights, title in ((axes[0], A_batch[1], "with lengths: padding hidden as keys"),
                           (axes[1], A_seen[1], "without lengths: padding attended to")):
    im = ax.imshow(weights, cmap="Blues", vmin=0, vmax=1)
    ax.set_xticks(range(len(labels)), labels, rotation=45, ha="right")
    ax.set_yticks(range(len(labels)), labels)
    ax.set_xlabel("key (attended to)")
    ax.set_title(title, fontsize=10)
axes[0].set_ylabel("query (attending)")
fig.colorbar(im, ax=axes, fraction=0.025)
plt.show()

# %% [markdown]
# On the left, the padding columns are empty: no one attends to padding. The padding *rows* still attend to the
# four real tokens, as the exercise asked; their outputs are computed and simply never used. This layer, with
# its three learned matrices and a mask, is the single head that chapter 03 multiplies.

# %% [markdown]
# ## Summary
#
# * Each token gets a **query**, a **key** and a **value**, three learned projections of the same embedding:
#   $Q = XW^Q$, $K = XW^K$, $V = XW^V$.
# * A **score** is a dot product $q_i \cdot k_j$; all of them at once are $QK^\top$, shape `[L_q, L_k]`.
# * For unit-variance entries, the variance of $q \cdot k$ is $d_k$ (measured above). Dividing by $\sqrt{d_k}$
#   keeps it at 1, which keeps the softmax away from a one-hot output with vanishing gradients.
# * **Softmax** turns each row of scores into weights that sum to 1; subtracting the row maximum first
#   prevents overflow.
# * The output is the **weighted sum** of the values. **Masks** (`True` = may attend) act on the scores,
#   before the softmax.
# * Karim's toy output $[2.0, 7.0, 1.5]$ uses weights rounded to 0.0/0.5/0.5 and no scale; the exact
#   unscaled output is $\approx [1.94, 6.68, 1.60]$.
# * Self-attention is **permutation equivariant**: it sees a set of tokens, not a sequence.
# * A **self-attention layer** owns $W^Q, W^K, W^V$ as `nn.Linear` layers (which store them transposed); their
#   number does not depend on the sequence length. In a padded batch, padding is hidden as **keys**, so a
#   sentence gets the same vectors in any batch.
#
# ## What's next
#
# One set of $W^Q, W^K, W^V$ can only express one notion of relevance at a time. Chapter 03,
# **multi-head attention**, runs several smaller attentions side by side — like the several filters of a
# convolutional layer — and combines what they find with an output matrix $W^O$: as many parameters in all as one
# full-width head followed by $W^O$.

# %% [markdown]
# ## Where you stand
#
# The six exercises of this chapter, and whether their last check passed. An exercise that doesn't pass yet
# has its one-line diagnosis here; fix it, run its test cell again, then run this cell.

# %%
exercise_summary(check_project_qkv, check_attention_scores, check_softmax, check_scaled_attention, check_self_attention,
                 check_self_attention_layer)

# %% [markdown]
# ## Glossary · 术语表
#
# | English | 中文 | Meaning |
# |---|---|---|
# | self-attention | 自注意力 | every token of a sequence attends to every token of the same sequence |
# | query | 查询向量 (Q) | what a token is looking for: $q_i = x_i W^Q$ |
# | key | 键向量 (K) | what a token offers to be matched against: $k_i = x_i W^K$ |
# | value | 值向量 (V) | what a token hands over when attended to: $v_i = x_i W^V$ |
# | projection matrix | 投影矩阵 / 参数矩阵 | a learned matrix ($W^Q$, $W^K$, $W^V$) mapping embeddings to queries, keys, values |
# | attention score | 注意力分数 | the dot product $q_i \cdot k_j$ (scaled by $1/\sqrt{d_k}$) |
# | scaled dot-product attention | 缩放点积注意力 | $\mathrm{softmax}(QK^\top/\sqrt{d_k})\,V$ |
# | softmax | softmax 归一化 | turns a row of scores into positive weights summing to 1 |
# | attention weights | 注意力权重 | the softmax of the scores; row $i$ says how much token $i$ takes from each token |
# | saturation | 饱和 | softmax output close to one-hot, where its gradients almost vanish |
# | numerical stability | 数值稳定性 | computing without overflow/underflow, e.g. subtracting the max before `exp` |
# | weighted sum | 加权求和 | the output $z_i = \sum_j a_{ij} v_j$ |
# | mask | 掩码 | boolean tensor, `True` = may attend; applied to the scores before softmax |
# | permutation equivariance | 置换等变性 | permuting the input tokens permutes the outputs the same way |
# | attention heatmap | 注意力热力图 | picture of the weight matrix, queries on rows, keys on columns |
# | parameter | 参数 | a number training adjusts; a layer (`nn.Module`) owns its parameters, e.g. in `nn.Linear` |
# | padding | 填充 | filler positions that make the sentences of a batch equally long; never attended to |
# | sequence length (lengths) | 序列长度 | how many positions of a padded sentence hold real tokens |
