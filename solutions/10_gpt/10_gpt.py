# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Chapter 10 — GPT: a decoder-only language model
#
# Chapter 07 trained an encoder-decoder: an encoder read a date, a decoder wrote its ISO form. Chapter 09's
# BERT kept only the encoder. This chapter keeps only the **decoder**, and with it the simplest training task
# there is: *predict the next token*. No labels, no second sequence: any text is training data. That is the
# recipe of GPT (Radford et al., 2018), GPT-2 (Radford et al., 2019) and GPT-3 (Brown et al., 2020), and of
# most large language models since.
#
# A model that predicts the next token does three things at once. It **scores** texts: by the chain rule, the
# product of its next-token probabilities is the probability of a whole text. It **generates**: draw a token,
# append it, predict again. And, at a large enough scale, it can be **prompted** to do tasks it was never
# trained on.
#
# In this chapter:
#
# 1. **The chain rule**: "It takes great courage" as a product of next-token probabilities; the decoder-only
#    model in one picture.
# 2. **The model, written by you**: GPT-2's pre-norm block and its forward pass, with the key/value cache. From
#    here on, every GPT in the chapter runs your two functions (once they pass their checks).
#    *Exercises 1 and 2: `gpt_block`, `gpt_forward`.*
# 3. **Every position is a training example**: windows of text, the causal mask, targets shifted by one.
#    *Exercise 3: `next_token_loss`.*
# 4. **Baselines**: what a loss of 2 nats per character means. Unigram and bigram models, bits, perplexity.
#    *Exercises 4 and 5: `bigram_log_probs`, `bits_per_char`.*
# 5. **A character-level GPT**, your model, trained here on Python's own help text, against those baselines.
# 6. **The chain rule, measured**: the trained model scores a sentence and its scrambled words.
# 7. **The same model on BPE tokens**, compared per character (per-token numbers are not comparable).
# 8. **Generation**: greedy with the key/value cache, temperature, top-k, top-p (nucleus) sampling and beam
#    search, with samples written by your sampling loop. *Exercises 6 to 9: `greedy_generate`,
#    `temperature_probs`, `top_p_filter`, `sample`.*
# 9. **Scale**: GPT-2 small counted, GPT-3's 175 billion parameters recomputed from its shape.
# 10. **Few-shot prompting**: GPT-3's in-context learning, and what a model this small does with its context,
#    measured (it finishes words from their first letters, short-context prediction; it does not copy).
# 11. **Three families**: encoder-decoder, encoder-only, decoder-only.
#
# The nine exercises take about 140 minutes in all. The whole notebook runs on one CPU thread in under a minute,
# both trainings included.

# %%
import math
import re
import time

import matplotlib.pyplot as plt
import torch

from transformer_lib import configs
from transformer_lib.attention import KVCache
from transformer_lib.checks import exercise_summary, model_calls, yours_or_reference
from transformer_lib.checks.ch10 import (
    check_bigram_log_probs,
    check_bits_per_char,
    check_gpt_block,
    check_gpt_forward,
    check_greedy_generate,
    check_next_token_loss,
    check_sample,
    check_temperature_probs,
    check_top_p_filter,
)
from transformer_lib.claims import claim, claim_between
from transformer_lib.corpus import char_splits
from transformer_lib.decoding import top_k_filter
from transformer_lib.diagrams.ch10 import draw_decoder_only, draw_three_families
from transformer_lib.gpt import (GPT, Block, CharTokenizer, GPTConfig, beam_search, evaluate_lm, generate,
                                 generate_long, train_lm, unigram_log_probs)
from transformer_lib.masks import causal_mask
from transformer_lib.tokenization import train_byte_level_bpe

torch.manual_seed(0)
torch.set_printoptions(precision=4, sci_mode=False)

# %% [markdown]
# ## 1. The chain rule
#
# A **language model** gives every text a probability. Writing a text $x_1, x_2, \dots, x_T$ as a sequence
# of tokens, the chain rule of probability splits that one number into a product of next-token
# predictions, with no approximation at all:
#
# $$P(x_1, \dots, x_T) = P(x_1)\, \prod_{t=2}^{T} P(x_t \mid x_1, \dots, x_{t-1}).$$
#
# Simon Prince's example (*Understanding Deep Learning*, 2023, section 12.7) reads it on the sentence *It takes
# great courage*, whose four words are $x_1$ = *It*, $x_2$ = *takes*, $x_3$ = *great* and $x_4$ = *courage*:
#
# $$P(x_1, x_2, x_3, x_4) = P(x_1) \times P(x_2 \mid x_1) \times P(x_3 \mid x_1, x_2) \times P(x_4 \mid x_1, x_2, x_3).$$
#
# So a model that, given any left context, returns a distribution over the next token *is* a model of whole
# texts. Such a model is called **autoregressive**: each token is predicted from the ones before it. Here are
# the four factors it must supply for Prince's sentence:

# %%
words = ["It", "takes", "great", "courage"]
for t, word in enumerate(words):
    context = " ".join(words[:t]) or "(the start)"
    print(f"factor {t + 1}: P({word!r:>9} | {context})")

# %% [markdown]
# Each factor is a number below one, so their product shrinks fast with the length of the text: a paragraph of
# 1,000 characters, each predicted with probability 0.3, has probability $0.3^{1000}$, far below the smallest
# float32. Models therefore work with **log-probabilities**, and the product becomes a sum:
#
# $$\log P(x_1, \dots, x_T) = \log P(x_1) + \sum_{t=2}^{T} \log P(x_t \mid x_{<t}).$$

# %%
p = torch.tensor(0.3)
print("0.3 ** 1000 in float32      :", (p ** 1000).item())
print("1000 * log(0.3), in float32 :", (1000 * p.log()).item())

# %% [markdown]
# ### The decoder-only model
#
# GPT is the Transformer's decoder without its cross-attention, since there is no encoder to attend to.
# Tokens are embedded and given learned position vectors; a stack of identical blocks follows, each a
# **masked self-attention** and an MLP, each inside a residual connection; a linear layer turns every
# position's final vector into logits over the vocabulary. The output layer reuses the token embedding matrix
# (**weight tying**, Press & Wolf, 2017).
#
# Where the LayerNorms sit changed between the first two GPTs (chapter 05 compared the two places). GPT-1
# (Radford et al., 2018, Figure 1) kept the original Transformer's order: each sub-block's output is added to
# its input, then normalised (**post-norm**). GPT-2 (Radford et al., 2019, section 2.3) moved the LayerNorm to
# the input of each sub-block, inside the residual branch (**pre-norm**), and added one more LayerNorm after the
# last block. The library's `transformer_lib.gpt.GPT` is GPT-2's architecture, pre-norm and final LayerNorm
# included: its tests copy the weights of a Hugging Face `GPT2LMHeadModel` into it and get the same logits.
#
# The picture shows one training window of the sentence. The causal mask beside the stack is what makes
# position $t$ see only positions $0..t$. So, in **one** forward pass, the output at every position is a
# prediction of the token after it, made from the left context alone. Read upwards: *It* predicts *takes*,
# *It takes* predicts *great*, and so on.

# %%
fig = draw_decoder_only(words)
plt.show()

# %% [markdown]
# ## 2. The model, written by you
#
# The library's `GPT` holds GPT-2's parts, under GPT-2's names. How the parts are wired is two plain functions,
# and you write both: one block, then the whole forward pass. Once they pass their checks, every GPT this chapter
# builds, trains and samples from runs your two functions (a model keeps the functions it runs as attributes,
# `GPT(config, block_fn=..., forward_fn=...)`, and the chapter checks that it calls yours).
#
# Here are the parts of one block, printed from a small one, 32 features wide with 2 heads:

# %%
small = GPTConfig(vocab_size=20, max_len=16, d_model=32, n_heads=2, n_layers=2, dropout=0.0)
print(Block(small))

# %% [markdown]
# `self_attn` is chapter 03's multi-head attention: it takes a query, a key and a value, each
# `[batch, seq, d_model]`, then a boolean mask (True = may attend, as everywhere in the course) that broadcasts to
# `[seq_q, seq_k]`, and the keyword `cache`. `feed_forward` is the MLP, 32 → 128 → 32 features with GPT-2's GELU,
# applied to every position on its own (chapter 05). `ln_1` and `ln_2` are LayerNorms over the features.
# `dropout` is applied by GPT-2 to each sub-block's output before it is added to the residual stream; it is the
# identity in this chapter, where every dropout rate is 0.
#
# The **key/value cache** is chapter 07's: when text is generated one token at a time, each block keeps the keys
# and values of the positions it has already seen in a `KVCache`, so that a new token's query can attend to them
# without recomputing them. `cache.length` says how many positions it holds. Given `cache=cache`, the attention
# appends the new positions' keys and values to it first, then attends over all of them.
#
# ### Exercise 1 — `gpt_block`
# > **Difficulty** ●●● · **Importance** ●●● · about 30 minutes
#
# Write `gpt_block(x, block, cache=None)`, one GPT-2 block (Radford et al., 2019, section 2.3): pre-norm,
#
# $$x \leftarrow x + \operatorname{Attn}(\operatorname{LN}_1(x)), \qquad x \leftarrow x + \operatorname{MLP}(\operatorname{LN}_2(x)),$$
#
# with each sub-block's output passed through `block.dropout` before it is added.
#
# * `x`: `[batch, seq, d_model]`, the residual stream; returns the same shape. `block`: a `Block`.
# * **Causal**: a position attends to itself and to the positions before it, never to later ones.
#   `causal_mask(size)` (chapter 06, imported above) is the `[size, size]` boolean lower triangle.
# * `cache`: `None`, or the block's `KVCache`, which may already hold `past` earlier positions. The positions of
#   `x` are then `past`, ..., `past + seq - 1`, and each of them may attend to all the cached positions and to the
#   new ones up to itself: the mask is `[seq, past + seq]`.
# * Compute the block from its parts. Do not call `block(x)`: that runs the function the block was built with,
#   and the checker's blocks refuse.
#
# Worked example: with 2 cached positions and 3 new ones (positions 2, 3 and 4), the mask has 3 rows, one per new
# position, and 5 columns, one per key:
#
# ```
# position 2:  T T T . .
# position 3:  T T T T .
# position 4:  T T T T T
# ```
#
# The checker runs your block with and without a cache, and once with `block.dropout` replaced by a fixed halving,
# to see where you apply it. It also changes the last position of an input and checks that no earlier output
# moves.
#
# <details><summary>Hint 1 — the idea</summary>Two residual steps. Each sub-block reads a normalised copy of x
# and adds its result to x itself, so the residual stream is never normalised inside the block: that is what
# "pre-norm" means. The cache changes one thing only, the mask: the new positions are the last rows of a larger
# causal mask.</details>
# <details><summary>Hint 2 — the plan</summary>Before anything changes the cache, note how many positions it
# already holds (none without a cache): the new tokens sit after them, and their mask is the part of a causal mask
# over all the positions that belongs to the new rows, <code>[seq, past + seq]</code>. Then two residual steps
# of the same shape, <code>[batch, seq, d_model]</code> in and out: each reads its own normalised copy of the
# stream, passes it through its sub-layer (the attention, given the mask and the cache, reads the copy as its
# queries, keys and values), drops out the result and adds it back to the stream.</details>
# <details><summary>Hint 3 — the key step</summary>A smaller example: 1 cached position and 2 new ones. The causal
# mask of size 3 has the rows <code>T . .</code>, <code>T T .</code>, <code>T T T</code>. Which of them belong to
# the new positions, and how many columns does each have? And why must <code>past</code> be read before the
# attention runs, not after?</details>

