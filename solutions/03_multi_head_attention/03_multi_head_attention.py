# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Chapter 03 — Multi-head attention
#
# Chapter 02 built one attention: one set of $W^Q, W^K, W^V$, one notion of "relevant", one weighted
# average of the values per token. Real sentences ask for several things at once. In *苹果公司发布新款iPhone*
# ("Apple releases a new iPhone"), the word 苹果 (apple) wants to look at 公司 (company) to learn that it is a
# company here, *and* at iPhone for the product context. One weighted average has to choose, or blur the two
# together.
#
# **Multi-head attention** runs several attentions side by side, each with its own small projections, and
# glues their results together. This chapter builds it:
#
# 1. **One head, one average** — a query that needs two different tokens, and why one head can't serve it.
# 2. **A bank of filters** — the idea, and the whole layer in one diagram, with the shape on every arrow.
# 3. **Splitting into heads** — the `view` + `transpose` that makes all heads one matrix product.
# 4. **Mixing the heads, masking the heads** — the output matrix $W^O$, and one mask for every head.
# 5. **The parameter count** — you count first; then we check your count against PyTorch.
# 6. **The layer as a module** — and the same numbers as PyTorch's own `nn.MultiheadAttention`.
# 7. **Heads of a trained model** — we train a small model on a task with two relations, measure where each
#    head looks and how sharply, and switch heads off one at a time.
#
# Six exercises are autograded: `split_heads`, `merge_heads`, `multi_head_attention_forward`,
# `count_mha_parameters`, the module `MultiHeadAttentionLayer` and `attention_entropy`; together they take about
# 85 minutes. Each one is then used by the rest of the chapter: yours when it passes its check, the library's
# otherwise.
#
# The equation of *Attention Is All You Need* (Vaswani et al., 2017, section 3.2.2) that we are heading for:
#
# $$\mathrm{MultiHead}(Q, K, V) = \mathrm{Concat}(\mathrm{head}_1, \dots, \mathrm{head}_h)\, W^O,
# \qquad \mathrm{head}_i = \mathrm{Attention}(Q W_i^Q,\; K W_i^K,\; V W_i^V).$$
#
# The paper numbers the heads 1 to $h$. From here on, the chapter counts them from 0, as the code does:
# head 0 to head $h - 1$, so the paper's $\mathrm{head}_1$ is our head 0.

# %%
import math
import time

import matplotlib.pyplot as plt
import torch
import torch.nn as nn
import torch.nn.functional as F

from transformer_lib.attention import MultiHeadAttention, scaled_dot_product_attention
from transformer_lib.checks import exercise_summary, yours_or_reference
from transformer_lib.checks.ch03 import (
    check_attention_entropy,
    check_count_mha_parameters,
    check_merge_heads,
    check_multi_head_attention_forward,
    check_multi_head_attention_layer,
    check_split_heads,
)
from transformer_lib.claims import claim, claim_between
from transformer_lib.diagrams.ch03 import draw_mask_broadcast, draw_multi_head_flow, draw_split_layouts
from transformer_lib.masks import causal_mask

torch.manual_seed(0)
torch.set_printoptions(precision=3, sci_mode=False)
# The tensors of this chapter are tiny: one thread is faster for them than two, and the
# training in section 7 then gives the same numbers on every run.
torch.set_num_threads(1)

# %% [markdown]
# ## 1. One head computes one weighted average
#
# Recall what a head returns for a query: $z = \sum_j a_j v_j$, with weights $a_j \ge 0$ that sum to one.
# Whatever the query is looking for, the answer is **one** mix of the values, all of them written into
# the same coordinates.
#
# Here is a query that needs two different tokens. Take sentences of five words from a tiny vocabulary
# A, B, C, D, and let the last token ask two questions: *what was the first word?* and *what was the word
# just before me?* To keep every number readable, we write the vectors by hand:
#
# * each key says only **where** its token stands (a one-hot vector of its position),
# * each value says only **which word** it is (a one-hot vector over A, B, C, D),
# * the query gives a large score, 20, to the positions it wants.
#
# One head must put both wishes into its single query: score 20 for position 0 *and* for position 3.
# Two heads can each ask one question.
#
# **Predict** before running: the two sentences below differ only by swapping A and B (first word and
# previous word trade places). What will the single head output for each of them?

# %%
words = ["A", "B", "C", "D"]


def keys_and_values(sentence):
    """Keys: one-hot positions [5, 5]. Values: one-hot words [5, 4]."""
    ids = torch.tensor([words.index(w) for w in sentence])
    return torch.eye(5), torch.eye(4)[ids]


position = torch.eye(5)  # row p is the one-hot vector of position p
q_both = 20 * (position[0] + position[3])[None]  # [1, 5]: one head wants the first AND the previous token
q_first, q_prev = 20 * position[0][None], 20 * position[3][None]  # two heads, one wish each

for sentence in (["A", "C", "D", "B", "C"], ["B", "C", "D", "A", "C"]):
    k, v = keys_and_values(sentence)
    z_one, a_one = scaled_dot_product_attention(q_both, k, v, scale=1.0)  # the scores are our hand-set numbers
    z_first, _ = scaled_dot_product_attention(q_first, k, v, scale=1.0)
    z_prev, _ = scaled_dot_product_attention(q_prev, k, v, scale=1.0)
    print(" ".join(sentence), f"(first word {sentence[0]}, previous word {sentence[3]})")
    print("   one head  : weights", a_one[0], " output over A,B,C,D", z_one[0])
    print("   two heads : output  ", torch.cat([z_first, z_prev], dim=-1)[0], " = [first word | previous word]")

# %% [markdown]
# The single head gives **exactly the same output** for both sentences: half of A plus half of B. The
# information "which of the two came first" is gone — not because the head attended to the wrong tokens
# (it found both), but because one weighted average adds their values into the same coordinates.
#
# The two heads each gather one word, and their outputs sit **side by side**: the first four numbers are the
# first word, the last four the previous word. Swapping A and B swaps the two blocks.
#
# A single head could try to tip the balance — more weight on one token than on the other — and hope that a
# later layer decodes the ratio. That is fragile, and in section 7 we will watch a trained single head attempt exactly
# this trick, with mixed success.


# %% [markdown]
# ## 2. Heads as a bank of filters
#
# The picture comes from convolutional networks. A convolutional layer does not have one filter but dozens, each
# detecting its own pattern (an edge, a colour blob, a texture), and the layer outputs all their feature maps.
# Multi-head attention does the same with attention: $h$ heads, each with its own $W_i^Q, W_i^K, W_i^V$, each
# free to look for its own kind of relation — the previous word, the subject of a verb, the noun a pronoun
# refers to. Trained Transformers do grow heads like these: Voita et al. (2019, "Analyzing Multi-Head
# Self-Attention: Specialized Heads Do the Heavy Lifting, the Rest Can Be Pruned") found, in a translation
# model, heads that attend to the neighbouring word, heads that follow syntactic relations and a head that
# attends to rare words. Section 7 trains a model and watches its heads divide the work.
#
# What keeps this from getting expensive is the size of each head. With $d_{model} = 512$ and $h = 8$ heads
# (the base model of Vaswani et al.), each head works in $d_k = d_{model} / h = 64$ dimensions. The heads'
# outputs, $h$ vectors of size $d_k$, are concatenated back to $d_{model}$ features, and one more matrix $W^O$
# ($d_{model} \times d_{model}$) mixes them. Prince (*Understanding Deep Learning*, 2023, chapter 12) draws the
# same computation: several heads run in parallel on the same input, their outputs are stacked, and a last
# linear map combines them. He also gives a reason that has nothing to do with what the heads end up
# representing (section 12.3.3): several heads seem to be needed for a Transformer to work well at all, and it has been
# suggested that they make training more robust to a bad initialization.
#
# Here is the whole layer as implementations compute it, with the shape of the tensor on every arrow
# (B = batch, L = sequence length, h = heads, $d_k = d_{model} / h$). The rest of the chapter builds each box.

# %%
draw_multi_head_flow()
plt.show()

# %% [markdown]
# Two things in the picture are new compared with chapter 02: the **split** (and its inverse, the **merge**),
# which turn one wide attention into $h$ narrow ones without a loop over heads; and $W^O$, the only place where
# the heads' results meet.

# %% [markdown]
# ## 3. Splitting d_model into heads
#
# We could keep $h$ separate little matrices $W_i^Q$ of size $d_{model} \times d_k$. Instead, implementations
# put them side by side in **one** $d_{model} \times d_{model}$ matrix $W^Q = [\,W_0^Q \mid W_1^Q \mid \dots \mid W_{h-1}^Q\,]$:
# one matrix product computes the queries of every head at once, and head $i$'s queries are simply the
# columns $i \cdot d_k, \dots, (i+1) \cdot d_k - 1$ of the result.
#
# Then comes the bookkeeping, worth drawing once by hand (the picture below draws it for you). The projected
# queries have shape `[batch, seq, d_model]`. Attention must run **per head**, and `@` treats every dimension
# but the last two as a batch dimension. So we want `[batch, heads, seq, d_k]`, in two moves:
#
# 1. `view(batch, seq, heads, d_k)` cuts the feature axis of each position into `heads` blocks of `d_k`;
# 2. `transpose(1, 2)` puts heads before positions: `[batch, heads, seq, d_k]`.
#
# After attention, `merge_heads` undoes both moves and the heads' outputs lie side by side again:
# `transpose(1, 2)` back to `[batch, seq, heads, d_k]`, then `reshape(batch, seq, d_model)`.
#
# Why not view straight to `[batch, heads, seq, d_k]`? `view` never moves numbers, it only reads the same
# memory with new dimensions — row by row. **Predict**: with 4 positions and 6 features cut into 3 heads,
# what would "head 0" contain if we viewed the `[4, 6]` matrix straight as `[3, 4, 2]`?
#
# The picture answers. Each cell of the projected matrix is coloured by the head that owns its feature and
# labelled with its position (t0 … t3).

