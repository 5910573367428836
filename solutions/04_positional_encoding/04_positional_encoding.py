# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Chapter 04 — Positional encoding · 位置编码
#
# "我打他" (*I hit him*) and "他打我" (*he hit me*) use the same three characters. Only their order
# differs, and the order is the whole meaning. Section 8 of chapter 02 showed a worrying fact:
# self-attention does not see order. Shuffle the tokens and the outputs are shuffled the same way, nothing
# more. A Transformer built from attention alone reads a sentence as a *bag* of tokens; section 1 below
# measures it again on 我打他.
#
# This chapter puts the order back. The recipe of *Attention Is All You Need* is short: give every
# position a vector and **add** it to the token's embedding. The interesting part is which vectors:
#
# 1. **The problem, measured**: with the library's `MultiHeadAttention`, 我打他 and 他打我 give the
#    same sentence vector.
# 2. **The sinusoidal encoding** of the original paper: sines and cosines at many frequencies.
# 3. **Adding it** to the embeddings, and what that changes for 我打他.
# 4. **Its best property**: moving $k$ positions ahead is one fixed rotation, whatever the position.
# 5. **Dot products** of two encodings depend only on the distance between the positions.
# 6. **Why add and not concatenate.**
# 7. **Learned positions** (BERT, GPT, ViT): a trained table, and its hard limit, `max_len`.
# 8. **Relative positions**: a learned bias per head on the attention scores that depends on $j - i$ only.
# 9. **A comparison** of the three on two small tasks, one needing absolute and one needing relative positions.
#
# Five exercises are autograded: `sinusoidal_table`, `add_positions`, `rotation_for_offset`,
# `relative_position_index` and `relative_position_bias`; together they take about 65 minutes. When an answer is wrong, the test cell tells
# you which common mistake it looks like. Once an exercise passes, the rest of the chapter runs on
# *your* function; until then it runs on the library's, and says so in one line.

# %%
import math

import matplotlib.pyplot as plt
import torch
import torch.nn as nn
import torch.nn.functional as F

from transformer_lib.attention import MultiHeadAttention
from transformer_lib.checks import exercise_summary, yours_or_reference
from transformer_lib.checks.ch04 import (
    check_add_positions,
    check_relative_position_bias,
    check_relative_position_index,
    check_rotation_for_offset,
    check_sinusoidal_table,
)
from transformer_lib.diagrams.ch04 import draw_positions_added, draw_relative_bias_lookup, draw_rotation_circle

torch.manual_seed(0)
torch.set_printoptions(precision=4, sci_mode=False)
torch.set_num_threads(1)  # tiny tensors: one thread is faster, and gives the same float sums as the saved outputs


def below(error: float) -> str:
    """A rounding-level error, as the power of ten just above it (its last digits vary between machines)."""
    return "0" if error == 0 else f"< 1e{math.floor(math.log10(error)) + 1}"

# %% [markdown]
# ## 1. Attention cannot tell 我打他 from 他打我
#
# Take a vocabulary of three characters, give each a random 16-dimensional embedding, and run both
# sentences through one multi-head attention layer (chapter 03). To compare whole sentences we
# **pool** them: the mean of the output vectors is one vector per sentence, a common way to feed a
# sentence classifier.
#
# **Predict** before running: will the two pooled vectors be different, a little different, or identical?
# And what about the output vector of the middle character 打 (*hit*), which stays in the middle in both
# sentences?

# %%
vocab = {"我": 0, "打": 1, "他": 2}  # I / me, hit, he / him
d_model = 16
embed = nn.Embedding(len(vocab), d_model)
mha = MultiHeadAttention(d_model, n_heads=2).eval()

i_hit_him = torch.tensor([[vocab[c] for c in "我打他"]])  # [1, 3]
he_hit_me = torch.tensor([[vocab[c] for c in "他打我"]])  # [1, 3], the same tokens reversed

with torch.no_grad():
    x_a, x_b = embed(i_hit_him), embed(he_hit_me)  # [1, 3, 16] each
    out_a, out_b = mha(x_a, x_a, x_a), mha(x_b, x_b, x_b)  # [1, 3, 16] each

print("pooled 我打他 (first 6 dims):", out_a.mean(dim=1)[0, :6])
print("pooled 他打我 (first 6 dims):", out_b.mean(dim=1)[0, :6])
print("pooled vectors equal (to 1e-6):  ", torch.allclose(out_a.mean(dim=1), out_b.mean(dim=1), atol=1e-6))
print("output of 打 equal in both:       ", torch.allclose(out_a[0, 1], out_b[0, 1], atol=1e-6))
print("outputs of 他打我 = outputs of 我打他 reversed:", torch.allclose(out_b, out_a.flip(1), atol=1e-6))

# %% [markdown]
# Identical. Reversing the input only reverses the outputs (**permutation equivariance**), so anything
# that pools over positions — a mean, a sum, a max — cannot tell the sentences apart. Worse, 打 gets
# exactly the same vector in both: nothing in it says who hits whom. The reason is in the equation:
# the output of token $i$ is $\sum_j a_{ij} v_j$ with $a_{ij}$ computed from the *contents* $x_i$ and
# $x_j$ alone. Nothing in it says where $j$ sits.
#
# The fix used by the Transformer is to make the input vectors themselves carry their position:
# replace $x_i$ by $x_i + p_i$, where $p_i$ is a vector that only depends on the position $i$. Then
# the same character at two different places gets two different vectors, and everything downstream
# can tell them apart.

# %% [markdown]
# ## 2. The sinusoidal encoding
#
# Which vectors $p_0, p_1, p_2, \dots$? The paper (section 3.5) uses sines and cosines. Pair the
# $d_{model}$ dimensions as $(0,1), (2,3), \dots$; pair $i$ gets its own angular frequency
# $\omega_i$, and position $pos$ fills the pair with the sine and cosine of the angle $pos \cdot \omega_i$:
#
# $$PE_{(pos,\,2i)} = \sin\!\left(\frac{pos}{10000^{2i/d_{model}}}\right), \qquad
#   PE_{(pos,\,2i+1)} = \cos\!\left(\frac{pos}{10000^{2i/d_{model}}}\right), \qquad
#   \omega_i = 10000^{-2i/d_{model}}.$$
#
# Picture a clock with $d_{model}/2$ hands. Hand $i$ turns by $\omega_i$ radians per position; its
# (sin, cos) pair is where its tip points. Hand 0 turns by 1 radian per step, a full turn every
# $2\pi \approx 6.3$ positions; each following hand is slower; the last one needs almost
# $10000 \cdot 2\pi$ positions for one turn. The fast hands tell neighbouring positions apart, the
# slow ones tell far-apart positions apart, and together the hands never show the same time twice in
# any sequence we care about. (A binary counter works in a similar way: its last bit flips every step, the
# next every two steps, each bit half as fast as the one before. Here each hand is slower than the one before by
# the fixed factor $10000^{2/d_{model}}$ rather than 2, and it turns smoothly where a bit jumps.)
#
# Two more properties make this choice attractive: every entry lies in $[-1, 1]$, whatever the
# position, and the table has no parameters: it is computed, so it exists for any length.