# %% nbgrader={"grade": false, "grade_id": "gpt_block", "locked": false, "schema_version": 3, "solution": true, "task": false}
def gpt_block(x: torch.Tensor, block: Block, cache: KVCache | None = None) -> torch.Tensor:
    """GPT-2's pre-norm block, causal, with an optional key/value cache: [batch, seq, d_model] -> same."""
    ### BEGIN SOLUTION
    past = 0 if cache is None else cache.length  # read it before the attention appends to the cache
    seq = x.shape[1]
    mask = causal_mask(past + seq, device=x.device)[past:]  # [seq, past + seq]: the rows of the new positions
    h = block.ln_1(x)
    x = x + block.dropout(block.self_attn(h, h, h, mask, cache=cache))  # [batch, seq, d_model]
    return x + block.dropout(block.feed_forward(block.ln_2(x)))
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "gpt_block_test", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false} tags=["raises-exception"]
check_gpt_block(gpt_block)
### BEGIN HIDDEN TESTS
check_gpt_block(gpt_block, hidden=True)
### END HIDDEN TESTS

# %%
gpt_block_impl = yours_or_reference(gpt_block, check_gpt_block)

# %% [markdown]
# The whole model's parts, from the same small configuration (20 tokens, 16 positions, 2 blocks):

# %%
for name, child in GPT(small).named_children():
    print(f"model.{name:<16}", child if name != "blocks" else f"{len(child)} blocks like the one above")

# %% [markdown]
# `model.positions` is a learned table of one vector per position, `model.positions.embedding` (chapter 04). Called
# with token vectors `[batch, seq, d_model]` and an `offset`, it returns them **plus** the vectors of positions
# `offset`, ..., `offset + seq - 1` (then its dropout). `model.lm_head` is the output layer, and its weight **is**
# `model.token_embedding.weight`, the same tensor (weight tying): token $v$'s logit is the dot product of the
# final state with $v$'s own embedding.
#
# ### Exercise 2 — `gpt_forward`
# > **Difficulty** ●●○ · **Importance** ●●● · about 15 minutes
#
# Write `gpt_forward(tokens, model, cache=None)`: token ids `[batch, seq]` → logits `[batch, seq, vocab]`. GPT-2's
# forward pass is: token vectors plus position vectors, every block in turn, a final LayerNorm, the output layer.
#
# * GPT-2 adds its token and position vectors as they are: no $\sqrt{d_\text{model}}$ scale (chapter 07's
#   Transformer had one). Here both tables start at std 0.02, as in Hugging Face's GPT-2 and nanoGPT; OpenAI's
#   released code starts the position table at 0.01.
# * The final LayerNorm, `model.ln_f`, is the one LayerNorm the residual stream ever passes through: the blocks
#   normalise only their sub-blocks' inputs.
# * `cache`: `None`, or `model.new_cache()`, a list of one `KVCache` per block; block $i$ keeps its keys and values
#   in entry $i$. With a cache, `tokens` are the tokens it has not seen yet, so their positions start after the
#   positions it holds, not at 0.
# * Run each block as a module, `block(x, its cache)`: that runs the block function the model was built with,
#   yours in this chapter's GPT. The checker's tiny models run a block of their own (GPT-1's post-norm block), so
#   that this check judges your forward pass alone. It runs your function on whole windows, then chunk by chunk
#   with a cache, and compares.
#
# <details><summary>Hint 1 — the idea</summary>A pipeline with one piece of state. Embed, run the stack,
# normalise, read out with the token table. The cache only says where the new tokens sit and where each block
# keeps its keys and values.</details>
# <details><summary>Hint 2 — the plan</summary>Four stages, with one number found first: how many positions the
# cache already holds (none without a cache), since the new tokens' positions count on from there. Ids become
# vectors, <code>[batch, seq, d_model]</code>, each carrying its position from that offset on; the blocks run in
# turn, each with its own entry of the cache; the stream is normalised a last time and read out against the
# vocabulary, <code>[batch, seq, vocab]</code>. The model object holds a module for each stage: look at its
# attributes.</details>
# <details><summary>Hint 3 — the key step</summary>The question that unlocks the offset: every block's cache entry
# holds the same number of positions, so which entry can you ask, and what is the offset when there is no cache at
# all? The page to read is Python's conditional expressions (<code>x if condition else y</code>).</details>

# %% nbgrader={"grade": false, "grade_id": "gpt_forward", "locked": false, "schema_version": 3, "solution": true, "task": false}
def gpt_forward(tokens: torch.Tensor, model: GPT, cache: list[KVCache] | None = None) -> torch.Tensor:
    """GPT-2's forward pass: token ids [batch, seq] -> next-token logits [batch, seq, vocab]."""
    ### BEGIN SOLUTION
    past = 0 if cache is None else cache[0].length  # positions the cache already holds
    x = model.positions(model.token_embedding(tokens), offset=past)  # [batch, seq, d_model]
    for i, block in enumerate(model.blocks):
        x = block(x, None if cache is None else cache[i])  # [batch, seq, d_model]
    return model.lm_head(model.ln_f(x))  # [batch, seq, vocab]: the output layer is the token table
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "gpt_forward_test", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false} tags=["raises-exception"]
check_gpt_forward(gpt_forward)
### BEGIN HIDDEN TESTS
check_gpt_forward(gpt_forward, hidden=True)
### END HIDDEN TESTS

# %%
gpt_forward_impl = yours_or_reference(gpt_forward, check_gpt_forward)

# %% [markdown]
# From here on, every GPT the chapter builds goes through `new_gpt`, which hands it the two functions above: yours
# where they passed, the library's reference where they did not (the lines after the checks said which).

# %%
def new_gpt(config: GPTConfig) -> GPT:
    """A GPT whose blocks run gpt_block_impl and whose forward pass is gpt_forward_impl."""
    return GPT(config, block_fn=gpt_block_impl, forward_fn=gpt_forward_impl)


def whose(impl, yours) -> str:
    return "your" if impl is yours else "the library's"


print(f"every GPT from here on runs {whose(gpt_block_impl, gpt_block)} gpt_block and "
      f"{whose(gpt_forward_impl, gpt_forward)} gpt_forward")

# %% [markdown]
# The cache changes the cost, never the result. Feed an untrained GPT twelve tokens at once, then the same twelve
# in three pieces with a cache: the logits agree (to rounding: the sums run in another order), and each block's
# cache ends up holding all twelve positions.

# %%
torch.manual_seed(1)
demo = new_gpt(small).eval()
tokens = torch.randint(0, small.vocab_size, (2, 12))  # [2, 12]
with torch.no_grad():
    at_once = demo(tokens)  # [2, 12, 20]
    cache = demo.new_cache()
    pieces = torch.cat([demo(tokens[:, :5], cache), demo(tokens[:, 5:6], cache), demo(tokens[:, 6:], cache)], dim=1)
print("same logits, at once and in pieces:", torch.allclose(at_once, pieces, atol=1e-5),
      "| positions in each block's cache:", [c.length for c in cache])

# %% [markdown]
# ## 3. Every position is a training example
#
# Training wants those predictions to match the text. Take a window of $L$ tokens from the training text and
# run the model on it. The output at position $t$ has seen tokens $0..t$ and is scored on token $t+1$: the
# **targets are the inputs shifted left by one**. That is $L - 1$ training examples from a single window, all
# computed in one pass. The last position's prediction has no target inside the window (its token lies past
# the end), so it is left out.
#
# Compare with BERT (chapter 09), which predicts only the 15% of tokens it masked: a decoder learns from every
# token, but sees only the left context; BERT sees both sides but gets fewer training signals per sequence
# (Prince, section 12.7).
#
# Our models read **characters** first. The text is the course's standard corpus: the prose of CPython's
# built-in help pages (`help("if")` and friends), which ships with Python, split once into a training part
# and a validation part by `corpus.char_splits()`.

# %%
train_text, val_text = char_splits()
chars = CharTokenizer(train_text, val_text)  # one token per character
train_ids, val_ids = chars.encode(train_text), chars.encode(val_text)  # [N_train], [N_val]
print(f"training text: {len(train_text):,} characters; validation text: {len(val_text):,} characters")
print(f"vocabulary: {len(chars)} characters, e.g. {''.join(chars.chars[30:60])!r}")
print("a sample of the training text:", repr(train_text[1000:1160]))

# %% [markdown]
# One window of 9 characters, and the 8 examples it holds:

# %%
window = chars.encode("It takes ")  # [9]
inputs, targets = window[:-1], window[1:]
for t in range(len(inputs)):
    print(f"position {t}: has seen {chars.decode(window[:t + 1])!r:13} -> must predict {chars.decode(targets[t:t + 1])!r}")

# %% [markdown]
# The causal mask is what makes this honest: without it, position $t$ could read token $t+1$, its own answer
# (chapter 06 built exactly that cheat). A quick proof on an untrained GPT, built by `new_gpt` from your block
# and forward pass: change the last character of a window, and no earlier position's logits move, not even by a
# rounding error.

# %%
torch.manual_seed(1)
tiny = new_gpt(GPTConfig(vocab_size=len(chars), max_len=32, d_model=32, n_heads=2, n_layers=2, dropout=0.0)).eval()
a = chars.encode("It takes great courage")[None]  # [1, 22]
b = a.clone()
b[0, -1] = chars.ids["x"]  # "It takes great couragx"
with torch.no_grad():
    same = torch.equal(tiny(a)[:, :-1], tiny(b)[:, :-1])
    moved = (tiny(a)[:, -1] - tiny(b)[:, -1]).abs().max().item()
print("logits of positions 0..20 bitwise identical:", same, "| largest change at position 21:", round(moved, 4))

# %% [markdown]
# ### Exercise 3 — `next_token_loss`
# > **Difficulty** ●●○ · **Importance** ●●● · about 15 minutes
#
# Write `next_token_loss(logits, tokens)`, the loss GPT is trained with.
#
# * `tokens`: `[batch, L]` integer ids, a batch of windows.
# * `logits = model(tokens)`: `[batch, L, vocab]`; `logits[:, t]` is the prediction made at position $t$.
# * returns a scalar tensor: the mean cross-entropy, **in nats** (natural logarithm), of the $B \times (L - 1)$
#   predictions that have a target ($B$ windows in the batch), position $t$ scored on `tokens[:, t + 1]`. With
#   $z_{b,t}$ for `logits[b, t]` and $x_{b,t+1}$ for `tokens[b, t + 1]`:
#
# $$\mathcal{L} = -\frac{1}{B\,(L-1)} \sum_{b} \sum_{t=0}^{L-2} \log \operatorname{softmax}(z_{b,t})[\,x_{b,t+1}\,]$$
#
# Worked example: logits that are all zero are a uniform guess, so with a vocabulary of 4 the loss is
# $\ln 4 \approx 1.386$ whatever the tokens. `torch.nn.functional.cross_entropy` is allowed (it wants the
# classes in dimension 1, or a flat `[N, vocab]` tensor).
#
# <details><summary>Hint 1 — the idea</summary>Two slices line the predictions up with their targets: drop the
# prediction that has no target (the last position's) and the token that nobody predicts (the first one). Then it
# is an ordinary classification loss over all the remaining (position, target) pairs.</details>
# <details><summary>Hint 2 — the plan</summary>The predictions: every position but the last,
# <code>[B, L-1, V]</code>. The targets: every token but the first, <code>[B, L-1]</code>. Flatten both, to
# <code>[B * (L-1), V]</code> and <code>[B * (L-1)]</code>, and take the mean cross-entropy.</details>
# <details><summary>Hint 3 — the key step</summary>A smaller example on other tensors: with
# <code>t = torch.tensor([[5, 6, 7, 8]])</code>, which slice gives the targets <code>[[6, 7, 8]]</code>, and which
# slice of a <code>[1, 4, V]</code> logits tensor gives the three predictions that have them? The page to read is
# <code>torch.nn.functional.cross_entropy</code>, for the shapes it expects.</details>