# %%
draw_split_layouts(seq=4, d_model=6, n_heads=3)
plt.show()

# %% [markdown]
# Top row: after `view` + `transpose`, head $i$ holds exactly its own block of features (one colour), for
# every position t0 … t3 in order, one position per row. Bottom row: viewing straight to
# `[heads, seq, d_k]` reads the memory row by row, so "head 0" gets all six features of t0 and the first two
# of t1. Its rows are no longer positions, and it mixes three heads' features. Nothing raises an error —
# the shape is right — which is what makes this bug so easy to write.
#
# ### Exercise 1 — `split_heads`
# > **Difficulty** ●○○ · **Importance** ●●● · about 10 minutes
#
# Write `split_heads(x, n_heads)`.
#
# * `x`: `[batch, seq, d_model]`, with `d_model` divisible by `n_heads`.
# * returns `[batch, n_heads, seq, d_k]` with `d_k = d_model // n_heads`; head `i` holds the features
#   `i*d_k … (i+1)*d_k - 1` of every position.
#
# Worked example: `x = torch.arange(12.).reshape(1, 2, 6)` and `n_heads = 3` give shape `[1, 3, 2, 2]`,
# with head 0 `[[0, 1], [6, 7]]`, head 1 `[[2, 3], [8, 9]]`, head 2 `[[4, 5], [10, 11]]`.
#
# <details><summary>Hint 1 — the idea</summary>Two moves: cut the feature axis of every position into <code>n_heads</code> blocks of <code>d_k</code> features, then swap the positions axis and the heads axis, so that each head holds its block for every position.</details>
# <details><summary>Hint 2 — the plan</summary>Shapes: <code>[batch, seq, d_model]</code> → (the same numbers, the last
# axis cut in two) → <code>[batch, seq, n_heads, d_k]</code> → (the positions axis and the heads axis swapped) →
# <code>[batch, n_heads, seq, d_k]</code>. The three sizes come from <code>x.shape</code>; <code>d_k</code> is
# <code>d_model</code> divided by <code>n_heads</code>, as an integer. Cutting straight to <code>[batch, n_heads, seq,
# d_k]</code> has the right shape and the wrong numbers (the picture above).</details>
# <details><summary>Hint 3 — the key step</summary>Test the plan on a toy: <code>t = torch.arange(12).view(1, 2,
# 6)</code> is one sentence of 2 positions with 6 features, cut into 3 heads of 2. Head 0 must hold <code>[[0, 1], [6,
# 7]]</code>: the first two features of each position. Cutting straight to <code>[1, 3, 2, 2]</code> gives it <code>[[0,
# 1], [2, 3]]</code> instead. Which two moves give the first?</details>

