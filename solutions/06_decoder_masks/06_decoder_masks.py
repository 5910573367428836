# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Chapter 06 — The decoder's masks: causal, padding, cross-attention
#
# The encoder of chapter 05 reads a whole source sentence at once, and every token may look at every other
# token. The **decoder** is different: it *writes* the target sentence, one token after the other, and each
# new token may only depend on the tokens written before it. Yet during training we want to process the
# whole target sentence in one pass, all positions in parallel, because that is what makes Transformers fast
# to train. **Masks** reconcile the two. They are small boolean tensors, and they are easy to get subtly wrong:
# a model trained with a broken mask can reach a *lower* training loss than a correct one and still generate
# worse (section 2 trains one of each).
#
# In this chapter:
#
# 1. **Teacher forcing**: why the decoder sees the whole target at once, and how it could cheat.
# 2. **The causal mask**: each position may look at itself and the past, never the future. Proved on the
#    library's `DecoderLayer`: change a future token and no earlier output moves.
# 3. **The padding mask**: sentences of different lengths share one tensor; the filler must stay invisible.
#    Which way a mask broadcasts, shown live.
# 4. **Both at once**: the mask of the decoder's self-attention.
# 5. **Cross-attention**: queries from the decoder, keys and values from the encoder.
# 6. **The three attention types** of the Transformer in one picture.
# 7. **Pitfalls, live**: masking after the softmax, `-inf` and NaN, fill values that are not negative enough
#    (and `-1e9` in float16), and queries with nothing to attend to.
# 8. **The decoder layer, assembled** from these parts, run by your code, and checked against PyTorch's own.
#
# Six exercises are autograded: `make_causal_mask`, `make_padding_mask`, `combine_decoder_mask`,
# `cross_attention`, `masked_softmax` and `decoder_layer_forward`; together they take about 75 minutes.
#
# The convention of the whole course (chapter 02): a mask is a boolean tensor that broadcasts to the attention
# scores `[..., L_q, L_k]`, and **`True` means "this query may attend to this key"**. It is the convention of
# PyTorch's `torch.nn.functional.scaled_dot_product_attention`, whose documentation describes a boolean mask in
# which True "indicates that the element should take part in attention". Beware: PyTorch's older
# `nn.MultiheadAttention` and `nn.Transformer` use the opposite meaning for their boolean masks (True = *not*
# allowed to attend), and many tutorials build float masks of 0 and `-inf` that are *added* to the scores.
# Mixing up these conventions is the most common mask bug.

# %%
import math

import matplotlib.pyplot as plt
import torch
import torch.nn as nn

from transformer_lib.attention import MultiHeadAttention, attention_scores, scaled_dot_product_attention, softmax
from transformer_lib.checks import exercise_summary, model_calls, yours_or_reference
from transformer_lib.checks.ch06 import (
    check_combine_decoder_mask,
    check_cross_attention,
    check_decoder_layer_forward,
    check_make_causal_mask,
    check_make_padding_mask,
    check_masked_softmax,
)
from transformer_lib.claims import claim, claim_between
from transformer_lib.diagrams.ch06 import draw_mask, draw_three_attentions
from transformer_lib.layers import Decoder, DecoderLayer, add_and_norm

torch.manual_seed(0)
torch.set_printoptions(precision=4, sci_mode=False)

# %% [markdown]
# ## 1. Teacher forcing: the decoder sees the whole answer
#
# Take a translation from French to English, the running example of Jay Alammar's *The Illustrated
# Transformer* (2018): *je suis étudiant* → *I am a student*. An autoregressive decoder models the target one
# token at a time, with the chain rule (Prince, *Understanding Deep Learning*, 2023, section 12.8):
#
# $$P(y_1, \dots, y_T \mid x) = \prod_{t=1}^{T} P(y_t \mid y_1, \dots, y_{t-1}, x).$$
#
# At **generation** time this is a loop: start from a beginning-of-sequence token `<bos>`, predict a word, append
# it, predict the next one, and so on, until the model writes the end-of-sequence token `<eos>`. At **training**
# time we already know the whole target, so we feed it all at once, shifted one step to the right, and ask every
# position for the *next* token. This is **teacher forcing**: the decoder's input at each step is the true
# previous token, not its own guess.

# %%
TGT_VOCAB = ["<pad>", "<bos>", "<eos>", "I", "am", "a", "student", "you", "are", "hello"]
SRC_VOCAB = ["<pad>", "je", "suis", "étudiant", "tu", "es", "bonjour"]
PAD = 0  # the padding id, in both vocabularies


def ids(words, vocab):
    return torch.tensor([vocab.index(w) for w in words])


target = ["I", "am", "a", "student", "<eos>"]
decoder_input = ["<bos>"] + target[:-1]  # shifted right: position t reads token t-1 of the target
for t, (seen, wanted) in enumerate(zip(decoder_input, target)):
    print(f"position {t}: input {seen!r:>10}  ->  must predict {wanted!r}")

# %% [markdown]
# All five rows are computed in one forward pass. But in self-attention every position can look at every
# position, and the input at position $t+1$ *is* the answer position $t$ must predict. Nothing stops the model
# from copying it. Here is a one-line "model" that does exactly that. Its queries are built by hand so that
# query $t$ matches only key $t+1$ ("look one step ahead"). The values are the input tokens, one-hot. We read
# the prediction as the token with the largest output.

# %%
L = len(decoder_input)
x_ids = ids(decoder_input, TGT_VOCAB)                               # [L]
values = torch.nn.functional.one_hot(x_ids, len(TGT_VOCAB)).float()  # [L, vocab]: each position's token
keys = torch.eye(L)                                                  # key j says "I am position j"
queries = 10.0 * torch.diag(torch.ones(L - 1), diagonal=1)           # query t asks for position t + 1

out, _ = scaled_dot_product_attention(queries, keys, values, scale=1.0)  # no mask
cheat = [TGT_VOCAB[i] for i in out.argmax(dim=-1).tolist()]
print("predicted:", cheat)
print("target   :", target)
print(f"correct  : {sum(p == w for p, w in zip(cheat, target))} of {L}")

# %% [markdown]
# Four of five right, and the model knows nothing about English: it reads the answer. Training pushes a real model
# towards this shortcut, since it lowers the loss, and at generation time the shortcut is gone: the future tokens
# do not exist yet (section 2 trains a small model both ways). It is an open-book exam in which the book holds the
# answers, followed by a closed-book one.
#
# The cure is to make attention **causal**: position $t$ may attend to positions $0, \dots, t$ only.

# %% [markdown]
# ## 2. The causal mask
#
# The causal (or "look-ahead", "subsequent") mask is a square boolean matrix, with queries on the rows and
# keys on the columns:
#
# $$M_{ij} = \begin{cases} \mathrm{True} & j \le i \\ \mathrm{False} & j > i \end{cases}$$
#
# True where the key is the query itself or comes before it, False where the key is in the future. It is the
# **lower triangle** of a matrix of ones, diagonal included. Vaswani et al. ("Attention Is All You
# Need", 2017, section 3.2.3) describe it as preventing leftward information flow in the decoder: the scores of
# illegal connections are set to $-\infty$ *before* the softmax, so their exponential is 0, the future gets
# exactly zero weight, and the visible weights still sum to one.
#
# **Predict**: how many entries of the $5 \times 5$ causal mask are True? And of the $L \times L$ one?

# %% [markdown]
# ### Exercise 1 — `make_causal_mask`
# > **Difficulty** ●○○ · **Importance** ●●● · about 5 minutes
#
# Write `make_causal_mask(size)` returning a boolean tensor of shape `[size, size]`, True where query $i$ may
# attend to key $j$, that is where $j \le i$.
#
# Worked example: `make_causal_mask(3)` is
# ```
# tensor([[ True, False, False],
#         [ True,  True, False],
#         [ True,  True,  True]])
# ```
# Careful with four classic slips: the upper triangle instead of the lower one, forgetting the diagonal (a
# token must see itself), True meaning "hide" (the convention of `nn.Transformer`'s masks, not ours), and a
# float mask of 0 and `-inf` instead of booleans.
#
# <details><summary>Hint 1 — the idea</summary>Entry <code>[i, j]</code> answers "may query i see key j?": yes when j ≤ i. Shade those cells of a 3 × 3 grid: they form a triangle, and the diagonal belongs to it.</details>
# <details><summary>Hint 2 — the plan</summary>Start from a <code>[size, size]</code> boolean matrix that is True
# everywhere, and keep its lower triangle, the diagonal included: the entries with a column number at most the row
# number. Print your answer for size 3 and compare it with the worked example before running the check.</details>
# <details><summary>Hint 3 — the key step</summary>The page to read: torch.tril, and its <code>diagonal</code> argument.
# On a toy, <code>torch.tril(torch.arange(1, 10).view(3, 3))</code> is <code>[[1, 0, 0], [4, 5, 0], [7, 8, 9]]</code>.
# Which dtype must your mask have, and what does the same call do to a matrix of True?</details>

# %% nbgrader={"grade": false, "grade_id": "make_causal_mask", "locked": false, "schema_version": 3, "solution": true, "task": false}
def make_causal_mask(size: int) -> torch.Tensor:
    """Causal mask: True where key j may be seen by query i, i.e. j <= i.

    Returns a bool tensor of shape [size, size].
    """
    ### BEGIN SOLUTION
    return torch.ones(size, size, dtype=torch.bool).tril()  # [size, size], diagonal included
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "make_causal_mask_test", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false} tags=["raises-exception"]
check_make_causal_mask(make_causal_mask)
### BEGIN HIDDEN TESTS
check_make_causal_mask(make_causal_mask, hidden=True)
### END HIDDEN TESTS

# %%
make_causal_mask_impl = yours_or_reference(make_causal_mask, check_make_causal_mask)

# %% [markdown]
# Here is the mask of our five decoder positions, drawn as a grid. Read it by rows: the query `am` (row 2) may
# look at `<bos>`, `I` and itself.

# %%
causal = make_causal_mask_impl(L)  # [5, 5]
print(f"True entries: {int(causal.sum())} of {causal.numel()}  (L (L + 1) / 2 = {L * (L + 1) // 2})")

fig, ax = plt.subplots(figsize=(3.6, 3.4))
draw_mask(ax, causal, decoder_input, decoder_input, "causal mask")
fig.tight_layout()
plt.show()