# %% nbgrader={"grade": false, "grade_id": "next_token_loss", "locked": false, "schema_version": 3, "solution": true, "task": false}
def next_token_loss(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy (nats) of each position's prediction against the next token.

    logits: [batch, L, vocab] = model(tokens); tokens: [batch, L]. Returns a scalar tensor.
    """
    ### BEGIN SOLUTION
    predictions = logits[:, :-1]  # [B, L-1, V]: the last position has no target in the window
    targets = tokens[:, 1:]  # [B, L-1]: position t is scored on token t + 1
    return torch.nn.functional.cross_entropy(predictions.reshape(-1, logits.shape[-1]), targets.reshape(-1))
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "next_token_loss_test", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false} tags=["raises-exception"]
check_next_token_loss(next_token_loss)
### BEGIN HIDDEN TESTS
check_next_token_loss(next_token_loss, hidden=True)
### END HIDDEN TESTS

# %%
next_token_loss_impl = yours_or_reference(next_token_loss, check_next_token_loss)

# %% [markdown]
# An untrained GPT knows nothing, so it should be about as unsure as a uniform guess over the 103 characters,
# whose loss is $\ln 103 \approx 4.63$ nats. Its initial weights are small (GPT-2's initialisation), so its
# logits are nearly equal, and that is what we see on a batch of 8 random windows of the training text:

# %%
torch.manual_seed(2)
untrained = new_gpt(GPTConfig(vocab_size=len(chars), max_len=32, d_model=96, n_heads=4, n_layers=2, dropout=0.0))
batch = train_ids[torch.randint(0, len(train_ids) - 32, (8,))[:, None] + torch.arange(32)]  # [8, 32]
with torch.no_grad():
    print(f"untrained GPT: {next_token_loss_impl(untrained(batch), batch).item():.3f} nats per character; "
          f"ln {len(chars)} = {math.log(len(chars)):.3f}")

# %% [markdown]
# ## 4. Baselines: what is a good loss?
#
# "2 nats per character" means nothing until it is compared with something. Two models that need no
# training at all make good yardsticks.
#
# * The **unigram** model ignores the context: $P(x_t \mid x_{<t}) = P(x_t)$, each character's frequency in the
#   training text. It knows that `e` is common and `~` rare, and nothing else.
# * The **bigram** model looks at one character of context: $P(x_t \mid x_{<t}) = P(x_t \mid x_{t-1})$, counted
#   over every pair of neighbours in the training text. It knows that `q` is followed by `u`.
#
# Counts have a problem: a pair that never occurs in training gets probability 0, and one such pair in the
# validation text makes the loss infinite. **Add-$\alpha$ smoothing** (Laplace's rule for $\alpha = 1$) adds a
# small pseudo-count to every cell first. With $c(i, j)$ the number of times token $j$ follows token $i$ in the
# training text:
#
# $$P(j \mid i) = \frac{c(i, j) + \alpha}{\sum_{k} c(i, k) + \alpha V}.$$
#
# The unigram model comes from the library; the bigram model is the next exercise.

# %%
V = len(chars)
unigram = unigram_log_probs(train_ids, V, alpha=1.0)  # [V]: log P(character)
# Score every validation character but the first, the same predictions the GPT will make.
unigram_nats = -unigram[val_ids[1:]].mean().item()
print(f"unigram model: {unigram_nats:.3f} nats per character on the validation text")
top = unigram.topk(5)
print("most frequent characters:", [(chars.decode([i]), round(p, 3)) for i, p in zip(top.indices.tolist(), top.values.exp().tolist())])

# %% [markdown]
# ### Exercise 4 — `bigram_log_probs`
# > **Difficulty** ●●○ · **Importance** ●●○ · about 15 minutes
#
# Write `bigram_log_probs(ids, vocab_size, alpha)`:
#
# * `ids`: `[N]` integer ids of a text; `vocab_size`: $V$; `alpha`: the pseudo-count.
# * returns a float32 tensor `[V, V]` whose entry `[i, j]` is $\log P(j \mid i)$, for token $j$ right after token $i$,
#   from the counts of every adjacent pair (overlapping: `ids[0], ids[1]`, then `ids[1], ids[2]`, ...) with
#   add-$\alpha$ smoothing. Row $i$ is the distribution of what follows token $i$, so each row of its
#   exponential sums to 1. A token never seen as a previous token gets a uniform row.
#
# Worked example: `ids = tensor([0, 1, 1, 2, 0, 1])`, `vocab_size = 4`, `alpha = 1`. The pairs are
# (0,1) twice, (1,1), (1,2) and (2,0). Row 0 counts `[0, 2, 0, 0]`, so its probabilities are
# `[1, 3, 1, 1] / 6` = `[0.1667, 0.5, 0.1667, 0.1667]`; row 3 was never a previous token: `[0.25] * 4`.
#
# <details><summary>Hint 1 — the idea</summary>Fill a <code>[V, V]</code> table of counts, the previous token
# choosing the row and the next one the column; add <code>alpha</code> to every cell, divide each row by its own
# total, take the log.</details>
# <details><summary>Hint 2 — the plan</summary>The pairs: the stream without its last id (the previous tokens)
# beside the stream without its first id (the next ones), both <code>[N - 1]</code>. A loop over the pairs works.
# Faster: give each pair a single index into a flattened table of V·V cells, count how often each index occurs
# (every cell, even those no pair reaches), and fold the counts back into <code>[V, V]</code>. The row totals,
# <code>[V, 1]</code>, broadcast over the columns; compute in float64 and return float32.</details>
# <details><summary>Hint 3 — the key step</summary>A smaller example: the counts <code>[[1, 3], [0, 0]]</code> with
# <code>alpha = 1</code> become <code>[[2, 4], [1, 1]]</code>; the row totals 6 and 2 turn them into the
# probabilities <code>[[1/3, 2/3], [1/2, 1/2]]</code>. Which dimension do you sum over, and what shape must the
# totals keep so that each row is divided by its own? The page to read is <code>torch.Tensor.sum</code> and its
# <code>keepdim</code> argument.</details>

# %% nbgrader={"grade": false, "grade_id": "bigram_log_probs", "locked": false, "schema_version": 3, "solution": true, "task": false}
def bigram_log_probs(ids: torch.Tensor, vocab_size: int, alpha: float = 1.0) -> torch.Tensor:
    """log P(next = j | previous = i) from the adjacent pairs of ids, add-alpha smoothed.

    ids: [N] integer ids. Returns a float32 tensor [vocab_size, vocab_size]; row i is a distribution.
    """
    ### BEGIN SOLUTION
    pairs = ids[:-1] * vocab_size + ids[1:]  # [N - 1]: one number per (previous, next)
    counts = torch.bincount(pairs, minlength=vocab_size * vocab_size).view(vocab_size, vocab_size).double()
    probs = (counts + alpha) / (counts.sum(dim=1, keepdim=True) + alpha * vocab_size)  # rows sum to 1
    return probs.log().float()
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "bigram_log_probs_test", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false} tags=["raises-exception"]
check_bigram_log_probs(bigram_log_probs)
### BEGIN HIDDEN TESTS
check_bigram_log_probs(bigram_log_probs, hidden=True)
### END HIDDEN TESTS

# %%
bigram_log_probs_impl = yours_or_reference(bigram_log_probs, check_bigram_log_probs)

# %% [markdown]
# Which $\alpha$? It is a setting of the model, so it is chosen on held-out data. A few values, scored on the
# validation text (the GPT will be scored on exactly the same predictions: every character but the first):

# %%
for alpha in [1.0, 0.1, 0.01]:
    table = bigram_log_probs_impl(train_ids, V, alpha)  # [V, V]
    nats = -table[val_ids[:-1], val_ids[1:]].mean().item()
    print(f"bigram model, alpha = {alpha:<5}: {nats:.3f} nats per character")
bigram = bigram_log_probs_impl(train_ids, V, 0.1)
bigram_nats = -bigram[val_ids[:-1], val_ids[1:]].mean().item()
after_q = bigram[chars.ids["q"]].exp()
print(f"after 'q' the bigram model expects 'u' with probability {after_q[chars.ids['u']]:.3f}")

# %% [markdown]
# One character of context is worth almost a nat: from 3.30 to 2.42 nats per character. The GPT will have to
# beat 2.42 to show that it uses more than the previous character.
#
# ### Nats, bits and perplexity
#
# A loss in **nats** uses the natural logarithm; in **bits**, base 2. One bit is $\ln 2 \approx 0.693$ nats, so
# bits $=$ nats $/ \ln 2$. Bits have a concrete meaning: a model with a loss of $b$ bits per character could
# drive a compressor (an arithmetic coder) that stores the text in about $b$ bits per character. Plain ASCII
# spends 8.
#
# Bits per character also make models with **different tokenizers** comparable. A model over subword tokens
# reports nats per *token*, and a token covers several characters. The total information in the text is
# (nats per token) × (number of tokens); divided by the number of characters, it becomes nats per character,
# and divided by $\ln 2$ as well, the bits per character $b$:
#
# $$b = \frac{\mathcal{L}_\text{token} \times n_\text{tokens}}{n_\text{chars} \times \ln 2}.$$
#
# For a character-level model $n_\text{tokens} = n_\text{chars}$ and this is just $\mathcal{L} / \ln 2$.

# %% [markdown]
# ### Exercise 5 — `bits_per_char`
# > **Difficulty** ●○○ · **Importance** ●●○ · about 5 minutes
#
# Write `bits_per_char(loss, n_tokens, n_chars)`: `loss` is a mean cross-entropy in nats per token (a float or a
# 0-d tensor) measured over a text of `n_tokens` tokens and `n_chars` characters; return the bits per character
# as a Python float.
#
# Worked example: a subword model at 2.0 nats per token on a text of 50 tokens and 120 characters:
# $2.0 \times 50 / (120 \times 0.6931) = 1.202$ bits per character.
#
# <details><summary>Hint 1 — the idea</summary>Two separate conversions: from "per token" to "per character"
# (how many tokens does one character amount to?), and from nats to bits (how many nats is one bit?).</details>
# <details><summary>Hint 2 — the plan</summary>Multiply the loss by the tokens per character,
# <code>n_tokens / n_chars</code>, then divide by the natural logarithm of 2. A 0-d tensor must become a Python
# number first.</details>

# %% nbgrader={"grade": false, "grade_id": "bits_per_char", "locked": false, "schema_version": 3, "solution": true, "task": false}
def bits_per_char(loss, n_tokens: int, n_chars: int) -> float:
    """Mean cross-entropy in nats per token -> bits per character of the same text."""
    ### BEGIN SOLUTION
    return float(loss) * n_tokens / n_chars / math.log(2)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "bits_per_char_test", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false} tags=["raises-exception"]
check_bits_per_char(bits_per_char)
### BEGIN HIDDEN TESTS
check_bits_per_char(bits_per_char, hidden=True)
### END HIDDEN TESTS

# %%
bits_per_char_impl = yours_or_reference(bits_per_char, check_bits_per_char)

# %% [markdown]
# **Perplexity** is the third way to say the same thing: $e^{\mathcal{L}}$ with $\mathcal{L}$ in nats (or
# $2^{b}$ with $b$ in bits). It is the number of equally likely choices the model is, on average, as uncertain
# as: a uniform guess over $V$ tokens has perplexity $V$. Its catch: it is *per token*, so it depends on what a
# token is (section 7).

# %%
n = len(val_ids) - 1  # the predictions every model below is scored on
baselines = {"uniform guess": math.log(V), "unigram": unigram_nats, "bigram (alpha 0.1)": bigram_nats}
print(f"{'model':<20} {'nats/char':>9} {'bits/char':>9} {'perplexity':>10}")
for name, nats in baselines.items():
    print(f"{name:<20} {nats:9.3f} {bits_per_char_impl(nats, n, n):9.3f} {math.exp(nats):10.1f}")

# %% [markdown]
# ## 5. A character-level GPT
#
# The model is **your** GPT: `new_gpt` builds it from your `gpt_block` and `gpt_forward` (or the references, as
# the lines after their checks said). 2 blocks, $d_\text{model} = 96$, 4 heads, a context of 32 characters; the
# vocabulary of 103 characters. Training draws batches of 32 random windows of **33** characters from the
# training text: the model reads the first 32, and each of its 32 positions is scored on the character after it
# (`lm_loss(model(window[:, :-1]), window[:, 1:])`, the `x` and `y` of nanoGPT's `get_batch`). That is your
# `next_token_loss` with one more character in the window, so that the last position has a target too: the
# validation below scores every position, so training must too. AdamW, a short linear warm-up of the
# learning rate, then a cosine decay (the schedule nanoGPT uses), gradients clipped to norm 1. 400 steps see
# 32 × 32 × 400 = 409,600 predictions, about one and a half passes over the training text.

# %%
CONTEXT, BATCH, STEPS, LR = 32, 32, 400, 4e-3
char_config = GPTConfig(vocab_size=V, max_len=CONTEXT, d_model=96, n_heads=4, n_layers=2, dropout=0.0)
torch.manual_seed(10)
char_model = new_gpt(char_config)
print(f"character-level GPT: {sum(p.numel() for p in char_model.parameters()):,} parameters")
print(f"{STEPS} steps x {BATCH} windows x {CONTEXT} characters = {STEPS * BATCH * CONTEXT:,} characters seen, "
      f"{STEPS * BATCH * CONTEXT / len(train_text):.2f} passes over the training text")

# %% tags=["nbval-ignore-output", "timing", "skip-when-grading"]
start = time.perf_counter()
char_history = train_lm(char_model, train_ids, context=CONTEXT, batch_size=BATCH, lr=LR, steps=STEPS,
                        generator=torch.Generator().manual_seed(0), desc="character GPT")
print(f"{STEPS} steps in {time.perf_counter() - start:.1f} s")

# %% [markdown]
# Whose code did that training run? `model_calls` (from `transformer_lib.checks`) runs the model once on a window
# and counts the calls made through every attribute that is the given function:

# %% tags=["skip-when-grading"]
first_window = train_ids[:CONTEXT][None]  # [1, 32]
assert model_calls(char_model, gpt_block_impl, first_window) == char_config.n_layers  # once per block
assert model_calls(char_model, gpt_forward_impl, first_window) == 1
print(f"the character GPT trained above ran {whose(gpt_block_impl, gpt_block)} gpt_block "
      f"({char_config.n_layers} calls per forward pass, one per block) and {whose(gpt_forward_impl, gpt_forward)} "
      f"gpt_forward, and it is the model the rest of the chapter measures and samples from")

# %% [markdown]
# The validation loss covers the **whole** validation text: `evaluate_lm` slides a window of 32 characters along
# it, 16 at a time, and scores every character but the first exactly once (after the first window, each with at
# least 16 characters of context). The same predictions as the baselines. The GPT's last digits vary from one
# machine to another (the order of float sums changes the training a little), so what the chapter claims from
# them follows the table.

# %% tags=["nbval-ignore-output", "skip-when-grading"]
char_model.eval()
char_nats = evaluate_lm(char_model, val_ids, context=CONTEXT, stride=CONTEXT // 2)
results = dict(baselines, **{"character GPT": char_nats})
print(f"{'model':<20} {'nats/char':>9} {'bits/char':>9} {'perplexity':>10}")
for name, nats in results.items():
    print(f"{name:<20} {nats:9.3f} {bits_per_char_impl(nats, n, n):9.3f} {math.exp(nats):10.1f}")

# %% tags=["skip-when-grading"]
smooth = torch.tensor(char_history).unfold(0, 20, 1).mean(dim=1)  # moving average over 20 steps, ending at steps 20..400


def first_step_below(level):
    """The first step at which the 20-step average of the training loss is below level (inf if never)."""
    below = (smooth < level).tolist()
    return below.index(True) + 20 if True in below else math.inf


measured = (f"GPT {char_nats:.3f}, bigram {bigram_nats:.3f} nats/char; average below unigram at step "
            f"{first_step_below(unigram_nats)}, below bigram at step {first_step_below(bigram_nats)}")
claim_between(char_nats, 1.8, 2.0, "the character GPT scores between 1.8 and 2.0 nats per character on the validation "
              "text (2.6 to 2.9 bits, a perplexity of 6 to 7.4)", measured=measured)
claim_between(bigram_nats - char_nats, 0.3, None, "it beats the bigram baseline by at least 0.3 nats per character",
              measured=measured)
claim(first_step_below(unigram_nats) <= 40, "its training loss (20-step average) is below the unigram level within 40 steps",
      measured=measured)
claim(100 <= first_step_below(bigram_nats) <= 150, "and below the bigram level after 100 to 150 steps", measured=measured)

# %% tags=["skip-when-grading"]
fig, ax = plt.subplots(figsize=(7.5, 3.8))
ax.plot(range(20, len(char_history) + 1), smooth, label="character GPT, training loss (20-step average)")
ax.axhline(unigram_nats, color="#999999", linestyle="--", label=f"unigram baseline ({unigram_nats:.2f})")
ax.axhline(bigram_nats, color="#d08020", linestyle="--", label=f"bigram baseline ({bigram_nats:.2f})")
ax.axhline(char_nats, color="#2f6fad", linestyle=":", label=f"GPT, validation ({char_nats:.2f})")
ax.set_xlabel("training step")
ax.set_ylabel("nats per character")
ax.set_ylim(1.5, 4.8)
ax.legend(fontsize=8)
ax.set_title("A 2-block GPT learns to use more than one character of context", fontsize=10)
plt.show()

# %% [markdown]
# Within 40 steps the training loss falls below the unigram level: the model has learned which characters are
# common. It crosses the bigram level after 100 to 150 steps, and from there on it can only improve by using more
# than the previous character, which is what attention is for. After only 400 steps it scores about 1.85 nats per
# character on the validation text here, about 0.57 below the bigram's 2.419; on every CPU we tried, 1.8 to 2.0
# nats (2.6 to 2.9 bits, a perplexity of 6 to 7.4 characters), at least 0.3 below the bigram.
#
# It is not a good model: the same architecture, trained longer with a longer context, does much better. The
# course's benchmark script,
# `benchmarks/bench_gpt.py`, trains the same architecture (with a context of 64 characters and its own learning
# rate) for 80 seconds on two threads, run as `.venv/bin/python benchmarks/bench_gpt.py`, and scores it on the
# same validation text.
# The three runs recorded in the script's notes, on a lightly loaded two-core machine, made 1,618 to 1,898 steps and reached 1.32 to 1.34 nats per character. Those figures come from that script, not from this notebook (a busier
# machine makes fewer steps in 80 seconds, and scores worse). Published character-level results cannot be set
# beside these: Transformer-XL's 0.99 bits per character (0.69 nats; Dai et al., 2019, Table 2) is on enwik8, a
# cut of English Wikipedia, with 277 million parameters. What matters here is that the whole pipeline is real,
# and that it is measured against something.

# %% [markdown]
# ## 6. The chain rule, measured
#
# The trained model now supplies the factors of section 1 for real, one character at a time. The text starts
# at the beginning of a paragraph (a newline, as in the corpus), so each factor is $P(x_t \mid x_{<t})$, the
# probability of a character given everything before it:

# %% tags=["nbval-ignore-output", "skip-when-grading"]
sentence = "\nIt takes great courage."
ids = chars.encode(sentence)[None]  # [1, 24]
with torch.no_grad():
    log_probs = torch.log_softmax(char_model(ids), dim=-1)[0, :-1]  # [23, V]: predictions for characters 1..23
picked = log_probs.gather(-1, ids[0, 1:, None]).squeeze(-1)  # [23]: log P(character t+1 | characters <= t)
for t in range(1, 10):
    print(f"P({chars.decode(ids[0, t:t + 1])!r:5} | {chars.decode(ids[0, :t])!r:12}) = {picked[t - 1].exp():.3f}")
print("...")
print(f"sum of the 23 log-probabilities: {picked.sum():.2f} nats, so P(sentence | new paragraph) = e^{picked.sum():.1f}")

# %% [markdown]
# The factors themselves differ a little from one machine to another, as the trained weights do; the chain rule
# does not. The sum of the log-factors is exactly $-(L-1)$ times the mean next-token loss, so your
# `next_token_loss` scores whole sentences too:

# %% tags=["skip-when-grading"]
with torch.no_grad():
    via_loss = -(ids.shape[1] - 1) * next_token_loss_impl(char_model(ids), ids).item()
claim(abs(picked.sum().item() - via_loss) < 1e-3,
      "the 23 log-factors add up to -23 times the mean next-token loss (to 0.001 nats)",
      measured=f"{picked.sum().item():.5f} vs {via_loss:.5f}")

# %% [markdown]
# The same characters in a scrambled order are much less likely: the model has learned something about English,
# at least about where spaces and capitals go, and how its words are spelt.

# %% tags=["nbval-ignore-output", "skip-when-grading"]
def sentence_log_prob(model, tokenizer, text):
    """log P(text[1:] | text[0]) = -(L - 1) * the mean next-token loss."""
    ids = tokenizer.encode(text)[None]  # [1, L]
    with torch.no_grad():
        return -(ids.shape[1] - 1) * next_token_loss_impl(model(ids), ids).item()


scores = {text: sentence_log_prob(char_model, chars, text)
          for text in ["\nIt takes great courage.", "\ncourage. great takes It", "\nIt tkaes gaert cuorage."]}
for text, score in scores.items():
    print(f"log P({text[1:]!r:26} | new paragraph) = {score:7.2f} nats")

# %% tags=["skip-when-grading"]
real, words_scrambled, letters_scrambled = scores.values()
measured = f"{real:.2f} vs {words_scrambled:.2f} and {letters_scrambled:.2f} nats"
claim(real >= words_scrambled + 4, "the sentence is at least 4 nats (a factor e^4 ≈ 55) more probable than its words "
      "in scrambled order", measured=measured)
claim(real >= letters_scrambled + 10, "and at least 10 nats more probable than with letters swapped inside its words",
      measured=measured)

# %% [markdown]
# ## 7. The same model on BPE tokens
#
# Characters make long sequences: a window of 32 characters is five or six words. Chapter 08's **byte-pair
# encoding** (BPE) merges frequent pieces into tokens, so the same window covers more text. We train a small
# byte-level BPE (GPT-2's kind) with 512 tokens on the training paragraphs, then the *same* GPT (only the
# vocabulary size changes, and with it the token table) for the *same* 400 steps of 32 windows of 32 tokens.

# %%
bpe = train_byte_level_bpe(train_text.split("\n"), vocab_size=512)
bpe_train = torch.tensor(bpe.encode(train_text).ids)  # [n_tokens]
bpe_val = torch.tensor(bpe.encode(val_text).ids)
print(f"BPE vocabulary: {bpe.get_vocab_size()} tokens")
print(f"validation text: {len(val_text):,} characters -> {len(bpe_val):,} tokens, "
      f"{len(val_text) / len(bpe_val):.2f} characters per token")
example = bpe.encode("The for statement iterates over the items of a sequence.")
print("tokens:", [bpe.decode([i]) for i in example.ids])

# %% tags=["skip-when-grading"]
bpe_config = GPTConfig(vocab_size=bpe.get_vocab_size(), max_len=CONTEXT, d_model=96, n_heads=4, n_layers=2,
                       dropout=0.0)
torch.manual_seed(10)
bpe_model = new_gpt(bpe_config)
sizes = {}
for name, model in [("character GPT", char_model), ("BPE GPT", bpe_model)]:
    total = sum(p.numel() for p in model.parameters())
    table, positions = model.token_embedding.weight.numel(), model.positions.embedding.weight.numel()
    sizes[name] = total
    print(f"{name:<13}: {total:,} parameters = token table {table:,} ({model.config.vocab_size} x 96) "
          f"+ positions {positions:,} + blocks and final LayerNorm {total - table - positions:,}")
more = sizes["BPE GPT"] - sizes["character GPT"]
print(f"the BPE GPT has {more:,} parameters more, {more / sizes['character GPT']:.0%}, all in its token table")

# %% tags=["nbval-ignore-output", "timing", "skip-when-grading"]
start = time.perf_counter()
bpe_history = train_lm(bpe_model, bpe_train, context=CONTEXT, batch_size=BATCH, lr=LR, steps=STEPS,
                       generator=torch.Generator().manual_seed(0), desc="BPE GPT")
print(f"{STEPS} steps in {time.perf_counter() - start:.1f} s")

# %% tags=["skip-when-grading"]
assert model_calls(bpe_model, gpt_block_impl, bpe_train[:CONTEXT][None]) == bpe_config.n_layers
assert model_calls(bpe_model, gpt_forward_impl, bpe_train[:CONTEXT][None]) == 1
print(f"the BPE GPT, too, ran {whose(gpt_block_impl, gpt_block)} gpt_block and {whose(gpt_forward_impl, gpt_forward)} "
      f"gpt_forward")

# %% [markdown]
# Now the comparison, and its trap. The BPE model's loss is in nats per **token**, and its perplexity counts
# choices among 512 tokens, each a piece of a word; the character model's counts choices among 103 characters.
# Those two numbers measure different things and must not be compared. Per **character** they can be: the
# total information over the validation text, divided by its number of characters (section 4). Both models are
# scored on the whole validation text.

# %% tags=["nbval-ignore-output", "skip-when-grading"]
bpe_model.eval()
bpe_nats_per_token = evaluate_lm(bpe_model, bpe_val, context=CONTEXT, stride=CONTEXT // 2)
n_tokens, n_chars = len(bpe_val) - 1, len(val_text) - 1  # predictions made; characters they cover
rows = [("character GPT", V, char_nats, n, n), ("BPE GPT", bpe.get_vocab_size(), bpe_nats_per_token, n_tokens, n_chars)]
print(f"{'model':<14} {'vocab':>5} {'nats/token':>10} {'perplexity/token':>16} {'nats/char':>9} {'bits/char':>9}")
for name, vocab, nats, tokens, characters in rows:
    bpc = bits_per_char_impl(nats, tokens, characters)
    print(f"{name:<14} {vocab:5d} {nats:10.3f} {math.exp(nats):16.1f} {bpc * math.log(2):9.3f} {bpc:9.3f}")

# %% tags=["skip-when-grading"]
bpe_nats_per_char = bpe_nats_per_token * n_tokens / n_chars
measured = (f"BPE {bpe_nats_per_token:.3f} nats/token = {bpe_nats_per_char:.3f} nats/char; "
            f"character GPT {char_nats:.3f} nats/char")
claim_between(bpe_nats_per_token, 3.0, None, "per token, the BPE model looks far worse: over 3 nats and a perplexity "
              "over 20, against the character model's under 2 and under 7.4", measured=measured)
claim_between(bpe_nats_per_char, 1.4, 1.6, "per character, the BPE model scores between 1.4 and 1.6 nats (2.0 to 2.3 "
              "bits)", measured=measured)
claim_between(char_nats - bpe_nats_per_char, 0.25, None, "so per character it is better than the character model, by "
              "at least 0.25 nats", measured=measured)

# %% [markdown]
# Per token, the BPE model looks far worse: about 3.2 nats here (over 3 on every CPU we tried) and a perplexity
# over 20, against the character model's under 2 nats and a perplexity under 7.4. Per character it is about 1.50
# nats here (1.4 to 1.6 on every CPU we tried, 2.0 to 2.3 bits): **better** than the character model, by about 0.35
# nats here and at least 0.25 on every CPU we tried. The per-token numbers only said that guessing a piece of a
# word is harder than guessing a letter.
#
# Why is it better here? With the same steps, batch and window, the BPE model read about twice as much text (a
# token is 2.14 characters on average) and its 32-token window reaches about 68 characters back, not 32. This
# comparison is at equal training steps and equal model size in the sense of Kaplan et al. (2020, "Scaling Laws
# for Neural Language Models"), who count a language model's parameters without its vocabulary and position
# embeddings: both models have the same 223,872 weights in their blocks and final LayerNorm. Counted in full they
# differ: the BPE model has 276,096 parameters against 236,832, 17% more, all of them in the 409 extra rows of its
# token table (which, tied, is also its output layer). That is the budget of this notebook; it says nothing about
# which tokenizer wins with a large model trained to convergence. What it does show is the rule: **compare
# language models across tokenizers in bits (or nats) per character, never in perplexity per token.**

# %% [markdown]
# ## 8. Generation
#
# A language model generates text by running the chain rule forwards: predict a distribution for the next
# token, choose one, append it, repeat. The choice is the whole art, and chapter 07 met the basic options:
# the most probable token (**greedy**), or a random draw, sharpened by a **temperature** or limited to the
# **top k** tokens. This section adds the **nucleus** (top-p) and compares them all on the character model.
#
# ### Greedy decoding with the cache
#
# Chapter 07's decoder fed only the newest token at every step and kept every earlier key and value in a
# **key/value cache**. A GPT does the same, and it is simpler: there is no encoder. `model.new_cache()` makes an
# empty cache; `model(new_tokens, cache)` appends the new tokens' keys and values to it, places them at the
# positions after the cached ones, and returns their logits `[batch, new, vocab]`.

# %% [markdown]
# ### Exercise 6 — `greedy_generate`
# > **Difficulty** ●●○ · **Importance** ●●● · about 15 minutes
#
# Write `greedy_generate(model, prompt, max_new_tokens)`:
#
# * `prompt`: `[batch, seq]` token ids; `model`: a `GPT` in eval mode (no gradients needed: the checker runs
#   you under `torch.no_grad()`).
# * returns `[batch, seq + max_new_tokens]`: the prompt followed by the new tokens, each the **argmax** of the
#   last position's logits.
# * uses the cache: the prompt runs through the model **once**, then every step feeds only the newest token,
#   `[batch, 1]`. The checker counts the positions your model computes: none may be computed twice.
#
# Worked example: for a prompt of 3 tokens and 4 new ones, the model is called 4 times, with 3, 1, 1 and 1
# positions (the last new token never needs to be fed: nothing comes after it).
#
# <details><summary>Hint 1 — the idea</summary>Keep two things apart: everything generated so far (what you
# return) and what the model has not seen yet (the prompt at the first step, then one token). The cache remembers
# the rest.</details>
# <details><summary>Hint 2 — the plan</summary>An empty cache from the model, before the loop. Then, max_new_tokens
# times: run the model on what it has not seen yet, with the cache; keep the last position's logits,
# <code>[batch, vocab]</code>; their argmax over the vocabulary is <code>[batch]</code>; as a column,
# <code>[batch, 1]</code>, it is appended to what you return and is also what the model sees next.</details>
# <details><summary>Hint 3 — the key step</summary>The question that unlocks the step: the model returns logits for
# every position it was fed, <code>[batch, seq, vocab]</code> at the first step and <code>[batch, 1, vocab]</code>
# after. Which position predicts the next token, and how do you keep the chosen token as a column
# <code>[batch, 1]</code>, ready to be fed next? The page to read is <code>torch.Tensor.argmax</code> and its
# <code>keepdim</code> argument.</details>

# %% nbgrader={"grade": false, "grade_id": "greedy_generate", "locked": false, "schema_version": 3, "solution": true, "task": false}
def greedy_generate(model: GPT, prompt: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
    """Greedy decoding with the key/value cache: [batch, seq] -> [batch, seq + max_new_tokens]."""
    ### BEGIN SOLUTION
    cache = model.new_cache()
    tokens = new = prompt  # new: what the model has not seen yet
    for _ in range(max_new_tokens):
        logits = model(new, cache)[:, -1]  # [batch, vocab]: only the last position predicts
        new = logits.argmax(dim=-1, keepdim=True)  # [batch, 1]
        tokens = torch.cat([tokens, new], dim=1)  # [batch, seq + 1]
    return tokens
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "greedy_generate_test", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false} tags=["raises-exception"]
check_greedy_generate(greedy_generate)
### BEGIN HIDDEN TESTS
check_greedy_generate(greedy_generate, hidden=True)
### END HIDDEN TESTS

# %%
greedy_generate_impl = yours_or_reference(greedy_generate, check_greedy_generate)

# %% [markdown]
# The cache changes the cost, never the result. The library's `generate` can run without it (every step re-runs
# the whole sequence): the tokens are the same, one by one. (The text itself depends on the trained weights, so
# its characters may differ on another machine; the claim below does not.)

# %% tags=["nbval-ignore-output", "skip-when-grading"]
prompt = chars.encode("\nThe ")[None]  # [1, 5]
with torch.no_grad():
    cached = greedy_generate_impl(char_model, prompt, CONTEXT - prompt.shape[1])  # fills the 32-position context
uncached = generate(char_model, prompt, CONTEXT - prompt.shape[1], greedy=True, use_cache=False)
print("greedy:", repr(chars.decode(cached[0])))

# %% tags=["skip-when-grading"]
claim(torch.equal(cached, uncached), "greedy output is identical with and without the key/value cache, token for token",
      measured=f"{chars.decode(cached[0])!r} vs {chars.decode(uncached[0])!r}")

# %% [markdown]
# Greedy text from a small model gets stuck in loops: once a phrase is the most probable continuation of
# itself, it repeats forever. A longer greedy run shows it. (The model's context is 32 positions, so
# `generate_long` slides a window along: when the window is full it keeps the last 16 tokens and starts a fresh
# cache. That scheme is this course's own. nanoGPT's `generate` keeps no cache at all: at every step it crops the
# sequence to its last `block_size` tokens and runs the model over all of them again, so every prediction sees a
# full window, at the price of recomputing it.)

# %% tags=["nbval-ignore-output", "skip-when-grading"]
greedy_text = generate_long(char_model, prompt, 150, generate_fn=greedy_generate_impl)
print(repr(chars.decode(greedy_text[0, 1:])))

# %% tags=["skip-when-grading"]
greedy_chars = chars.decode(greedy_text[0, prompt.shape[1]:])  # the 150 generated characters
stretches = [greedy_chars[i:i + 12] for i in range(len(greedy_chars) - 11)]
loop = max(stretches, key=stretches.count)
claim(stretches.count(loop) >= 5, "the greedy text loops: one 12-character stretch of it comes back at least 5 times",
      measured=f"{loop!r} {stretches.count(loop)} times")

# %% [markdown]
# ### Temperature
#
# Sampling draws the next token from the model's distribution instead, so that a likely-but-not-top token gets
# its chance. The **temperature** $T$ reshapes the distribution first: $\operatorname{softmax}(z / T)$ for
# logits $z$. $T < 1$ stretches the gaps between logits, so the distribution gets sharper (the limit $T \to 0$ is
# greedy); $T > 1$ flattens it (the limit is uniform).

# %% [markdown]
# ### Exercise 7 — `temperature_probs`
# > **Difficulty** ●○○ · **Importance** ●●○ · about 5 minutes
#
# Write `temperature_probs(logits, temperature)`: `logits` `[..., vocab]`, `temperature` $> 0$; return the
# probabilities $\operatorname{softmax}(z / T)$ of the logits $z$ over the last dimension, same shape and dtype.
#
# Worked example: logits `[1., 2., 3.]` at $T = 0.5$ become `[2., 4., 6.]`, whose softmax is
# `[0.0159, 0.1173, 0.8668]` (at $T = 1$: `[0.0900, 0.2447, 0.6652]`).
#
# <details><summary>Hint 1 — the idea</summary>The temperature acts on the logits, <i>before</i> the softmax.
# Dividing probabilities afterwards would break their sum.</details>
# <details><summary>Hint 2 — the plan</summary>One division, then one softmax over the vocabulary, the last
# dimension. <code>torch.softmax</code> subtracts the maximum for you, which matters when <code>logits / T</code>
# is huge.</details>

# %% nbgrader={"grade": false, "grade_id": "temperature_probs", "locked": false, "schema_version": 3, "solution": true, "task": false}
def temperature_probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """softmax(logits / temperature) over the last dimension: [..., vocab] -> [..., vocab]."""
    ### BEGIN SOLUTION
    return torch.softmax(logits / temperature, dim=-1)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "temperature_probs_test", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false} tags=["raises-exception"]
check_temperature_probs(temperature_probs)
### BEGIN HIDDEN TESTS
check_temperature_probs(temperature_probs, hidden=True)
### END HIDDEN TESTS

# %%
temperature_probs_impl = yours_or_reference(temperature_probs, check_temperature_probs)

# %% [markdown]
# The model's distribution for the character after `"The value of the "`, at three temperatures (the 12 most
# probable characters at $T = 1$):

# %% tags=["skip-when-grading"]
context_ids = chars.encode("The value of the ")[None]  # [1, 17]
with torch.no_grad():
    next_logits = char_model(context_ids)[0, -1]  # [V]
order = next_logits.topk(12).indices
labels = [repr(chars.decode([i]))[1:-1] or " " for i in order.tolist()]
fig, axes = plt.subplots(1, 3, figsize=(11, 3.0), sharey=True)
for ax, temperature in zip(axes, [0.5, 1.0, 2.0]):
    probs = temperature_probs_impl(next_logits, temperature)  # [V]
    ax.bar(range(12), probs[order], color="#2f6fad")
    ax.set_xticks(range(12), labels, fontsize=8)
    ax.set_title(f"T = {temperature}: top char {probs.max():.2f}, top 12 hold {probs[order].sum():.2f}", fontsize=9)
axes[0].set_ylabel("probability")
plt.show()

# %% [markdown]
# ### Top-k and top-p
#
# Even a sharpened distribution keeps a long tail: hundreds of unlikely tokens, each rare, but together likely
# enough to be drawn every few steps, and one bad draw can derail everything after it. Two filters cut the tail
# before drawing.
#
# * **Top-k** (Fan et al., 2018; chapter 07) keeps the $k$ most probable tokens. But a fixed $k$ is too many when
#   the model is sure (after `q`, only `u` makes sense) and too few when it is not (the first letter of a word).
# * **Top-p**, or **nucleus sampling** (Holtzman et al., 2020, "The Curious Case of Neural Text Degeneration"),
#   keeps the *smallest set of most probable tokens whose probabilities add up to at least* $p$. Its size adapts
#   to the model's confidence.
#
# The convention, which is Holtzman et al.'s and Hugging Face's: sort the tokens by probability, and keep a token
# if the tokens ranked **above** it hold less than $p$. So the token that **crosses** $p$ is kept; the most
# probable token is always kept, even when it alone holds more than $p$.

# %% [markdown]
# ### Exercise 8 — `top_p_filter`
# > **Difficulty** ●●● · **Importance** ●●○ · about 20 minutes
#
# Write `top_p_filter(logits, p)`: `logits` `[..., vocab]`, `0 < p < 1`. Return a tensor of the same shape in
# which the logits of the tokens outside the nucleus are `-inf` and the others are **unchanged**, in vocabulary
# order.
#
# Worked example: probabilities `[0.1, 0.5, 0.05, 0.15, 0.2]` (as logits, their logs) and $p = 0.8$. Sorted:
# 0.5, 0.2, 0.15, 0.1, 0.05; the mass before each is 0, 0.5, 0.7, 0.85, 0.95. The first three have less than 0.8
# before them, so tokens 1, 4 and 3 stay (0.85 in all) and tokens 0 and 2 become `-inf`.
#
# <details><summary>Hint 1 — the idea</summary>Decide in sorted order, apply in vocabulary order. In sorted order
# the nucleus is a prefix, and "the mass before a token" is a cumulative sum minus the token itself.</details>
# <details><summary>Hint 2 — the plan</summary>Work in the order of probability, not of the vocabulary: line each
# row up from the most to the least likely token, remembering where each one came from, <code>[..., vocab]</code>.
# For each token in that line, find the probability mass strictly in front of it; the token is dropped when that
# mass has already reached p (so the most likely token always stays). Carry the keep-or-drop decision back to the
# vocabulary's order, <code>[..., vocab]</code>, and give every dropped token a score that no sampling can
# pick.</details>
# <details><summary>Hint 3 — the key step</summary>A smaller example on other tensors: <code>[10, 20, 30]</code>
# sorted in descending order is <code>[30, 20, 10]</code>, with the sort's indices <code>[2, 1, 0]</code>. A flag
# computed in sorted order, <code>[True, False, False]</code>, belongs at vocabulary position 2 for its first entry.
# Which operation writes each sorted entry back at the index the sort's indices hold for it? The page to read is
# <code>torch.Tensor.scatter</code>.</details>

# %% nbgrader={"grade": false, "grade_id": "top_p_filter", "locked": false, "schema_version": 3, "solution": true, "task": false}
def top_p_filter(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Nucleus filtering: -inf outside the smallest set of most probable tokens with mass >= p.

    logits: [..., vocab]. Returns [..., vocab], kept logits unchanged, in vocabulary order.
    """
    ### BEGIN SOLUTION
    sorted_logits, order = logits.sort(dim=-1, descending=True)  # [..., vocab]
    probs = torch.softmax(sorted_logits.float(), dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs  # [..., vocab]: what the better-ranked tokens hold
    drop_sorted = mass_before >= p  # the crossing token has less than p before it: it stays
    drop = drop_sorted.scatter(-1, order, drop_sorted)  # back to vocabulary order
    return logits.masked_fill(drop, float("-inf"))
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "top_p_filter_test", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false} tags=["raises-exception"]
check_top_p_filter(top_p_filter)
### BEGIN HIDDEN TESTS
check_top_p_filter(top_p_filter, hidden=True)
### END HIDDEN TESTS

# %%
top_p_filter_impl = yours_or_reference(top_p_filter, check_top_p_filter)

# %% [markdown]
# The adaptivity, measured: how many characters the nucleus keeps at $p = 0.9$, in a context where the model is
# sure of the next character and in one where it is not. Top-k would keep the same $k$ in both.

# %% tags=["nbval-ignore-output", "skip-when-grading"]
nucleus_size = {}
for text in ["The value of the ", "The value of the expressio", "\n"]:
    with torch.no_grad():
        logits = char_model(chars.encode(text)[None])[0, -1]  # [V]
    nucleus_size[text] = int(top_p_filter_impl(logits, 0.9).isfinite().sum())
    best = logits.softmax(-1).max().item()
    print(f"after {text!r:26}: top character has p = {best:.2f}; the 0.9-nucleus keeps {nucleus_size[text]:3d} of {V}")

# %% tags=["skip-when-grading"]
measured = str(nucleus_size)
claim(nucleus_size["The value of the expressio"] <= 2,
      "where the model is sure (after 'expressio'), the 0.9-nucleus keeps at most 2 characters", measured=measured)
claim(min(nucleus_size["The value of the "], nucleus_size["\n"]) >= 10,
      "where it is not (the first letter of a word, of a paragraph), it keeps at least 10", measured=measured)

# %% [markdown]
# ### The sampling loop
#
# Everything a sampler needs is now on the table: your greedy loop with the cache, your temperature, your
# nucleus, and the top-k filter. The top-k filter is the library's, `transformer_lib.decoding.top_k_filter`
# (imported above): the reference answer to chapter 07's exercise, since this notebook cannot reach the one you
# wrote there. It takes logits `[..., vocab]` and `k` (`None` keeps every token) and returns them with `-inf`
# everywhere but the `k` largest. The order in which the pieces act is Hugging Face's, and it matters: the
# temperature first, then top-k, then top-p, so that the nucleus is measured on the distribution actually
# sampled from.
#
# ### Exercise 9 — `sample`
# > **Difficulty** ●●○ · **Importance** ●●● · about 20 minutes
#
# Write `sample(model, prompt, max_new_tokens, temperature=1.0, top_k=None, top_p=None, generator=None)`:
# `[batch, seq]` → `[batch, seq + max_new_tokens]`, the prompt followed by the new tokens.
#
# * The loop and the cache are those of your `greedy_generate`: the prompt runs through the model once, then each
#   step feeds only the newest token. The checker counts the positions computed.
# * Each new token is a **draw**, one per row, from the last position's distribution: at `temperature` (use
#   `temperature_probs_impl`, yours if it passed), restricted to the `top_k` most probable tokens
#   (`top_k_filter`), then to the nucleus of mass `top_p` (`top_p_filter_impl`, only when `top_p` is not `None`).
# * The filters work on logits and put `-inf` outside what they keep. The logarithm of probabilities serves as
#   logits: the softmax of $\log p$ is $p$ again.
# * Draw with `torch.multinomial` and the `generator` you are given, so that a seeded generator gives the same
#   samples every time. The checker runs your function twice with the same seeded generator but a different
#   global random state, and expects the same tokens; it also checks that every token drawn lies inside the top-k
#   and the nucleus at that temperature.
#
# <details><summary>Hint 1 — the idea</summary>Your greedy loop with one change: the argmax becomes a draw. The
# draw wants probabilities; the two filters want logits. Moving between the two is a log one way and a softmax the
# other.</details>
# <details><summary>Hint 2 — the plan</summary>Keep the loop of your greedy decoder and change what happens to
# the scores of the last position, <code>[batch, vocab]</code>: the temperature acts first; the two filters, top-k and
# top-p (only when it is given), work on scores in log space and only cut, never rescale; and the draw needs
# weights again. One token per sentence comes out, <code>[batch, 1]</code>, drawn with the generator you were given,
# never the global one; it joins the output and is the model's next input.</details>
# <details><summary>Hint 3 — the key step</summary>The page to read is <code>torch.multinomial</code>: what its
# input rows must hold (non-negative weights, one row per sentence), what shape it returns for one draw per row, and
# its <code>generator</code> argument. Then the question: is what your filters return ready for it, or must it go
# through one more step first?</details>

# %% nbgrader={"grade": false, "grade_id": "sample", "locked": false, "schema_version": 3, "solution": true, "task": false}
def sample(model: GPT, prompt: torch.Tensor, max_new_tokens: int, temperature: float = 1.0, top_k: int | None = None,
           top_p: float | None = None, generator: torch.Generator | None = None) -> torch.Tensor:
    """Sampling with the key/value cache, temperature, top-k and top-p: [batch, seq] -> [batch, seq + max_new_tokens]."""
    ### BEGIN SOLUTION
    cache = model.new_cache()
    tokens = new = prompt  # new: what the model has not seen yet
    for _ in range(max_new_tokens):
        logits = model(new, cache)[:, -1]  # [batch, vocab]
        scores = top_k_filter(temperature_probs_impl(logits, temperature).log(), top_k)  # log-probabilities at T
        if top_p is not None:
            scores = top_p_filter_impl(scores, top_p)  # -inf outside the nucleus
        new = torch.multinomial(torch.softmax(scores, dim=-1), 1, generator=generator)  # [batch, 1]
        tokens = torch.cat([tokens, new], dim=1)
    return tokens
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "sample_test", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false} tags=["raises-exception"]
check_sample(sample)
### BEGIN HIDDEN TESTS
check_sample(sample, hidden=True)
### END HIDDEN TESTS