# %% [markdown]
# ### Exercise 1 — `sinusoidal_table`
# > **Difficulty** ●●○ · **Importance** ●●● · about 20 minutes
#
# Write `sinusoidal_table(max_len, d_model)` returning the table `PE` of shape `[max_len, d_model]`,
# float32, row `pos` being the encoding of position `pos` (`d_model` is even).
#
# Worked example: `sinusoidal_table(3, 4)` has $\omega = [1, 0.01]$, so its row 1 is
# $[\sin 1, \cos 1, \sin 0.01, \cos 0.01] \approx [0.8415, 0.5403, 0.0100, 0.9999]$, and row 0 is
# $[0, 1, 0, 1]$ (as row 0 is for every `d_model`).
#
# A common slip, seen in many code snippets online: a loop over the dimension index `dim` with
# `10000 ** (2 * dim / d_model)`. There `dim` is already the even dimension (0, 2, 4, … for the sines),
# so the 2 is counted twice and every frequency but the first is wrong. The exponent is
# (even dimension index) / `d_model`, that is $2i/d_{model}$ with $i$ the *pair* index.
#
# <details><summary>Hint 1 — the idea</summary>Every entry is the sine or the cosine of one angle, position times frequency. Build all the angles at once as an outer product: the positions as a column <code>[max_len, 1]</code> times the frequencies as a row <code>[1, d_model/2]</code>. Then the sines go into the even columns of the table and the cosines into the odd columns.</details>
# <details><summary>Hint 2 — the plan</summary>Three tensors. The frequencies, <code>[d_model/2]</code>: the even numbers 0, 2, 4, … below <code>d_model</code> are already the $2i$ of the formula. The angles, <code>[max_len, d_model/2]</code>, computed in float64 so that large positions stay accurate. A table of zeros, <code>[max_len, d_model]</code>: the columns taken with step 2 from column 0 receive the sines, those taken with step 2 from column 1 the cosines. Return the table as float32.</details>
# <details><summary>Hint 3 — the key step</summary>Two toys. A slice with a step takes every second entry from a start:
# after <code>v = torch.zeros(6)</code> and <code>v[1::2] = torch.tensor([7, 8, 9])</code>, <code>v</code> is <code>[0,
# 7, 0, 8, 0, 9]</code>. An outer product by broadcasting: a column of shape <code>[3, 1]</code> times a row of shape
# <code>[1, 2]</code> is a <code>[3, 2]</code> table. Which dtype must the positions and the frequencies have before
# they meet?</details>

# %% nbgrader={"grade": false, "grade_id": "sinusoidal_table", "locked": false, "schema_version": 3, "solution": true, "task": false}
def sinusoidal_table(max_len: int, d_model: int) -> torch.Tensor:
    """The sinusoidal positional encoding: row pos is the vector of position pos.

    Returns [max_len, d_model], float32: PE[pos, 2i] = sin(pos * w_i), PE[pos, 2i+1] = cos(pos * w_i),
    with w_i = 10000^(-2i / d_model).
    """
    ### BEGIN SOLUTION
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)  # [d/2]: 0, 2, 4, ...
    omega = 10000.0 ** (-two_i / d_model)  # [d/2]
    angle = torch.arange(max_len, dtype=torch.float64)[:, None] * omega  # [max_len, d/2]
    pe = torch.zeros(max_len, d_model, dtype=torch.float64)
    pe[:, 0::2] = angle.sin()  # even dims
    pe[:, 1::2] = angle.cos()  # odd dims, the same frequency as the sine before them
    return pe.float()
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "sinusoidal_table_test", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false} tags=["raises-exception"]
check_sinusoidal_table(sinusoidal_table)
### BEGIN HIDDEN TESTS
check_sinusoidal_table(sinusoidal_table, hidden=True)
### END HIDDEN TESTS

# %%
sinusoidal_table_impl = yours_or_reference(sinusoidal_table, check_sinusoidal_table)

# %% [markdown]
# The worked example, and the wavelength ($2\pi / \omega_i$, positions per full turn) of the fastest
# and the slowest pair for the paper's $d_{model} = 512$:

# %%
from transformer_lib.positional import sinusoidal_frequencies

print("sinusoidal_table(3, 4) =\n", sinusoidal_table_impl(3, 4))
wavelength = 2 * math.pi / sinusoidal_frequencies(512)  # [256]
print(f"d_model = 512: fastest pair turns every {wavelength[0]:.2f} positions, slowest every {wavelength[-1]:,.0f}")

# %% [markdown]
# The table as a picture: positions down, dimensions across (left). On the right, a few dimensions
# followed along the positions. Dimensions 0 and 1 are the sine and cosine of the fastest hand; the
# further right a dimension, the slower it moves, until the last columns look constant: over 100
# positions their hands have barely started to turn.

# %%
pe_picture = sinusoidal_table_impl(100, 64)  # [100, 64]
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(8, 3.6))
im = ax1.imshow(pe_picture, cmap="RdBu", vmin=-1, vmax=1, aspect="auto")
ax1.set_xlabel("dimension")
ax1.set_ylabel("position")
ax1.set_title("PE, 100 positions x 64 dims")
fig.colorbar(im, ax=ax1, fraction=0.046)
for dim in [0, 1, 10, 30]:
    ax2.plot(pe_picture[:, dim], label=f"dim {dim}")
ax2.set_xlabel("position")
ax2.set_ylabel("value")
ax2.set_title("a few dimensions")
ax2.legend(fontsize=7, loc="lower left")
fig.tight_layout()
plt.show()

# %% [markdown]
# ## 3. Adding positions to the embeddings
#
# The encoder's input is the token embedding plus the position vector, row by row:
# $x_{pos} + PE_{pos}$. In a batch, every sentence gets the same rows $PE_0, PE_1, \dots$, so the
# table broadcasts over the batch.
#
# One detail matters later (chapter 07): a decoder that generates text feeds its tokens one at a time,
# and the new token is not at position 0 but at position *offset* = the number of tokens already
# generated. So the function takes an `offset`: the rows added are $PE_{offset}, \dots, PE_{offset + seq - 1}$.
#
# The picture below is the whole idea, drawn for a five-token sentence with 6 dimensions (colours: red
# negative, blue positive). Each token's embedding is looked up by *what* the token is, each position
# vector by *where* it stands. "the" appears twice: one embedding, two different sums.

# %%
draw_positions_added()
plt.show()

# %% [markdown]
# ### Exercise 2 — `add_positions`
# > **Difficulty** ●○○ · **Importance** ●●● · about 5 minutes
#
# Write `add_positions(x, pe, offset=0)`.
#
# * `x`: `[batch, seq, d_model]` token embeddings; `pe`: `[max_len, d_model]` a table of position vectors
#   (sinusoidal or learned, it doesn't matter here); `offset`: the position of the first token.
# * returns `[batch, seq, d_model]`: `x[b, t] + pe[offset + t]` for every sentence `b` and token `t`,
#   in `x`'s dtype.
#
# Worked example: with `x = torch.zeros(1, 2, 4)`, `pe = sinusoidal_table(5, 4)` and `offset=3`, the
# result holds rows 3 and 4 of the table.
#
# (The library's version also raises a `ValueError` when `offset + seq` runs past the table; the
# checker doesn't ask you for that.)
#
# <details><summary>Hint 1 — the idea</summary>You need <code>seq</code> consecutive rows of the table, one per token, starting at row <code>offset</code>; every sentence of the batch gets the same rows. The sequence length is the second entry of <code>x.shape</code>: the first is the batch size.</details>
# <details><summary>Hint 2 — the plan</summary>A slice of the table, <code>[seq, d_model]</code>, added to <code>x</code>, <code>[batch, seq, d_model]</code>, broadcasts over the batch by itself. Convert the slice to the dtype of <code>x</code> first, so that a float64 <code>x</code> stays float64.</details>
# <details><summary>Hint 3 — the key step</summary>The question that unlocks it: with <code>offset</code> = 3 and
# sentences of 4 tokens, which rows of the table do the tokens get? Rows 3, 4, 5 and 6. A slice's end is excluded, so
# where does it end? Then the page to read for the dtype: torch.Tensor.to.</details>

# %% nbgrader={"grade": false, "grade_id": "add_positions", "locked": false, "schema_version": 3, "solution": true, "task": false}
def add_positions(x: torch.Tensor, pe: torch.Tensor, offset: int = 0) -> torch.Tensor:
    """Token embeddings plus the vectors of their positions offset, offset+1, ...

    x: [batch, seq, d_model]; pe: [max_len, d_model]. Returns [batch, seq, d_model] in x's dtype.
    """
    ### BEGIN SOLUTION
    seq = x.shape[1]
    rows = pe[offset : offset + seq]  # [seq, d_model]: positions offset .. offset + seq - 1
    return x + rows.to(x.dtype)  # broadcast over the batch
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "add_positions_test", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false} tags=["raises-exception"]
check_add_positions(add_positions)
### BEGIN HIDDEN TESTS
check_add_positions(add_positions, hidden=True)
### END HIDDEN TESTS

# %%
add_positions_impl = yours_or_reference(add_positions, check_add_positions)

# %% [markdown]
# The worked example first. Then the library's module, `SinusoidalPositionalEncoding(d_model, max_len)`,
# which keeps the table as a *buffer* (it moves to the GPU with the model but is never trained) and adds
# it in `forward(x, offset=0)`. Its table has `max_len` rows; a longer input is refused with a message
# naming the limit, instead of a shape error deep inside:

# %%
from transformer_lib.positional import SinusoidalPositionalEncoding

print("worked example:\n", add_positions_impl(torch.zeros(1, 2, 4), sinusoidal_table_impl(5, 4), offset=3))

positions = SinusoidalPositionalEncoding(d_model, max_len=50)
print("trainable parameters:", sum(p.numel() for p in positions.parameters()))
try:
    positions(torch.zeros(1, 60, d_model))
except ValueError as error:
    print("ValueError:", error)

# %% [markdown]
# Back to 我打他. **Predict**: with the positions added before the attention layer (same embeddings,
# same layer as in section 1), are the two pooled vectors still equal?

# %%
pe_small = sinusoidal_table_impl(50, d_model)  # [50, 16]
with torch.no_grad():
    y_a, y_b = add_positions_impl(x_a, pe_small), add_positions_impl(x_b, pe_small)  # [1, 3, 16]: embedding + position
    pos_out_a, pos_out_b = mha(y_a, y_a, y_a), mha(y_b, y_b, y_b)

pooled_a, pooled_b = pos_out_a.mean(dim=1), pos_out_b.mean(dim=1)
print("pooled 我打他 (first 6 dims):", pooled_a[0, :6])
print("pooled 他打我 (first 6 dims):", pooled_b[0, :6])
print(f"largest difference between the pooled vectors: {(pooled_a - pooled_b).abs().max():.4f}")
print(f"largest difference between the two outputs of 打: {(pos_out_a[0, 1] - pos_out_b[0, 1]).abs().max():.4f}")

# %% [markdown]
# Now they differ: 我 at position 0 and 我 at position 2 are different input vectors, so the attention
# scores, the mixtures and the pooled vector change. The layer is untrained, so the difference means
# nothing yet; what matters is that a model *can* now learn that the character before 打 is the one
# who hits.

# %% [markdown]
# ## 4. Moving k positions is a rotation, the same at every position
#
# Why sines and cosines, and why in pairs? Because of the angle-addition formulas. For one pair with
# frequency $\omega$, write $a = pos\cdot\omega$ and $b = k\cdot\omega$:
#
# $$\sin(a + b) = \cos b \,\sin a + \sin b\, \cos a, \qquad \cos(a + b) = -\sin b\, \sin a + \cos b\, \cos a.$$
#
# In matrix form, the pair at position $pos + k$ is a 2×2 rotation of the pair at position $pos$:
#
# $$\begin{pmatrix} \sin((pos+k)\omega) \\ \cos((pos+k)\omega) \end{pmatrix} =
#   \begin{pmatrix} \cos k\omega & \sin k\omega \\ -\sin k\omega & \cos k\omega \end{pmatrix}
#   \begin{pmatrix} \sin(pos\,\omega) \\ \cos(pos\,\omega) \end{pmatrix}.$$
#
# The matrix contains $k$ but **not** $pos$. Stack one such block per pair on the diagonal and you get
# a matrix $M_k$ with $PE_{pos+k} = M_k\, PE_{pos}$ for every position at once. This is the property
# the paper had in mind ("for any fixed offset $k$, $PE_{pos+k}$ can be represented as a linear
# function of $PE_{pos}$"), and the reason it expected the model to "easily learn to attend by
# relative positions": "three positions further on" is one linear map, something a layer's weight
# matrices can represent, instead of a different thing at every position.
#
# The picture: each pair of dimensions is a point on the unit circle (its sine across, its cosine up),
# one point per position. Moving $k = 2$ positions turns the point by the angle $2\omega_i$, and the red
# arc (from position 1) and the blue arc (from position 4) have the same length: the turn does not depend
# on where you start. The fast pair 0 turns 2 radians, the slower pair 1 only 0.63.

# %%
draw_rotation_circle(k=2, d_model=16, pairs=(0, 1))
plt.show()
omega = sinusoidal_frequencies(16)  # [8]: the frequency of each pair, for d_model = 16
print("turn for k = 2:", ",  ".join(f"pair {i} by 2 x {omega[i]:.4f} = {2 * omega[i]:.2f} rad" for i in (0, 1)))

# %% [markdown]
# ### Exercise 3 — `rotation_for_offset`
# > **Difficulty** ●●● · **Importance** ●●○ · about 20 minutes
#
# Write `rotation_for_offset(k, d_model)` returning $M_k$, a float32 `[d_model, d_model]` matrix, zero
# except for the 2×2 blocks on the diagonal: block $i$ (rows and columns $2i, 2i+1$) is
# $\begin{pmatrix} \cos k\omega_i & \sin k\omega_i \\ -\sin k\omega_i & \cos k\omega_i \end{pmatrix}$ with
# $\omega_i = 10000^{-2i/d_{model}}$. `k` is an integer, possibly negative or zero.
#
# With the table's rows as row vectors, the property reads `pe[pos + k] == pe[pos] @ M.T`.
#
# Worked example: `rotation_for_offset(1, 2)` is $\begin{pmatrix} \cos 1 & \sin 1 \\ -\sin 1 & \cos 1\end{pmatrix}
# \approx \begin{pmatrix} 0.5403 & 0.8415 \\ -0.8415 & 0.5403 \end{pmatrix}$.
#
# <details><summary>Hint 1 — the idea</summary>Compute the angles, the offset k times each pair's frequency (the same frequencies as in exercise 1, <code>[d_model/2]</code>), and their cosines and sines. Block i needs those two numbers in its four places: the cosine on its diagonal, the sine above it, minus the sine below it. A Python loop over the pairs that fills one 2×2 block at a time is a fine way to start.</details>
# <details><summary>Hint 2 — the plan</summary>Without a loop: start from a zero matrix <code>[d_model, d_model]</code>, in float64. Taking every second row and every second column, both starting at 0, gives a <code>[d_model/2, d_model/2]</code> grid of the top-left entries of all the blocks, and block i's top-left entry sits on that grid's diagonal, at (i, i). The same holds for the other three kinds of entry (even row and odd column, odd row and even column, odd row and odd column). So each kind is one diagonal matrix written into one strided slice. Return float32.</details>
# <details><summary>Hint 3 — the key step</summary>The question that unlocks it: in a 4 × 4 matrix, where are the
# bottom-left entries of its two 2 × 2 blocks? At (1, 0) and (3, 2): the rows from 1 with step 2 crossed with the
# columns from 0 with step 2, and in that 2 × 2 grid they are the diagonal. A diagonal matrix written into that strided
# slice fills exactly them (the page to read: torch.diag). Which of the four kinds of entry gets minus the
# sine?</details>

# %% nbgrader={"grade": false, "grade_id": "rotation_for_offset", "locked": false, "schema_version": 3, "solution": true, "task": false}
def rotation_for_offset(k: int, d_model: int) -> torch.Tensor:
    """M_k with PE[pos + k] = M_k @ PE[pos] for every pos: one 2x2 rotation by k * w_i per pair.

    Returns [d_model, d_model], float32.
    """
    ### BEGIN SOLUTION
    omega = 10000.0 ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)  # [d/2]
    angle = k * omega  # [d/2]: how far each hand turns in k steps
    cos, sin = angle.cos(), angle.sin()
    m = torch.zeros(d_model, d_model, dtype=torch.float64)
    m[0::2, 0::2] = torch.diag(cos)  # new sine   =  cos(kw) sin + sin(kw) cos
    m[0::2, 1::2] = torch.diag(sin)
    m[1::2, 0::2] = torch.diag(-sin)  # new cosine = -sin(kw) sin + cos(kw) cos
    m[1::2, 1::2] = torch.diag(cos)
    return m.float()
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "rotation_for_offset_test", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false} tags=["raises-exception"]
check_rotation_for_offset(rotation_for_offset)
### BEGIN HIDDEN TESTS
check_rotation_for_offset(rotation_for_offset, hidden=True)
### END HIDDEN TESTS

# %%
rotation_for_offset_impl = yours_or_reference(rotation_for_offset, check_rotation_for_offset)

# %% [markdown]
# Now check the property on a whole table: for several offsets $k$, apply the single matrix $M_k$ to
# *every* position and compare with the table $k$ rows further down. With your float32 table and matrix
# the error is float32 rounding, below $10^{-6}$. The library's versions of the two functions take a
# `dtype`; in float64 the error left is below $10^{-13}$: the property is exact, only rounding remains.