# %% [markdown]
# Back to the cheat: with the mask, query $t$ can no longer reach key $t+1$. Every score it may still see is 0,
# so it gets a uniform average of the past, and the trick is gone:

# %%
out, _ = scaled_dot_product_attention(queries, keys, values, mask=causal, scale=1.0)
masked_cheat = [TGT_VOCAB[i] for i in out.argmax(dim=-1).tolist()]
print("predicted:", masked_cheat)
print(f"correct  : {sum(p == w for p, w in zip(masked_cheat, target))} of {L}")

# %% [markdown]
# ### The proof on the real thing: the library's `DecoderLayer`
#
# A decoder layer is more than one attention: masked self-attention, cross-attention over the encoder
# output, a feed-forward network, residual connections and LayerNorm (chapter 05). Only the self-attention
# mixes positions; everything else works on each position separately. So the mask on the self-attention
# should be enough to make the *whole layer* causal.
#
# A property test says it precisely: **changing a future token changes no earlier output.** We take
# random vectors for the five decoder inputs and for a four-token encoder output (the "memory"), then replace the
# vector of position 3 (`a`) by another one.
#
# **Predict** before running: with the causal mask, which of the five outputs change? And without it?

# %%
torch.manual_seed(6)
d_model, n_heads = 16, 2
layer = DecoderLayer(d_model, n_heads, d_ff=32).eval()  # eval(): no dropout, deterministic
x = torch.randn(1, L, d_model)       # [batch=1, tgt_len=5, d_model]: the decoder inputs
memory = torch.randn(1, 4, d_model)  # [batch=1, src_len=4, d_model]: the encoder output
x_changed = x.clone()
x_changed[0, 3] = torch.randn(d_model)  # a different token at position 3


def change_per_position(a, b):
    """Largest absolute change of each position's output vector. a, b: [1, seq, d_model] -> [seq]."""
    return (a - b).abs().amax(dim=-1)[0]


with torch.no_grad():
    for name, mask in [("causal mask", causal), ("no mask    ", None)]:
        delta = change_per_position(layer(x, memory, tgt_mask=mask), layer(x_changed, memory, tgt_mask=mask))
        print(f"{name}: change of each output when token 3 changes:", [f"{d:.4f}" for d in delta.tolist()])
    same_past = torch.equal(layer(x, memory, tgt_mask=causal)[:, :3], layer(x_changed, memory, tgt_mask=causal)[:, :3])
    print("causal mask: outputs 0, 1, 2 bitwise identical:", same_past)

# %% [markdown]
# With the mask, outputs 0, 1 and 2 do not move at all, not even by a rounding error: a hidden key gets a
# weight of exactly 0. Outputs 3 and 4 may and do change, since they are allowed to see position 3.
# Without the mask, every output changes: position 2, which must predict `a`, can read it.
#
# A second way to say the same thing: with the mask, running the layer on the whole sentence gives position
# $t$ the same output as running it on the prefix $0..t$ alone, which is all that exists at generation time.
# (The two runs multiply matrices of different sizes, so they agree up to float32 rounding, not bit for bit.)

# %%
with torch.no_grad():
    full = layer(x, memory, tgt_mask=causal)  # [1, 5, d_model], all positions at once
    for t in range(L):
        prefix = layer(x[:, : t + 1], memory, tgt_mask=make_causal_mask_impl(t + 1))  # what exists at step t
        same = torch.allclose(prefix[0, t], full[0, t], atol=1e-6)
        print(f"position {t}: prefix run == full run at position {t}: {same}")

# %% [markdown]
# Teacher forcing with the mask trains the model in exactly the situation it will meet when generating, for
# all positions in one pass. Without the mask it trains in a situation generation never offers. A small test
# shows what that costs. The sequences are 8 random tokens followed by the same 8 again, so the first half cannot
# be predicted and the second half can, by looking 8 positions back. A tiny decoder (embeddings, one attention layer
# with a shortcut, a read-out) is trained for 100 steps twice, with your causal mask and with none, then asked to
# generate: at step $t$ it sees the tokens $0..t$ only, since the rest is not written yet.
#
# **Predict**: which model ends with the lower training loss? Which one generates the second half better?

# %% tags=["nbval-ignore-output"]
HALF, TOY_VOCAB = 8, 10


def repeated_halves(n, gen):
    """n sequences of 8 random tokens and the same 8 again; inputs and next-token targets, [n, 15] each."""
    half = torch.randint(TOY_VOCAB, (n, HALF), generator=gen)
    sequences = torch.cat([half, half], dim=1)  # [n, 16]
    return sequences[:, :-1], sequences[:, 1:]  # position t must predict token t + 1


class TinyDecoder(nn.Module):
    def __init__(self, d=32, length=2 * HALF - 1):
        super().__init__()
        self.tok, self.pos = nn.Embedding(TOY_VOCAB, d), nn.Embedding(length, d)
        self.attn, self.read_out = MultiHeadAttention(d, 2), nn.Linear(d, TOY_VOCAB)

    def forward(self, tokens, masked):
        h = self.tok(tokens) + self.pos.weight[: tokens.shape[1]]  # [batch, seq, d]
        mask = make_causal_mask_impl(tokens.shape[1]) if masked else None
        return self.read_out(h + self.attn(h, h, h, mask=mask))  # [batch, seq, vocab]


def train_tiny(masked, steps=100):
    torch.manual_seed(0)
    model, gen = TinyDecoder(), torch.Generator().manual_seed(1)
    optimiser = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(steps):
        inputs, targets = repeated_halves(64, gen)
        loss = nn.functional.cross_entropy(model(inputs, masked).flatten(0, 1), targets.flatten())
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
    return model, loss.item()


test_inputs, test_targets = repeated_halves(500, torch.Generator().manual_seed(2))
toy = {}
for masked in (True, False):
    model, final_loss = train_tiny(masked)
    with torch.no_grad():  # generating: at step t only the tokens 0..t exist
        steps = [model(test_inputs[:, : t + 1], masked)[:, -1].argmax(-1) for t in range(2 * HALF - 1)]
    right = torch.stack(steps, dim=1) == test_targets  # [500, 15]
    toy[masked] = final_loss, right[:, HALF - 1 :].float().mean().item()  # the second half's targets
    print(f"{'causal mask' if masked else 'no mask':>11}: final training loss {final_loss:.3f}, "
          f"second half right when generating {toy[masked][1]:.3f}")
claim_between(toy[False][0], None, 0.05, "without the mask, the training loss falls below 0.05: the model reads the answers")
claim_between(toy[True][0], 0.9, None,
              "with the mask it stays above 0.9: the random first half cannot be predicted (7/15 of the targets)")
claim_between(toy[True][1], 0.95, None, "with the mask, generation gets more than 0.95 of the second half right")
claim_between(toy[False][1], None, 0.95,
              "without it, generation gets less than 0.95 of the second half right, after the far lower training loss")

# %% [markdown]
# The model without the mask reached a training loss of about 0 (below 0.05 on every CPU we tried), where the
# masked one stays at about 1.2: seven of the fifteen targets are random tokens, which cannot be predicted without
# reading them. But
# generating, it gets about 0.84 of the second half right here (below 0.95 on every CPU we tried), where the masked
# model gets about 1.00 (above 0.95): part of what it learned was to read the answer one position ahead, and at
# generation time that position is empty. A broken mask makes the training loss look better and the model worse.
#
# The attention weights show where the mask acts. Below are the weights of the
# layer's self-attention (averaged over its two heads), read through `need_weights=True`:

# %%
with torch.no_grad():
    attn = layer.self_attn
    attn(x, x, x, mask=None, need_weights=True)
    w_free = attn.last_weights[0].mean(dim=0)    # [5, 5], averaged over the heads
    attn(x, x, x, mask=causal, need_weights=True)
    w_causal = attn.last_weights[0].mean(dim=0)  # [5, 5]

fig, axes = plt.subplots(1, 2, figsize=(7.5, 3.4))
for ax, w, title in [(axes[0], w_free, "no mask: rows read the future"), (axes[1], w_causal, "causal mask")]:
    im = ax.imshow(w, cmap="Blues", vmin=0, vmax=1)
    ax.set_xticks(range(L), decoder_input, rotation=45, ha="right", fontsize=8)
    ax.set_yticks(range(L), decoder_input, fontsize=8)
    ax.set_xlabel("key", fontsize=8)
    ax.set_title(title, fontsize=9)
axes[0].set_ylabel("query", fontsize=8)
fig.colorbar(im, ax=axes, fraction=0.03)
plt.show()

future = ~causal  # [5, 5]: True above the diagonal
print("weight each query puts on future keys, no mask:", [f"{w:.2f}" for w in (w_free * future).sum(-1).tolist()])
print("weight each query puts on future keys, causal :", [f"{w:.2f}" for w in (w_causal * future).sum(-1).tolist()])

# %% [markdown]
# ## 3. The padding mask
#
# We train on batches, and a batch is a rectangular tensor `[batch, seq]`. Sentences have different lengths,
# so the short ones are filled up with a **padding** token, `<pad>` (id 0 here), to the length of the longest.
# Here are three decoder inputs:

# %%
batch_words = [
    ["<bos>", "I", "am", "a", "student"],
    ["<bos>", "you", "are", "<pad>", "<pad>"],
    ["<bos>", "hello", "<pad>", "<pad>", "<pad>"],
]
tgt = torch.stack([ids(w, TGT_VOCAB) for w in batch_words])  # [batch=3, tgt_len=5]
print(tgt)

# %% [markdown]
# A padding token is not a word; it only makes the tensor rectangular. But it still has an embedding, and if
# a real token may attend to it, the real token's output depends on **how much padding** its sentence got,
# that is, on which other sentences happened to share its batch. So padded positions must be hidden **as
# keys**: no query may attend to them.
#
# The padding mask says which *keys* are real. It is the same for every query (and every head) of a sentence,
# so it has **size 1 on the query axis** and lets broadcasting copy it over the queries. The keys stay on the
# last axis. The scores come in two layouts in this course, and the padding mask follows them:
#
# | scores | layout | padding mask |
# |---|---|---|
# | one head (chapter 02, and exercise 4 below) | `[batch, L_q, L_k]` | `[batch, 1, seq]` |
# | several heads (chapter 03) | `[batch, heads, L_q, L_k]` | `[batch, 1, 1, seq]` |
#
# Both are correct: each broadcasts over the queries. The library's `MultiHeadAttention` accepts either (a 3-D
# mask gets its heads axis added inside, as in chapter 03), and `padding_mask` returns the 4-D one, which fits
# the per-head scores directly. What goes wrong is a mask whose **1 sits on the wrong axis**: `[batch, seq, 1]`
# hides query rows instead of key columns, and a bare `[batch, seq]` lines its batch axis up with the queries
# (harmless only for a batch of one sentence, whose batch axis has size 1).
# Both can run without an error message; we will watch them do it right after the exercise.