# %%
sample_impl = yours_or_reference(sample, check_sample)

# %% [markdown]
# ### Samples
#
# Five rules, each run by `sample_impl` (yours, if it passed) on the character model: three temperatures, then
# top-k and top-p at $T = 1$. The same seed for every rule, 32 samples of 200 characters each, from the same
# prompt; the first sample of each is shown. The model's window is 32 characters, so `generate_long` slides the
# window along as it did for the greedy text, and calls your function once per window. (The samples depend on
# the trained weights, so another machine shows other ones; what the chapter says about them is checked below on
# all 32.)

# %%
rules = {
    "T = 0.5": dict(temperature=0.5),
    "T = 1.0": dict(temperature=1.0),
    "T = 1.5": dict(temperature=1.5),
    "top-k 10": dict(top_k=10),
    "top-p 0.9": dict(top_p=0.9),
}


def sampler(generator, **rule):
    """generate_long's generate_fn: one window continued by sample_impl, with one generator throughout."""
    return lambda model, window, steps: sample_impl(model, window, steps, generator=generator, **rule)


# %% tags=["nbval-ignore-output"]
samples = {}
for name, rule in rules.items():
    g = torch.Generator().manual_seed(0)
    samples[name] = generate_long(char_model, prompt.expand(32, -1), 200, generate_fn=sampler(g, **rule))  # [32, 205]
    print(f"--- {name}\n{chars.decode(samples[name][0, 1:])}\n")