# %% nbgrader={"grade": false, "grade_id": "split_heads", "locked": false, "schema_version": 3, "solution": true, "task": false}
def split_heads(x: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Cut the features of every position into heads.

    x: [batch, seq, d_model] -> [batch, n_heads, seq, d_k], d_k = d_model // n_heads.
    """
    ### BEGIN SOLUTION
    batch, seq, d_model = x.shape
    d_k = d_model // n_heads
    return x.view(batch, seq, n_heads, d_k).transpose(1, 2)  # [batch, n_heads, seq, d_k]
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "split_heads_test", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false} tags=["raises-exception"]
check_split_heads(split_heads)
### BEGIN HIDDEN TESTS
check_split_heads(split_heads, hidden=True)
### END HIDDEN TESTS

# %%
split_heads_impl = yours_or_reference(split_heads, check_split_heads)

# %% [markdown]
# The worked example, and a look at the memory. `transpose` does not move any number either: it only changes
# the *strides*, the steps through memory that each index takes. The result is no longer laid out row after
# row, which `is_contiguous()` reports:

# %%
x_small = torch.arange(12.0).reshape(1, 2, 6)  # [batch 1, seq 2, d_model 6]
heads_small = split_heads_impl(x_small, 3)  # [1, 3, 2, 2]
print("shape:", tuple(heads_small.shape))
for i in range(3):
    print(f"head {i}:", heads_small[0, i].tolist())
print("contiguous before:", x_small.is_contiguous(), " after split_heads:", heads_small.is_contiguous())

# %% [markdown]
# ### Exercise 2 — `merge_heads`
# > **Difficulty** ●○○ · **Importance** ●●● · about 10 minutes
#
# Write `merge_heads(x)`, the inverse of `split_heads`: the outputs of the heads, concatenated for every
# position.
#
# * `x`: `[batch, n_heads, seq, d_k]`.
# * returns `[batch, seq, n_heads * d_k]`: position `t` holds head 0's `d_k` numbers, then head 1's, and so on.
#
# Worked example: `merge_heads(split_heads(x, n_heads))` gives back `x`, for any `x` and `n_heads`.
#
# <details><summary>Hint 1 — the idea</summary>Undo the two moves of <code>split_heads</code> in reverse order: put the positions back in front of the heads, then glue each position's heads back into one vector.</details>
# <details><summary>Hint 2 — the plan</summary>Shapes: <code>[batch, n_heads, seq, d_k]</code> → (the heads axis and the
# positions axis swapped back) → <code>[batch, seq, n_heads, d_k]</code> → (the last two axes joined) → <code>[batch,
# seq, n_heads * d_k]</code>. After the swap the memory is no longer laid out row by row, so <code>view</code> refuses
# ("view size is not compatible with input tensor's size and stride"); <code>reshape</code> copies when it
# must.</details>
# <details><summary>Hint 3 — the key step</summary>Check on the toy of exercise 1: merging the heads of
# <code>torch.arange(12).view(1, 2, 6)</code>, split into 3 heads, must give back exactly that tensor, position 0
# holding 0 to 5. Which axes must be next to each other before they can be joined? The pages to read:
# torch.Tensor.transpose and torch.Tensor.reshape.</details>

# %% nbgrader={"grade": false, "grade_id": "merge_heads", "locked": false, "schema_version": 3, "solution": true, "task": false}
def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """Concatenate the heads of every position.

    x: [batch, n_heads, seq, d_k] -> [batch, seq, n_heads * d_k].
    """
    ### BEGIN SOLUTION
    batch, n_heads, seq, d_k = x.shape
    return x.transpose(1, 2).reshape(batch, seq, n_heads * d_k)  # [batch, seq, d_model]
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "merge_heads_test", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false} tags=["raises-exception"]
check_merge_heads(merge_heads)
### BEGIN HIDDEN TESTS
check_merge_heads(merge_heads, hidden=True)
### END HIDDEN TESTS

# %%
merge_heads_impl = yours_or_reference(merge_heads, check_merge_heads)

# %% [markdown]
# Now the whole journey of a batch through a multi-head layer, shape by shape: 2 sentences of 5 tokens,
# $d_{model} = 12$, 3 heads of $d_k = 4$. We use the library's `MultiHeadAttention` only for its four
# weight matrices (`w_q`, `w_k`, `w_v`, `w_o`, each an `nn.Linear(12, 12)`), and do every step by hand
# (the queries' split and the final merge written out, the keys and values split by `split_heads_impl`):

# %%
layer = MultiHeadAttention(d_model=12, n_heads=3)
x = torch.randn(2, 5, 12)  # [batch, seq, d_model]


def show(name, t):
    print(f"{name:<44} {str(list(t.shape)):<15} contiguous: {t.is_contiguous()}")


show("x", x)
q = layer.w_q(x)
show("q = x W^Q (all heads at once)", q)
q4 = q.view(2, 5, 3, 4)
show("q.view(batch, seq, heads, d_k)", q4)
q_heads = q4.transpose(1, 2)
show("  .transpose(1, 2) -> q of each head", q_heads)
k_heads, v_heads = split_heads_impl(layer.w_k(x), 3), split_heads_impl(layer.w_v(x), 3)
scores = q_heads @ k_heads.transpose(-2, -1) / math.sqrt(4)
show("scores = q k^T / sqrt(d_k), per head", scores)
weights = torch.softmax(scores, dim=-1)
heads_out = weights @ v_heads
show("head outputs = weights @ v", heads_out)
back = heads_out.transpose(1, 2)
show("  .transpose(1, 2)", back)
concat = back.reshape(2, 5, 12)
show("  .reshape(batch, seq, d_model) = Concat", concat)
out = layer.w_o(concat)
show("output = Concat W^O", out)
print("merge_heads_impl gives the same Concat:", torch.equal(merge_heads_impl(heads_out), concat))
print("same output as the library's layer (to 1e-6):", torch.allclose(out, layer(x, x, x), atol=1e-6))

# %% [markdown]
# Two things to notice. The scores have shape `[2, 3, 5, 5]`: a separate 5 × 5 attention matrix for each of
# the 3 heads of each of the 2 sentences, all from **one** `@`. And after each `transpose` the tensor is not
# contiguous, which is why the merge uses `reshape` (it copies when it must); `view` would refuse.

# %% [markdown]
# ## 4. W^O: mixing the heads
#
# After the concatenation, feature $i \cdot d_k + m$ of a position is simply feature $m$ of head $i$: the heads
# sit in separate slots and have not met. $W^O$ is where they meet. Cut $W^O$ into $h$ horizontal blocks of
# $d_k$ rows, $W^O_0, \dots, W^O_{h-1}$; a block matrix product gives
#
# $$\mathrm{Concat}(\mathrm{head}_0, \dots, \mathrm{head}_{h-1})\, W^O = \sum_{i=0}^{h-1} \mathrm{head}_i\, W^O_i .$$
#
# So every output feature is a learned combination of **all** heads: each head writes its findings into the
# output through its own $d_k \times d_{model}$ block. Leaving $W^O$ out is a classic bug: the layer still runs
# and the shapes still fit, but every output feature then carries one head's information only. Let's check the
# identity on the layer above (`nn.Linear` stores its weight transposed, so $W^O$ is `w_o.weight.T`, plus a bias):

# %%
W_O = layer.w_o.weight.T  # [d_model in, d_model out]: x @ W_O
d_k = 4
by_blocks = sum(heads_out[:, i] @ W_O[i * d_k:(i + 1) * d_k] for i in range(3)) + layer.w_o.bias  # [2, 5, 12]
print("Concat W^O == sum over heads of head_i W^O_i (to 1e-6):", torch.allclose(out, by_blocks, atol=1e-6))
with torch.no_grad():
    share = [(heads_out[:, i] @ W_O[i * d_k:(i + 1) * d_k]).norm().item() for i in range(3)]
print("size (norm) of each head's term head_i W^O_i:", [f"{s:.2f}" for s in share])

# %% [markdown]
# The two sides agree, and each of the three heads adds a term of similar size to the output:
# every output feature draws on every head. In a trained model $W^O$ learns how much of each head each output
# feature needs.
#
# ### One mask for every head
#
# A mask hides keys from queries: boolean, `True` = may attend, broadcast to the scores (chapter 02). Two shapes
# come up in practice. A decoder's causal mask is `[L_q, L_k]`, the same for every sentence. A batch of sentences
# of different lengths needs one row of visible keys per sentence, `[batch, 1, L_k]`, which hides each sentence's
# padding. (Chapter 06 builds them from the token ids, in the 4-D form below; here we write them by hand.) The `1`
# there means "the same for every query": it broadcasts over the queries. This chapter accepts exactly these
# shapes, plus a full `[batch, L_q, L_k]`.
#
# The scores now have one more dimension, `[batch, heads, L_q, L_k]`, and **broadcasting lines dimensions up
# from the right**. A 2-D mask `[L_q, L_k]` is fine: it broadcasts over batch and heads. A 3-D mask is not safe:
# `[batch, 1, L_k]` is read as `[heads, L_q, L_k]`, its sentences matched to heads. The cure is to give
# it a heads dimension of size 1, `mask.unsqueeze(1)`: `[batch, 1, 1, L_k]` (or `[batch, 1, L_q, L_k]`), which
# reaches every head, and every query, of its own sentence. (The library's `padding_mask` returns
# `[batch, 1, 1, L_k]` directly; chapter 06 builds it.)

# %%
draw_mask_broadcast()
plt.show()


# %%
def broadcast_or_not(mask_shape, scores_shape):
    try:
        return str(list(torch.broadcast_shapes(mask_shape, scores_shape)))
    except RuntimeError:
        return "does not broadcast"


scores_shape = torch.Size([2, 3, 4, 6])  # [batch, heads, L_q, L_k]
for name, shape in (("causal [L_q, L_k]", [4, 6]), ("padding [batch, 1, L_k]", [2, 1, 6]),
                    ("full [batch, L_q, L_k]", [2, 4, 6])):
    fixed = shape[:1] + [1] + shape[1:] if len(shape) == 3 else shape  # unsqueeze(1) for 3-D masks
    print(f"{name:<24} {str(shape):<10} as it is: {broadcast_or_not(shape, scores_shape):<19} "
          f"| with heads dim {str(fixed):<13}: {broadcast_or_not(fixed, scores_shape)}")

# The two cases where a padding mask [batch, 1, L_k] left as it is broadcasts without an error:
for n_sentences in (1, 3):  # 3 heads: one sentence, then as many sentences as heads
    lengths = torch.tensor([4, 6, 2])[:n_sentences]  # sentence b has lengths[b] real tokens out of 6
    pad = (torch.arange(6) < lengths[:, None])[:, None, :]  # [batch, 1, L_k]
    target = (n_sentences, 3, 4, 6)  # [batch, heads, L_q, L_k]
    as_is, fixed = pad.expand(target), pad.unsqueeze(1).expand(target)
    print(f"padding {list(pad.shape)} for 3 heads, as it is: same mask as with heads dim? {torch.equal(as_is, fixed)}; "
          f"keys visible to sentence 0 in heads 0, 1, 2: {as_is[0, :, 0].sum(-1).tolist()} (it has {lengths[0]})")

# %% [markdown]
# With 2 sentences and 3 heads, a 3-D mask left as it is fails loudly. With a single sentence, `[1, 1, L_k]`
# broadcasts and is right: its one row of visible keys reaches every head and every query of the only sentence,
# exactly what `unsqueeze(1)` gives. The silent error needs as many sentences as heads: then row $i$ of the mask
# goes to head $i$ of *every* sentence, as in the picture, and sentence 0 sees its own 4 keys in head 0 only. That
# is why the checker of the next exercise has such cases.
#
# ### Exercise 3 — `multi_head_attention_forward`
# > **Difficulty** ●●● · **Importance** ●●● · about 25 minutes
#
# Put it together with plain weight matrices (no biases), as in chapter 02:
# `multi_head_attention_forward(query, key, value, w_q, w_k, w_v, w_o, n_heads, mask=None)` returns
# `(output, weights)`.
#
# * `query`: `[batch, L_q, d_model]`; `key`, `value`: `[batch, L_k, d_model]` (for self-attention all three
#   are the same tensor; for cross-attention the keys and values come from another sequence).
# * `w_q`, `w_k`, `w_v`, `w_o`: `[d_model, d_model]`, used as `x @ w`.
# * `mask`: `None` or boolean, `True` = may attend, shaped `[L_q, L_k]`, `[batch, L_q, L_k]` or `[batch, 1, L_k]`
#   (broadcast over the queries): the same mask for every head.
# * returns `output` `[batch, L_q, d_model]` and `weights` `[batch, n_heads, L_q, L_k]`.
#
# Worked example: with `n_heads = 1` and identity matrices for all four weights, the output is chapter 02's
# `scaled_attention(query, key, value)`. With `query` of shape `[2, 5, 8]` and `n_heads = 2`, `weights` has
# shape `[2, 2, 5, 5]`.
#
# You may use `split_heads_impl`, `merge_heads_impl` (yours, or the library's if yours does not pass yet) and
# `scaled_dot_product_attention` (imported above), or write the steps out.
#
# <details><summary>Hint 1 — the idea</summary>Project, split, attend, merge, mix. Each head compares vectors of size <code>d_k</code>, so the scale is $\sqrt{d_k}$, not $\sqrt{d_{model}}$.
# The scores gain a heads axis, <code>[batch, heads, L_q, L_k]</code>, while a 3-D mask is <code>[batch, L_q, L_k]</code> or <code>[batch, 1, L_k]</code>: broadcasting lines axes up from the right, so the mask needs a heads axis of size 1 first.</details>
# <details><summary>Hint 2 — the plan</summary>Shapes: query, key and value, each times its matrix, <code>[batch, L, d_model]</code> → split → <code>[batch, heads, L, d_k]</code> (<code>L_q</code> positions for the queries, <code>L_k</code> for the keys and values);
# scores and weights <code>[batch, heads, L_q, L_k]</code>, the softmax over the keys; a 3-D mask becomes <code>[batch, 1, L_q, L_k]</code> or <code>[batch, 1, 1, L_k]</code>; weights times values <code>[batch, heads, L_q, d_k]</code> → merge → <code>[batch, L_q, d_model]</code> → times <code>w_o</code>.
# Return that and the per-head weights. Your <code>split_heads_impl</code>, <code>merge_heads_impl</code> and the imported <code>scaled_dot_product_attention</code> do most of the steps.</details>
# <details><summary>Hint 3 — the key step</summary>Two questions. A mask <code>[batch, L_q, L_k]</code> meets scores
# <code>[batch, heads, L_q, L_k]</code>, and broadcasting lines axes up from the right: where must an axis of size 1 go,
# so that every head gets the same mask (torch.Tensor.unsqueeze)? And the keys may be longer or shorter than the
# queries: does your split take its sizes from the tensor it is given, or from the queries?</details>

# %% nbgrader={"grade": false, "grade_id": "multi_head_attention_forward", "locked": false, "schema_version": 3, "solution": true, "task": false}
def multi_head_attention_forward(query, key, value, w_q, w_k, w_v, w_o, n_heads, mask=None):
    """Multi-head attention with plain matrices.

    query: [batch, L_q, d_model]; key, value: [batch, L_k, d_model]; w_*: [d_model, d_model].
    mask: bool (True = may attend), [L_q, L_k], [batch, L_q, L_k] or [batch, 1, L_k].
    Returns (output [batch, L_q, d_model], weights [batch, n_heads, L_q, L_k]).
    """
    ### BEGIN SOLUTION
    batch, l_q, d_model = query.shape
    d_k = d_model // n_heads
    q = (query @ w_q).view(batch, l_q, n_heads, d_k).transpose(1, 2)  # [batch, heads, L_q, d_k]
    k = (key @ w_k).view(batch, -1, n_heads, d_k).transpose(1, 2)  # [batch, heads, L_k, d_k]
    v = (value @ w_v).view(batch, -1, n_heads, d_k).transpose(1, 2)  # [batch, heads, L_k, d_k]
    scores = q @ k.transpose(-2, -1) / math.sqrt(d_k)  # [batch, heads, L_q, L_k]
    if mask is not None:
        if mask.dim() == 3:
            mask = mask.unsqueeze(1)  # [batch, 1, L_q or 1, L_k]: the same mask for every head
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    weights = torch.softmax(scores, dim=-1)
    out = (weights @ v).transpose(1, 2).reshape(batch, l_q, d_model)  # [batch, L_q, d_model]: Concat(heads)
    return out @ w_o, weights
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "multi_head_attention_forward_test", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false} tags=["raises-exception"]
check_multi_head_attention_forward(multi_head_attention_forward)
### BEGIN HIDDEN TESTS
check_multi_head_attention_forward(multi_head_attention_forward, hidden=True)
### END HIDDEN TESTS

# %%
multi_head_attention_forward_impl = yours_or_reference(multi_head_attention_forward, check_multi_head_attention_forward)

# %% [markdown]
# The worked example: one head and identity weights give back single-head attention, and a padding mask
# `[batch, 1, L_k]` (the second sentence has only 3 real tokens) reaches every head and every query:

# %%
x8 = torch.randn(2, 5, 8)
eye = torch.eye(8)
out_1, _ = multi_head_attention_forward_impl(x8, x8, x8, eye, eye, eye, eye, n_heads=1)
print("1 head + identity weights == chapter 02's attention (to 1e-6):",
      torch.allclose(out_1, scaled_dot_product_attention(x8, x8, x8)[0], atol=1e-6))

w_q8, w_k8, w_v8, w_o8 = (torch.randn(8, 8) / math.sqrt(8) for _ in range(4))
pad = torch.tensor([[True] * 5, [True] * 3 + [False] * 2])[:, None, :]  # [batch, 1, L_k]
out_2, weights_2 = multi_head_attention_forward_impl(x8, x8, x8, w_q8, w_k8, w_v8, w_o8, n_heads=2, mask=pad)
print("output", list(out_2.shape), " weights", list(weights_2.shape))
print("weight on the two padding keys of sentence 2, per head:", weights_2[1, :, :, 3:].sum(dim=(-2, -1)))

# %% [markdown]
# ## 5. Counting the parameters
#
# Splitting into $h$ heads gives $h$ views of the input. What does it cost? Before reading on, count it
# yourself. The layer learns four projections, $W^Q, W^K, W^V$ and $W^O$, and, when `bias` is true, a bias
# vector for each.
#
# * Head $i$ has its own $W_i^Q, W_i^K, W_i^V$. How many rows and columns does each have, and how many biases?
# * How many numbers do all $h$ heads hold together? And $W^O$, which reads the concatenated heads?
# * **Predict**: does the total depend on `n_heads`? For $d_{model} = 512$, which has more parameters, a layer
#   with 8 heads or a layer with 1 head — and by how much?
#
# ### Exercise 4 — `count_mha_parameters`
# > **Difficulty** ●○○ · **Importance** ●●○ · about 10 minutes
#
# Write `count_mha_parameters(d_model, n_heads, bias=True)`: the number of parameters (an `int`) of a
# multi-head attention layer with `n_heads` heads over `d_model` features, its projections $W^Q, W^K, W^V, W^O$
# and, when `bias` is true, their biases. Derive it from the heads: count one head, then all of them, then $W^O$.
#
# Worked example: `count_mha_parameters(4, 2)` is 80 and `count_mha_parameters(4, 2, bias=False)` is 64.
# Check that your reasoning gives these two numbers before you write the code.
#
# <details><summary>Hint 1 — the idea</summary>A head reads all $d_{model}$ input features and produces $d_k = d_{model} / h$ numbers: its $W_i^Q$ is
# $d_{model} \times d_k$, with one bias per output, and likewise $W_i^K$ and $W_i^V$. $W^O$ reads what all the heads produced together and writes $d_{model}$ numbers.</details>
# <details><summary>Hint 2 — the plan</summary>Count one head: three matrices of $d_{model} \times d_k$ entries, plus $d_k$ biases each when <code>bias</code> is true.
# Multiply by the number of heads. Add $W^O$: as many entries as it has inputs (the concatenated heads) times outputs, plus one bias per output when <code>bias</code> is true.
# Use integer division for $d_k$, so that the result is a Python int.</details>
# <details><summary>Hint 3 — the key step</summary>Check your count on small numbers: <code>d_model = 4</code>, 2 heads,
# with biases. One head's query matrix is 4 × 2 = 8 entries plus 2 biases; three such matrices per head and 2 heads make
# 60; $W^O$ has 4 × 4 = 16 entries plus 4 biases, 20. The total is 80, and 64 without any bias. Does your formula give
# both?</details>

# %% nbgrader={"grade": false, "grade_id": "count_mha_parameters", "locked": false, "schema_version": 3, "solution": true, "task": false}
def count_mha_parameters(d_model: int, n_heads: int, bias: bool = True) -> int:
    """Parameters of multi-head attention: h heads of W_i^Q, W_i^K, W_i^V (d_model x d_k), plus W^O."""
    ### BEGIN SOLUTION
    d_k = d_model // n_heads
    per_head = 3 * (d_model * d_k + (d_k if bias else 0))  # W_i^Q, W_i^K, W_i^V and their biases
    w_o = d_model * d_model + (d_model if bias else 0)
    return n_heads * per_head + w_o
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "count_mha_parameters_test", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false} tags=["raises-exception"]
check_count_mha_parameters(count_mha_parameters)
### BEGIN HIDDEN TESTS
check_count_mha_parameters(count_mha_parameters, hidden=True)
### END HIDDEN TESTS

# %%
count_mha_parameters_impl = yours_or_reference(count_mha_parameters, check_count_mha_parameters)

# %% [markdown]
# ### The count, derived
#
# Head $i$ has $W_i^Q, W_i^K, W_i^V$ of size $d_{model} \times d_k$, plus $d_k$ biases each. All $h$ heads together
# have $3 h (d_{model} d_k + d_k) = 3(d_{model}^2 + d_{model})$, because $h\, d_k = d_{model}$. $W^O$ maps the
# $h \cdot d_k = d_{model}$ concatenated features back to $d_{model}$: another $d_{model}^2 + d_{model}$. So the
# layer has
#
# $$P = 4\, d_{model}^2 + 4\, d_{model}$$
#
# parameters ($4\, d_{model}^2$ without biases), whatever $h$ is.
#
# The answer to the prediction: 8 heads and 1 head have **exactly** as many parameters. Multi-head attention
# does not buy its several views with more parameters; it **cuts** one full-width head into $h$ independent
# smaller ones. Vaswani et al. (2017, section 3.2.2) make the same remark about compute: because each head is
# smaller, the total cost is similar to one head of full width. For the scores of a sequence of length $L$,
# $h$ heads compute $h \cdot L^2 \cdot d_k = L^2 \cdot d_{model}$ multiply-adds, like one full-width head.
#
# Now check the count against real modules: the library's `MultiHeadAttention` and PyTorch's
# `nn.MultiheadAttention` (built on PyTorch's `meta` device: shapes only, no memory), for the paper's base size.

# %%
def parameters_of(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


print("worked example, d_model 4, 2 heads:", count_mha_parameters_impl(4, 2), "with biases,",
      count_mha_parameters_impl(4, 2, bias=False), "without")
with torch.device("meta"):
    for h in (1, 8):
        for bias in (True, False):
            library = MultiHeadAttention(512, h, bias=bias)
            pytorch = nn.MultiheadAttention(512, h, bias=bias, batch_first=True)
            print(f"d_model 512, {h} head{'s' if h > 1 else ' '}, bias={bias!s:<5}: count {count_mha_parameters_impl(512, h, bias):>9,}"
                  f" | library {parameters_of(library):>9,} | nn.MultiheadAttention {parameters_of(pytorch):>9,}")
print(f"4 d^2 + 4 d for d = 512: {4 * 512**2 + 4 * 512:,}")
L = 128
print(f"score multiply-adds for L = {L}: 1 head {1 * L * L * 512:,}, 8 heads {8 * L * L * 64:,}")

# %% [markdown]
# All three agree, for 1 head and for 8: the same parameters, used differently.

# %% [markdown]
# ## 6. The layer as a module
#
# Inside a Transformer, multi-head attention is a layer that owns its four projections and is called like a
# function: an `nn.Module`. One more exercise packages sections 3 to 5 that way.
#
# ### Exercise 5 — `MultiHeadAttentionLayer`
# > **Difficulty** ●●○ · **Importance** ●●● · about 20 minutes
#
# Package it as an `nn.Module`, the way it is used inside a Transformer.
#
# * `__init__(self, d_model, n_heads)`: raise a `ValueError` whose message says that `d_model` must be divisible
#   by `n_heads` when it isn't (not an `assert`); create four `nn.Linear(d_model, d_model)` layers (with biases)
#   named **`w_q`, `w_k`, `w_v`, `w_o`** (the checker loads weights by these names).
# * `forward(self, query, key, value, mask=None)`: `query` `[batch, L_q, d_model]`, `key`/`value`
#   `[batch, L_k, d_model]`, `mask` as in exercise 3; returns the output `[batch, L_q, d_model]` (just the tensor).
#
# Worked example: `MultiHeadAttentionLayer(12, 3)(x, x, x)` for `x` of shape `[2, 5, 12]` has shape `[2, 5, 12]`;
# with the weights of `layer` from section 3 loaded (`load_state_dict(layer.state_dict())`), its output equals
# `layer(x, x, x)`. `MultiHeadAttentionLayer(10, 3)` raises `ValueError`.
#
# You may use `split_heads_impl`, `merge_heads_impl`, `scaled_dot_product_attention` or PyTorch's fused
# `F.scaled_dot_product_attention` (same boolean mask convention: `True` = may attend).
#
# <details><summary>Hint 1 — the idea</summary>The constructor checks its arguments, then creates the four layers under the names the checker loads weights into, and keeps <code>n_heads</code> and <code>d_k</code> as attributes for <code>forward</code>.
# In <code>forward</code>, the layer <code>w_q</code> applied to the queries is exercise 3's product with $W^Q$, plus a bias; the rest is exercise 3 again.</details>
# <details><summary>Hint 2 — the plan</summary>Constructor (after the parent's, which is already there): raise a <code>ValueError</code> whose message names <code>d_model</code> and <code>n_heads</code> when <code>d_model</code> is not a multiple of <code>n_heads</code>; then the four <code>nn.Linear</code> layers from <code>d_model</code> to <code>d_model</code>.
# <code>forward</code>: <code>[batch, L, d_model]</code> → layer <code>w_q</code>, <code>w_k</code> or <code>w_v</code> → split → <code>[batch, heads, L, d_k]</code>; a 3-D mask gets a heads axis; attention per head → <code>[batch, heads, L_q, d_k]</code> → merge → <code>[batch, L_q, d_model]</code> → layer <code>w_o</code>. Return only the output.</details>
# <details><summary>Hint 3 — the key step</summary>The page to read: torch.nn.functional.scaled_dot_product_attention. A
# boolean <code>attn_mask</code> is True where attention is allowed, as in this course, and it broadcasts over the heads
# once it has an axis for them. It takes queries, keys and values already split into heads: what does it return, and
# what is left to do after it?</details>

# %% nbgrader={"grade": false, "grade_id": "multi_head_attention_layer", "locked": false, "schema_version": 3, "solution": true, "task": false}
class MultiHeadAttentionLayer(nn.Module):
    """Multi-head attention: h heads of size d_k = d_model / h, concatenated and mixed by W^O."""

    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        ### BEGIN SOLUTION
        if d_model % n_heads != 0:
            raise ValueError(f"d_model ({d_model}) must be divisible by n_heads ({n_heads})")
        self.d_model, self.n_heads, self.d_k = d_model, n_heads, d_model // n_heads
        self.w_q = nn.Linear(d_model, d_model)
        self.w_k = nn.Linear(d_model, d_model)
        self.w_v = nn.Linear(d_model, d_model)
        self.w_o = nn.Linear(d_model, d_model)
        ### END SOLUTION

    def forward(self, query, key, value, mask=None):
        """query: [batch, L_q, d_model]; key, value: [batch, L_k, d_model] -> [batch, L_q, d_model]."""
        ### BEGIN SOLUTION
        batch, l_q, _ = query.shape
        q = self.w_q(query).view(batch, l_q, self.n_heads, self.d_k).transpose(1, 2)  # [batch, heads, L_q, d_k]
        k = self.w_k(key).view(batch, -1, self.n_heads, self.d_k).transpose(1, 2)  # [batch, heads, L_k, d_k]
        v = self.w_v(value).view(batch, -1, self.n_heads, self.d_k).transpose(1, 2)  # [batch, heads, L_k, d_k]
        if mask is not None and mask.dim() == 3:
            mask = mask.unsqueeze(1)  # one mask for all heads
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # [batch, heads, L_q, d_k]
        return self.w_o(out.transpose(1, 2).reshape(batch, l_q, self.d_model))  # [batch, L_q, d_model]
        ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "multi_head_attention_layer_test", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false} tags=["raises-exception"]
check_multi_head_attention_layer(MultiHeadAttentionLayer)
### BEGIN HIDDEN TESTS
check_multi_head_attention_layer(MultiHeadAttentionLayer, hidden=True)
### END HIDDEN TESTS

# %%
MultiHeadAttentionLayer_impl = yours_or_reference(MultiHeadAttentionLayer, check_multi_head_attention_layer)

# %% [markdown]
# PyTorch ships its own layer, `torch.nn.MultiheadAttention`, which stores $W^Q, W^K, W^V$ stacked in one
# `in_proj_weight`. Copy the weights of a `MultiHeadAttentionLayer_impl` into it and compare, on a
# cross-attention with padding (note PyTorch's opposite convention: its `key_padding_mask` is `True` for the
# keys to **hide**). Our layer returns only its output; to see its attention weights, the small function
# `head_weights` below recomputes them from the layer's `w_q` and `w_k` with `split_heads_impl`. Section 7 uses
# it to look inside a trained layer.

# %%
def head_weights(layer: nn.Module, n_heads: int, query, key, mask=None) -> torch.Tensor:
    """The attention weights [batch, heads, L_q, L_k] of a layer with projections w_q and w_k."""
    q = split_heads_impl(layer.w_q(query), n_heads)  # [batch, heads, L_q, d_k]
    k = split_heads_impl(layer.w_k(key), n_heads)  # [batch, heads, L_k, d_k]
    if mask is not None and mask.dim() == 3:
        mask = mask.unsqueeze(1)  # the same mask for every head
    return scaled_dot_product_attention(q, k, k, mask=mask)[1]  # the values do not change the weights


ours = MultiHeadAttentionLayer_impl(12, 3).eval()
theirs = nn.MultiheadAttention(12, 3, batch_first=True).eval()
with torch.no_grad():
    theirs.in_proj_weight.copy_(torch.cat([ours.w_q.weight, ours.w_k.weight, ours.w_v.weight]))  # [3 d_model, d_model]
    theirs.in_proj_bias.copy_(torch.cat([ours.w_q.bias, ours.w_k.bias, ours.w_v.bias]))
    theirs.out_proj.load_state_dict(ours.w_o.state_dict())

decoder_side, encoder_side = torch.randn(2, 4, 12), torch.randn(2, 6, 12)
visible = torch.tensor([[True] * 6, [True] * 4 + [False] * 2])  # [batch, L_k]: True = real token
with torch.no_grad():
    ours_out = ours(decoder_side, encoder_side, encoder_side, mask=visible[:, None, :])  # mask [batch, 1, L_k]
    ours_w = head_weights(ours, 3, decoder_side, encoder_side, mask=visible[:, None, :])
    theirs_out, theirs_w = theirs(decoder_side, encoder_side, encoder_side, key_padding_mask=~visible,
                                  average_attn_weights=False)
print("same outputs (to 1e-6):", torch.allclose(ours_out, theirs_out, atol=1e-6))
print(f"same weights [batch, heads, L_q, L_k] = {list(theirs_w.shape)} (to 1e-6):",
      torch.allclose(ours_w, theirs_w, atol=1e-6))

# %% [markdown]
# The library's `MultiHeadAttention` computes the same layer, with options around it: `dropout` on the attention
# weights in training, `bias=False` for projections without bias vectors, a `bias` added to the scores for relative
# positions (chapter 04), a `need_weights=True` switch that keeps the weights in `last_weights` (a fused fast path
# otherwise), a cache for generation (chapter 07), and input checks that name a wrong shape.

# %% [markdown]
# ## 7. Do heads really learn different relations? Train a model
#
# Section 1 built two heads by hand. Do heads **choose** different jobs when they learn? Let's train a model that
# needs two relations at once.
#
# **The task.** Sequences of 10 random tokens from a vocabulary of 16. At every position $t \ge 1$, the model must
# output two tokens: the **first** token of the sequence, and the **previous** one (position $t - 1$).
#
# **The model** is as small as it can be: a token embedding plus a learned position embedding (chapter 04 explains
# why attention needs positions), **one** multi-head attention layer — your `MultiHeadAttentionLayer` if it passes
# its check — with a causal mask (position $t$ sees positions $0 \dots t$), and two linear read-outs, one per
# question. No feed-forward network, no residual connection: whatever the read-outs know came through the
# attention. $d_{model} = 32$.
#
# We train it twice, with 4 heads ($d_k = 8$) and with 1 head ($d_k = 32$). By section 5 the two attention layers
# have the same number of parameters. **Predict**: will they do equally well?

# %%
VOCAB, SEQ, D_MODEL = 16, 10, 32


def make_batch(gen, n):
    """n random sequences [n, SEQ] and their two targets: the first token, the previous token."""
    tokens = torch.randint(0, VOCAB, (n, SEQ), generator=gen)
    first = tokens[:, :1].expand(n, SEQ)
    previous = torch.cat([tokens[:, :1], tokens[:, :-1]], dim=1)  # position 0 has no previous: never scored
    return tokens, first, previous


class TwoQuestions(nn.Module):
    def __init__(self, n_heads):
        super().__init__()
        self.n_heads = n_heads
        self.tok = nn.Embedding(VOCAB, D_MODEL)
        self.pos = nn.Embedding(SEQ, D_MODEL)
        self.attn = MultiHeadAttentionLayer_impl(D_MODEL, n_heads)
        self.read_first = nn.Linear(D_MODEL, VOCAB)
        self.read_previous = nn.Linear(D_MODEL, VOCAB)

    def embed(self, tokens):
        return self.tok(tokens) + self.pos.weight[: tokens.shape[1]]  # [batch, seq, d_model]

    def read_out(self, z):
        return self.read_first(z), self.read_previous(z)  # two [batch, seq, VOCAB] logits

    def forward(self, tokens):
        h = self.embed(tokens)
        return self.read_out(self.attn(h, h, h, mask=causal_mask(tokens.shape[1])))


def loss_fn(model, tokens, first, previous):
    logits_first, logits_previous = model(tokens)
    return (F.cross_entropy(logits_first[:, 1:].reshape(-1, VOCAB), first[:, 1:].reshape(-1))
            + F.cross_entropy(logits_previous[:, 1:].reshape(-1, VOCAB), previous[:, 1:].reshape(-1)))


def train(n_heads, steps=300, seed=0):
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    model = TwoQuestions(n_heads)
    optimiser = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(steps):
        loss = loss_fn(model, *make_batch(gen, 128))
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        losses.append(loss.item())
    return model.eval(), losses


test_tokens, test_first, test_previous = make_batch(torch.Generator().manual_seed(1234), 2000)  # fresh sequences


def accuracy_of(logits_first, logits_previous):
    """Test accuracy at positions 1 .. 9: the first token, the previous token, both at once."""
    ok_first = (logits_first.argmax(-1) == test_first)[:, 1:]
    ok_previous = (logits_previous.argmax(-1) == test_previous)[:, 1:]
    return ok_first.float().mean().item(), ok_previous.float().mean().item(), (ok_first & ok_previous).float().mean().item()


def accuracy(model):
    with torch.no_grad():
        return accuracy_of(*model(test_tokens))


# %% [markdown]
# ### Measuring a head: where it looks, and how sharply
#
# Once trained, we will ask two questions of every head. **Where** does it look: how much weight does it give to
# the first token, how much to the previous one? And **how sharply**: does it put nearly all its weight on one
# key, or spread it? The second question has a standard measure, the **entropy** of a query's weights
# $a_1, \dots, a_n$ (they are $\ge 0$ and sum to one, a probability distribution over the keys):
#
# $$H = -\sum_{j} a_j \log a_j .$$
#
# $H = 0$ when one key takes all the weight; $H = \log n$ when $n$ keys share it equally ($\log 2 \approx 0.69$ for
# two). Studies of trained Transformers use it to tell sharp heads from broad ones: Clark et al. (2019, "What
# Does BERT Look At?") measured the entropy of every head of BERT and found heads attending very broadly
# next to heads that attend sharply; Voita et al. (2019) use a close cousin, a head's average maximum weight,
# which they call its confidence.
#
# ### Exercise 6 — `attention_entropy`
# > **Difficulty** ●○○ · **Importance** ●●○ · about 10 minutes
#
# Write `attention_entropy(weights)`.
#
# * `weights`: `[..., L_q, L_k]` (any number of leading dimensions, e.g. `[batch, heads, L_q, L_k]`): each row is a
#   query's weights over the keys, $\ge 0$, summing to one — or all zeros for a query that may see no key.
# * returns `[..., L_q]`: the entropy of every row, with the natural log (in *nats*). A key with weight exactly 0
#   (a masked key) contributes 0, the limit of $a \log a$ as $a \to 0$.
#
# Worked example: the rows `[1, 0, 0, 0]`, `[0.25, 0.25, 0.25, 0.25]` and `[0.5, 0.5, 0, 0]` give
# `[0.000, 1.386, 0.693]`, that is $0$, $\log 4$ and $\log 2$.
#
# <details><summary>Hint 1 — the idea</summary>One term per key, $-a \log a$, summed over the keys. The catch is a masked key, weight exactly 0:
# in floating point, zero times the log of zero is zero times minus infinity, which is NaN, and one NaN spoils the whole sum. The term's limit is 0, and 0 is what it must contribute.</details>
# <details><summary>Hint 2 — the plan</summary>Shapes: <code>[..., L_q, L_k]</code> → elementwise $-a \log a$, with 0
# where $a = 0$ → a sum over the keys, the last dimension → <code>[..., L_q]</code>. Computing the log first and
# multiplying after cannot work at $a = 0$; the term must come from something that knows its limit.</details>
# <details><summary>Hint 3 — the key step</summary>The page to read: torch.special.entr, which is $-x \log x$ and 0 at
# $x = 0$ (torch.xlogy is its cousin, $x \log y$). On a toy, the weights <code>[1., 0.]</code> have entropy 0 and
# <code>[0.5, 0.5]</code> have $\log 2$.</details>

# %% nbgrader={"grade": false, "grade_id": "attention_entropy", "locked": false, "schema_version": 3, "solution": true, "task": false}
def attention_entropy(weights: torch.Tensor) -> torch.Tensor:
    """Entropy (in nats) of each query's attention weights: [..., L_q, L_k] -> [..., L_q]."""
    ### BEGIN SOLUTION
    return torch.special.entr(weights).sum(dim=-1)  # entr(a) = -a log a, and entr(0) = 0: masked keys add nothing
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "attention_entropy_test", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false} tags=["raises-exception"]
check_attention_entropy(attention_entropy)
### BEGIN HIDDEN TESTS
check_attention_entropy(attention_entropy, hidden=True)
### END HIDDEN TESTS