# %% [markdown]
# ### Exercise 2 — `make_padding_mask`
# > **Difficulty** ●○○ · **Importance** ●●● · about 5 minutes
#
# Write `make_padding_mask(tokens, pad_id)`.
#
# * `tokens`: `[batch, seq]` integer ids; `pad_id`: the id of the padding token (not always 0!).
# * returns a bool tensor `[batch, 1, 1, seq]` (the per-head layout), True at real tokens, False at padding.
#
# Worked example: `make_padding_mask(torch.tensor([[5, 7, 0], [4, 0, 0]]), 0)` has shape `[2, 1, 1, 3]`, and
# `[:, 0, 0]` of it is `[[True, True, False], [True, False, False]]`.
#
# <details><summary>Hint 1 — the idea</summary>A token is real when its id differs from <code>pad_id</code>: one comparison gives <code>[batch, seq]</code> booleans. Then give them the layout of the scores they will meet: keys on the last axis, size 1 on the heads and query axes.</details>
# <details><summary>Hint 2 — the plan</summary>Two steps. Compare <code>tokens</code> with <code>pad_id</code>: <code>[batch, seq]</code> booleans, True at the real tokens. Then insert two size-1 axes between the batch and the keys, to reach <code>[batch, 1, 1, seq]</code> (indexing with <code>None</code> inserts an axis, and so does <code>unsqueeze</code>).</details>
# <details><summary>Hint 3 — the key step</summary>On a toy: for <code>t = torch.tensor([[5, 0]])</code>, of shape
# <code>[1, 2]</code>, <code>t[:, None].shape</code> is <code>[1, 1, 2]</code>: each <code>None</code> in an index adds
# an axis of size 1 where it stands. How many, and where, take <code>[batch, seq]</code> to <code>[batch, 1, 1,
# seq]</code>?</details>

# %% nbgrader={"grade": false, "grade_id": "make_padding_mask", "locked": false, "schema_version": 3, "solution": true, "task": false}
def make_padding_mask(tokens: torch.Tensor, pad_id: int) -> torch.Tensor:
    """Padding mask: True at real tokens, False at padding, laid out to hide padded *keys*.

    tokens: [batch, seq] integer ids. Returns a bool tensor of shape [batch, 1, 1, seq].
    """
    ### BEGIN SOLUTION
    real = tokens != pad_id  # [batch, seq]
    return real[:, None, None, :]  # [batch, 1 (heads), 1 (queries), seq (keys)]
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "make_padding_mask_test", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false} tags=["raises-exception"]
check_make_padding_mask(make_padding_mask)
### BEGIN HIDDEN TESTS
check_make_padding_mask(make_padding_mask, hidden=True)
### END HIDDEN TESTS

# %%
make_padding_mask_impl = yours_or_reference(make_padding_mask, check_make_padding_mask)

# %% [markdown]
# Does the mask make a sentence's outputs independent of its padding? Take *you are* (sentence 1) and run
# self-attention on it twice: alone, as the 3 tokens `<bos> you are`, and inside the padded batch, where it has
# two `<pad>` tokens at the end. Compare the outputs of its three real positions.

# %%
torch.manual_seed(7)
embed = torch.nn.Embedding(len(TGT_VOCAB), d_model)
self_attn = MultiHeadAttention(d_model, n_heads).eval()
pad_mask = make_padding_mask_impl(tgt, PAD)  # [3, 1, 1, 5]
print("padding mask shape:", list(pad_mask.shape))

with torch.no_grad():
    alone = embed(tgt[1:2, :3])  # [1, 3, d_model]: "<bos> you are", no padding
    batch = embed(tgt)           # [3, 5, d_model]: the padded batch
    out_alone = self_attn(alone, alone, alone)
    out_masked = self_attn(batch, batch, batch, mask=pad_mask)[1:2, :3]
    out_unmasked = self_attn(batch, batch, batch)[1:2, :3]
print(f"with the padding mask   : largest difference {(out_masked - out_alone).abs().max():.4f}")
print(f"without the padding mask: largest difference {(out_unmasked - out_alone).abs().max():.4f}")

# %% [markdown]
# With the mask, batching changes nothing (up to float32 rounding); without it, *you are* is
# contaminated by its own padding.
#
# Notice what the padding mask does **not** hide: the padded *queries*. The rows of `<pad>` positions still
# attend to the real tokens and produce some output. That output is garbage, but harmless: nothing later
# reads it, because every layer hides padded keys, and the loss ignores padded positions (chapter 07). Hiding
# those rows too would leave them with nothing to attend to. Section 7 shows why that is worse than it sounds.

# %% [markdown]
# ### Which way a mask broadcasts, live
#
# Broadcasting lines shapes up **from the right** and copies every axis of size 1. So the position of the 1
# decides what the mask means. Four layouts of the same True/False values, handed to `MultiHeadAttention` on a
# batch of **five** sentences of length five. Five and five on purpose: with `batch == seq`, even the wrong
# layouts broadcast without an error. For each layout we measure how far the real tokens' outputs are from
# running each sentence alone, without padding (0 means the padding is invisible).
#
# **Predict**: which of the four layouts give 0?

# %%
batch5_words = [
    ["<bos>", "I", "am", "a", "student"],
    ["<bos>", "you", "are", "<pad>", "<pad>"],
    ["<bos>", "hello", "<pad>", "<pad>", "<pad>"],
    ["<bos>", "I", "am", "<pad>", "<pad>"],
    ["<bos>", "you", "are", "a", "<pad>"],
]
tgt5 = torch.stack([ids(w, TGT_VOCAB) for w in batch5_words])  # [batch=5, seq=5]
real5 = tgt5 != PAD                                            # [batch, seq]
lengths5 = real5.sum(dim=-1).tolist()


def as_seen_by_attention(mask, batch, length):
    """What MultiHeadAttention makes of a mask: [batch, 1 (heads), L_q, L_k]."""
    if mask.dim() == 3:
        mask = mask.unsqueeze(1)  # MultiHeadAttention gives a 3-D mask its heads axis
    return mask.expand(batch, 1, length, length)


layouts = {
    "[batch, 1, 1, seq]": make_padding_mask_impl(tgt5, PAD),  # padding_mask's layout
    "[batch, 1, seq]": real5[:, None, :],                     # chapter 03's layout for MultiHeadAttention
    "[batch, seq, 1]": real5[:, :, None],                     # the 1 on the wrong side
    "[batch, seq]": real5,                                    # no 1 at all
}
with torch.no_grad():
    h5 = embed(tgt5)  # [5, 5, d_model]
    alone5 = [self_attn(h5[b:b + 1, :n], h5[b:b + 1, :n], h5[b:b + 1, :n])[0] for b, n in enumerate(lengths5)]
    for name, mask in layouts.items():
        out5 = self_attn(h5, h5, h5, mask=mask)  # [5, 5, d_model]
        error = max((out5[b, :n] - alone5[b]).abs().max().item() for b, n in enumerate(lengths5))
        print(f"mask {name:<19}: largest difference from the unpadded runs {error:.4f}")

# %% [markdown]
# The two layouts with the 1 on the query axis give 0 (up to rounding): they are the same mask, one for
# single-head scores and one for per-head scores. The two others run silently and are wrong. The grids show
# what attention made of each, for sentence 1 (*you are*, two padding tokens):

# %%
fig, axes = plt.subplots(1, 4, figsize=(11, 3.2))
words1 = batch5_words[1]
for ax, (name, mask) in zip(axes, layouts.items()):
    draw_mask(ax, as_seen_by_attention(mask, 5, 5)[1, 0], words1, words1, f"mask {name}")
for ax in axes[1:]:
    ax.set_ylabel("")
fig.tight_layout()
plt.show()

# %% [markdown]
# * `[batch, seq, 1]` turned the padding into **rows**: the padded *queries* see nothing, and the real tokens
#   still read the padded keys. It hides the wrong thing.
# * `[batch, seq]` is read as one `[L_q, L_k]` grid shared by every sentence: **row $i$ holds the padding of
#   sentence $i$**. Query 4 of *you are* uses the padding of sentence 4, and so on.
#
# The bare mask is not always wrong. A 2-D mask is read as one `[L_q, L_k]` grid for the whole batch, so the
# bare mask's first axis, the batch, lands on the query axis. For a single sentence that axis has size 1, which
# is exactly where the padding mask wants its 1: `[1, seq]` broadcasts over the queries of the `[1, seq, seq]`
# scores and hides the right keys. It goes wrong with several sentences, `[B, seq]` against `[B, L, L]`
# scores, because the batch then lines up with the queries: silently when `B` equals the length, as above;
# with any other `B` it does not broadcast at all. That is the lucky case, and the library says so in words.
# Both, on sentence 1 alone and on the batch of three:

# %%
with torch.no_grad():
    one = h5[1:2]  # sentence 1 (you are + two padding tokens) alone: a batch of 1
    out_one = self_attn(one, one, one, mask=real5[1:2])  # the bare mask, [1, seq]
error_one = (out_one[0, :lengths5[1]] - alone5[1]).abs().max().item()
print(f"batch of 1, bare [1, seq] mask: largest difference from the unpadded run {error_one:.4f}")
try:
    with torch.no_grad():
        self_attn(batch, batch, batch, mask=tgt != PAD)  # batch of 3, seq of 5: a [3, 5] mask
except ValueError as err:
    print("ValueError:", err)

# %% [markdown]
# ## 4. Both at once: the decoder's self-attention mask
#
# The decoder's self-attention needs both rules at the same time: a key is visible only if it is **not in the
# future** *and* **not padding**. Two boolean masks combine with a logical AND (`&`), and broadcasting does
# the layout: the causal mask, `[L, L]`, AND the padding mask, `[batch, 1, 1, L]`, give one mask of shape
# `[batch, 1, L, L]`.