# %% [markdown]
# None of this is English yet, but the differences between the rules show. At $T = 0.5$ the text falls back
# on the safest words ("the", "is", "a") and repeats them. At $T = 1$ most words are invented but have the
# shape of English, with the capitals, punctuation and line breaks of the help pages. At $T = 1.5$ the tail
# takes over: digits, quotes, `…` and symbols the model rarely predicts now come up every few characters. Top-k
# and top-p sampling start from the same random numbers as $T = 1$ and cut that tail: fewer odd characters, more
# real words. Counted over the 32 samples of each rule, a *real word* being a word of the training text (two
# letters or more) and a *rare character* one that makes up less than 0.5% of it:

# %%
rare = unigram.exp() < 0.005  # [V]: True for the rare characters
known_words = set(re.findall(r"[a-z]{2,}", train_text.lower()))


def profile(tokens):
    """Share of rare characters, share of real words and share of 'the' among the words, in samples [n, 5 + new]."""
    words = [w for row in tokens for w in re.findall(r"[a-z]{2,}", chars.decode(row[prompt.shape[1]:]).lower())]
    return (rare[tokens[:, prompt.shape[1]:]].float().mean().item(), sum(w in known_words for w in words) / len(words),
            words.count("the") / len(words))


profiles = {name: profile(tokens) for name, tokens in samples.items()}
measured = "; ".join(f"{name}: rare {r:.3f}, real {k:.3f}, the {t:.3f}" for name, (r, k, t) in profiles.items())
(rare_05, real_05, the_05), (rare_1, real_1, _), (rare_15, _, _), (rare_k, real_k, _), (rare_p, real_p, _) = (
    profiles.values())