# %%
attention_entropy_impl = yours_or_reference(attention_entropy, check_attention_entropy)

worked = torch.tensor([[1.0, 0.0, 0.0, 0.0], [0.25, 0.25, 0.25, 0.25], [0.5, 0.5, 0.0, 0.0]])
print("worked example:", attention_entropy_impl(worked))
causal_uniform = causal_mask(SEQ).float() / causal_mask(SEQ).sum(dim=-1, keepdim=True)  # [SEQ, SEQ]: query t spreads over t + 1 keys
print("a head spreading evenly over everything it may see, per query position:", attention_entropy_impl(causal_uniform))

# %% [markdown]
# Under the causal mask, query $t$ sees $t + 1$ keys, so the broadest it can be is $\log(t + 1)$: the second line.
# Now train the two models (the times vary from run to run, so they are printed on their own):

# %% tags=["nbval-ignore-output", "timing"]
models, curves = {}, {}
start = time.perf_counter()
models[4], curves[4] = train(n_heads=4)
print(f"4 heads: trained in {time.perf_counter() - start:.1f} s")

# %% tags=["nbval-ignore-output", "timing"]
start = time.perf_counter()
models[1], curves[1] = train(n_heads=1)
print(f"1 head: trained in {time.perf_counter() - start:.1f} s")