# %% [markdown]
# ### Exercise 3 — `combine_decoder_mask`
# > **Difficulty** ●●○ · **Importance** ●●● · about 10 minutes
#
# Write `combine_decoder_mask(tokens, pad_id)`, the mask of the decoder's self-attention.
#
# * `tokens`: `[batch, L]` integer ids of the decoder input; `pad_id`: the padding id.
# * returns a bool tensor `[batch, 1, L, L]`: entry `[b, 0, i, j]` is True when $j \le i$ **and** token $j$ of
#   sentence $b$ is not padding.
#
# Worked example: for `tokens = torch.tensor([[1, 7, 8, 0]])` and `pad_id = 0`, the result has shape
# `[1, 1, 4, 4]` and `[0, 0]` of it is
# ```
# [[ True, False, False, False],
#  [ True,  True, False, False],
#  [ True,  True,  True, False],
#  [ True,  True,  True, False]]
# ```
# You may build on your two earlier functions through `make_causal_mask_impl` and `make_padding_mask_impl`
# (yours if they passed their checks, the library's otherwise).
#
# <details><summary>Hint 1 — the idea</summary>Two rules, and a key must pass both: that is a logical AND of two boolean masks. Broadcasting lines the causal grid up with every sentence's padding row.</details>
# <details><summary>Hint 2 — the plan</summary>Shapes: the causal mask <code>[L, L]</code>, with <code>L</code> the length of the decoder's input; the padding mask <code>[batch, 1, 1, L]</code>; combined, they broadcast to <code>[batch, 1, L, L]</code>. <code>make_causal_mask_impl</code> and <code>make_padding_mask_impl</code> make the two ingredients.</details>
# <details><summary>Hint 3 — the key step</summary>On a toy: a row <code>torch.tensor([True, True, False])</code> and a
# column <code>torch.tensor([[True], [False]])</code> combined by the logical AND operator broadcast to <code>[[True,
# True, False], [False, False, False]]</code>, shape <code>[2, 3]</code>. And one question: on which device must the
# causal mask be made, so that it can meet the padding mask? (The <code>device</code> argument of torch.ones.)</details>

# %% nbgrader={"grade": false, "grade_id": "combine_decoder_mask", "locked": false, "schema_version": 3, "solution": true, "task": false}
def combine_decoder_mask(tokens: torch.Tensor, pad_id: int) -> torch.Tensor:
    """Mask of the decoder's self-attention: causal AND padding.

    tokens: [batch, L] integer ids. Returns a bool tensor of shape [batch, 1, L, L].
    """
    ### BEGIN SOLUTION
    L = tokens.shape[1]
    causal = torch.ones(L, L, dtype=torch.bool, device=tokens.device).tril()  # [L, L]
    real = (tokens != pad_id)[:, None, None, :]  # [batch, 1, 1, L]
    return causal & real  # [batch, 1, L, L]
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "combine_decoder_mask_test", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false} tags=["raises-exception"]
check_combine_decoder_mask(combine_decoder_mask)
### BEGIN HIDDEN TESTS
check_combine_decoder_mask(combine_decoder_mask, hidden=True)
### END HIDDEN TESTS

# %%
combine_decoder_mask_impl = yours_or_reference(combine_decoder_mask, check_combine_decoder_mask)

# %% [markdown]
# The library calls it `decoder_self_mask`. Here are its three ingredients for the sentence *you are*, the
# padding mask drawn broadcast over the queries:

# %%
tgt_mask = combine_decoder_mask_impl(tgt, PAD)  # [3, 1, 5, 5]
print("decoder self-attention mask:", list(tgt_mask.shape))

b = 1
words = batch_words[b]
fig, axes = plt.subplots(1, 3, figsize=(8, 3.2))
draw_mask(axes[0], make_causal_mask_impl(L), words, words, "causal")
draw_mask(axes[1], pad_mask[b, 0].expand(L, L), words, words, "padding (keys)")
draw_mask(axes[2], tgt_mask[b, 0], words, words, "causal AND padding")
for ax in axes[1:]:
    ax.set_ylabel("")
fig.tight_layout()
plt.show()
print("visible keys per query of 'you are':", tgt_mask[b, 0].sum(dim=-1).tolist())

# %% [markdown]
# Every row keeps at least one True: key 0, the `<bos>` token, is real and is never in anybody's future. With
# padding at the end (right padding) and a begin token first, the decoder's self-attention never has an
# empty row. Section 7 shows what happens when one does.

# %% [markdown]
# ## 5. Cross-attention: the decoder reads the encoder
#
# Between its masked self-attention and its feed-forward network, every decoder layer has a second attention,
# the **encoder–decoder attention** or **cross-attention** (Vaswani et al., 2017, section 3.2.3; Prince,
# *Understanding Deep Learning*, section 12.8). It works like self-attention, except for where its inputs come
# from:
#
# * the **queries** come from the decoder: "what does the target word I am writing need from the source?";
# * the **keys and values** come from the encoder's output, the **memory**: every source token, already
#   encoded with its context.
#
# $$\mathrm{CrossAttention}(X_{dec}, M) = \mathrm{softmax}\!\left(\frac{(X_{dec}W^Q)(M W^K)^\top}{\sqrt{d_k}}\right) M W^V$$
#
# Two consequences for the mask:
#
# * **No causal mask.** The whole source sentence is known before decoding starts; nothing in it is "future".
# * **The source padding mask**, the same one the encoder used. Padded source tokens must not be read.
#
# The weight matrix is no longer square: one row per target position, one column per source position,
# `[batch, T, S]` for one head. Our source batch, three French sentences of length 4:

# %%
src_words = [
    ["je", "suis", "étudiant", "<pad>"],
    ["tu", "es", "<pad>", "<pad>"],
    ["bonjour", "<pad>", "<pad>", "<pad>"],
]
src = torch.stack([ids(w, SRC_VOCAB) for w in src_words])  # [batch=3, src_len=4]
src_mask = make_padding_mask_impl(src, PAD)                # [3, 1, 1, 4]: for per-head scores
src_mask_1head = src_mask[:, 0]                            # [3, 1, 4]: for one head's scores [3, T, 4]
print("source padding mask, per head :", list(src_mask.shape))
print("source padding mask, one head :", list(src_mask_1head.shape), "->", src_mask_1head[:, 0].tolist())

# %% [markdown]
# ### Exercise 4 — `cross_attention`
# > **Difficulty** ●●○ · **Importance** ●●● · about 15 minutes
#
# Write single-head cross-attention, `cross_attention(x, memory, w_q, w_k, w_v, mask=None)`, returning
# `(output, weights)`.
#
# * `x`: `[batch, T, d_model]`, the decoder's states (they ask); `memory`: `[batch, S, d_model]`, the encoder's
#   output (it answers). `T` and `S` usually differ.
# * `w_q`, `w_k`: `[d_model, d_k]`; `w_v`: `[d_model, d_v]`, used as `x @ w`.
# * `mask`: `None`, or boolean (True = may attend) broadcastable to the scores `[batch, T, S]`: typically the
#   source padding mask in its one-head layout `[batch, 1, S]`, which broadcasts over the `T` queries.
# * returns `output` `[batch, T, d_v]`, one vector per **target** position, and `weights` `[batch, T, S]`.
#
# Worked example: with `x` `[2, 5, 8]`, `memory` `[2, 4, 8]`, `w_q` and `w_k` `[8, 4]` and `w_v` `[8, 6]`, the
# output is `[2, 5, 6]` and the weights `[2, 5, 4]`; with the mask `[[[True, True, False, False]]]` the last
# two columns of the weights are exactly 0 and every row sums to 1.
#
# You may use `scaled_dot_product_attention` (imported above: it takes `q, k, v, mask` and returns
# `(output, weights)`), or write the scale, the fill and the softmax yourself.
#
# <details><summary>Hint 1 — the idea</summary>The recipe of chapter 02's self-attention, with the sources changed: the decoder asks, the encoder's memory answers. And no causal mask: the whole source exists before decoding starts.</details>
# <details><summary>Hint 2 — the plan</summary>Shapes: <code>q</code> <code>[batch, T, d_k]</code> from <code>x</code>; <code>k</code> <code>[batch, S, d_k]</code> and <code>v</code> <code>[batch, S, d_v]</code> from <code>memory</code>; the scores <code>[batch, T, S]</code>, divided by the square root of <code>d_k</code> (the width of the queries and keys, not <code>d_model</code>); the mask <code>[batch, 1, S]</code> broadcasts over the rows and hides its keys before the softmax over the keys; the output, the weights times <code>v</code>, is <code>[batch, T, d_v]</code>.</details>
# <details><summary>Hint 3 — the key step</summary>Check the shapes before the numbers: with T = 2 target positions and
# S = 5 source positions, the weights must be <code>[batch, 2, 5]</code>, every row summing to 1. If you get
# <code>[batch, 2, 2]</code> or <code>[batch, 5, 5]</code>, which input did the keys come from? And the mask is True for
# the keys to keep, while torch.Tensor.masked_fill fills where <em>its</em> mask is True.</details>

# %% nbgrader={"grade": false, "grade_id": "cross_attention", "locked": false, "schema_version": 3, "solution": true, "task": false}
def cross_attention(x, memory, w_q, w_k, w_v, mask=None):
    """Single-head cross-attention: queries from the decoder states x, keys and values from memory.

    x: [batch, T, d_model]; memory: [batch, S, d_model]; w_q, w_k: [d_model, d_k]; w_v: [d_model, d_v].
    mask: None or bool broadcastable to [batch, T, S], True = may attend.
    Returns (output [batch, T, d_v], weights [batch, T, S]).
    """
    ### BEGIN SOLUTION
    q = x @ w_q  # [batch, T, d_k]: the decoder asks
    k = memory @ w_k  # [batch, S, d_k]: the encoder's memory answers
    v = memory @ w_v  # [batch, S, d_v]
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # [batch, T, S]
    if mask is not None:
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)  # [batch, 1, S] covers every query
    weights = torch.softmax(scores, dim=-1)  # [batch, T, S], no causal mask: the source is all known
    return weights @ v, weights  # [batch, T, d_v], [batch, T, S]
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "cross_attention_test", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false} tags=["raises-exception"]
check_cross_attention(cross_attention)
### BEGIN HIDDEN TESTS
check_cross_attention(cross_attention, hidden=True)
### END HIDDEN TESTS