# %%
from transformer_lib.positional import offset_rotation, sinusoidal_encoding

max_len, d_pe = 500, 64
tables = {
    "float32, your functions": (sinusoidal_table_impl(max_len, d_pe), lambda k: rotation_for_offset_impl(k, d_pe)),
    "float64, the library": (sinusoidal_encoding(max_len, d_pe, dtype=torch.float64),
                             lambda k: offset_rotation(k, d_pe, dtype=torch.float64)),
}
for label, (pe, rotation) in tables.items():  # pe: [500, 64]
    for k in (1, 5, 50, 200):
        m_k = rotation(k)  # [64, 64]
        error = (pe[: max_len - k] @ m_k.T - pe[k:]).abs().max()  # all positions pos = 0 .. 499 - k at once
        print(f"{label:>23}, k = {k:>3}: max over {max_len - k} positions of |M_k PE[pos] - PE[pos+k]| {below(error)}")

# %% [markdown]
# A second way to see it, without the formula: **learn** the matrix. Take a free $d \times d$ matrix and
# fit it by least squares so that it maps $PE_{pos}$ to $PE_{pos+k}$ on 100 randomly chosen positions
# only. If the property holds, the fitted matrix must be $M_k$, and it must work on all the positions
# it never saw. (The 100 positions are spread over 2000, so that even the slowest hand turns enough
# to pin down its block; over a short stretch the slow pairs look constant and their blocks are not
# determined.)

# %%
gen = torch.Generator().manual_seed(4)
max_len, d_fit, k = 2000, 16, 5
pe = sinusoidal_table_impl(max_len, d_fit).double()  # [2000, 16]
order = torch.randperm(max_len - k, generator=gen)
fit_pos, other_pos = order[:100], order[100:]
m_fit_t = torch.linalg.lstsq(pe[fit_pos], pe[fit_pos + k]).solution  # [16, 16]: pe[fit] @ m_fit_t ~ pe[fit + k]
m_k = rotation_for_offset_impl(k, d_fit).double()
print(f"fitted on 100 positions; largest |fitted - M_k| entry:        {below((m_fit_t.T - m_k).abs().max())}")
print(f"checked on the other {len(other_pos)} positions: largest error {below((pe[other_pos] @ m_fit_t - pe[other_pos + k]).abs().max())}")

# %% [markdown]
# The matrix itself, for $d_{model} = 16$ and $k = 5$: eight 2×2 rotations on the diagonal. The first
# block turns by 5 radians, the last ones hardly at all (they are nearly the identity).

# %%
fig, ax = plt.subplots(figsize=(4, 3.4))
im = ax.imshow(m_k, cmap="RdBu", vmin=-1, vmax=1)
ax.set_title("M_k for k = 5, d_model = 16")
ax.set_xlabel("column")
ax.set_ylabel("row")
fig.colorbar(im, ax=ax, fraction=0.046)
fig.tight_layout()
plt.show()

# %% [markdown]
# ## 5. Dot products depend only on the distance
#
# Attention compares vectors with dot products, so look at $PE_{i} \cdot PE_{j}$. Pair by pair,
# $\sin a \sin b + \cos a \cos b = \cos(a - b)$, hence
#
# $$PE_i \cdot PE_j = \sum_{m=0}^{d_{model}/2 - 1} \cos\big((i - j)\,\omega_m\big),$$
#
# a function of $i - j$ alone. And since cosine is even, of $|i - j|$ alone: the dot product knows how
# far apart two positions are, not which one comes first. (The learned $W^Q$ and $W^K$ can break that
# symmetry: $PE_i^\top W PE_j$ with $W$ close to some $M_k$ peaks at one signed offset.) **Predict**: on
# a heatmap of $PE\,PE^\top$, what shape will lines of equal value have?

# %%
pe = sinusoidal_table_impl(64, 64).double()  # [64, 64]
gram = pe @ pe.T  # [64, 64]: PE_i . PE_j
offset = torch.arange(64)[:, None] - torch.arange(64)[None, :]  # [64, 64]: i - j
formula = torch.cos(offset[..., None] * sinusoidal_frequencies(64)).sum(-1)  # sum_m cos((i-j) w_m)
print(f"max |PE_i . PE_j - sum_m cos((i-j) w_m)| over all i, j: {below((gram - formula).abs().max())}")
print(f"PE_20 . PE_23 = {gram[20, 23]:.4f},  PE_20 . PE_17 = {gram[20, 17]:.4f},  PE_40 . PE_43 = {gram[40, 43]:.4f}")
print(f"PE_i . PE_i = {gram[0, 0]:.1f} = d_model / 2")

fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(8, 3.4))
im = ax1.imshow(gram, cmap="viridis")
ax1.set_xlabel("position j")
ax1.set_ylabel("position i")
ax1.set_title("PE_i . PE_j")
fig.colorbar(im, ax=ax1, fraction=0.046)
for i, style in ((10, "o-"), (30, "x--")):
    ax2.plot(range(-10, 31), [gram[i, i + k].item() for k in range(-10, 31)], style, markersize=4, label=f"i = {i}")
ax2.set_xlabel("offset k")
ax2.set_title("PE_i . PE_(i+k): the same from every i")
ax2.legend()
fig.tight_layout()
plt.show()

# %% [markdown]
# Lines of equal value are the diagonals: the matrix is constant along every diagonal (a *Toeplitz*
# matrix), and the two curves on the right, taken from positions 10 and 30, lie on top of each other.
# The similarity is largest at distance 0 and falls off, with ripples, as positions move apart, with no
# dependence on where in the sentence the pair sits.

# %% [markdown]
# ## 6. Why add, not concatenate?
#
# Adding a position vector to a word vector looks like it mixes two unrelated things. Concatenating,
# $[x \,|\, p]$, would keep them apart. The paper (section 3.5) sums them and gives no reason for summing rather
# than concatenating; the three observations below are this course's case for it.
#
# **Concatenation costs width.** Every layer's matrices grow with the square of the width. With
# $d_{model} = 512$ for the words, concatenating 512 position dimensions doubles the width; even 64
# extra dimensions cost over a quarter more per attention layer:

# %%
def n_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


base_count = n_params(MultiHeadAttention(512, 8))
for width in (512, 512 + 64, 512 + 512):
    count = n_params(MultiHeadAttention(width, 8))
    print(f"width {width:>4}: one MultiHeadAttention layer has {count:>9,} parameters ({count / base_count:.2f} x)")

# %% [markdown]
# **Concatenation followed by a linear map *is* an addition.** The first thing a layer does with its
# input is multiply it by a matrix ($W^Q$, $W^K$, $W^V$). Split that matrix into the rows that meet $x$
# and the rows that meet $p$: $[x \,|\, p]\,W = x\,W_x + p\,W_p$. So concatenating amounts to adding a
# *projected* position vector. Adding directly forces $W_x = W_p$, and the next observation says why
# that costs little:

# %%
gen = torch.Generator().manual_seed(6)
x_word, p_pos = torch.randn(5, 8, generator=gen), torch.randn(5, 3, generator=gen)  # 8 word dims, 3 position dims
w = torch.randn(8 + 3, 4, generator=gen)  # a layer's matrix acting on the concatenation
concatenated = torch.cat([x_word, p_pos], dim=-1) @ w  # [5, 4]
added = x_word @ w[:8] + p_pos @ w[8:]  # the same as adding a projected position vector
print(f"max |[x|p] W - (x W_x + p W_p)| {below((concatenated - added).abs().max())}   (float32 rounding)")

# %% [markdown]
# **In high dimension, random directions are nearly orthogonal.** Word embeddings start random; the
# positional vectors of a sentence's positions fill only a small part of the space. Below: the cosine
# between 1000 random word vectors and the encodings of 100 positions, for growing $d_{model}$, then how
# many directions hold 99% of the 100 position vectors' energy (their principal components), and what
# share of a random word vector's energy falls into those directions.