# %% [markdown]
# The result: accuracy on 2000 fresh test sequences. Their last digits vary from one machine to another (the
# order of float sums changes the training a little); the cell after them checks what the chapter claims from them.

# %% tags=["nbval-ignore-output"]
accuracies = {n_heads: accuracy(models[n_heads]) for n_heads in (4, 1)}  # (first, previous, both)
for n_heads, (acc_first, acc_previous, acc_both) in accuracies.items():
    print(f"{n_heads} head{'s' if n_heads > 1 else ' '}: test accuracy: first token {acc_first:.3f}, "
          f"previous token {acc_previous:.3f}, both {acc_both:.3f}")

# %%
measured = " vs ".join(" / ".join(f"{a:.3f}" for a in accuracies[n]) for n in (4, 1))  # shown if a claim fails
claim_between(min(accuracies[4]), 0.99, None,
              "the 4-head model answers both questions right on at least 99% of the test positions", measured=measured)
claim_between(min(accuracies[1][:2]), 0.8, None,
              "the 1-head model still gets most answers right: at least 80% on each question", measured=measured)
claim_between(accuracies[4][2] - accuracies[1][2], 0.05, None,
              "but it is clearly worse: on both questions at once, at least 5 points below the 4-head model",
              measured=measured)

# %% [markdown]
# On this run the 4-head model's accuracy is about 1.00 on both questions (at least 0.99 on every CPU we tried).
# The single head's is about 0.95 on the first token and about 0.96 on the previous one (at least 0.8 on each), but
# on both questions at once it trails the 4-head model by about 0.08 (at least 0.05 on every CPU we tried). The
# training curves:

# %%
fig, ax = plt.subplots(figsize=(6, 3))
for n_heads, style in ((4, "-"), (1, "--")):
    ax.plot(curves[n_heads], style, label=f"{n_heads} head{'s' if n_heads > 1 else ''}")
ax.set_yscale("log")
ax.set_xlabel("training step")
ax.set_ylabel("loss (both questions)")
ax.legend()
fig.tight_layout()
plt.show()

# %% [markdown]
# Now the attention maps of one test sequence, computed with `head_weights`: one picture per head of the 4-head
# model, and the single head of the other. Rows are the querying positions, columns the positions attended to;
# the causal mask leaves the upper triangle empty.

# %%
attention = {}  # n_heads -> weights [2000, heads, SEQ, SEQ] on the test sequences
with torch.no_grad():
    for n_heads, model in models.items():
        h = model.embed(test_tokens)  # [2000, SEQ, d_model]
        attention[n_heads] = head_weights(model.attn, n_heads, h, h, mask=causal_mask(SEQ))

fig, axes = plt.subplots(1, 5, figsize=(8, 2.3))
panels = [(attention[4][0, i], f"4 heads: head {i}") for i in range(4)] + [(attention[1][0, 0], "1 head")]
for ax, (m, title) in zip(axes, panels):
    ax.imshow(m, cmap="Blues", vmin=0, vmax=1)
    ax.set_title(title, fontsize=9)
    ax.set_xticks([0, 9])
    ax.set_yticks([0, 9])
    ax.set_xlabel("key position", fontsize=8)