# %%
cross_attention_impl = yours_or_reference(cross_attention, check_cross_attention)

# %% [markdown]
# ### A cross-attention heatmap
#
# What a trained cross-attention does is align target words with source words (chapter 01 called attention a
# soft alignment). To see one without training a model (chapter 07 trains one), we set the weights **by
# hand**. Each word gets a 4-feature vector: *I* and *je* share the feature "first person", *am* and *suis* the
# feature "to be", *student* and *étudiant* the feature "student". The article *a* carries half of "student"
# (French has no separate article here: *étudiant* alone means *a student*). $W^Q$ and $W^K$ are scaled
# identities and $W^V$ the identity, so a score is just the dot product of two words' features.
#
# The `<pad>` memory vector is made deliberately "attractive" (a bit of every feature), as the output of an
# encoder at a padded position may well be, since the encoder computes *something* there too.

# %%
features = {  # first person, to be, student, (unused)
    "je": [1.0, 0.0, 0.0, 0.0], "suis": [0.0, 1.0, 0.0, 0.0], "étudiant": [0.0, 0.0, 1.0, 0.0],
    "<pad>": [0.6, 0.6, 0.6, 0.0],
    "I": [1.0, 0.0, 0.0, 0.0], "am": [0.0, 1.0, 0.0, 0.0], "a": [0.0, 0.0, 0.5, 0.0], "student": [0.0, 0.0, 1.0, 0.0],
}
src_tokens, tgt_tokens = src_words[0], ["I", "am", "a", "student"]
mem_hand = torch.tensor([[features[w] for w in src_tokens]])  # [1, src_len=4, 4]
dec_hand = torch.tensor([[features[w] for w in tgt_tokens]])  # [1, tgt_len=4, 4]
eye4 = torch.eye(4)

with torch.no_grad():
    _, w_no_mask = cross_attention_impl(dec_hand, mem_hand, 3 * eye4, 3 * eye4, eye4, None)
    _, w_src_mask = cross_attention_impl(dec_hand, mem_hand, 3 * eye4, 3 * eye4, eye4, src_mask_1head[:1])
w_no_mask, w_src_mask = w_no_mask[0], w_src_mask[0]  # [tgt_len, src_len]

fig, axes = plt.subplots(1, 2, figsize=(7.5, 3.2))
for ax, w, title in [(axes[0], w_no_mask, "cross-attention, no mask"), (axes[1], w_src_mask, "with the source padding mask")]:
    im = ax.imshow(w, cmap="Blues", vmin=0, vmax=1)
    ax.set_xticks(range(len(src_tokens)), src_tokens, rotation=45, ha="right", fontsize=8)
    ax.set_yticks(range(len(tgt_tokens)), tgt_tokens, fontsize=8)
    ax.set_xlabel("source token (key, value)", fontsize=8)
    ax.set_title(title, fontsize=9)
    for i in range(w.shape[0]):
        for j in range(w.shape[1]):
            ax.text(j, i, f"{w[i, j]:.2f}", ha="center", va="center", fontsize=7,
                    color="white" if w[i, j] > 0.5 else "black")
axes[0].set_ylabel("target token (query)", fontsize=8)
fig.colorbar(im, ax=axes, fraction=0.03)
plt.show()
print("weight on <pad>, no mask  :", [f"{v:.2f}" for v in w_no_mask[:, 3].tolist()])
print("weight on <pad>, with mask:", [f"{v:.2f}" for v in w_src_mask[:, 3].tolist()])

# %% [markdown]
# Each target word looks mostly at its translation. Without the mask, a noticeable share of every row goes to
# the padding (the printed weights on `<pad>`), most of all for *a*, which matches nothing strongly. With the
# source padding mask, `<pad>` gets exactly 0 and its share returns to the real words.
#
# ### Cross-attention in the library's layers
#
# `MultiHeadAttention` does the same with several heads: its weights are `[batch, heads, T, S]`, and the
# source padding mask in its per-head layout `[batch, 1, 1, S]` reaches every head and every query. With the
# three source sentences and the three target sentences of section 3:

# %%
torch.manual_seed(8)
cross = MultiHeadAttention(d_model, n_heads).eval()
dec_states = torch.randn(3, 5, d_model)  # [batch, tgt_len, d_model]: queries come from here
memory = torch.randn(3, 4, d_model)      # [batch, src_len, d_model]: keys and values come from here
with torch.no_grad():
    out = cross(dec_states, memory, memory, mask=src_mask, need_weights=True)
print("decoder states (queries):", list(dec_states.shape))
print("memory (keys, values)   :", list(memory.shape))
print("source padding mask     :", list(src_mask.shape))
print("attention weights       :", list(cross.last_weights.shape), "= [batch, heads, tgt_len, src_len]")
print("output                  :", list(out.shape), "= one vector per target position")

# %% [markdown]
# The output has one vector per **target** position, the length of the queries: cross-attention brings
# source information to each target token, and never changes the target's length.
#
# The property test, now for the source: in a whole `DecoderLayer` with the source padding mask, changing the
# memory at a padded source position must change nothing at all.

# %%
memory_changed = memory.clone()
memory_changed[1, 2:] = torch.randn(2, d_model)  # sentence 1 ("tu es") has padding at positions 2 and 3
with torch.no_grad():
    for name, mask in [("with src_mask   ", src_mask), ("without src_mask", None)]:
        y = layer(dec_states, memory, src_mask=mask, tgt_mask=tgt_mask)
        y_changed = layer(dec_states, memory_changed, src_mask=mask, tgt_mask=tgt_mask)
        print(f"{name}: largest change of the decoder output: {(y - y_changed).abs().max():.4f}")

# %% [markdown]
# ## 6. The three attention types, side by side
#
# A Transformer for translation uses attention in three places, the three that Vaswani et al. (2017,
# section 3.2.3) list:
#
# | attention | where | queries from | keys and values from | may see | mask | weights |
# |---|---|---|---|---|---|---|
# | encoder self-attention | every encoder layer | the encoder (source) | the encoder (source) | every real source token | source padding `[B, 1, 1, S]` | `[B, h, S, S]` |
# | masked decoder self-attention | every decoder layer, first | the decoder (target) | the decoder (target) | itself and earlier real target tokens | causal AND target padding `[B, 1, T, T]` | `[B, h, T, T]` |
# | encoder–decoder (cross-) attention | every decoder layer, second | the decoder (target) | the encoder output (memory) | every real source token | source padding `[B, 1, 1, S]` | `[B, h, T, S]` |
#
# ($B$ batch, $h$ heads, $S$ source length, $T$ target length.) Only the decoder's self-attention needs the causal
# mask; padding must be hidden everywhere. The library's `EncoderDecoder` takes exactly two masks, `src_mask`
# and `tgt_mask`: the first serves both the encoder and the cross-attention.
#
# The picture below draws each of them for sentence 1 (*tu es* → *you are*), with the masks built above. The
# rows are the queries and say which sequence asks; the columns are the keys and values and say which sequence
# answers. The encoder's grid is a full block with the padded columns removed, the decoder's a triangle, the
# cross-attention's a rectangle. (Prince, section 12.9, draws the first two as the "interaction matrices" of
# an encoder and a decoder.)

# %%
b = 1
fig = draw_three_attentions(src_words[b], batch_words[b],
                            enc_mask=src_mask[b, 0].expand(4, 4),    # [S, S]
                            dec_mask=tgt_mask[b, 0],                 # [T, T]
                            cross_mask=src_mask[b, 0].expand(5, 4))  # [T, S]
plt.show()

# %% [markdown]
# Checking the shapes with three attention modules, one per type:

# %%
torch.manual_seed(9)
enc_self, dec_self, enc_dec = (MultiHeadAttention(d_model, n_heads).eval() for _ in range(3))
src_x = torch.randn(3, 4, d_model)  # [B, S, d_model]
tgt_x = torch.randn(3, 5, d_model)  # [B, T, d_model]
with torch.no_grad():
    enc_self(src_x, src_x, src_x, mask=src_mask, need_weights=True)
    dec_self(tgt_x, tgt_x, tgt_x, mask=tgt_mask, need_weights=True)
    enc_dec(tgt_x, src_x, src_x, mask=src_mask, need_weights=True)
for name, module, mask in [("encoder self-attention", enc_self, src_mask),
                           ("masked decoder self-att.", dec_self, tgt_mask),
                           ("cross-attention", enc_dec, src_mask)]:
    print(f"{name:<25} mask {str(list(mask.shape)):<14} weights {list(module.last_weights.shape)}")

# %% [markdown]
# ## 7. Pitfalls, live
#
# Every pitfall below is a real bug that runs without an error message. Each is shown, measured, then fixed.
#
# ### Pitfall 1: masking after the softmax
#
# A tempting shortcut: compute the usual softmax, then zero the weights of the hidden keys (or multiply by the
# mask). Take the query `I` (position 1): it may see `<bos>` and itself, not the three keys after it.

# %%
scores_I = torch.tensor([1.0, 2.0, 0.5, 3.0, 1.5])  # query "I" against the 5 keys
visible_I = causal[1]                                # [True, True, False, False, False]

right = softmax(scores_I.masked_fill(~visible_I, torch.finfo(scores_I.dtype).min))
wrong = softmax(scores_I) * visible_I                # softmax first, mask second
print("mask before softmax:", right, f" sum {right.sum():.4f}")
print("mask after softmax :", wrong, f" sum {wrong.sum():.4f}")

# %% [markdown]
# The weights after the late mask no longer sum to one: this row sums to 0.28, so the query's output
# shrinks to about a quarter of its size, and by a different factor for every query. Worse, the future still
# leaks in, through the softmax's denominator. Change only a **future** score (key 3, `student`) and watch the
# weights of the two *visible* keys:

# %%
scores_I_changed = scores_I.clone()
scores_I_changed[3] = -2.0  # a different future token
for name, s in [("original future score", scores_I), ("changed future score ", scores_I_changed)]:
    late = softmax(s) * visible_I
    early = softmax(s.masked_fill(~visible_I, torch.finfo(s.dtype).min))
    print(f"{name}: late mask {late[:2]}   early mask {early[:2]}")