# %%
gen = torch.Generator().manual_seed(7)
print(f"{'d_model':>7} | {'mean |cos|':>10} {'max |cos|':>9} | {'dirs for 99% of PE':>18} | {'word energy in them':>19}")
for d in (8, 64, 512):
    words = torch.randn(1000, d, generator=gen, dtype=torch.float64)  # random embeddings, N(0, 1) entries
    pe = sinusoidal_table_impl(100, d).double()  # [100, d]
    cos = F.normalize(words, dim=-1) @ F.normalize(pe, dim=-1).T  # [1000, 100]
    _, s, vh = torch.linalg.svd(pe, full_matrices=False)
    r = int(((s**2).cumsum(0) / (s**2).sum() < 0.99).sum()) + 1  # directions for 99% of the energy
    share = ((words @ vh[:r].T) ** 2).sum(-1) / (words**2).sum(-1)  # [1000]: energy of each word in those directions
    print(f"{d:>7} | {cos.abs().mean():>10.3f} {cos.abs().max():>9.3f} | {r:>18} | {share.mean():>19.3f}")

# %% [markdown]
# In 8 dimensions a word vector and a position vector can be strongly aligned (the largest |cos| is near 1),
# and positions use most of the space. In 512 dimensions the typical |cos| is 0.036, and 100
# positions live, to 99%, in about 30 directions that carry only about 6% of a random word vector's
# energy. The sum $x + p$ then keeps both readable: a projection onto those few directions mostly sees
# the position, a projection onto the rest mostly sees the word. Addition is almost a concatenation
# that the model gets for free.
#
# One more detail, for chapter 08: the paper multiplies the embeddings by $\sqrt{d_{model}}$ before adding the
# positions (Vaswani et al., 2017, section 3.4), and does not say why. This course reads it as a balance, so that
# words with small initial embeddings are not drowned by position vectors whose entries are of size 1; chapter 08
# measures when that balance holds and when it does not.

# %% [markdown]
# ## 7. Learned absolute positions
#
# The paper also tried the simplest alternative: a table of position vectors *learned* like word
# embeddings, one trainable row per position, and found "nearly identical results". BERT, GPT-2 and
# ViT use learned positions. The library's `LearnedPositionalEmbedding(d_model, max_len)` holds an
# `nn.Embedding(max_len, d_model)` initialised with small random values (standard deviation 0.02) and
# adds its rows with the same `add_positions` as the sinusoidal module.
#
# A learned table costs `max_len * d_model` parameters, and it has a hard limit: there is no row for
# position `max_len`. A sinusoidal table can be computed for any length.
#
# To see a learned table do its job, we need a task that cannot be solved without positions. **Reversing**
# a sequence is one: the output at position $i$ must be the token at position $L-1-i$. The model
# below is as small as it gets: token embedding, positions, *one* multi-head attention layer, and a
# linear read-out that names the token each output vector carries. Each position must learn to attend
# to its mirror position.

# %%
from transformer_lib.positional import LearnedPositionalEmbedding, RelativePositionBias

VOCAB, D_TINY, HEADS = 12, 32, 2


class TinyAttentionModel(nn.Module):
    """Embedding, positions of one kind, one attention layer, a linear read-out to the vocabulary."""

    def __init__(self, kind: str, max_len: int, max_distance: int = 8):
        super().__init__()
        self.kind = kind
        self.embed = nn.Embedding(VOCAB, D_TINY)
        if kind == "learned":
            self.positions = LearnedPositionalEmbedding(D_TINY, max_len)
        elif kind == "sinusoidal":
            self.register_buffer("pe", sinusoidal_table_impl(1000, D_TINY))  # [1000, d]: fixed, never trained
        elif kind == "relative":
            self.relative = RelativePositionBias(HEADS, max_distance)
        self.attn = MultiHeadAttention(D_TINY, HEADS)
        self.readout = nn.Linear(D_TINY, VOCAB)

    def forward(self, tokens: torch.Tensor, need_weights: bool = False) -> torch.Tensor:
        x = self.embed(tokens)  # [batch, L, d]
        length, bias = tokens.shape[1], None
        if self.kind == "learned":
            x = self.positions(x)  # absolute: added to the input (the library's module refuses L > max_len)
        elif self.kind == "sinusoidal":
            x = add_positions_impl(x, self.pe)  # absolute: added to the input
        elif self.kind == "relative":
            bias = relative_position_bias_impl(self.relative.table, length, length)  # [heads, L, L], added to the scores
        return self.readout(self.attn(x, x, x, bias=bias, need_weights=need_weights))  # [batch, L, VOCAB]


def make_batch(task: str, n: int, length: int, gen: torch.Generator):
    """Random token sequences and their targets; -100 marks positions without a target."""
    tokens = torch.randint(VOCAB, (n, length), generator=gen)  # [n, L]
    if task == "reverse":
        targets = tokens.flip(1)  # position i must output the token at L-1-i
    else:  # "previous": position i must output the token at i-1
        targets = tokens.roll(1, dims=1)
        targets[:, 0] = -100  # the first position has no previous token
    return tokens, targets


def train_model(kind: str, task: str, length: int, steps: int = 200, seed: int = 0) -> TinyAttentionModel:
    torch.manual_seed(seed)
    model = TinyAttentionModel(kind, max_len=length)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(seed + 1)
    for _ in range(steps):
        tokens, targets = make_batch(task, 64, length, gen)
        loss = F.cross_entropy(model(tokens).reshape(-1, VOCAB), targets.reshape(-1), ignore_index=-100)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model


@torch.no_grad()
def accuracy(model: TinyAttentionModel, task: str, length: int):
    """Share of correct tokens on 500 fresh sequences, or the error if the model cannot take that length."""
    tokens, targets = make_batch(task, 500, length, torch.Generator().manual_seed(123))
    try:
        predicted = model(tokens).argmax(-1)  # [500, L]
    except ValueError as error:
        return error
    scored = targets != -100
    return ((predicted == targets) & scored).sum().item() / scored.sum().item()


# %% [markdown]
# **Predict**: the model starts with random position vectors. What accuracy will it have before any
# training (there are 12 symbols)? And after 200 small training steps?

# %%
untrained = train_model("learned", "reverse", length=8, steps=0)  # same initialisation, no training
trained = train_model("learned", "reverse", length=8, steps=200)
print(f"reverse, length 8, learned positions: untrained accuracy {accuracy(untrained, 'reverse', 8):.3f}, "
      f"after 200 steps {accuracy(trained, 'reverse', 8):.3f}   (chance: {1 / VOCAB:.3f})")
print("position parameters:", n_params(trained.positions), "= max_len x d_model =", 8 * D_TINY)

# %% [markdown]
# The attention weights show what was learned: before training each position spreads its attention over
# everything; after training, position $i$ looks at position $7 - i$, the anti-diagonal.

# %%
tokens, _ = make_batch("reverse", 1, 8, torch.Generator().manual_seed(9))
fig, axes = plt.subplots(1, 2, figsize=(7, 3.3))
for ax, model, title in zip(axes, (untrained, trained), ("untrained", "after 200 steps")):
    with torch.no_grad():
        model(tokens, need_weights=True)
    im = ax.imshow(model.attn.last_weights[0].mean(0), cmap="Blues", vmin=0, vmax=1)  # mean over heads
    ax.set_title(title)
    ax.set_xlabel("key position")
    ax.set_ylabel("query position")
fig.colorbar(im, ax=axes, fraction=0.03)
plt.show()

# %% [markdown]
# And the limit. This model was built with `max_len = 8`; a sequence of 9 tokens has a position with no
# row in the table. The sinusoidal formula has no such limit: its table can be computed for any length, with
# nothing to train (this model computes 1000 rows; the library's module of section 3 refuses inputs longer than
# the `max_len` it was built with, but a larger `max_len` costs no training). Whether the model still gives *good*
# answers at unseen lengths is another question, answered in section 9:

# %%
longer = torch.randint(VOCAB, (1, 9), generator=torch.Generator().manual_seed(10))
try:
    trained(longer)
except ValueError as error:
    print("learned, 9 tokens -> ValueError:", error)
sinusoidal_model = train_model("sinusoidal", "reverse", length=8, steps=0)
print("sinusoidal, 9 tokens -> output of shape", tuple(sinusoidal_model(longer).shape))