axes[0].set_ylabel("query position", fontsize=8)
fig.tight_layout()
plt.show()

# %% [markdown]
# The same, measured over all 2000 test sequences, for queries at positions $t \ge 2$ (where "first" and
# "previous" are different positions): the average weight each head gives to position 0 and to position $t - 1$,
# and its average entropy, with your `attention_entropy_impl`:

# %% tags=["nbval-ignore-output"]
queries = torch.arange(2, SEQ)
jobs, entropies = {}, {}
for n_heads in (4, 1):
    w = attention[n_heads]  # [2000, heads, SEQ, SEQ]
    on_first = w[:, :, 2:, 0].mean(dim=(0, 2))  # [heads]
    on_previous = w[:, :, queries, queries - 1].mean(dim=(0, 2))  # [heads]
    entropy = attention_entropy_impl(w)[:, :, 2:].mean(dim=(0, 2))  # [heads], in nats
    entropies[n_heads] = entropy
    print(f"{n_heads}-head model (d_k = {D_MODEL // n_heads}):")
    for i in range(n_heads):
        jobs[n_heads, i] = ("first token" if on_first[i] > 0.8 else "previous token" if on_previous[i] > 0.8
                            else "a mix")
        print(f"   head {i}: weight on the first token {on_first[i]:.2f}, on the previous token "
              f"{on_previous[i]:.2f}, entropy {entropy[i]:.2f}  -> {jobs[n_heads, i]}")
    if n_heads == 1:
        single_split = on_first[0].item(), on_previous[0].item()

# The single head's split between the two tokens, for the query at position 6, sequence by sequence:
w_single = attention[1][:, 0, 6]  # [2000, SEQ]
share_first = w_single[:, 0] / (w_single[:, 0] + w_single[:, 5])
print(f"1 head, position 6: share of (first + previous) weight given to the first token ranges from "
      f"{share_first.min():.2f} to {share_first.max():.2f} across the test sequences")

# %%
print(f"for comparison: log 2 = {math.log(2):.2f} (two keys shared equally); spreading evenly over all visible "
      f"keys: {attention_entropy_impl(causal_uniform)[2:].mean():.2f}")
four_jobs = [jobs[4, i] for i in range(4)]
claim("a mix" not in four_jobs and set(four_jobs) == {"first token", "previous token"},
      "each head of the 4-head model gives more than 0.8 of its weight to one relation, and both relations have a head",
      measured=", ".join(four_jobs))
claim_between(min(single_split), 0.3, None, "the single head splits its weight between the two: at least 0.3 on each",
              measured=f"{single_split[0]:.2f} on the first token, {single_split[1]:.2f} on the previous one")
claim_between(entropies[4].max().item(), None, 0.5, "every head of the 4-head model is sharp: entropy below 0.5",
              measured=f"{[round(e, 2) for e in entropies[4].tolist()]}")
claim_between(entropies[1][0].item(), 0.6, 1.1,
              "the single head's entropy is between 0.6 and 1.1: near log 2, far from an even spread")
claim_between(share_first.min().item(), None, 0.1,
              "from one sequence to the next, the single head gives the first token almost none (< 0.1) of that weight "
              "in some sequences")
claim_between(share_first.max().item(), 0.9, None, "and almost all (> 0.9) of it in others")

# %% [markdown]
# Read the two models side by side:
#
# * In the 4-head model **each head picked one relation**: some put nearly all their weight on column 0 (the first
#   token: a vertical stripe in the picture), the others on the diagonal just below the main one (the previous
#   token). Their entropies, at most about 0.34 here (below 0.5 on every CPU we tried), are far below the single
#   head's: sharp heads, each looking at one key. Nobody told
#   them to divide the work; it is simply what lets the read-outs answer both questions exactly, since the
#   concatenation keeps the two answers in separate coordinates, as in section 1. Several heads may end up doing
#   the same job: nothing forbids redundancy.
# * The single head has to serve both questions with one average. Averaged over the test sequences it spreads its
#   weight over the first and the previous token, about 0.45 and about 0.49 here (on every CPU we tried, at least
#   0.3 on each) — both stripes, each faded — the blend of section 1. Its entropy, about 0.81 here (between 0.6 and
#   1.1 on every CPU we tried), is a little above $\log 2 \approx 0.69$, the entropy of an even split between two
#   keys, and far below the 1.80 of an even spread. But that average hides a wide spread. Sequence by sequence, the
#   query at position 6 gives the first token anything from about 0.04 to about 0.96 of the weight it puts on the
#   two (under 0.1 and over 0.9 on every CPU we tried). That is how the head still gets a good
#   share of the answers right, by the trick announced in section 1: the balance between the two tokens depends on
#   which tokens they are, and the read-outs learn to decode it. But that trick is imperfect, as its accuracy above
#   shows, while the 4-head model answers both
#   questions on the same number of parameters. Vaswani et al. (2017, Table 3) saw the same on translation: one
#   head of full width scored 0.9 BLEU below their best number of heads.
#
# ### Switching heads off
#
# If two heads do the same job, does the model need both? Michel et al. (2019, "Are Sixteen Heads Really Better
# than One?") asked this of large trained models by **masking heads at test time** — multiplying a head's output
# by 0 before $W^O$ — and found that a large share of heads can be removed without much loss, some layers down to a
# single head. Our model is small enough to try every head. The function below recomputes the layer by hand, with
# your `split_heads_impl` and `merge_heads_impl`, and zeroes the heads it is told to remove:

# %%
def logits_without(model, removed=()):
    """The two read-outs' logits on the test set with the heads in `removed` switched off: their outputs zeroed
    before W^O."""
    layer, n_heads = model.attn, model.n_heads
    with torch.no_grad():
        h = model.embed(test_tokens)  # [2000, SEQ, d_model]
        q, k, v = (split_heads_impl(w(h), n_heads) for w in (layer.w_q, layer.w_k, layer.w_v))  # [2000, heads, SEQ, d_k]
        heads_out, _ = scaled_dot_product_attention(q, k, v, mask=causal_mask(SEQ))  # [2000, heads, SEQ, d_k]
        heads_out[:, list(removed)] = 0.0
        return model.read_out(layer.w_o(merge_heads_impl(heads_out)))  # two [2000, SEQ, VOCAB]


def accuracy_without(model, removed=()):
    """Test accuracy with the heads in `removed` switched off."""
    return accuracy_of(*logits_without(model, removed))


# %% tags=["nbval-ignore-output"]
four = models[4]
trials = [(), (0,), (1,), (2,), (3,)]
for job in ("first token", "previous token"):
    together = tuple(i for i in range(4) if jobs[4, i] == job)  # every head that does this job
    if together and together not in trials:
        trials.append(together)