# %% [markdown]
# With the late mask, the weights on `<bos>` and `I` depend on the future token: position 1 can still learn
# from position 3. With the mask applied to the scores, they do not move. Rule: **mask the scores, then take the
# softmax.**
#
# ### Pitfall 2: `-inf` and a row with nothing to attend to
#
# The paper sets the scores of illegal connections to $-\infty$ (Vaswani et al., 2017, section 3.2.3), and many
# implementations fill with `float('-inf')` literally: $e^{-\infty} = 0$, exactly what we want. It works as long
# as every row keeps at least one visible key. A row where *every* key is hidden becomes all `-inf`, and the
# stable softmax computes $-\infty - (-\infty)$, which is NaN (not a number). Here in float16, the dtype of
# mixed-precision training, with a query (row 1) that may see nothing:

# %%
scores16 = torch.tensor([[1.0, 2.0, 0.5], [0.3, -1.0, 2.0]], dtype=torch.float16)  # [2 queries, 3 keys]
mask16 = torch.tensor([[True, True, False], [False, False, False]])  # query 1 may see no key
naive = softmax(scores16.masked_fill(~mask16, float("-inf")))
print("fill with -inf:\n", naive)

# %% [markdown]
# And a NaN never stays where it is born. The next layer mixes values; hidden keys get weight 0, but
# $0 \times \mathrm{NaN} = \mathrm{NaN}$, so one NaN value poisons **every** output that merely *skips* it:

# %%
values3 = torch.tensor([[1.0, 0.0], [0.0, 1.0], [float("nan"), float("nan")]])  # value 2 is NaN
weights3 = torch.tensor([[0.5, 0.5, 0.0], [1.0, 0.0, 0.0]])  # nobody looks at value 2 ...
print("weights @ values:\n", weights3 @ values3)             # ... and still every output is NaN

# %% [markdown]
# The fix has two steps, and the library's `scaled_dot_product_attention` does both:
#
# 1. Fill with **the most negative finite number of the dtype**, `torch.finfo(scores.dtype).min`, not `-inf`.
#    A fully hidden row then holds equal finite numbers, and the softmax is defined: uniform.
# 2. A uniform average over keys the query must not see is still wrong, so **set rows with no visible key to
#    zero**. That query's output is then 0.

# %%
step1 = softmax(scores16.masked_fill(~mask16, torch.finfo(scores16.dtype).min))
step2 = step1.masked_fill(~mask16.any(dim=-1, keepdim=True), 0.0)
print(f"finfo(float16).min = {torch.finfo(torch.float16).min:.0f}")
print("step 1, finfo.min fill:\n", step1)
print("step 2, empty rows zeroed:\n", step2)

# %% [markdown]
# ### Exercise 5 — `masked_softmax`
# > **Difficulty** ●●○ · **Importance** ●●● · about 15 minutes
#
# Write `masked_softmax(scores, mask)`: the softmax over the last dimension (the keys) that respects a mask.
#
# * `scores`: `[..., L_q, L_k]`, any float dtype, float16 included.
# * `mask`: bool, broadcastable to `scores` (for example `[L_q, L_k]` or `[batch, 1, 1, L_k]`), True = may attend.
# * returns weights with the shape of `scores` (and its dtype): hidden keys get exactly 0; each row with a
#   visible key sums to 1; a row with **no** visible key is all zeros, never NaN.
#
# Worked example: the two rows above, `masked_softmax(scores16, mask16)`, give `step2`.
#
# You may use `torch.softmax` or the `softmax` of chapter 02 (imported above).
#
# <details><summary>Hint 1 — the idea</summary>Hidden scores must become so negative that their exponential is 0, yet stay finite, so that a row whose keys are all hidden does not compute −∞ − (−∞). Such a row then comes out uniform: set it to zero at the end.</details>
# <details><summary>Hint 2 — the plan</summary>Three steps, every tensor <code>[..., L_q, L_k]</code>: hide the
# forbidden scores with a very negative but finite number, normalise over the keys (the last dimension) with the maximum
# subtracted, then clear the rows of the queries that see no key at all. Those rows are found by asking of the mask, for
# every query, whether at least one key is visible: a <code>[..., L_q, 1]</code> answer, False exactly for
# them.</details>
# <details><summary>Hint 3 — the key step</summary>The pages to read: torch.finfo (its <code>min</code> is the most
# negative finite number of a dtype, -65504 for float16) and torch.Tensor.any. Why not minus infinity? Try a toy row of
# two hidden scores, both minus infinity: minus its own maximum it is inf - inf, NaN.</details>