# %% [markdown]
# ## 8. Relative positions
#
# Often what matters is not "word number 17" but "the word just before me" or "three words to the
# left". **Relative** position methods encode exactly that: they leave the input alone and act inside
# attention, on the pair (query $i$, key $j$), through the offset $j - i$ alone. (Prince, *Understanding
# Deep Learning*, section 12.3, surveys absolute and relative encodings.) Two published forms:
#
# * **Shaw et al. (2018)**, "Self-Attention with Relative Position Representations", learn a *vector*
#   $a^K_{j-i}$ per clipped offset and add it to the key inside the score,
#   $e_{ij} = q_i \cdot (k_j + a^K_{j-i}) / \sqrt{d_k}$, and a second vector $a^V_{j-i}$ to the value in
#   the weighted sum, $z_i = \sum_j a_{ij} (v_j + a^V_{j-i})$. Offsets beyond a maximum distance $D$
#   share the vector of $\pm D$ (clipping).
# * **T5** (Raffel et al., 2020, section 2.1) adds a learned *scalar* per head to each score: $b^{(h)}$ of the
#   offset's bucket. The buckets are exact for small offsets and logarithmically wider for large ones, up to
#   128. T5 shares the table across its layers (the paper says across the whole model; the released code keeps
#   one table for the encoder and one for the decoder), and within a layer each head has its own biases.
#
# This chapter builds the scalar form, a **relative position bias**, with Shaw's simple clipping in place
# of T5's logarithmic buckets. For head $h$,
#
# $$\mathrm{score}^{(h)}_{ij} = \frac{q_i \cdot k_j}{\sqrt{d_k}} + b^{(h)}_{\,\mathrm{clip}(j - i,\; -D,\; D)}.$$
#
# Each head's table has $2D + 1$ entries, whatever the sequence length, and $b$ depends on $j - i$ only:
# the same bias at position 3 and at position 3000. Two exercises build it: first the index of every
# (query, key) pair's clipped offset in the table, then the lookup that turns a table into a bias matrix.
#
# (Prince's section 12.3 also lists variants of absolute encodings: added at every layer instead of only
# at the input, or added to the queries and keys but not to the values.)

# %% [markdown]
# ### Exercise 4 — `relative_position_index`
# > **Difficulty** ●●○ · **Importance** ●●○ · about 10 minutes
#
# Write `relative_position_index(q_len, k_len, max_distance)` returning an integer (`torch.long`) tensor
# `[q_len, k_len]` whose entry `[i, j]` is $\mathrm{clip}(j - i, -D, D) + D$ with $D$ = `max_distance`:
# 0 means "$D$ or more positions to the left", $D$ means "the same position", $2D$ "$D$ or more to the right".
# Queries and keys are both numbered from 0.
#
# Worked example: `relative_position_index(4, 4, 2)` is
# ```
# [[2, 3, 4, 4],
#  [1, 2, 3, 4],
#  [0, 1, 2, 3],
#  [0, 0, 1, 2]]
# ```
#
# <details><summary>Hint 1 — the idea</summary>Three steps: the offset <code>j - i</code> of every (query, key) pair, then clip it to the range from <code>-D</code> to <code>D</code>, then shift it up by <code>D</code> so that it becomes a valid index 0 … 2D.</details>
# <details><summary>Hint 2 — the plan</summary>Broadcasting builds all the offsets at once: the key positions as a row <code>[1, k_len]</code> minus the query positions as a column <code>[q_len, 1]</code> is the <code>[q_len, k_len]</code> matrix of <code>j - i</code>. Clip it with both bounds (tensors have a <code>clamp</code> method), then add <code>D</code>. Integer ranges are int64 already.</details>
# <details><summary>Hint 3 — the key step</summary>Work a toy by hand, <code>q_len = k_len = 3</code> and <code>D =
# 1</code>: the offsets are <code>[[0, 1, 2], [-1, 0, 1], [-2, -1, 0]]</code>, clipped <code>[[0, 1, 1], [-1, 0, 1],
# [-1, -1, 0]]</code>, shifted <code>[[1, 2, 2], [0, 1, 2], [0, 0, 1]]</code>. Does your function give that last matrix?
# The page to read: torch.Tensor.clamp.</details>

# %% nbgrader={"grade": false, "grade_id": "relative_position_index", "locked": false, "schema_version": 3, "solution": true, "task": false}
def relative_position_index(q_len: int, k_len: int, max_distance: int) -> torch.Tensor:
    """Index of the clipped offset j - i of every (query i, key j) pair in a table of 2*max_distance + 1 entries.

    Returns int64 [q_len, k_len] with values in [0, 2 * max_distance].
    """
    ### BEGIN SOLUTION
    query_pos = torch.arange(q_len)[:, None]  # [L_q, 1]
    key_pos = torch.arange(k_len)[None, :]  # [1, L_k]
    offset = key_pos - query_pos  # [L_q, L_k]: j - i, negative = key to the left
    return offset.clamp(-max_distance, max_distance) + max_distance
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "relative_position_index_test", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false} tags=["raises-exception"]
check_relative_position_index(relative_position_index)
### BEGIN HIDDEN TESTS
check_relative_position_index(relative_position_index, hidden=True)
### END HIDDEN TESTS

# %%
relative_position_index_impl = yours_or_reference(relative_position_index, check_relative_position_index)
print("relative_position_index(4, 4, 2) =\n", relative_position_index_impl(4, 4, 2))

# %% [markdown]
# ### From a table to a bias matrix
#
# Each head owns a table of $2D + 1$ numbers, one per clipped offset. The bias matrix of a head is the
# table *looked up* (gathered) with the index of exercise 4: entry $(i, j)$ is the table entry of the offset
# $j - i$. So every diagonal of the matrix holds one value, and a head that wants "the previous token" only
# has to raise one number, the entry of offset $-1$:

# %%
draw_relative_bias_lookup(max_distance=2, length=6)
plt.show()

# %% [markdown]
# ### Exercise 5 — `relative_position_bias`
# > **Difficulty** ●●○ · **Importance** ●●○ · about 10 minutes
#
# Write `relative_position_bias(table, q_len, k_len)`.
#
# * `table`: `[heads, 2D + 1]`, one learned scalar per head and clipped offset; column $m + D$ holds the
#   bias of offset $m$, so $D$ = `(table.shape[1] - 1) // 2`.
# * returns `[heads, q_len, k_len]`, in the table's dtype, with entry `[h, i, j]` equal to
#   `table[h, clip(j - i, -D, D) + D]`. Added to scores `[batch, heads, q_len, k_len]`, it broadcasts over
#   the batch.
#
# Worked example: with `table = torch.tensor([[0., 3., 0., 0., 0.]])` (one head, $D = 2$, a bonus of 3
# for offset $-1$), `relative_position_bias(table, 3, 3)` is
# ```
# [[[0., 0., 0.],
#   [3., 0., 0.],
#   [0., 3., 0.]]]
# ```
# Every query gets the bonus on the key just before it.
#
# The table is trained, so build the result by *indexing* the table (the gradient then reaches it), not by
# copying numbers out with `.item()`. You may call `relative_position_index_impl` (your exercise 4, or the
# library's if yours does not pass yet).
#
# <details><summary>Hint 1 — the idea</summary>The index of exercise 4 tells, for every pair <code>(i, j)</code>, which column of the table it needs. Indexing a tensor with an integer tensor returns a tensor of the index's shape, filled with the entries it points to: a lookup that gradients flow through.</details>
# <details><summary>Hint 2 — the plan</summary>First the <code>[q_len, k_len]</code> int64 index of the clipped offsets: your <code>relative_position_index_impl</code>, with <code>D</code> read from the table's width. Then index the table's <em>second</em> dimension with it and keep the first, the heads, whole: the result is <code>[heads, q_len, k_len]</code>, heads first, in the table's dtype.</details>
# <details><summary>Hint 3 — the key step</summary>On a toy: <code>t = torch.tensor([[10, 20, 30]])</code> (1 head, 3
# columns), indexed on its second dimension by the integer tensor <code>[[2, 0], [1, 1]]</code>, gives <code>[[[30, 10],
# [20, 20]]]</code>, of shape <code>[1, 2, 2]</code>: the heads first, then the index's shape. How do you keep the first
# dimension whole while indexing the second?</details>