claim(real_05 > 0.6 and the_05 > 0.15, "at T = 0.5 over 60% of the words are real, and 'the' alone is over 15% of them",
      measured=measured)
claim(real_1 < 0.5, "at T = 1 most words are invented: under half of them are real", measured=measured)
claim(rare_15 >= 2 * rare_1, "at T = 1.5 rare characters are at least twice as frequent as at T = 1", measured=measured)
claim(max(rare_k, rare_p) < rare_1 and min(real_k, real_p) > real_1,
      "top-k and top-p cut the tail: fewer rare characters than at T = 1, and more real words", measured=measured)

# %% [markdown]
# ### Beam search
#
# Greedy search picks the best *next* token, not the best *sequence*: a token that looks good now may lead
# nowhere. **Beam search** (chapter 07) keeps the `beam_size` most probable partial continuations at every step
# and returns the best whole one. It finds more probable text, as the scores show: each continuation's
# log-probability given the prompt, summed with the chain rule.

# %% tags=["nbval-ignore-output"]
def continuation_log_prob(model, tokens, prompt_len):
    """log P(tokens[prompt_len:] | tokens[:prompt_len]), by the chain rule, from next_token_loss."""
    with torch.no_grad():
        mean = next_token_loss_impl(model(tokens), tokens).item()  # over all L - 1 predictions
        before = next_token_loss_impl(model(tokens[:, :prompt_len]), tokens[:, :prompt_len]).item()
    return -(tokens.shape[1] - 1) * mean + (prompt_len - 1) * before