# %% nbgrader={"grade": false, "grade_id": "masked_softmax", "locked": false, "schema_version": 3, "solution": true, "task": false}
def masked_softmax(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Softmax over the keys in which hidden keys get zero weight; rows with nothing visible are zeros.

    scores: [..., L_q, L_k] float; mask: bool broadcastable to scores, True = may attend.
    Returns weights of the shape and dtype of scores.
    """
    ### BEGIN SOLUTION
    hidden = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)  # finite, even in float16
    shifted = hidden - hidden.amax(dim=-1, keepdim=True)
    e = shifted.exp()
    weights = e / e.sum(dim=-1, keepdim=True)  # [..., L_q, L_k]
    empty = ~mask.any(dim=-1, keepdim=True)  # [..., L_q, 1]: queries that may see nothing
    return weights.masked_fill(empty, 0.0)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "masked_softmax_test", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false} tags=["raises-exception"]
check_masked_softmax(masked_softmax)
### BEGIN HIDDEN TESTS
check_masked_softmax(masked_softmax, hidden=True)
### END HIDDEN TESTS

# %%
masked_softmax_impl = yours_or_reference(masked_softmax, check_masked_softmax)

# %% [markdown]
# The library's attention computes its weights exactly this way, so that there is one copy of the logic. Your
# function (or the reference) against it, on the decoder's mask and on the float16 example:

# %%
g = torch.Generator().manual_seed(10)
q, k, v = (torch.randn(3, 2, 5, 8, generator=g) for _ in range(3))  # [batch, heads, T, d_k]
_, weights = scaled_dot_product_attention(q, k, v, mask=tgt_mask)
print("scaled_dot_product_attention's weights == masked_softmax_impl(scores) (to 1e-6):",
      torch.allclose(weights, masked_softmax_impl(attention_scores(q, k), tgt_mask), atol=1e-6))
print("float16 example:\n", masked_softmax_impl(scores16, mask16))

# %% [markdown]
# ### Pitfall 3: a fill value that is not negative enough (and `-1e9` in float16)
#
# Why not fill with some "big" negative constant? Because "big" is relative to the scores. After the fill,
# a hidden key has score $c$ and gets weight $e^{c} / (\sum_{j \in V} e^{s_j} + |H|\, e^{c})$, with $V$ the
# visible keys and $|H|$ the number of hidden ones. That is tiny only if $c$ is far below **every visible score**, and scores can be large and negative.
#
# **Predict**: for a query whose visible scores are around $-12$, how much weight leaks to the hidden keys if
# they are filled with $-10$?
#
# The cell below fills two hidden keys with several constants, for two queries: one with moderate visible
# scores `[2, 1]`, one with very negative ones `[-12, -14]`.

# %%
hidden2 = torch.tensor([True, True, False, False])  # two visible keys, two hidden
rows = {"visible scores [2, 1]": torch.tensor([2.0, 1.0, 5.0, 4.0]),
        "visible scores [-12, -14]": torch.tensor([-12.0, -14.0, 5.0, 4.0])}
print(f"{'fill value':>14} | " + " | ".join(f"{name:>26}" for name in rows))
for fill in [0.0, -1.0, -10.0, -1e4, torch.finfo(torch.float32).min]:
    leaks = [softmax(s.masked_fill(~hidden2, fill))[2:].sum().item() for s in rows.values()]
    print(f"{fill:>14.4g} | " + " | ".join(f"{'leaked weight ' + format(x, '.2e'):>26}" for x in leaks))

# %% [markdown]
# A fill of 0 or $-1$ hands the hidden keys a large share: 0.165 and 0.0679 of the first query's weight,
# practically all of the second's. $-10$ looks safe for the first query (it leaks less than a hundred-thousandth), but for the
# second the hidden keys take 0.929 of the weight: $-10$ is *larger* than $-12$. Only a fill far below any
# score that can occur is safe, which is why the library uses the most negative number of the dtype.
#
# Then why not the classic `-1e9`, the fill of the Annotated Transformer's `attention` function (Rush, "The
# Annotated Transformer", Harvard NLP, 2018)? In float32 it works. In float16, whose largest magnitude is
# 65504, $-10^9$ does not exist:

# %%
print(f"finfo(float16).min = {torch.finfo(torch.float16).min:.0f}, finfo(float32).min = {torch.finfo(torch.float32).min:.3g}")
print("-1e9 as float16 :", torch.tensor(-1e9).to(torch.float16))
try:
    scores16.masked_fill(~mask16, -1e9)
except RuntimeError as err:
    print("masked_fill(~mask, -1e9) on float16 scores -> RuntimeError:", err)
additive = torch.zeros(2, 3).masked_fill(~mask16, -1e9).to(torch.float16)  # an "additive mask" made in float32
print("additive -1e9 mask cast to float16 -> softmax:\n", softmax(scores16 + additive))

# %% [markdown]
# `masked_fill` refuses outright, which is the kind outcome. The additive mask (a float mask added to the
# scores, a common style) silently becomes `-inf` and brings back pitfall 2's NaN for the empty row.
# `torch.finfo(scores.dtype).min` always fits the scores' dtype, whatever it is: $-65504$ in float16,
# about $-3.4 \times 10^{38}$ in float32.
#
# ### Pitfall 4: padded queries, rows with nothing to attend to
#
# Section 3 hid padded *keys* only. It is tempting to hide padded *queries* too ("padding should not attend
# to anything either"), with a mask that is False on their rows. Those rows then have nothing to attend to.
# With the `-inf` fill, each one is a NaN, and pitfall 2 showed where NaN goes: into the next layer, where the
# padded position is a key that every real token skips, with weight $0 \times \mathrm{NaN}$. Two stacked
# attentions, the second one with the ordinary padding mask:

# %%
def naive_attention(q, k, v, mask):
    """Attention with the -inf fill and nothing else: fine until a row has no visible key."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    return softmax(scores.masked_fill(~mask, float("-inf"))) @ v


real = tgt[1] != PAD                          # "<bos> you are <pad> <pad>": [T, T, T, F, F]
keys_only = real[None, :].expand(L, L)        # [5, 5]: hide padded keys (section 3)
rows_too = keys_only & real[:, None]          # [5, 5]: ... and padded queries as well
print("visible keys per query, rows hidden too:", rows_too.sum(-1).tolist())

g = torch.Generator().manual_seed(11)
h = torch.randn(L, 4, generator=g)  # one sentence, 5 positions, 4 features
for name, first_mask in [("padded keys hidden (section 3)   ", keys_only), ("padded queries hidden too, -inf ", rows_too)]:
    h1 = naive_attention(h, h, h, first_mask)    # layer 1
    h2 = naive_attention(h1, h1, h1, keys_only)  # layer 2: ordinary padding mask
    print(f"{name}: NaN in layer 1 at positions {h1.isnan().any(-1).nonzero().flatten().tolist()}, "
          f"in layer 2 at positions {h2.isnan().any(-1).nonzero().flatten().tolist()}")

# %% [markdown]
# In layer 1 the NaN sits at the two padded positions, harmless-looking because the loss ignores them. One
# layer later, the three *real* tokens are NaN too, and so is the loss. With `masked_softmax` the empty
# rows are exact zeros instead, and nothing spreads:

# %%
h1 = masked_softmax_impl(h @ h.T / math.sqrt(4), rows_too) @ h
h2 = masked_softmax_impl(h1 @ h1.T / math.sqrt(4), keys_only) @ h1
print("masked_softmax: NaN anywhere?", bool(h1.isnan().any() or h2.isnan().any()), "| padded rows of layer 1:\n", h1[3:])

# %% [markdown]
# Two lessons. Hide padding on the **keys** only, as `padding_mask` does, and leave padded queries alone; the
# loss ignores their outputs anyway. And make the softmax safe for empty rows, because they do occur in
# practice: with **left padding** (padding at the start, used by many decoder-only models to batch prompts),
# the causal mask AND the padding mask leave the first rows empty:

# %%
left_padded = torch.tensor([[PAD, PAD, 1, 7, 8]])  # "<pad> <pad> <bos> you are"
print("visible keys per query, left padding:", combine_decoder_mask_impl(left_padded, PAD)[0, 0].sum(-1).tolist())

# %% [markdown]
# ## 8. The decoder layer, assembled
#
# Every part of a decoder layer is now on the table. Vaswani et al. (2017, section 3.1) stack three sub-layers,
# each inside the Add & Norm of chapter 05:
#
# $$x \leftarrow \mathrm{LN}_1\big(x + \mathrm{MaskedSelfAttn}(x)\big), \qquad
# x \leftarrow \mathrm{LN}_2\big(x + \mathrm{CrossAttn}(x, M)\big), \qquad
# x \leftarrow \mathrm{LN}_3\big(x + \mathrm{FFN}(x)\big).$$
#
# The masked self-attention lets each target position read the target up to itself, under the mask of
# exercise 3. The cross-attention takes its queries from the decoder and its keys and values from the encoder's
# memory $M$, under the source padding mask (exercise 4). The feed-forward network then works on each position
# alone. It is chapter 05's encoder layer with one more sub-layer in the middle, and the pre-norm form is the same
# change as there: $x \leftarrow x + \mathrm{Sublayer}(\mathrm{LN}(x))$ for each of the three.

# %% [markdown]
# ### Exercise 6 — `decoder_layer_forward`
# > **Difficulty** ●●○ · **Importance** ●●● · about 25 minutes
#
# Write `decoder_layer_forward(x, memory, src_mask, tgt_mask, layer)`, the forward pass of one decoder layer, from
# the parts of the library's `DecoderLayer`, wired as chapter 05's `encoder_layer_forward`:
#
# * `x`: `[batch, T, d_model]`, the decoder's input; `memory`: `[batch, S, d_model]`, the encoder's output.
#   Returns `[batch, T, d_model]`.
# * `src_mask`: the source padding mask `[batch, 1, 1, S]`, or `None`. `tgt_mask`: the mask of the decoder's
#   self-attention, causal AND target padding `[batch, 1, T, T]` (or a plain causal `[T, T]`), or `None`.
# * `layer`: a `DecoderLayer`. Its parts:
#   * `layer.self_attn` and `layer.cross_attn`: two `MultiHeadAttention` modules, each called with a query, a key,
#     a value and a mask;
#   * `layer.feed_forward`: the position-wise FFN of chapter 05, as a module;
#   * `layer.norm1`, `layer.norm2`, `layer.norm3`: the `LayerNorm`s around the self-attention, the cross-attention
#     and the FFN. Call one on a tensor, or hand its `.gamma`, `.beta` and `.eps` to chapter 05's `add_and_norm`
#     (imported above from the library);
#   * `layer.dropout1`, `layer.dropout2`, `layer.dropout3`: `nn.Dropout` modules, one per sub-layer, applied to its
#     output before it is added to `x` (the checker runs them in eval mode, where they do nothing);
#   * `layer.norm_first`: `False` for post-norm (the paper), `True` for pre-norm.
#
# Do not call the layer itself on `x`: that runs the library's own forward pass (the checker refuses it).
#
# Worked example: a fresh `DecoderLayer(16, 2, 32)` has $\gamma = 1$ and $\beta = 0$ in its three norms, so in
# post-norm every output vector has mean 0 and norm $\sqrt{16} = 4$. The check also runs your function a second
# time, after changing the last real target token of every sentence: the outputs at the earlier positions must
# not move at all.
#
# <details><summary>Hint 1 — the idea</summary>Chapter 05's encoder layer with a third sub-layer in the middle. Write
# each sub-layer as a small function of one tensor, <code>[batch, T, d_model]</code> in and out, with its dropout
# applied to its output, and wrap each in Add &amp; Norm. Only the middle one looks at the memory, and only the
# first one needs the causal mask.</details>
# <details><summary>Hint 2 — the plan</summary>Three residual steps, each replacing <code>x</code>: the masked
# self-attention (the decoder's stream as query, key and value, with the target's mask), the cross-attention (the stream
# asks, the memory answers as key and value, with the source's mask), and the FFN; each has its own norm and dropout,
# numbered in that order. In pre-norm only the decoder's stream is normalised before a sub-layer, never the
# memory.</details>
# <details><summary>Hint 3 — the key step</summary>The question that unlocks it: the cross-attention is a function of
# the decoder's stream alone, so how does it get the memory and the source's mask from the enclosing function (a nested
# <code>def</code> or a <code>lambda</code>)? And which of the attention module's three inputs are the memory?</details>

# %% nbgrader={"grade": false, "grade_id": "decoder_layer_forward", "locked": false, "schema_version": 3, "solution": true, "task": false}
def decoder_layer_forward(x: torch.Tensor, memory: torch.Tensor, src_mask: torch.Tensor | None,
                          tgt_mask: torch.Tensor | None, layer: DecoderLayer) -> torch.Tensor:
    """Masked self-attention, cross-attention over the memory, then the FFN, each inside Add & Norm.

    x: [batch, T, d_model]; memory: [batch, S, d_model]; src_mask, tgt_mask: None or bool masks (True = may attend).
    Returns [batch, T, d_model].
    """
    ### BEGIN SOLUTION
    def self_attention(y):  # the target reads itself, up to each position
        return layer.dropout1(layer.self_attn(y, y, y, tgt_mask))  # [batch, T, d_model]

    def cross_attention(y):  # queries from the decoder, keys and values from the encoder's memory
        return layer.dropout2(layer.cross_attn(y, memory, memory, src_mask))  # [batch, T, d_model]

    def ffn(y):  # each position on its own
        return layer.dropout3(layer.feed_forward(y))  # [batch, T, d_model]

    if layer.norm_first:  # pre-norm: normalise the stream before each sub-layer, add the raw stream
        x = x + self_attention(layer.norm1(x))
        x = x + cross_attention(layer.norm2(x))
        return x + ffn(layer.norm3(x))
    x = layer.norm1(x + self_attention(x))  # post-norm: normalise each sum
    x = layer.norm2(x + cross_attention(x))
    return layer.norm3(x + ffn(x))
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "decoder_layer_forward_test", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false} tags=["raises-exception"]
check_decoder_layer_forward(decoder_layer_forward)
### BEGIN HIDDEN TESTS
check_decoder_layer_forward(decoder_layer_forward, hidden=True)
### END HIDDEN TESTS

# %%
decoder_layer_forward_impl = yours_or_reference(decoder_layer_forward, check_decoder_layer_forward)

# %% [markdown]
# ### Your layer in a decoder
#
# The library's `Decoder(layer, n_layers, norm_first, layer_forward=...)` stacks deep copies of a `DecoderLayer`,
# and runs each of them with the function it is given: here `decoder_layer_forward_impl`, yours if it passed. We
# build a two-layer decoder (each layer with its own random weights), count the calls that one forward pass makes to your function, and run it on the first
# sentence pair of the batch, *je suis étudiant* → `<bos> I am a student`, the target embedded with the `embed`
# table of section 3 and the memory a random stand-in for an encoder's output.

# %%
torch.manual_seed(12)
decoder = Decoder(DecoderLayer(d_model, n_heads, d_ff=32), n_layers=2,
                  layer_forward=decoder_layer_forward_impl).eval()
for p in decoder.parameters():  # the two copies start equal: give each layer its own random matrices
    if p.dim() > 1:
        nn.init.xavier_uniform_(p)
with torch.no_grad():
    dec_x = embed(tgt[:1])                 # [1, 5, d_model]: "<bos> I am a student"
    dec_memory = torch.randn(1, 4, d_model)  # [1, 4, d_model]: "je suis étudiant <pad>"
one_src_mask, one_tgt_mask = src_mask[:1], tgt_mask[:1]  # [1, 1, 1, 4] and [1, 1, 5, 5]
assert model_calls(decoder, decoder_layer_forward_impl, dec_x, dec_memory, one_src_mask, one_tgt_mask) == 2
whose = "your" if decoder_layer_forward_impl is decoder_layer_forward else "the library's"
print(f"the decoder runs {whose} decoder_layer_forward, once per layer")

# %% [markdown]
# **Predict**: we change the input vector at one target position $j$ and record how much every output position
# $i$ moves. Which cells of the $5 \times 5$ grid of changes can be non-zero with the causal mask? And without any
# target mask?