# %% nbgrader={"grade": false, "grade_id": "relative_position_bias", "locked": false, "schema_version": 3, "solution": true, "task": false}
def relative_position_bias(table: torch.Tensor, q_len: int, k_len: int) -> torch.Tensor:
    """The bias each head adds to its scores: bias[h, i, j] = table[h, clip(j - i, -D, D) + D].

    table: [heads, 2D + 1]. Returns [heads, q_len, k_len] in the table's dtype.
    """
    ### BEGIN SOLUTION
    max_distance = (table.shape[1] - 1) // 2
    offset = torch.arange(k_len)[None, :] - torch.arange(q_len)[:, None]  # [L_q, L_k]: j - i
    index = offset.clamp(-max_distance, max_distance) + max_distance  # [L_q, L_k]: a column of the table
    return table[:, index]  # [heads, L_q, L_k]: a gather, so gradients reach the table
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "relative_position_bias_test", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false} tags=["raises-exception"]
check_relative_position_bias(relative_position_bias)
### BEGIN HIDDEN TESTS
check_relative_position_bias(relative_position_bias, hidden=True)
### END HIDDEN TESTS

# %%
relative_position_bias_impl = yours_or_reference(relative_position_bias, check_relative_position_bias)

# %% [markdown]
# The library's `RelativePositionBias(n_heads, max_distance)` is a module around this lookup: it holds the
# table, `[n_heads, 2D + 1]`, as a parameter (initialised to zeros: no preference for any offset), and
# `MultiHeadAttention` adds the bias to its scores through `bias=`. Below, a table filled by hand (head 0
# prefers the previous token, head 1 the next one), looked up with your function: every diagonal of the
# bias matrix holds one value.

# %%
relative = RelativePositionBias(n_heads=2, max_distance=2)  # table [2, 5]: offsets -2 .. 2
with torch.no_grad():
    relative.table.copy_(torch.tensor([[0.0, 3.0, 0.0, 0.0, 0.0],     # head 0: +3 for offset -1
                                       [0.0, 0.0, 0.0, 3.0, 0.0]]))   # head 1: +3 for offset +1
bias = relative_position_bias_impl(relative.table, 5, 5)  # [2, 5, 5]
print("head 0 bias:\n", bias[0].detach())
print("gradients reach the table:", bias.requires_grad)

# %% [markdown]
# Two practical points. First, during generation with a key/value cache (chapter 07), the one new query
# sits at the *last* position, not at position 0; the module's `forward(q_len, k_len, q_offset)` places the
# queries there, and its result must equal the last rows of the full matrix. Second, the bias must give the
# same attention on both of `MultiHeadAttention`'s paths, the readable one (`need_weights=True`, which
# computes the scores, adds the bias, then takes the softmax) and PyTorch's fused kernel:

# %%
print("one query at position 4 == last row of the full matrix:", torch.equal(relative(1, 5, q_offset=4), bias[:, -1:]))

attention = MultiHeadAttention(d_model, n_heads=2).eval()
x = torch.randn(1, 5, d_model)
with torch.no_grad():
    readable = attention(x, x, x, bias=bias, need_weights=True)
    fused = attention(x, x, x, bias=bias, need_weights=False)
print(f"readable vs fused path, max difference {below((readable - fused).abs().max())}")
print("head 0, attention of query 3 over the 5 keys:", attention.last_weights[0, 0, 3])

# %% [markdown]
# ## 9. Three kinds of positions compared
#
# | | sinusoidal (absolute) | learned (absolute) | relative bias |
# |---|---|---|---|
# | where it acts | added to the input embeddings | added to the input embeddings | added to the attention scores |
# | parameters | none | `max_len × d_model` | `heads × (2D + 1)` per layer (T5: one table per stack, shared by its layers) |
# | longest input | no limit of its own (the table is computed for any length) | `max_len`, a hard limit | any (far offsets are clipped) |
# | knows "position 5" | yes | yes | no, only offsets |
# | knows "two to my left" | through the rotation $M_k$, learnable | only if trained at every position | directly |
# | used in | the original Transformer | BERT, GPT-2, ViT | T5 (Raffel et al. 2020), Swin (chapter 12) |
#
# (Shaw et al. 2018 is relative too, but acts differently: learned vectors per offset added to the keys and
# values inside attention, rather than one scalar per head added to the scores.)
#
# Two small experiments test the middle rows. **Reverse** (length 8) needs absolute positions: the
# target position $7 - i$ depends on $i$. **Copy the previous token** (length 16) needs only the offset
# $-1$. Each model is trained for 200 steps on its task and length, then measured on fresh sequences
# of that length; the copy models are also measured on sequences of length 32, twice as long as anything
# they saw. **Predict** which cells of the table will be near 1.0.

# %%
KINDS = ("none", "learned", "sinusoidal", "relative")
results, reverse_models, copy_models = {}, {}, {}
for kind in KINDS:
    reverse_models[kind] = train_model(kind, "reverse", length=8)
    copy_models[kind] = train_model(kind, "previous", length=16)
    results[kind] = (accuracy(reverse_models[kind], "reverse", 8), accuracy(copy_models[kind], "previous", 16),
                     accuracy(copy_models[kind], "previous", 32))


def cell(value) -> str:
    return "no row > max_len" if isinstance(value, ValueError) else f"{value:.3f}"


print(f"accuracy after 200 steps (chance {1 / VOCAB:.3f})")
print(f"{'positions':>10} | {'reverse, L=8':>12} | {'previous, L=16':>14} | {'previous, L=32':>16}")
for kind, (rev, prev16, prev32) in results.items():
    print(f"{kind:>10} | {cell(rev):>12} | {cell(prev16):>14} | {cell(prev32):>16}")

# %% [markdown]
# Reading the table:
#
# * **No positions** fails both tasks. It beats chance (0.083) only because the answer is always one of the
#   tokens present, so betting on a token that occurs somewhere in the sequence sometimes pays.
#   Order itself is invisible to it.
# * **Learned and sinusoidal** positions solve both tasks at the length they were trained on. The
#   learned table simply has no row for position 16 and beyond.
# * **The relative bias reverses only in part** (0.578): that is 7 times chance and twice the model without
#   positions (0.289), yet far from the absolute models' 1.000. A bias knows how far apart two tokens are,
#   not where the query is, and reversing needs a different offset at every position. Where its 0.578 comes
#   from is the next cell's question.
# * **The relative bias copies the previous token** at its training length (1.000) and still at twice that
#   length (0.984): "offset $-1$" means the same thing everywhere. The last cell of this section shows how far
#   that carries.
# * **Sinusoidal** copies well up to the length it was trained on and worse beyond (0.659 at length 32):
#   the rotation property *allows* a length-independent rule, but nothing forced this model to learn
#   one using only positions 0–15. "Extrapolates" means "has a vector for every position", not "works there".
#
# **Predict**: which positions of the reversed sequence does the relative model get right?

# %%
tokens, targets = make_batch("reverse", 500, 8, torch.Generator().manual_seed(123))
for kind in ("none", "relative"):
    with torch.no_grad():
        right = (reverse_models[kind](tokens).argmax(-1) == targets).float().mean(0)  # [8]: accuracy per position
    print(f"reverse, {kind:>8} positions, accuracy per position 0..7:", " ".join(f"{r:.2f}" for r in right))
table = reverse_models["relative"].relative.table.detach()  # [heads, 17]: offsets -8 .. 8
D = reverse_models["relative"].relative.max_distance
print("relative model, head 0, the bias of each offset:")
print("  ".join(f"{m:+d}:{table[0, m + D]:+.2f}" for m in range(-7, 8)))

# %% [markdown]
# The ends of the sequence, not the middle. The relative model reverses position 0 and position 7 almost
# always and the four middle positions no better than the model without positions. The edges leak
# absolute position into the offsets: a query at position 0 has no key to its left, and offset $+7$ (the key
# at distance 7 to the right) exists for it alone; offset $-7$ exists only for the query at position 7. So
# a large bias on $\pm 7$, which the model learned (the first and last biases printed), sends exactly those
# two queries to their mirror images. Positions 1 and 6 mostly succeed by the same trick one step in (the
# next-largest biases are on $\pm 5$), and the even offsets, never an answer when the length is 8, are
# pushed down. In the middle every query sees offsets on both sides, and nothing tells it where it stands.
#
# The attention of the two copy models at length 32 shows the difference: the relative model keeps one
# line just below the diagonal (each token attends most to its left neighbour) over the whole sequence; the
# sinusoidal one keeps it for the first 16 positions and then loses it. The relative model's line is
# faint, and the last cell of this section says why.