table = {removed: accuracy_without(four, removed) for removed in trials}  # removed -> (first, previous, both)
print(f"{'heads removed':<40} first   previous  both")
for removed, accs in table.items():
    label = "none" if not removed else ", ".join(f"{i} ({jobs[4, i]})" for i in removed)
    print(f"{label:<40} " + "   ".join(f"{a:.3f}" for a in accs))

# %%
QUESTION = {"first token": 0, "previous token": 1}  # which accuracy of the table each job answers
OTHER = {"first token": 1, "previous token": 0}
claim(table[()] == accuracies[4], "with no head removed, the hand-made layer gives the model's own accuracy",
      measured=f"{table[()]} vs {accuracies[4]}")
single = [(i, table[(i,)], jobs[4, i]) for i in range(4)]  # one head removed
claim(all(accs[OTHER[job]] >= 0.99 for _, accs, job in single),
      "removing one head leaves the other question's accuracy at 0.99 or more",
      measured=", ".join(f"head {i}: {accs[OTHER[job]]:.3f}" for i, accs, job in single))
costs = [table[()][QUESTION[job]] - accs[QUESTION[job]] for _, accs, job in single]  # loss on the head's own question
claim_between(max(costs), 0.1, None, "some heads cost their question 10 points or more when removed",
              measured=", ".join(f"{c:.3f}" for c in costs))
claim_between(min(costs), None, 0.01, "at least one head costs its question 1 point or less when removed",
              measured=", ".join(f"{c:.3f}" for c in costs))
for job in QUESTION:
    accs = table[tuple(i for i in range(4) if jobs[4, i] == job)]
    claim_between(accs[QUESTION[job]], None, 0.2,
                  f"removing every {job.replace(' ', '-')} head leaves under 0.2 of the {job} answers "
                  "(chance: 1/16 ≈ 0.06)", measured=f"{accs[0]:.3f} / {accs[1]:.3f}")
    claim_between(accs[OTHER[job]], 0.99, None, "and the other question at 0.99 or more",
                  measured=f"{accs[0]:.3f} / {accs[1]:.3f}")

# %% [markdown]
# With no head removed, the hand-made computation gives the model's own accuracy: the pieces you wrote rebuild the
# layer exactly. Then read the table row by row:
#
# * Removing one head leaves the *other* question alone: a first-token head only costs first-token answers,
#   a previous-token head only previous-token answers.
# * Heads that share a job do not all matter equally. The costliest removal takes about 0.64 of its question's
#   answers here (at least 0.1 on every CPU we tried), because the read-out learned to rely on that head; at least
#   one head can go at almost no cost (1 point or less), because a twin carries its answer — the redundancy Michel
#   et al. found in large models.
# * Removing **every** head of one job wipes out that question's answers, down to about 0.13 for the first token
#   and about 0.06 for the previous token here (under 0.2 on every CPU we tried), and leaves the other question
#   untouched: each relation lives in its own heads, and nowhere else.
#
# The previous token's 0.06 is chance (1/16 ≈ 0.06). The first token's is twice that. Where does the extra come
# from? The same two removals, position by position:

# %% tags=["nbval-ignore-output"]
print("accuracy at positions 1 .. 9, with every head of that question's job removed:")
by_position = {}
for job, question in QUESTION.items():
    removed = tuple(i for i in range(4) if jobs[4, i] == job)
    logits = logits_without(four, removed)[question]  # [2000, SEQ, VOCAB]: the read-out of this job's question
    right = logits.argmax(-1) == (test_first, test_previous)[question]  # [2000, SEQ]
    by_position[job] = right[:, 1:].float().mean(dim=0)  # [9]: positions 1 .. 9
    print(f"   {job + ' question:':<26}" + " ".join(f"{a:.2f}" for a in by_position[job]))
claim_between(by_position["first token"][0].item(), 0.3, None,
              "with every first-token head removed, the first-token question is still answered right more than 0.3 "
              "of the time at position 1, where the first token is also the previous one")
rest = torch.cat([by_position["first token"][1:], by_position["previous token"]])  # every other position
claim_between(rest.max().item(), None, 0.15,
              "everywhere else, a question whose heads are removed stays near chance: under 0.15 at every position")

# %% [markdown]
# The extra is all at position 1, where the first token is also the previous one. There the first-token read-out
# still finds its answer about 0.70 of the time here (over 0.3 on every CPU we tried) in what the previous-token
# heads carry; at every other position both questions are at chance. The favour is not returned: at position 1
# the previous-token read-out does not use what the first-token heads carry, although it is the same token.
#
# Trained language models show the same division of labour on a larger scale: heads that track the neighbouring
# word, heads that follow syntax, heads that link a pronoun to its noun (Voita et al., 2019; Clark et al., 2019),
# and many heads that can go with little loss (Michel et al., 2019).

# %% [markdown]
# ## Summary
#
# * One attention head returns, for each query, **one** weighted average of the values. A query that needs
#   two different things gets them blended into the same coordinates.
# * Multi-head attention runs $h$ heads side by side, like a **bank of filters**; head $i$ has its own
#   $W_i^Q, W_i^K, W_i^V$ and works in $d_k = d_{model}/h$ dimensions.
# * In code the heads share one $d_{model} \times d_{model}$ projection whose output is **split**:
#   `view(batch, seq, heads, d_k).transpose(1, 2)` → `[batch, heads, seq, d_k]`; all heads attend in one
#   batched product; **merge** is `transpose(1, 2).reshape(batch, seq, d_model)`. Viewing without the
#   transpose gives the right shape and the wrong numbers.
# * $W^O$ **mixes** the concatenated heads: $\mathrm{Concat}(\mathrm{head}_i)\,W^O = \sum_i \mathrm{head}_i W^O_i$.
# * A mask of shape `[batch, 1, L_k]` or `[batch, L_q, L_k]` needs a heads dimension, `unsqueeze(1)`, to reach every
#   head of its own sentence; `[L_q, L_k]` broadcasts as it is. Without it, one sentence's mask still happens to be
#   right; with as many sentences as heads, the mask runs silently and lands on the wrong heads.
# * The layer has $4 d_{model}^2 + 4 d_{model}$ parameters for **any** number of heads: the same as one
#   full-width head with $W^O$.
# * Trained on a task with two relations, the heads of a 4-head layer specialised, one relation each (entropies at
#   most about 0.34 here), and answered both questions; a single head blended the two on average (entropy
#   about 0.81, though its split varied from sequence to sequence) and did worse. Switching heads off showed a
#   head the model did not need, and that each relation lived only in its own heads.
#
# ## What's next
#
# In section 7 we gave the model learned position vectors without explaining them, and section 1 used keys that
# were nothing but positions. Attention itself is blind to order (chapter 02, section 8). Chapter 04,
# **positional encoding**, shows how the Transformer tells positions apart: the sinusoidal encoding of the paper,
# learned positions, and relative ones.

# %% [markdown]
# ## Where you stand
#
# Which of this chapter's exercises pass (run their test cells first; a failing one shows its one-line message
# there, and the chapter used the library's version in its place):

# %%
exercise_summary(check_split_heads, check_merge_heads, check_multi_head_attention_forward,
                 check_count_mha_parameters, check_multi_head_attention_layer, check_attention_entropy)

# %% [markdown]
# ## Glossary · 术语表
#
# | English | 中文 | Meaning |
# |---|---|---|
# | multi-head attention | 多头注意力 | $h$ attentions side by side, concatenated and mixed by $W^O$ |
# | attention head | 注意力头 | one attention with its own $W_i^Q, W_i^K, W_i^V$, working in $d_k$ dimensions |
# | head dimension $d_k$ | 每个头的维度 | $d_{model} / h$: the size of each head's queries, keys and values |
# | filter (bank of filters) | 卷积核 / 滤波器 | in a CNN, one pattern detector; many of them side by side, like heads |
# | split heads | 拆头 | `view(batch, seq, h, d_k).transpose(1, 2)`: `[batch, seq, d_model]` → `[batch, h, seq, d_k]` |
# | merge heads / concatenate | 拼接 | the inverse: the heads' outputs side by side again, `[batch, seq, d_model]` |
# | transpose | 转置 | swap two dimensions; changes strides, moves no data |
# | contiguous | 内存连续 | laid out row after row in memory; `view` needs it, `reshape` copies when it's not |
# | broadcasting | 广播 | lining shapes up from the right and stretching size-1 dimensions, as a mask does over the heads |
# | output projection $W^O$ | 输出投影 | the $d_{model} \times d_{model}$ matrix that mixes the concatenated heads |
# | parameter count | 参数量 | $4 d_{model}^2 + 4 d_{model}$ for multi-head attention, whatever $h$ is |
# | entropy (of attention) | （注意力）熵 | $-\sum_j a_j \log a_j$: 0 for a head that looks at one key, $\log n$ for one spread over $n$ |
# | head specialisation | 头的分工 | different heads of a trained model attending to different relations |
# | head pruning | 注意力头剪枝 | switching heads off (their output set to 0) to see which ones the model needs |
# | causal mask | 因果掩码 | position $t$ may attend only to positions $0 \dots t$ |
# | padding mask | 填充掩码 | hides the padding keys of shorter sequences in a batch |
# | cross-attention | 交叉注意力 | queries from one sequence, keys and values from another |