# %%
def influence(tgt_mask_used):
    """[changed input position j, output position i]: the largest change of output i when input j changes."""
    g = torch.Generator().manual_seed(13)
    grid = torch.zeros(L, L)
    with torch.no_grad():
        base = decoder(dec_x, dec_memory, one_src_mask, tgt_mask_used)  # [1, 5, d_model]
        for j in range(L):
            changed = dec_x.clone()
            changed[0, j] = torch.randn(d_model, generator=g)
            grid[j] = (decoder(changed, dec_memory, one_src_mask, tgt_mask_used) - base).abs().amax(dim=-1)[0]
    return grid


with_mask, without_mask = influence(one_tgt_mask), influence(None)
words0 = batch_words[0]
top = max(with_mask.max(), without_mask.max()).item()  # one colour scale for both grids
fig, axes = plt.subplots(1, 2, figsize=(8, 3.4))
for ax, grid, title in [(axes[0], with_mask, "causal AND padding mask"), (axes[1], without_mask, "no target mask")]:
    im = ax.imshow(grid, cmap="Oranges", vmin=0, vmax=top)
    ax.set_xticks(range(L), words0, rotation=45, ha="right", fontsize=8)
    ax.set_yticks(range(L), words0, fontsize=8)
    ax.set_xlabel("output position i", fontsize=8)
    ax.set_title(title, fontsize=9)
    for j in range(L):
        for i in range(L):
            ax.text(i, j, "0" if grid[j, i] == 0 else "", ha="center", va="center", fontsize=8)
axes[0].set_ylabel("input position j changed", fontsize=8)
fig.colorbar(im, ax=axes, fraction=0.03)
plt.show()
past = torch.ones(L, L, dtype=torch.bool).triu(1).T  # [j, i]: output i comes before the changed input j
print("largest change of an output before the changed position, causal mask:", with_mask[past].max().item())
claim(bool((without_mask[past] > 1e-3).all()), "without a target mask, changing an input moves every output before it")

# %% [markdown]
# With the mask, every cell below the diagonal is exactly 0: changing input $j$ moves outputs $j$ and after, never
# an earlier one, through both layers of the stack (a cell marked 0 is zero to the last bit). Without a target
# mask, every input moves every output, the future included. That is the property the library's `DecoderLayer`
# showed in section 2, now measured on your layer in a stack.
#
# Is it the layer PyTorch ships? We copy the weights of one `DecoderLayer` into `nn.TransformerDecoderLayer` and
# compare, in both forms, with both masks. PyTorch keeps $W^Q, W^K, W^V$ stacked in one `in_proj_weight`, names
# its cross-attention `multihead_attn`, and its boolean masks mark what is *hidden* (`True` = may not attend), the
# opposite of this course's convention.

# %%
def to_torch_decoder_layer(ours: DecoderLayer) -> nn.TransformerDecoderLayer:
    theirs = nn.TransformerDecoderLayer(d_model, n_heads, ours.feed_forward.linear1.out_features, dropout=0.0,
                                        batch_first=True, norm_first=ours.norm_first)
    with torch.no_grad():
        for mine, torch_attn in [(ours.self_attn, theirs.self_attn), (ours.cross_attn, theirs.multihead_attn)]:
            torch_attn.in_proj_weight.copy_(torch.cat([mine.w_q.weight, mine.w_k.weight, mine.w_v.weight]))
            torch_attn.in_proj_bias.copy_(torch.cat([mine.w_q.bias, mine.w_k.bias, mine.w_v.bias]))
            torch_attn.out_proj.load_state_dict(mine.w_o.state_dict())
        theirs.linear1.load_state_dict(ours.feed_forward.linear1.state_dict())
        theirs.linear2.load_state_dict(ours.feed_forward.linear2.state_dict())
        for torch_norm, my_norm in [(theirs.norm1, ours.norm1), (theirs.norm2, ours.norm2), (theirs.norm3, ours.norm3)]:
            torch_norm.weight.copy_(my_norm.gamma)
            torch_norm.bias.copy_(my_norm.beta)
    return theirs.train()  # training mode with dropout 0: PyTorch's plain (not fused) path


torch.manual_seed(14)
dec_states3 = torch.randn(3, 5, d_model)  # [batch, T, d_model]: the three target sentences of section 3
memory3 = torch.randn(3, 4, d_model)      # [batch, S, d_model]: the three source sentences
with torch.no_grad():
    for norm_first in [False, True]:
        ours = DecoderLayer(d_model, n_heads, d_ff=32, norm_first=norm_first).eval()
        ours.norm1.gamma.uniform_(0.5, 1.5)  # not all ones, so that a misplaced norm would show
        ours.norm3.beta.normal_()
        theirs = to_torch_decoder_layer(ours)
        mine = decoder_layer_forward_impl(dec_states3, memory3, src_mask, tgt_mask, ours)
        reference = theirs(dec_states3, memory3, tgt_mask=~tgt_mask.repeat_interleave(n_heads, dim=0).squeeze(1),
                           memory_key_padding_mask=src == PAD)  # PyTorch: True = hidden
        gap = (mine - reference).abs().max().item()
        claim(gap < 1e-5, f"norm_first={norm_first}: decoder_layer_forward_impl and nn.TransformerDecoderLayer "
              "agree to 1e-5", measured=f"{gap:.1e}")

# %% [markdown]
# Chapter 07 stacks this layer into the whole encoder–decoder and trains it. The library's `DecoderLayer` runs
# the same top-level `decoder_layer_forward` that your answer was compared with, plus one thing that only
# generation needs: a key/value cache, so that the decoder can be fed one new token at a time (chapter 07,
# section 4).

# %% [markdown]
# ## Summary
#
# * **Teacher forcing** feeds the whole (shifted) target to the decoder at once; without a mask, position $t$
#   reads token $t+1$, the answer it must predict. The hand-made cheat got 4 of 5 tokens right without knowing
#   any English.
# * The **causal mask** is the lower triangle, diagonal included: True where $j \le i$. With it, changing a
#   future token changed no earlier output of `DecoderLayer` (a change of exactly 0), and the full-sentence run
#   matched the prefix runs of generation.
# * The **padding mask** hides padded *keys* for every query: keys on the last axis, a 1 on the query axis.
#   `[batch, 1, seq]` for one head's scores and `[batch, 1, 1, seq]` for per-head scores are the same mask, and
#   `MultiHeadAttention` takes both. `[batch, seq, 1]` (hides queries) and a bare `[batch, seq]` (the batch on
#   the query axis) ran silently with `batch == seq` and were wrong; the bare mask is right only for a batch of one.
# * The decoder's self-attention uses **causal AND padding**, `[batch, 1, L, L]` (`decoder_self_mask`).
# * **Cross-attention** takes queries from the decoder and keys and values from the encoder's memory; its
#   weights are `[batch, T, S]` per head, and its only mask is the **source padding mask**.
# * Masks act on the **scores, before the softmax**. Fill with `torch.finfo(dtype).min`, not `-inf` (NaN on
#   empty rows), not a small constant (leaks), not `-1e9` (float16 cannot hold it: `masked_fill` raises a
#   RuntimeError, and an additive mask cast to float16 turns it into `-inf`), and zero the rows
#   with nothing to attend to. That is `masked_softmax`, which the library's attention uses.
# * A **decoder layer** is masked self-attention, cross-attention over the memory, then the FFN, each inside Add &
#   Norm (`decoder_layer_forward`). A two-layer decoder running it kept every output before a changed target token
#   exactly unchanged, and one layer matched `nn.TransformerDecoderLayer` in both norm placements.
#
# ## What's next
#
# All the pieces of the Transformer are now in place. Chapter 07, **training and inference**, puts them to
# work: the generator (linear + log-softmax), the cross-entropy loss that ignores padded positions, teacher
# forcing with shifted targets, the warm-up schedule, and then generation, greedy and beam search, one token
# at a time, with the encoder's memory computed once and a KV cache for the decoder.

# %% [markdown]
# ## Where you stand
#
# Which of this chapter's exercises pass, as last checked (run the test cells again after a change):

# %%
exercise_summary(check_make_causal_mask, check_make_padding_mask, check_combine_decoder_mask,
                 check_cross_attention, check_masked_softmax, check_decoder_layer_forward)

# %% [markdown]
# ## Glossary · 术语表
#
# | English | 中文 | Meaning |
# |---|---|---|
# | decoder | 解码器 | the half of the Transformer that generates the target sequence token by token |
# | autoregressive | 自回归 | each token is predicted from the tokens before it: $P(y_t \mid y_{<t}, x)$ |
# | teacher forcing | 教师强制 | training with the true previous tokens as decoder input, all positions at once |
# | shifted right | 右移一位 | the decoder input is `<bos>` followed by the target without its last token |
# | mask | 掩码 | boolean tensor, True = may attend, applied to the scores before the softmax |
# | causal mask / look-ahead mask | 因果掩码 / 序列掩码（下三角） | lower triangle: position $i$ may see positions $j \le i$ only |
# | padding | 填充 | filler tokens that make sentences of different lengths one rectangular tensor |
# | padding mask | 填充掩码（padding mask） | hides padded keys: `[batch, 1, seq]` (one head) or `[batch, 1, 1, seq]` (per head) |
# | masked self-attention | 掩码自注意力 | the decoder's self-attention under causal AND padding masks |
# | cross-attention | 交叉注意力 / 编码器-解码器注意力 | queries from the decoder, keys and values from the encoder output |
# | memory | 编码器输出（memory） | the encoder's output vectors, read by every decoder layer |
# | broadcasting | 广播 | size-1 dimensions are repeated to match: `[B, 1, 1, S]` against `[B, h, T, S]` |
# | additive mask | 加性掩码 | a float mask of 0 and `-inf` added to the scores; this course passes booleans instead |
# | fully masked row | 全被屏蔽的行 | a query with no visible key; must give zero weights, not NaN |
# | NaN | 非数（NaN） | "not a number", e.g. $-\infty - (-\infty)$; spreads through every later sum |
# | float16 / half precision | 半精度浮点 | 16-bit floats, largest magnitude 65504: `-1e9` overflows to `-inf` |
# | decoder layer | 解码器层 | masked self-attention, cross-attention, then the FFN, each inside Add & Norm |
# | decoder stack | 解码器堆叠 | $N$ decoder layers, each reading the layer below and the same encoder memory |