# %%
tokens, _ = make_batch("previous", 1, 32, torch.Generator().manual_seed(11))
maps = {}
for kind in ("relative", "sinusoidal"):
    with torch.no_grad():
        copy_models[kind](tokens, need_weights=True)
    maps[kind] = copy_models[kind].attn.last_weights[0].mean(0)  # [32, 32], mean over heads
top = max(m.max().item() for m in maps.values())
fig, axes = plt.subplots(1, 2, figsize=(8, 3.6))
for ax, kind in zip(axes, maps):
    im = ax.imshow(maps[kind], cmap="Blues", vmin=0, vmax=top)
    ax.axvline(15.5, color="red", linewidth=0.8)
    ax.axhline(15.5, color="red", linewidth=0.8)
    ax.set_title(f"{kind}, trained on L=16, run on L=32", fontsize=9)
    ax.set_xlabel("key position")
    ax.set_ylabel("query position")
fig.colorbar(im, ax=axes, fraction=0.03)
plt.show()

weights = copy_models["relative"].relative.table.detach()  # [heads, 2D+1], offsets -8 .. 8
best = weights.argmax(dim=-1) - copy_models["relative"].relative.max_distance
print("relative model: the offset with the largest learned bias, per head:", best.tolist())
on_previous = maps["relative"].diagonal(offset=-1)  # [31]: weight of query i on key i-1
print(f"relative model at L=32: mean weight on the previous token {on_previous.mean():.3f}, "
      f"on the other 31 keys together {1 - on_previous.mean():.3f}")

# %% [markdown]
# A clipped bias is a fixed bonus. Offset $-1$ gets it; every other offset, including the far ones
# clipped to $\pm D$, gets about the same lower bias. If the bonus is a gap $g$ on the scores, the
# softmax gives the previous token about $e^{g} / (e^{g} + L - 1)$ of the weight: for large $L$ it halves
# each time the length doubles. **Predict** what that does to the accuracy at lengths 64, 128 and 256.

# %%
model = copy_models["relative"]
table = model.relative.table.detach()  # [heads, 17]: offsets -8 .. 8
D = model.relative.max_distance
others = torch.cat([table[:, : D - 1], table[:, D:]], dim=1)  # [heads, 16]: every offset but -1
gap = table[:, D - 1] - others.mean(dim=1)  # [heads]: the bonus of offset -1 over the rest
print("bias gap of offset -1 per head:", " ".join(f"{g:.2f}" for g in gap))
print(f"{'length':>6} | {'accuracy':>8} | {'weight on previous':>18} | {'e^g / (e^g + L - 1)':>19}")
for length in (16, 32, 64, 128, 256):
    tokens, _ = make_batch("previous", 50, length, torch.Generator().manual_seed(11))
    with torch.no_grad():
        model(tokens, need_weights=True)
    measured = model.attn.last_weights.mean(1).diagonal(offset=-1, dim1=-2, dim2=-1).mean()  # mean over heads
    predicted = (gap.exp() / (gap.exp() + length - 1)).mean()
    print(f"{length:>6} | {accuracy(model, 'previous', length):>8.3f} | {measured:>18.3f} | {predicted:>19.3f}")

# %% [markdown]
# The weight on the previous token follows the formula, and the accuracy follows the weight down: the
# output of a query is its previous token's value times that weight plus a blur of all the other tokens,
# and the blur's random part shrinks only like $1/\sqrt{L}$ (it is an average of $L - 1$ random tokens)
# while the signal shrinks like $1/L$. So "offset $-1$ means the same everywhere" holds for the rule the
# model learned, not for its accuracy: measured here, 1.000 at the training length, 0.984 at twice it, and
# 0.409 at sixteen times it. That is a verdict on this model, trained for 200 steps at one length, whose gap came
# out at about 1.9: a clipped bias table keeps the weight on the previous token only with a gap that grows like
# $\log L$, and nothing in training at length 16 asked this model for one. It is not a verdict on relative
# positions in general: ALiBi (Press, Smith & Lewis, "Train Short, Test Long", 2022) subtracts from each score a
# penalty that grows with the distance instead of being clipped, and was designed to work on inputs longer than
# those it was trained on.

# %% [markdown]
# ## Summary
#
# * Self-attention is **permutation equivariant**: without positions, 我打他 and 他打我 give the same
#   pooled vector and the same vector for 打.
# * The **sinusoidal encoding** fills pair $i$ of dimensions with $\sin(pos\,\omega_i)$ and
#   $\cos(pos\,\omega_i)$, $\omega_i = 10000^{-2i/d_{model}}$: clock hands from one turn every 6.28
#   positions to one every 60,611 (for $d_{model} = 512$). No parameters, values in $[-1, 1]$.
# * It is **added** to the embeddings, with an `offset` when tokens arrive one at a time.
# * Moving $k$ positions is one block-diagonal **rotation** $M_k$, the same for every position (checked
#   to rounding error, and recovered by least squares from 100 positions). Dot products
#   $PE_i \cdot PE_j$ depend only on $|i - j|$.
# * **Adding instead of concatenating** saves width; concatenation followed by a linear map is itself an
#   addition; and in high dimension word and position vectors are nearly orthogonal.
# * **Learned positions** train well but stop at `max_len`. **Relative position biases** (a scalar per head
#   and clipped offset, gathered from a table, as in T5, which shares its table across the layers of a stack) know
#   only offsets: they reverse only the ends of a sequence, where the edges reveal the position. Our small model
#   copied the previous token perfectly at the training length but less well the longer the input, since its
#   fixed bonus is shared among more keys (ALiBi, whose penalty grows with the distance, was designed for longer
#   inputs). Shaw et al.'s relative representations are the vector version, added to keys
#   and values. Sinusoidal vectors exist at every length, but a model trained on short inputs need not use
#   them well on long ones.
#
# ## What's next
#
# We now have every ingredient of the attention sub-layer: embeddings with positions, multi-head
# attention. Chapter 05 wraps it into a full **encoder layer**: residual connections, layer
# normalisation, and the position-wise feed-forward network, then stacks the layers.

# %% [markdown]
# ## Where you stand
#
# Which of this chapter's exercises pass (run after finishing them; an exercise that does not pass yet
# says what its check found):

# %%
exercise_summary(check_sinusoidal_table, check_add_positions, check_rotation_for_offset,
                 check_relative_position_index, check_relative_position_bias)

# %% [markdown]
# ## Glossary · 术语表
#
# | English | 中文 | Meaning |
# |---|---|---|
# | positional encoding | 位置编码 | a vector per position, added to the token embeddings so the model sees order |
# | permutation equivariance | 置换等变性 | permuting the input tokens permutes the outputs the same way |
# | pooling | 池化 | combining a sequence of vectors into one (mean, sum, max) |
# | sinusoidal encoding | 正弦位置编码 / 三角函数位置编码 | $\sin$ and $\cos$ of $pos\,\omega_i$, $\omega_i = 10000^{-2i/d_{model}}$ |
# | frequency / wavelength | 频率 / 波长 | how fast a pair turns ($\omega_i$) / positions per full turn ($2\pi/\omega_i$) |
# | absolute position | 绝对位置 | the index of a token in the sequence: 0, 1, 2, … |
# | relative position (offset) | 相对位置（偏移量） | the signed distance $j - i$ between a key and a query |
# | rotation matrix | 旋转矩阵 | here $M_k$: maps $PE_{pos}$ to $PE_{pos+k}$ for every $pos$ |
# | linear transformation | 线性变换 | a map $v \mapsto Mv$; "$PE_{pos+k}$ is a linear function of $PE_{pos}$" |
# | learned positional embedding | 可学习位置编码 | a trained table with one vector per position (BERT, GPT-2, ViT) |
# | max_len | 最大长度 | the number of rows of a positional table; longer inputs have no vector |
# | extrapolation | 外推 | running a model on sequences longer than it was trained on |
# | relative position bias | 相对位置偏置 | a learned scalar per head and offset, added to the attention scores (T5) |
# | relative position representation | 相对位置表示 | Shaw et al.: learned vectors per offset, added to the keys and values inside attention |
# | gather (table lookup) | 查表 / 按索引取值 | indexing a table with an integer tensor: the result has the index's shape |
# | clipping | 截断 | offsets beyond $\pm D$ share the bias of $\pm D$ |
# | add vs concatenate | 相加与拼接 | combining word and position vectors by $x + p$ rather than $[x \,|\, p]$ |