beam_prompt = chars.encode("\nIn the ")[None]  # [1, 8]
new = CONTEXT - beam_prompt.shape[1]
with torch.no_grad():
    candidates = {"greedy": greedy_generate_impl(char_model, beam_prompt, new),
                  "beam search, 4 beams": beam_search(char_model, beam_prompt, new, beam_size=4, length_penalty=0.0)}
beam_scores = {name: continuation_log_prob(char_model, tokens, beam_prompt.shape[1]) for name, tokens in candidates.items()}
for name, tokens in candidates.items():
    print(f"{name:<21} log P = {beam_scores[name]:7.2f}  {chars.decode(tokens[0, 1:])!r}")

# %%
greedy_score, beam_score = beam_scores.values()
measured = f"log P {greedy_score:.2f} vs {beam_score:.2f}"
claim(beam_score > greedy_score, "beam search finds a more probable continuation than greedy search", measured=measured)

# %% [markdown]
# Beam search is the standard for tasks with one right answer (translation, chapter 07's dates). For open-ended
# text, Holtzman et al. found the opposite of what one might hope: the most probable continuations are bland and
# repetitive, and human text is *not* the most probable text under a language model. That is why chat models and
# story generators sample, with a temperature and a nucleus.

# %% [markdown]
# ## 9. Scale: GPT-2 and GPT-3
#
# The models of the literature are this chapter's model, larger. GPT-2 small (Radford et al., 2019): 12 blocks,
# $d_\text{model} = 768$, 12 heads, 1,024 positions and GPT-2's byte-level BPE of 50,257 tokens. Built on PyTorch's
# `meta` device, its weights take no memory, and it can be counted:

# %%
gpt2 = configs.gpt2_small(device="meta")
count = lambda module: sum(p.numel() for p in module.parameters())  # noqa: E731
print(f"GPT-2 small: {count(gpt2):,} parameters")
print(f"  token embedding {gpt2.token_embedding.weight.shape[0]:,} x {gpt2.token_embedding.weight.shape[1]} = "
      f"{gpt2.token_embedding.weight.numel():,} (also the output layer: tied)")
print(f"  positions       {gpt2.positions.embedding.weight.shape[0]:,} x 768 = {gpt2.positions.embedding.weight.numel():,}")
print(f"  12 blocks       {count(gpt2.blocks):,}   final LayerNorm {count(gpt2.ln_f):,}")
with torch.device("meta"):  # the next size up: 24 blocks of 1,024, 16 heads
    gpt2_medium = GPT(GPTConfig(vocab_size=50257, max_len=1024, d_model=1024, n_heads=16, n_layers=24))
print(f"GPT-2 medium: {count(gpt2_medium):,} parameters")

# %% [markdown]
# 124,439,808 is the size of OpenAI's released checkpoint of GPT-2 small, named "124M". The GPT-2 paper itself
# (Radford et al., 2019, Table 2) lists this model as 117M, and the next one as 345M. Those figures are not
# roundings but a miscount: OpenAI's `gpt-2` repository renamed the two checkpoints 124M and 355M, and its README
# explains that "our original parameter counts were wrong due to an error (in our previous blog posts and
# paper)". The counts above, from the models' shapes, agree with the corrected names. Without weight tying, GPT-2
# small's output layer would add another 38.6M.
#
# Where do a block's parameters live? Attention has four $d \times d$ matrices ($W^Q, W^K, W^V, W^O$), the MLP two
# of $d \times 4d$: $4d^2 + 8d^2 = 12 d^2$ per block, plus biases and LayerNorms, which grow only like $d$. So a
# stack of $L$ blocks holds about $12 L d^2$ parameters. GPT-3 (Brown et al., 2020, Table 2.1) has
# $L = 96$ blocks of $d_\text{model} = 12{,}288$, 96 heads, a context of 2,048 tokens, and the same 50,257 tokens:

# %%
L_gpt3, d_gpt3 = 96, 12288
print(f"12 L d^2 = 12 x {L_gpt3} x {d_gpt3:,}^2 = {12 * L_gpt3 * d_gpt3 ** 2:,} = "
      f"{12 * L_gpt3 * d_gpt3 ** 2 / 1e9:.1f} billion")
with torch.device("meta"):  # shapes only: 175 billion float32 weights would need 700 GB
    gpt3 = GPT(GPTConfig(vocab_size=50257, max_len=2048, d_model=d_gpt3, n_heads=96, n_layers=L_gpt3))
embeddings = gpt3.token_embedding.weight.numel() + gpt3.positions.embedding.weight.numel()
print(f"token and position embeddings: (50,257 + 2,048) x {d_gpt3:,} = {embeddings:,} = {embeddings / 1e9:.1f} billion")
print(f"the whole model, embeddings, biases and LayerNorms included: {count(gpt3):,}")
print(f"published: 175.0 billion; recomputed: {count(gpt3) / 1e9:.1f} billion")

# %% [markdown]
# The formula alone gives 173.9 billion; the embeddings add 0.6 billion, and the total, 174.6 billion, is the
# published "175B" to the rounding. (GPT-3 alternates dense attention with locally banded sparse attention,
# chapter 11's subject, which changes which keys a query sees but not the number of weights.) GPT-3 was trained on
# 300 billion tokens; our character model has 236,832 parameters and saw 409,600 characters.

# %% [markdown]
# ## 10. Few-shot prompting, and what a small model learns in context
#
# GPT-3's paper is titled "Language Models are Few-Shot Learners" (Brown et al., 2020). Its finding: a large enough
# language model can do a task it was never trained for, **without any change to its weights**, if the prompt
# shows it the task. The prompt is ordinary text: an instruction, a few solved examples, then the new case, and
# the model's most probable continuation is the answer. The paper's own illustration (its Figure 2.1) is
# translation, spelt here as the paper spells it:

# %%
few_shot = ("Translate English to French:\n"
            "sea otter => loutre de mer\n"
            "peppermint => menthe poivrée\n"
            "plush girafe => girafe peluche\n"
            "cheese =>")
print(few_shot)
print(f"\n(the prompt is {len(few_shot)} characters long; our model's window holds {CONTEXT})")

# %% [markdown]
# With no solved example this is **zero-shot**, with one **one-shot**, with several **few-shot**; the paper
# calls the whole phenomenon **in-context learning**. It grows with scale: in the paper's experiments the gap
# between zero-shot and few-shot accuracy widens as models grow from 125 million to 175 billion parameters.
# And it is uneven: Prince (section 12.7) notes that performance is erratic, and that it is not clear whether
# the model generalises from the examples or interpolates between things it has seen.
#
# Our model cannot do this, for two plain reasons. Its window holds 32 characters, so the prompt above does not
# fit: not even one solved example together with the question. And in Brown et al.'s experiments, learning a task
# from examples in the prompt is something that grows with size, across models of 125 million parameters and
# more, the smallest of them over 500 times ours (236,832 parameters, trained on about one and a half passes
# over a quarter of a megabyte of Python documentation).
#
# What *can* a model this small do in context? Olsson et al. (2022, "In-context Learning and Induction Heads")
# define in-context learning broadly, as the loss falling with the position in the context, because a later
# prediction has more text to go on. They score it far from the start (token 500 against token 50), since every
# model improves over its first few dozen tokens. Our window only shows that early part, and it can be measured here. Cut the validation text into windows of 32
# characters (plus the one after each, the last target) and average the loss at each position, that is, with
# 1, 2, ..., 32 characters of context:

# %% tags=["nbval-ignore-output"]
n_windows = (len(val_ids) - 1) // CONTEXT
windows = val_ids[:n_windows * CONTEXT + 1].unfold(0, CONTEXT + 1, CONTEXT)  # [808, 33]: the validation text, cut up
with torch.no_grad():
    window_log_probs = torch.log_softmax(char_model(windows[:, :-1]), dim=-1)  # [808, 32, V]
position_loss = -window_log_probs.gather(-1, windows[:, 1:, None]).squeeze(-1).mean(dim=0)  # [32]
for seen in [1, 2, 4, 8, 16, 32]:  # position_loss[seen - 1]: the prediction made after `seen` characters
    print(f"after {seen:2d} character(s) of context: {position_loss[seen - 1]:.3f} nats per character")
early, middle, late = position_loss[0].item(), position_loss[7:15].mean().item(), position_loss[15:].mean().item()
print(f"mean over 8 to 15 characters: {middle:.3f}; over 16 to 32: {late:.3f}; "
      f"fall from 1 character to 8-15: {early - middle:.3f}; last position above 8-15: {position_loss[-1] - middle:.3f}")
fig, ax = plt.subplots(figsize=(7.5, 3.2))
ax.plot(range(1, CONTEXT + 1), position_loss, marker="o", markersize=3, label="character GPT, validation text")
ax.axhline(bigram_nats, color="#d08020", linestyle="--", label=f"bigram baseline ({bigram_nats:.2f})")
ax.set_xlabel("characters of context seen")
ax.set_ylabel("nats per character")
ax.legend(fontsize=8)
ax.set_title("Loss by position in the window: it falls for a few characters, then stops falling, "
             "and rises at the end", fontsize=10)
plt.show()

# %%
measured = f"1 character: {early:.3f}; 8 to 15: {middle:.3f}; 16 to 32: {late:.3f} nats per character"
claim_between(early - middle, 0.6, None, "from 1 character of context to 8 or more, the loss falls by at least 0.6 nats",
              measured=measured)
claim(late > middle - 0.1, "beyond that it hardly falls: 16 to 32 characters gain less than 0.1 nats over 8 to 15",
      measured=measured)
claim(early > bigram_nats, "with a single character of context it does worse than the bigram model",
      measured=f"{measured}; bigram {bigram_nats:.3f}")
claim_between(position_loss[-1].item() - middle, 0.05, None, "at the last position of the window the loss is higher "
              "again than with 8 to 15 characters, by more than 0.05 nats",
              measured=f"{measured}; after 32: {position_loss[-1].item():.3f}")

# %% [markdown]
# With a single character to go on, the GPT does worse than the bigram model, which is built for exactly that
# case (for the GPT it is one training prediction in 32). The loss then falls steeply over the next few
# characters, as the model finishes a word whose beginning it has seen: from 1 character of context to 8 to 15 it
# falls by about 0.81 nats here (at least 0.6 on every CPU we tried). Then it stops falling: 16 to 32 characters
# gain less than 0.1 nats over 8 to 15. It does not stay level, though: over the last positions of the window it
# rises again, and at the last one it is about 0.15 nats higher than the mean over 8 to 15 characters here (more
# than 0.05 on every CPU we tried). Every position has a target in every training window, but not every position
# is trained alike: under the causal mask, row $p$ of the position table gets gradient only from the predictions
# at $p$ and after, so the last rows learn from the fewest. This run does not say whether that is the cause.
# Past about 8 characters, more context buys this model nothing.
#
# The fall over the first 8 characters is not in-context learning in Olsson et al.'s sense. It is short-context
# prediction, finishing a word from its first letters, the improvement every model shows over its first few
# tokens, and exactly what they exclude by comparing the loss at token 500 with the loss at token 50. A window of
# 32 characters cannot measure their kind at all.
#
# The next kind up is **copying**. Olsson et al. describe **induction heads**: attention heads that complete a
# pattern seen earlier in the context, so that after "[A][B] … [A]" they predict "[B]". They found them in models
# of two or more layers, and ours has two. A model that copies this way predicts the second occurrence of a
# string far better than the first: the answer is in its own window. The test: 400 stretches of 16 characters
# from random places in the validation text, each written twice into one 32-character window, and the loss on
# characters 2 to 16 of each copy (not even a perfect copier can predict the first character of the second copy:
# in the first copy, nothing came before it).

# %% tags=["nbval-ignore-output"]
starts = torch.randint(0, len(val_ids) - 16, (400,), generator=torch.Generator().manual_seed(0))
stretch = val_ids[starts[:, None] + torch.arange(16)]  # [400, 16]
twice = torch.cat([stretch, stretch], dim=1)  # [400, 32]: a stretch, then the same stretch again
with torch.no_grad():
    twice_log_probs = torch.log_softmax(char_model(twice), dim=-1)[:, :-1]  # [400, 31, V]
copy_loss = -twice_log_probs.gather(-1, twice[:, 1:, None]).squeeze(-1)  # [400, 31]: [:, t] scores character t + 1
first_copy, second_copy = copy_loss[:, :15].mean().item(), copy_loss[:, 16:].mean().item()  # characters 2..16
print("one of the windows:", repr(chars.decode(twice[0])))
print(f"characters 2 to 16 of the first copy: {first_copy:.3f} nats per character; of the second: {second_copy:.3f}")

# %%
measured = f"first copy {first_copy:.3f}, second copy {second_copy:.3f} nats per character"
claim_between(second_copy - first_copy, -0.1, None, "the second copy costs no less than the first (to 0.1 nats): the "
              "model does not copy", measured=measured)
claim_between(second_copy, 1.5, None, "it still pays over 1.5 nats for each character of a string it saw 16 characters "
              "earlier", measured=measured)

# %% [markdown]
# The model does not copy. It pays about 1.96 nats per character for the second copy here (over 1.5 on every CPU
# we tried), about 0.07 more than for the first rather than less (never less by 0.1 or more on any CPU we tried),
# although each character of the second copy already appeared exactly 16 positions earlier in the same window. So this is where a model of this size, trained this
# briefly, stands: it uses the last few characters to finish a word, which is short-context prediction, not
# in-context learning.
# Copying a pattern it has just seen is beyond it, and learning a task from a few examples in the prompt, Brown
# et al.'s few-shot learning, belongs to models with orders of magnitude more parameters and training text.

# %% [markdown]
# ## 11. Three families
#
# The Transformer of 2017 was an encoder and a decoder. Chapters 09 and 10 kept one half each, and the three
# resulting families cover most of what is built today. What separates them is which positions may attend to
# which, and what they are trained to predict:
#
# * **Encoder-decoder** (the original Transformer; T5): the encoder reads the whole input with full attention,
#   the decoder writes the output causally and reads the encoder through cross-attention. For tasks that map one
#   text to another: translation, summarising.
# * **Encoder-only** (BERT): full attention, every token sees every token; trained to fill in masked tokens. It
#   produces representations for understanding tasks (classification, tagging, span extraction), but does not
#   generate text left to right.
# * **Decoder-only** (GPT): causal attention only; trained to predict the next token everywhere. It generates,
#   and with prompting it can be turned to many tasks, translation included, by putting the input in the prompt.

# %%
fig = draw_three_families()
plt.show()

# %% [markdown]
# ## Summary
#
# * A language model is a next-token predictor: by the **chain rule**, $P(x_1..x_T) = \prod_t P(x_t \mid x_{<t})$,
#   and log-probabilities turn the product into a sum.
# * GPT-2 is a stack of **pre-norm** blocks, $x + \operatorname{Attn}(\operatorname{LN}_1(x))$ then
#   $x + \operatorname{MLP}(\operatorname{LN}_2(x))$, with **masked (causal) self-attention**; token plus position
#   vectors go in, a final LayerNorm and the tied token table come out. With a **key/value cache** each block keeps
#   its keys and values, the new tokens' positions continue after the cached ones, and the logits are those of the
#   whole sequence at once. You wrote both functions, and the models of this chapter ran them.
# * With the causal mask, one forward pass over a window makes a prediction at every position, and **every
#   position is a training example** with the targets shifted by one: `logits[:, :-1]` against `tokens[:, 1:]`, the
#   last prediction left out. Training windows one token longer than the context give the last position a target
#   too, and the validation scores every position.
# * Losses mean something only against **baselines**: on the course text a unigram model scores 3.30 nats per
#   character and a bigram model 2.42; the character GPT, trained here for 400 steps, about 1.85 (1.8 to 2.0 on
#   every CPU we tried).
# * **Nats, bits, perplexity**: bits = nats / ln 2, perplexity = $e^{\mathcal{L}}$ for a loss $\mathcal{L}$ in nats. Across tokenizers, compare **per
#   character**: the BPE GPT's about 3.2 nats per token are about 1.50 nats per character here, better than the
#   character model at equal steps and equal blocks (its larger token table makes it 17% larger in all), though
#   its per-token perplexity (over 20 against under 7.4) looks far worse.
# * **Generation**: greedy (with a key/value cache, identical tokens to the uncached run) loops; temperature
#   reshapes the distribution *before* the softmax; top-k keeps $k$ tokens, top-p the smallest nucleus with mass
#   $\ge p$ (the crossing token kept); sampling draws from what is left with a seeded generator, so a sample can be
#   reproduced; beam search finds more probable but blander text.
# * **Scale**: GPT-2 small has 124,439,808 parameters (the paper's "117M" was a miscount); $12 L d^2$ with GPT-3's
#   96 blocks of 12,288 gives 173.9 billion, 174.6 billion with the embeddings: the published 175B. Few-shot
#   prompting is a property of such scale, not of small models: ours uses a few characters of context to finish
#   words, and does not even copy a string repeated in its window.
#
# ## What's next
#
# Attention compares every position with every other, so its cost grows with the square of the context: our
# model's 32 positions are cheap, GPT-3's 2,048 are not, and a book is out of reach. Chapter 11, **long
# sequences**, measures that cost and the ways around it: sliding windows, dilated and global attention, linear
# attention, and the memory-saving trick behind FlashAttention.

# %% [markdown]
# ## Where you stand
#
# Which of this chapter's exercises pass, as last checked (run the test cells again after a change):

# %%
exercise_summary(check_gpt_block, check_gpt_forward, check_next_token_loss, check_bigram_log_probs, check_bits_per_char,
                 check_greedy_generate, check_temperature_probs, check_top_p_filter, check_sample)

# %% [markdown]
# ## Glossary · 术语表
#
# | English | 中文 | Meaning |
# |---|---|---|
# | language model | 语言模型 | a probability distribution over texts, built from next-token predictions |
# | autoregressive | 自回归 | each token predicted from the tokens before it, $P(x_t \mid x_{<t})$ |
# | chain rule | 链式法则 | $P(x_1..x_T) = \prod_t P(x_t \mid x_{<t})$, exact, no approximation |
# | decoder-only | 仅解码器 | a stack of masked self-attention blocks with no encoder (GPT) |
# | masked (causal) self-attention | 掩码（因果）自注意力 | position $t$ attends to positions $0..t$ only |
# | shifted targets | 移一位的目标 | the target of position $t$ is token $t+1$ of the same window |
# | next-token prediction | 下一词预测 | the training task of a decoder-only model |
# | unigram / bigram model | 一元 / 二元语法模型 | counts of single tokens / of adjacent pairs: baselines with 0 / 1 token of context |
# | add-α smoothing | 加α平滑（拉普拉斯平滑） | a pseudo-count added to every count, so nothing has probability 0 |
# | nats / bits per character | 每字符奈特 / 比特 | cross-entropy per character with $\ln$ / $\log_2$; bits = nats / ln 2 |
# | perplexity | 困惑度 | $e^{\mathcal{L}}$ for a loss $\mathcal{L}$ in nats: the number of equally likely choices; per token, so tokenizer-dependent |
# | greedy decoding | 贪心解码 | always the most probable next token |
# | temperature | 温度 | softmax(logits / T): T < 1 sharper, T > 1 flatter |
# | top-k sampling | Top-k 采样 | draw only among the k most probable tokens |
# | nucleus (top-p) sampling | 核采样（Top-p 采样） | draw among the smallest set of top tokens with mass ≥ p |
# | beam search | 束搜索 | keep the best few partial sequences at every step |
# | key/value cache | 键值缓存（KV 缓存） | keys and values of earlier tokens, kept so each step feeds one token |
# | pre-norm / post-norm | 前置归一化 / 后置归一化 | LayerNorm on each sub-block's input (GPT-2) / on the residual sum (GPT-1) |
# | residual stream | 残差流 | the vector x each block reads and adds to; never normalised inside a pre-norm block |
# | final LayerNorm | 最终层归一化 | GPT-2's LayerNorm after the last block, before the output layer |
# | multinomial draw | 多项分布采样 | drawing one token with the given probabilities (torch.multinomial) |
# | random generator (seed) | 随机数生成器（种子） | the source of a sample's randomness; the same seed gives the same sample |
# | weight tying | 权重共享（绑定） | the output layer reuses the token embedding matrix |
# | few-shot / in-context learning | 少样本 / 上下文学习 | a task shown by examples in the prompt, no weight update |
# | induction head | 归纳头 | an attention head that completes a pattern seen earlier: after [A][B] … [A], predict [B] |
