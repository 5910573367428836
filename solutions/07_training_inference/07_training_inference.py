# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Chapter 07 — Training and inference: a Transformer learns to read dates
#
# Chapters 01 to 06 built every part of the Transformer: attention, heads, positions, the encoder and decoder
# layers, and their masks. The model in `transformer_lib.layers.EncoderDecoder` is complete, but untrained:
# its weights are random, and it knows nothing. This chapter trains one, on one CPU thread, in a few tens of
# seconds, and then uses it.
#
# The task is small but real: read a date written by a human, in any of a dozen styles, and write it in the
# ISO 8601 form computers agree on.
#
# | the model reads | it writes |
# |---|---|
# | `3 March 2021`, `March 3rd, 2021`, `Wed, 3 Mar 2021`, `03/03/21`, `3.3.2021`, `2021年3月3日`, ... | `2021-03-03` |
#
# It is a translation task in miniature. The model must copy some characters (the digits of the year), look up
# others (*March* → `03`), reorder them (the day comes first in `3.3.2021`, last in the output), and ignore some
# (*Wed*). We test it on dates it has **never seen in any format**, and ask for the whole output to be exactly
# right.
#
# The chapter goes from the model's last layer to its finished outputs:
#
# 1. **The task and its data**: dates, a character vocabulary, padded batches.
# 2. **The generator**: a linear layer and a log-softmax turn the decoder's vectors into next-token log-probabilities.
# 3. **Choosing the next token**: greedy choice, sampling, temperature and top-k.
# 4. **The loss**: cross-entropy, and label smoothing.
# 5. **Teacher forcing**: the decoder reads the gold answer, shifted right by one.
# 6. **The warm-up schedule** of the learning rate (eq. 3 of the paper).
# 7. **Training**: one loop, and how the same loop runs on several processes.
# 8. **Exact match** on held-out dates.
# 9. **Teacher forcing vs free running**: what changes when the model reads its own guesses.
# 10. **Where the decoder looks**: the cross-attention between a date and its ISO form.
# 11. **Greedy vs beam search**.
# 12. **The encoder runs once** per sentence, and 13. **the KV cache** saves the decoder from redoing work.
#
# Four exercises are autograded: `top_k_filter`, `label_smoothed_targets`, `teacher_forcing_inputs` and
# `noam_learning_rate`.

# %%
import copy
import datetime as dt
import math
import time
from contextlib import contextmanager

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F

from transformer_lib.checks.ch07 import (
    check_label_smoothed_targets,
    check_noam_learning_rate,
    check_teacher_forcing_inputs,
    check_top_k_filter,
)
from transformer_lib.datasets import DATE_FORMATS, dates_task, format_date, make_loader
from transformer_lib.decoding import beam_search, greedy_decode, sample_next_token, sequence_log_prob
from transformer_lib.layers import EncoderDecoder, TransformerConfig, count_parameters
from transformer_lib.masks import causal_mask, padding_mask
from transformer_lib.training import LabelSmoothingLoss, noam_scheduler, prepare_batch, train

torch.manual_seed(0)
torch.set_printoptions(precision=4, sci_mode=False)
torch.set_num_threads(1)  # one thread: the same float sums, hence the same trained model, on every run

# %% [markdown]
# ## 1. The task: human dates in, ISO dates out
#
# `transformer_lib.datasets` writes dates in twelve styles. Each style is named by the way it writes 3 March 2021:

# %%
example_day = dt.date(2021, 3, 3)
for name in DATE_FORMATS:
    print(f"{format_date(example_day, name):>16}  ->  {example_day.isoformat()}")

# %% [markdown]
# The data set draws random dates between 1970 and 2060 and writes each one in a random style. **Before**
# drawing the training examples, it sets aside 1,000 dates for the test set. No training example uses any of
# them, in any style, so a correct answer on the test set cannot be a memorised one.

# %%
task = dates_task(n_train=30_000, n_test=1_000, seed=0)
vocab = task.vocab
train_dates = {target for _, target in task.train}
test_dates = {target for _, target in task.test}
print(f"{len(task.train):,} training pairs, {len(task.test):,} test pairs, "
      f"dates from {min(train_dates | test_dates)} to {max(train_dates | test_dates)}")
for source, target in task.train[:4]:
    print(f"  train: {source!r:>20} -> {target!r}")
for source, target in task.test[:3]:
    print(f"  test : {source!r:>20} -> {target!r}")

print(f"test dates that also occur in training: {len(train_dates & test_dates)}")

# %% [markdown]
# The model reads and writes **characters**. The vocabulary holds every character any style can produce, after
# three special tokens: `<pad>` fills short sequences up to the length of the longest in a batch, `<bos>`
# ("beginning of sequence") is the decoder's first input, and `<eos>` ("end of sequence") is the token the
# decoder writes when it is done. One vocabulary serves both sides (the ISO dates need only digits and `-`).

# %%
print(vocab)
print("special ids: pad", vocab.pad_id, " bos", vocab.bos_id, " eos", vocab.eos_id)
print("encode('3 Mar')           :", vocab.encode("3 Mar"))
print("encode('2021-03-03', eos) :", vocab.encode("2021-03-03", add_eos=True))
print("decode back               :", repr(vocab.decode(vocab.encode("2021-03-03", add_eos=True))))

# %% [markdown]
# A batch is two padded tensors of token ids: the sources `[batch, S]`, and the targets `[batch, T]`, each
# target ending with `<eos>`. Sources have different lengths, so the shorter ones are filled with `<pad>`
# (id 0) up to the longest of the batch.

# %%
BATCH_SIZE = 128
train_loader = make_loader(task.train, vocab, batch_size=BATCH_SIZE, seed=0)
src, tgt = next(iter(train_loader))
print("src", list(src.shape), " tgt", list(tgt.shape), f" ({len(train_loader)} batches per epoch)")
print("first source ids:", src[0].tolist())
print("            text:", repr(vocab.decode(src[0])))
print("first target ids:", tgt[0].tolist())

# %% [markdown]
# ## 2. The generator: from vectors to log-probabilities
#
# The decoder outputs one vector of size $d_{model}$ per target position. The **generator**, the last layer of
# the model (document 000 §11), turns each vector $h$ into a probability for every token of the vocabulary:
# a linear map to $V$ scores (the *logits*), then a softmax. We keep the logarithm of the probabilities:
#
# $$\log p(v \mid h) = \mathrm{log\_softmax}(h W + b)_v = z_v - \log \sum_{u} e^{z_u}, \qquad z = h W + b.$$
#
# Here is the model we will train: two encoder layers, two decoder layers, $d_{model} = 64$, four heads,
# $d_{ff} = 256$. It is a small version of the paper's base model (which has six and six layers, $d_{model} = 512$).

# %%
config = TransformerConfig(src_vocab=len(vocab), tgt_vocab=len(vocab), d_model=64, n_heads=4, d_ff=256,
                           n_layers=2, dropout=0.0, max_len=64)
torch.manual_seed(0)
model = EncoderDecoder(config)
print(f"{count_parameters(model):,} parameters")
print(model.generator)

batch = prepare_batch(src, tgt, vocab.bos_id, vocab.pad_id)  # section 5 explains the decoder's input
with torch.no_grad():
    log_probs = model(batch.src, batch.decoder_input, batch.src_mask, batch.tgt_mask)  # [batch, T, V]
print("log_probs:", list(log_probs.shape), "= [batch, target positions, vocabulary]")
print(f"probabilities sum to 1 at every position: {torch.allclose(log_probs.exp().sum(-1), torch.ones(1))}")
gold = log_probs.gather(-1, batch.target.unsqueeze(-1)).squeeze(-1)  # [batch, T]: log p(correct token)
print(f"untrained: mean -log p(correct token) = {-gold.mean():.3f};  log V = log {len(vocab)} = {math.log(len(vocab)):.3f}")

# %% [markdown]
# Untrained, the model is no better than a uniform guess over the 63 tokens, whose $-\log p$ would be
# $\log 63$; it is even a little worse, because its random weights make it confidently wrong here and there.
#
# Why log-softmax in one step rather than `log(softmax(z))`? A probability below about $10^{-45}$ is 0 in
# float32, and $\log 0 = -\infty$: one such token in a loss makes it infinite. Computed together, the log never
# sees the tiny number:

# %%
print("float32 holds 1e-45 as", torch.tensor(1e-45).item(), "but 1e-46 as", torch.tensor(1e-46).item())
z = torch.tensor([0.0, -120.0])  # e^-120 is about 1e-52
print("log(softmax(z)):", torch.log(torch.softmax(z, dim=-1)))
print("log_softmax(z) :", torch.log_softmax(z, dim=-1))

# %% [markdown]
# ## 3. Choosing the next token
#
# At inference time nobody gives the decoder the answer. It writes one token at a time: read the tokens written
# so far, take the log-probabilities at the **last** position (the earlier positions predict tokens that are
# already written), choose a token, append it, repeat until `<eos>`. How to choose?
#
# * **Greedy**: the most probable token, `argmax`. Deterministic; right for a task with one correct answer, like ours.
# * **Sampling**: draw the token at random from the distribution. Varied outputs, for stories or dialogue.
#   A **temperature** $\tau$ reshapes the distribution first, $p_v \propto e^{z_v / \tau}$: $\tau < 1$ sharpens
#   it towards the greedy choice, $\tau > 1$ flattens it.
# * **Top-k sampling** (document 004 §12.7.3) draws only among the $k$ most probable tokens, so that the long
#   tail of unlikely tokens, each rare but many together, can never derail the output.
#
# Here are 1,000 draws from a made-up distribution over five tokens (`transformer_lib.decoding.sample_next_token`,
# with a seeded generator so that the counts are the same on every run):

# %%
toy_logits = torch.tensor([[2.0, 1.5, 0.5, -0.5, -1.0]])  # [1, 5]
print("probabilities:", [round(p, 3) for p in torch.softmax(toy_logits, -1)[0].tolist()])
for temperature, top_k in [(1.0, None), (0.5, None), (2.0, None), (1.0, 2)]:
    g = torch.Generator().manual_seed(0)
    draws = torch.cat([sample_next_token(toy_logits, temperature, top_k, generator=g) for _ in range(1000)])
    print(f"temperature {temperature}, top_k {str(top_k):>4}: counts {torch.bincount(draws, minlength=5).tolist()}")

# %% [markdown]
# With $\tau = 0.5$ the first token wins more often, with $\tau = 2$ the rare tokens come up more; with $k = 2$
# tokens 2, 3 and 4 never come up at all.
#
# ### Exercise 1 — `top_k_filter`
# > **Difficulty** ●○○ · **Importance** ●●○ · about 10 minutes
#
# Write `top_k_filter(logits, k)`: keep the `k` largest logits of each row, and set every other entry to
# `float('-inf')`, so that the softmax gives them probability exactly 0.
#
# * `logits`: `[..., vocab]` (any number of leading dimensions); `k`: an integer, `1 <= k < vocab`.
# * returns a new tensor of the same shape and dtype.
#
# Worked example: `top_k_filter(torch.tensor([1.0, 3.0, -2.0, 0.5, 2.0, -1.0]), 2)` is
# `tensor([-inf, 3., -inf, -inf, 2., -inf])`.
#
# <details><summary>Hint 1</summary><code>logits.topk(k, dim=-1)</code> returns the <code>k</code> largest values of each row and their indices.</details>
# <details><summary>Hint 2</summary>Start from <code>torch.full_like(logits, float('-inf'))</code> and put the values back at their indices with <code>.scatter(-1, indices, values)</code>. (A threshold, <code>logits &lt; k-th value</code>, also works when there are no ties.)</details>

# %% nbgrader={"grade": false, "grade_id": "top_k_filter", "locked": false, "schema_version": 3, "solution": true, "task": false}
def top_k_filter(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Keep the k largest logits of each row, set the others to -inf.

    logits: [..., vocab]; 1 <= k < vocab. Returns [..., vocab].
    """
    ### BEGIN SOLUTION
    values, indices = logits.topk(k, dim=-1)  # [..., k]
    filtered = torch.full_like(logits, float("-inf"))  # [..., vocab]
    return filtered.scatter(-1, indices, values)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "top_k_filter_test", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
check_top_k_filter(top_k_filter)
### BEGIN HIDDEN TESTS
check_top_k_filter(top_k_filter, hidden=True)
### END HIDDEN TESTS

# %%
from transformer_lib.decoding import top_k_filter  # the reference: the rest of the chapter runs even if your answer is unfinished

filtered = top_k_filter(toy_logits, 2)
print("top-2 logits       :", filtered)
print("their probabilities:", torch.softmax(filtered, -1))

# %% [markdown]
# ## 4. The loss: cross-entropy, and label smoothing
#
# Training makes the probability of the correct next token large. For a target sequence $y_1, \dots, y_T$ the
# loss is the **cross-entropy**: the mean, over all real (non-padding) target positions of the batch, of
#
# $$-\log p(y_t \mid y_{<t}, x).$$
#
# It is 0 when the model puts probability 1 on every correct token, and $\log V \approx 4.14$ for a uniform guess.
# Written as a distribution, the target at each position is **one-hot**: probability 1 on the correct token, 0
# elsewhere, and the cross-entropy against a target distribution $q$ is $H(q, p) = -\sum_v q_v \log p_v$.
#
# **Label smoothing** (section 5.4 of the paper, $\varepsilon_{ls} = 0.1$) trains towards a softened target: the
# correct token gets $1 - \varepsilon$, and the other tokens share $\varepsilon$. The model is then never pushed
# to be infinitely sure (with a one-hot target, the loss keeps falling as the correct logit grows without bound).
# The paper notes that this hurts perplexity, since the model learns to be less sure, but improves accuracy
# and BLEU.
#
# Which tokens share $\varepsilon$? Not `<pad>`: it is never a correct next token. And not the correct token,
# which has its own share. So each of the other $V - 2$ tokens gets $\varepsilon / (V - 2)$. A position whose
# target *is* `<pad>` is not a real position at all: its whole row is zero, and it adds nothing to the loss.
# (This is the Annotated Transformer's version. PyTorch's `cross_entropy(..., label_smoothing=ε)` is slightly
# different: it spreads $\varepsilon / V$ over *all* $V$ tokens, `<pad>` and the correct one included. We
# compare the two below.)
#
# A picture says it faster. A vocabulary of 8 tokens, `<pad>` = 0, and a target of three tokens and two pads:

# %%
def show_targets(ax, q, target, title):
    ax.imshow(q, cmap="Blues", vmin=0, vmax=1)
    for i in range(q.shape[0]):
        for j in range(q.shape[1]):
            ax.text(j, i, f"{q[i, j]:.2f}".rstrip("0").rstrip(".") if q[i, j] else "0", ha="center", va="center",
                    fontsize=7, color="white" if q[i, j] > 0.5 else "black")
    ax.set_xticks(range(q.shape[1]), ["pad"] + [str(v) for v in range(1, q.shape[1])], fontsize=8)
    ax.set_yticks(range(len(target)), [f"target {t}" if t else "target pad" for t in target.tolist()], fontsize=8)
    ax.set_xlabel("token of the vocabulary", fontsize=8)
    ax.set_title(title, fontsize=9)


toy_target = torch.tensor([3, 5, 2, 0, 0])
one_hot = F.one_hot(toy_target, 8).float()
one_hot[toy_target == 0] = 0.0
smoothed = torch.full((5, 8), 0.2 / 6)
smoothed.scatter_(1, toy_target[:, None], 0.8)
smoothed[:, 0] = 0.0
smoothed[toy_target == 0] = 0.0

fig, axes = plt.subplots(1, 2, figsize=(8, 2.8))
show_targets(axes[0], one_hot, toy_target, "one-hot target")
show_targets(axes[1], smoothed, toy_target, "smoothed target, eps = 0.2")
fig.tight_layout()
plt.show()

# %% [markdown]
# ### Exercise 2 — `label_smoothed_targets`
# > **Difficulty** ●●○ · **Importance** ●●● · about 15 minutes
#
# Write `label_smoothed_targets(target, vocab_size, smoothing, pad_id)`, the right-hand picture for any input.
#
# * `target`: integer token ids, any shape `[...]`; `smoothing` $= \varepsilon \in [0, 1)$; `vocab_size` $\ge 3$.
# * returns `q`: float32, `[..., vocab_size]`, with, for a row whose target is a real token: `1 - smoothing` at
#   the target, `0` at `pad_id`, `smoothing / (vocab_size - 2)` everywhere else; and all zeros for a row whose
#   target is `pad_id`.
#
# Worked example: `label_smoothed_targets(torch.tensor([3, 0]), 5, 0.3, 0)` is
# `[[0, 0.1, 0.1, 0.7, 0.1], [0, 0, 0, 0, 0]]`.
#
# <details><summary>Hint 1</summary>Start from a tensor full of <code>smoothing / (vocab_size - 2)</code> of shape <code>(*target.shape, vocab_size)</code>, then fix three things: the target column, the <code>pad_id</code> column, and the padded rows.</details>
# <details><summary>Hint 2</summary><code>q.scatter_(-1, target.unsqueeze(-1), 1 - smoothing)</code>; then <code>q[..., pad_id] = 0</code>; then <code>q[target == pad_id] = 0</code>.</details>

# %% nbgrader={"grade": false, "grade_id": "label_smoothed_targets", "locked": false, "schema_version": 3, "solution": true, "task": false}
def label_smoothed_targets(target: torch.Tensor, vocab_size: int, smoothing: float, pad_id: int) -> torch.Tensor:
    """The smoothed target distribution of every position.

    target: [...] integer ids. Returns q: [..., vocab_size], float32.
    """
    ### BEGIN SOLUTION
    q = torch.full((*target.shape, vocab_size), smoothing / (vocab_size - 2))  # [..., V]
    q.scatter_(-1, target.unsqueeze(-1), 1.0 - smoothing)  # the correct token
    q[..., pad_id] = 0.0  # <pad> is never a correct token
    q[target == pad_id] = 0.0  # padded positions are not trained at all
    return q
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "label_smoothed_targets_test", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
check_label_smoothed_targets(label_smoothed_targets)
### BEGIN HIDDEN TESTS
check_label_smoothed_targets(label_smoothed_targets, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# The library's `LabelSmoothingLoss(vocab_size, padding_idx, smoothing)` uses these targets: it computes the
# cross-entropy $H(q, p) = -\sum_v q_v \log p_v$ at every position and averages over the real (non-`<pad>`) target
# positions. The Annotated Transformer reports the KL divergence $\mathrm{KL}(q \,\|\, p) = H(q, p) - H(q)$
# instead. The two differ by $H(q)$, the entropy of the target, a constant, so they have the same gradients and
# train the same model.
#
# Let us hold it against PyTorch on the batch above. Without smoothing, it is exactly PyTorch's cross-entropy
# that ignores `<pad>`. With smoothing, the two spread $\varepsilon$ differently, so their values differ:

# %%
from transformer_lib.training import label_smoothed_targets  # the reference: the rest of the chapter runs even if your answer is unfinished

V = len(vocab)
flat_log_probs, flat_target = log_probs.reshape(-1, V), batch.target.reshape(-1)
ours_0 = LabelSmoothingLoss(V, vocab.pad_id, smoothing=0.0)(log_probs, batch.target)
torch_0 = F.cross_entropy(flat_log_probs, flat_target, ignore_index=vocab.pad_id)
print(f"eps = 0  : ours {ours_0:.6f}   torch cross_entropy(ignore_index=pad) {torch_0:.6f}")
ours = LabelSmoothingLoss(V, vocab.pad_id, smoothing=0.1)(log_probs, batch.target)
torch_ls = F.cross_entropy(flat_log_probs, flat_target, ignore_index=vocab.pad_id, label_smoothing=0.1)
print(f"eps = 0.1: ours {ours:.6f}   torch cross_entropy(label_smoothing=0.1)   {torch_ls:.6f}")

# %% [markdown]
# (`tests/test_training.py` shows when they agree exactly: when the model gives `<pad>` no probability, ours
# with $\varepsilon$ equals PyTorch's over the other $V - 1$ classes with $\varepsilon' = \varepsilon (V-1)/(V-2)$.)
#
# **Predict** before running the next cell: with $\varepsilon = 0.1$, can the loss of a perfect model reach 0?
# If not, what is the smallest value it can take?

# %%
criterion = LabelSmoothingLoss(V, vocab.pad_id, smoothing=0.1)
q_row = label_smoothed_targets(torch.tensor([5]), V, 0.1, vocab.pad_id)[0]  # one smoothed target row
entropy = -(q_row[q_row > 0] * q_row[q_row > 0].log()).sum()
print(f"each of the other {V - 2} tokens gets 0.1 / {V - 2} = {0.1 / (V - 2):.5f}")
print(f"smallest possible loss = H(q) = {entropy:.4f}   (criterion.min_loss() = {criterion.min_loss():.4f})")

# %% [markdown]
# No: the loss is smallest when $p = q$, where it equals the entropy of $q$, here about 0.74. Its minimum is at
# a model that gives the correct token probability 0.9, not 1. Keep this floor in mind when reading the
# training curve in section 7: a loss of 0.74 is perfect.
#
# ## 5. Teacher forcing: the decoder reads the answer, shifted right
#
# Chapter 06 introduced **teacher forcing**: during training, the decoder's input is the *correct* target,
# shifted one position to the right behind `<bos>`, and every position is asked for the next token. All positions
# are trained in one pass, and the causal mask keeps each position from seeing the token it must predict.
#
# In the library the target `tgt` is `[y_1, ..., y_T, <eos>]` (then padding), without `<bos>`. The decoder's
# input is `[<bos>, y_1, ..., y_T]`: the same length, with `<bos>` in front and the last token dropped.
# Position $t$ reads $y_{t-1}$ and must output $y_t$; the last position reads $y_T$ and must output `<eos>`.
#
# ### Exercise 3 — `teacher_forcing_inputs`
# > **Difficulty** ●○○ · **Importance** ●●● · about 10 minutes
#
# Write `teacher_forcing_inputs(tgt, bos_id)` returning the pair `(decoder_input, target)`.
#
# * `tgt`: `[batch, T]` integer ids, each row `[y_1, ..., <eos>, <pad>, ...]`.
# * returns `decoder_input`: `[batch, T]`, `bos_id` followed by `tgt` without its last column; and `target`:
#   `tgt` itself.
#
# Worked example: `teacher_forcing_inputs(torch.tensor([[7, 8, 9, 2], [6, 2, 0, 0]]), 1)` returns
# `(tensor([[1, 7, 8, 9], [1, 6, 2, 0]]), tensor([[7, 8, 9, 2], [6, 2, 0, 0]]))`.
#
# <details><summary>Hint 1</summary>Make a column of <code>bos_id</code> of shape <code>[batch, 1]</code>, e.g. <code>torch.full_like(tgt[:, :1], bos_id)</code>, and glue it in front with <code>torch.cat(..., dim=1)</code>.</details>
# <details><summary>Hint 2</summary><code>decoder_input = torch.cat([bos_column, tgt[:, :-1]], dim=1)</code>; return <code>decoder_input, tgt</code>.</details>

# %% nbgrader={"grade": false, "grade_id": "teacher_forcing_inputs", "locked": false, "schema_version": 3, "solution": true, "task": false}
def teacher_forcing_inputs(tgt: torch.Tensor, bos_id: int):
    """The decoder's input and the target of teacher forcing.

    tgt: [batch, T] integer ids. Returns (decoder_input [batch, T], target [batch, T]).
    """
    ### BEGIN SOLUTION
    bos_column = torch.full_like(tgt[:, :1], bos_id)  # [batch, 1]
    decoder_input = torch.cat([bos_column, tgt[:, :-1]], dim=1)  # [batch, T]: shifted right
    return decoder_input, tgt
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "teacher_forcing_inputs_test", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
check_teacher_forcing_inputs(teacher_forcing_inputs)
### BEGIN HIDDEN TESTS
check_teacher_forcing_inputs(teacher_forcing_inputs, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# On the first date of the batch, position by position:

# %%
from transformer_lib.training import make_teacher_forcing_batch as teacher_forcing_inputs  # the reference

decoder_input, target = teacher_forcing_inputs(tgt[:1], vocab.bos_id)
print(f"source: {vocab.decode(src[0])!r}")
print("position       :", " ".join(f"{t:>5}" for t in range(tgt.shape[1])))
print("decoder reads  :", " ".join(f"{vocab.itos[i]:>5}" for i in decoder_input[0].tolist()))
print("must predict   :", " ".join(f"{vocab.itos[i]:>5}" for i in target[0].tolist()))

# %% [markdown]
# `prepare_batch(src, tgt, bos_id, pad_id)` builds this and the two masks of chapter 06 for a whole batch: the
# source padding mask `[batch, 1, 1, S]` for the encoder and for cross-attention, and the causal-and-padding mask
# `[batch, 1, T, T]` for the decoder's self-attention.

# %%
print("src_mask", list(batch.src_mask.shape), " tgt_mask", list(batch.tgt_mask.shape))
print("decoder input", list(batch.decoder_input.shape), " target", list(batch.target.shape),
      f" real target tokens: {batch.n_tokens}")

# %% [markdown]
# ## 6. The learning rate: warm up, then decay
#
# The paper trains with Adam ($\beta_1 = 0.9$, $\beta_2 = 0.98$, $\epsilon = 10^{-9}$) and a learning rate that
# changes at every step (section 5.3, eq. 3):
#
# $$\mathrm{lrate} = d_{model}^{-0.5} \cdot \min\left(\mathrm{step}^{-0.5},\ \mathrm{step} \cdot \mathrm{warmup}^{-1.5}\right),$$
#
# with steps counted from 1 and $\mathrm{warmup} = 4000$. For the first $\mathrm{warmup}$ steps the second term is
# the smaller one: the rate grows **linearly** from almost 0. Then the first term takes over, and the rate
# **decays** as $1/\sqrt{\mathrm{step}}$. The two meet at $\mathrm{step} = \mathrm{warmup}$, the peak. Why start
# small? At the start the weights are random and Adam's running estimates of the gradients' size rest on only a
# few steps; large steps then can throw the model into a bad region it never leaves. A Transformer with its
# LayerNorm after the residual sum (the paper's post-norm, chapter 05) is known to need this warm-up most.
#
# ### Exercise 4 — `noam_learning_rate`
# > **Difficulty** ●○○ · **Importance** ●●○ · about 5 minutes
#
# Write `noam_learning_rate(step, d_model, warmup)`, eq. 3 as a Python float. (The schedule is often called the
# *Noam* schedule, after Noam Shazeer, one of the paper's authors.)
#
# * `step` $\ge 1$, `d_model` and `warmup`: positive integers. Returns a float.
#
# Worked example: `noam_learning_rate(4000, 512, 4000)` is $\frac{1}{\sqrt{512 \cdot 4000}} \approx 6.99 \times 10^{-4}$,
# the peak of the paper's schedule.
#
# <details><summary>Hint 1</summary>Python's <code>**</code> takes negative and fractional powers: <code>step ** -0.5</code>.</details>
# <details><summary>Hint 2</summary><code>d_model ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)</code></details>

# %% nbgrader={"grade": false, "grade_id": "noam_learning_rate", "locked": false, "schema_version": 3, "solution": true, "task": false}
def noam_learning_rate(step: int, d_model: int, warmup: int) -> float:
    """The learning rate of eq. 3 at `step` (counted from 1)."""
    ### BEGIN SOLUTION
    return d_model ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "noam_learning_rate_test", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
check_noam_learning_rate(noam_learning_rate)
### BEGIN HIDDEN TESTS
check_noam_learning_rate(noam_learning_rate, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# The paper trains for 100,000 steps; we have a few hundred. So our run uses a shorter warm-up (100 steps),
# a factor 0.5 in front of eq. 3 (the Annotated Transformer has the same knob), and one change the paper does
# not make: over the last 150 steps the rate is scaled down linearly to 0, a **cool-down**. After a few hundred
# steps the $1/\sqrt{\mathrm{step}}$ decay has barely started, and with the rate still high the weights keep
# jumping between nearly-right solutions, so the accuracy after the last step would be partly luck. The
# cool-down lets them settle. (The paper gets a similar effect by averaging its last checkpoints.)

# %%
from transformer_lib.training import noam_lambda, noam_rate  # the reference

TOTAL_STEPS, WARMUP, FACTOR, COOLDOWN = 400, 100, 0.5, 150
paper_steps = range(1, 100_001)
ours_schedule = noam_lambda(config.d_model, WARMUP, FACTOR, total_steps=TOTAL_STEPS, cooldown=COOLDOWN)
our_steps = range(1, TOTAL_STEPS + 1)

fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(8, 3))
ax1.plot(paper_steps, [noam_rate(s, 512, 4000) for s in paper_steps])
ax1.axvline(4000, color="grey", linestyle=":")
ax1.set_title("the paper: d_model 512, warmup 4000", fontsize=9)
ax1.set_xlabel("step")
ax1.set_ylabel("learning rate")
ax2.plot(our_steps, [ours_schedule(s - 1) for s in our_steps], label="ours, with cool-down")
ax2.plot(our_steps, [FACTOR * noam_rate(s, config.d_model, WARMUP) for s in our_steps], "--", label="eq. 3 x 0.5")
ax2.axvline(WARMUP, color="grey", linestyle=":")
ax2.set_title("this chapter: d_model 64, warmup 100", fontsize=9)
ax2.set_xlabel("step")
ax2.legend(fontsize=8)
fig.tight_layout()
plt.show()
print(f"paper's peak: {noam_rate(4000, 512, 4000):.2e} at step 4000;  ours: {ours_schedule(WARMUP - 1):.2e} at step {WARMUP}")

# %% [markdown]
# ## 7. Training
#
# `transformer_lib.training.train(model, loader, optimizer, loss_fn, steps=..., scheduler=...)` is one loop
# that every later chapter reuses. Each step:
#
# 1. takes a batch `(src, tgt)` and builds the decoder's input and the masks (`prepare_batch`, section 5);
# 2. runs the model on the whole batch, all target positions at once: log-probabilities `[batch, T, V]`;
# 3. computes the loss (section 4), back-propagates, clips the gradient's norm to 1 (a cheap guard against a
#    rare huge step), lets Adam update the weights and the scheduler set the next learning rate (section 6);
# 4. records the loss, and shows a progress bar.
#
# It returns the list of losses, one per step. We train for 150 steps, keep a copy of this **half-trained**
# model for section 9, and continue to 400.

# %%
torch.manual_seed(0)
model = EncoderDecoder(config)
optimizer = torch.optim.Adam(model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9)  # lr=1: the scheduler sets it
scheduler = noam_scheduler(optimizer, config.d_model, WARMUP, FACTOR, total_steps=TOTAL_STEPS, cooldown=COOLDOWN)
criterion = LabelSmoothingLoss(V, vocab.pad_id, smoothing=0.1)
SNAPSHOT = 150

# %%
# NBVAL_IGNORE_OUTPUT
start = time.perf_counter()
history = train(model, train_loader, optimizer, criterion, steps=SNAPSHOT, scheduler=scheduler,
                bos_id=vocab.bos_id, pad_id=vocab.pad_id, max_grad_norm=1.0, desc="steps 1-150")
half_trained = copy.deepcopy(model).eval()  # a frozen copy; training goes on with `model`
print(f"{len(history)} steps in {time.perf_counter() - start:.1f} s")

# %%
# NBVAL_IGNORE_OUTPUT
start = time.perf_counter()
history += train(model, train_loader, optimizer, criterion, steps=TOTAL_STEPS - SNAPSHOT, scheduler=scheduler,
                 bos_id=vocab.bos_id, pad_id=vocab.pad_id, max_grad_norm=1.0, desc="steps 151-400")
model.eval()
print(f"{TOTAL_STEPS - SNAPSHOT} more steps in {time.perf_counter() - start:.1f} s")

# %%
print(f"loss: first step {history[0]:.3f}, step {SNAPSHOT} {history[SNAPSHOT - 1]:.3f}, "
      f"last step {history[-1]:.3f};  floor H(q) = {criterion.min_loss():.3f}")
print(f"examples seen: {len(history) * BATCH_SIZE:,} = {len(history) * BATCH_SIZE / len(task.train):.1f} epochs")

fig, ax = plt.subplots(figsize=(7, 3))
ax.plot(range(1, len(history) + 1), history, linewidth=1, label="training loss")
ax.axhline(criterion.min_loss(), color="black", linestyle="--", linewidth=1, label="floor: H(q)")
ax.axvline(SNAPSHOT, color="grey", linestyle=":", label="half-trained copy")
ax.set_xlabel("step")
ax.set_ylabel("loss")
ax.set_ylim(0, 5)
ax.legend(fontsize=8)
fig.tight_layout()
plt.show()

# %% [markdown]
# The loss starts above $\log 63$ (section 2), falls fast during the first hundred steps, while the learning rate
# warms up, and flattens just above the floor $H(q)$ of section 4.
#
# ### The same loop on several processes
#
# The training loop is also ready for **data parallelism**, the way large models are trained. Several processes
# each hold a copy of the model and read a different share of every batch; after each backward pass they average
# their gradients, so every copy takes exactly the same step and the copies never drift apart. In PyTorch:
# launch the processes with `torchrun`; in each, join the group (`torch.distributed.init_process_group`,
# with the `gloo` backend on CPUs), wrap the model in `DistributedDataParallel` (which averages the gradients
# during `loss.backward()`), and give the loader a `DistributedSampler` (which hands each process its share of
# every epoch). The loop itself does not change. From a terminal, two processes on this machine:
#
# ```bash
# torchrun --nproc_per_node=2 -m transformer_lib.training --task dates --steps 400 --out runs/dates
# ```
#
# Each process saves its final weights; `tests/test_training.py` runs it and checks that the two processes end
# with bit-identical weights.
#
# ## 8. Exact match on dates the model has never seen
#
# Now the real test. For each of the 1,000 held-out sources, `greedy_decode` (section 3) writes an output,
# starting from `<bos>` and stopping at `<eos>`. An output counts only if **every** character is right.

# %%
MAX_NEW_TOKENS = 12  # 10 characters and <eos>, plus one to spare
test_src = vocab.encode_batch([source for source, _ in task.test])  # [1000, S]
test_src_mask = padding_mask(test_src, vocab.pad_id)  # [1000, 1, 1, S]
test_gold = [target for _, target in task.test]


def exact_match(outputs: torch.Tensor) -> float:
    """Fraction of decoder outputs [batch, 1 + steps] (starting with <bos>) equal to the gold ISO date."""
    predictions = vocab.decode_batch(outputs)
    return sum(p == g for p, g in zip(predictions, test_gold)) / len(test_gold)


greedy_out = greedy_decode(model, test_src, test_src_mask, MAX_NEW_TOKENS, vocab.bos_id, vocab.eos_id)
accuracy = exact_match(greedy_out)
print(f"held-out exact match (greedy): {accuracy:.1%} of {len(test_gold)} dates")

predictions = vocab.decode_batch(greedy_out)
for (source, gold), prediction in list(zip(task.test, predictions))[:6]:
    print(f"  {source!r:>20} -> {prediction}  {'ok' if prediction == gold else 'WRONG, expected ' + gold}")
wrong = [(s, g, p) for (s, g), p in zip(task.test, predictions) if p != g]
print(f"{len(wrong)} wrong:", wrong[:5])

# %% [markdown]
# The model writes the held-out dates in ISO form with the exact-match accuracy printed above, after a few
# hundred steps on one CPU thread. Try your own: write a date in one of the twelve styles, in the next cell.

# %%
def to_iso(text: str) -> str:
    src = vocab.encode_batch([text])
    return vocab.decode(greedy_decode(model, src, padding_mask(src, vocab.pad_id), MAX_NEW_TOKENS,
                                      vocab.bos_id, vocab.eos_id)[0])


for text in ["14 July 1989", "Dec 25 '49", "2060年1月1日", "Sat, 29 Feb 2020"]:
    print(f"{text!r:>20} -> {to_iso(text)}")

# %% [markdown]
# ## 9. Teacher forcing vs free running
#
# Training always gave the decoder the **correct** previous characters. At inference it reads **its own** previous
# outputs, which may be wrong, a situation it never met in training. This mismatch is called **exposure bias**.
# We can measure it on the half-trained copy from step 150, which still makes mistakes: for every position,
# the accuracy of the next character when the decoder reads the gold prefix (teacher forcing) and when it reads
# its own greedy outputs (free running).
#
# **Predict** first: which will be more accurate, and at which positions will the gap be largest?

# %%
test_tgt = vocab.encode_batch(test_gold, add_eos=True)  # [1000, 11]: 10 characters and <eos>
T = test_tgt.shape[1]


@torch.no_grad()
def per_position_accuracy(m):
    """Accuracy of each target position: with the gold prefix, and with the model's own prefix."""
    b = prepare_batch(test_src, test_tgt, vocab.bos_id, vocab.pad_id)
    forced = m(b.src, b.decoder_input, b.src_mask, b.tgt_mask).argmax(-1)  # [1000, T]
    free = greedy_decode(m, test_src, test_src_mask, MAX_NEW_TOKENS, vocab.bos_id, vocab.eos_id)[:, 1:]
    free = F.pad(free, (0, max(0, T - free.shape[1])), value=vocab.eos_id)[:, :T]  # [1000, T]
    return forced, free, (forced == test_tgt).float().mean(0), (free == test_tgt).float().mean(0)


forced, free, forced_acc, free_acc = per_position_accuracy(half_trained)
print("position               :", " ".join(f"{t:>5}" for t in range(T)))
print("field                  :", " ".join(f"{f:>5}" for f in ["Y", "Y", "Y", "Y", "-", "M", "M", "-", "D", "D", "eos"]))
print("teacher forcing        :", " ".join(f"{a:5.3f}" for a in forced_acc.tolist()))
print("free running           :", " ".join(f"{a:5.3f}" for a in free_acc.tolist()))
print(f"whole date right: teacher forcing {(forced == test_tgt).all(1).float().mean():.3f}, "
      f"free running {(free == test_tgt).all(1).float().mean():.3f}")

# %% [markdown]
# Two things to read in these numbers. First, the *whole-date* accuracies are equal, and must be: if every
# character is right under teacher forcing, greedy decoding reads exactly the gold prefix at every step and
# writes the same characters. Second, position by position, free running is never more accurate, and the gap
# opens *after* the positions where the model hesitates (the third digit of the year, the first of the day): a
# wrong character becomes part of the input for everything that follows. The next cell counts the dates that
# get more wrong characters free running than teacher forced, and shows the one where free running adds the most:

# %%
extra_errors = (free != test_tgt).sum(1) - (forced != test_tgt).sum(1)  # [1000]
print(f"{int((extra_errors > 0).sum())} of {len(test_gold)} dates have more wrong characters free running than "
      f"teacher forced, {int((extra_errors < 0).sum())} fewer")
i = int(extra_errors.argmax())  # the date where free running adds the most errors
print(f"source          : {task.test[i][0]!r}")
print(f"gold            : {vocab.decode(test_tgt[i])}")
print(f"teacher forcing : {''.join(vocab.itos[t] for t in forced[i].tolist())}   (each character from the gold prefix)")
print(f"free running    : {''.join(vocab.itos[t] for t in free[i].tolist())}   (each character from its own prefix)")

fig, ax = plt.subplots(figsize=(7, 3))
ax.plot(range(T), forced_acc, "o-", label="teacher forcing (gold prefix)")
ax.plot(range(T), free_acc, "s-", label="free running (own prefix)")
ax.set_xticks(range(T), ["Y", "Y", "Y", "Y", "-", "M", "M", "-", "D", "D", "eos"])
ax.set_xlabel("target position: year, month, day")
ax.set_ylabel("accuracy, half-trained model")
ax.legend(fontsize=8)
fig.tight_layout()
plt.show()

# %% [markdown]
# In the example, the first wrong character sends free running down another path: what it writes next fits its
# own mistake rather than the source. In this task the source pins down every character, so the decoder can often
# recover after a slip by looking at the source again; in open-ended generation (chapter 10) a slip changes what the text is about, and the
# damage compounds. The fully trained model barely meets the problem:

# %%
_, _, forced_acc_final, free_acc_final = per_position_accuracy(model)
print(f"trained model, lowest per-position accuracy: teacher forcing {forced_acc_final.min():.3f}, "
      f"free running {free_acc_final.min():.3f}")

# %% [markdown]
# ## 10. Where the decoder looks: cross-attention
#
# Each decoder layer's cross-attention (chapter 06) lets every output position look at the source characters. A
# trained model's weights show an **alignment**: which characters of the source each output character comes
# from. `MultiHeadAttention` keeps its weights in `last_weights` when it is called with `need_weights=True`;
# the decoder layer does not pass that flag, so we add it with a forward pre-hook, for one run.

# %%
@contextmanager
def keep_attention_weights(attention):
    """Make `attention` (a MultiHeadAttention) run with need_weights=True inside the `with` block."""
    hook = attention.register_forward_pre_hook(lambda module, args, kwargs: (args, {**kwargs, "need_weights": True}),
                                               with_kwargs=True)
    try:
        yield attention
    finally:
        hook.remove()


held_out_day = sorted(task.held_out)[123]
source_text = format_date(held_out_day, "Wed, 3 Mar 2021")
one_src = vocab.encode_batch([source_text])  # [1, S]
one_mask = padding_mask(one_src, vocab.pad_id)
output = greedy_decode(model, one_src, one_mask, MAX_NEW_TOKENS, vocab.bos_id, vocab.eos_id)  # [1, 1 + steps]
cross = model.decoder.layers[-1].cross_attn
with keep_attention_weights(cross), torch.no_grad():
    # Teacher forcing on the model's own output: one pass gives the weights of every output position.
    prefix = output[:, :-1]  # <bos> + characters (the final <eos> is never an input)
    model.decode(model.encode(one_src, one_mask), one_mask, prefix, causal_mask(prefix.shape[1]))
weights = cross.last_weights[0].mean(0)  # [T, S], averaged over the heads
print(f"{source_text!r} -> {vocab.decode(output[0])!r}   (a held-out date); weights {list(cross.last_weights.shape)}")

out_chars = [vocab.itos[t] for t in output[0, 1:].tolist()]  # what each position wrote
fig, ax = plt.subplots(figsize=(7, 4))
ax.imshow(weights, cmap="Blues", vmin=0)
ax.set_xticks(range(len(source_text)), [c if c != " " else "_" for c in source_text])
ax.set_yticks(range(len(out_chars)), out_chars)
ax.set_xlabel("source character (key)")
ax.set_ylabel("output character (query)")
ax.set_title("cross-attention, last decoder layer, mean over heads", fontsize=9)
fig.tight_layout()
plt.show()
for t, ch in enumerate(out_chars):
    j = int(weights[t].argmax())
    print(f"writes {ch!r:>7}: largest weight {weights[t, j]:.2f}, on {source_text[j]!r} (source position {j})")
weekday = slice(0, source_text.index(" "))  # "Thu,"
print(f"largest weight any output character gives a character of the weekday {source_text[weekday]!r}: "
      f"{weights[:, weekday].max():.2f}")

# %% [markdown]
# Read the rows. Each digit that depends on the source looks at the characters it comes from, with a large
# weight: the year's digits at the year, the day's at the day, and the month's second digit at the month's name.
# The rows whose character is the same for every date, the two dashes and `<eos>`, have nothing to look up:
# their weights are spread thinly over the whole source. (So is the month's leading `0`; this layer leaves it
# to the layer below.) The weekday, which the output does not need, is never singled out: it gets only its part
# of those thinly spread rows. Nobody told the model where each field is: it learned the alignment from the
# pairs alone, the alignment document 000 (§3) describes for translation (*green* → 绿).
#
# ## 11. Greedy vs beam search
#
# Greedy decoding takes the single best character at every step. But the most probable *sequence* need not start
# with the most probable first character. **Beam search** (document 004 §12.7.3) keeps the `beam_size` best
# partial outputs at every step, extends each by every possible token, and keeps the best `beam_size` of the
# extensions, ranked by the sum of their log-probabilities, divided by a length penalty (Wu et al., 2016) so
# that longer outputs are not punished for having more terms. Greedy search is beam search with `beam_size=1`.
#
# On our two models:

# %%
outputs = {}
for name, m in [("half-trained", half_trained), ("trained", model)]:
    g_out = greedy_decode(m, test_src, test_src_mask, MAX_NEW_TOKENS, vocab.bos_id, vocab.eos_id)
    b_out = beam_search(m, test_src, test_src_mask, MAX_NEW_TOKENS, vocab.bos_id, vocab.eos_id, beam_size=4)
    outputs[name] = g_out, b_out
    print(f"{name:>12}: greedy {exact_match(g_out):.1%}, beam search (4 beams) {exact_match(b_out):.1%}")

greedy_half, beam_out = outputs["half-trained"]
greedy_text, beam_text = vocab.decode_batch(greedy_half), vocab.decode_batch(beam_out)
differ = [i for i in range(len(test_gold)) if greedy_text[i] != beam_text[i]]
print(f"half-trained: the two disagree on {len(differ)} of {len(test_gold)} dates")
i = next(i for i in differ if beam_text[i] == test_gold[i])
g_ids = F.pad(greedy_half[i : i + 1], (0, max(0, beam_out.shape[1] - greedy_half.shape[1])), value=vocab.eos_id)
b_ids = F.pad(beam_out[i : i + 1], (0, max(0, greedy_half.shape[1] - beam_out.shape[1])), value=vocab.eos_id)
lp = sequence_log_prob(half_trained, test_src[[i, i]], test_src_mask[[i, i]], torch.cat([g_ids, b_ids]), vocab.eos_id)
print(f"  source {task.test[i][0]!r}, gold {test_gold[i]}")
print(f"  greedy {greedy_text[i]}  log P = {lp[0]:.3f}")
print(f"  beam   {beam_text[i]}  log P = {lp[1]:.3f}")
width = max(greedy_half.shape[1], beam_out.shape[1])
both = torch.cat([F.pad(o[differ], (0, width - o.shape[1]), value=vocab.eos_id) for o in (greedy_half, beam_out)])
lp_all = sequence_log_prob(half_trained, test_src[differ].repeat(2, 1), test_src_mask[differ].repeat(2, 1, 1, 1),
                           both, vocab.eos_id).view(2, -1)  # [greedy / beam, dates that differ]
print(f"beam's output has the larger log P on {int((lp_all[1] > lp_all[0]).sum())} of the {len(differ)} dates "
      f"where the two differ")

# %% [markdown]
# Beam search finds outputs that the model itself rates as more probable (a larger $\log P$, counted below over
# all the dates where the two disagree), and on the half-trained model that makes it a little more accurate.
# On the trained model there is nothing left to fix: when the model is confident, greedy and beam search agree. Beam search costs about
# `beam_size` times the work of greedy decoding, so it pays off where the model hesitates: translation and
# summarisation use it; chat models, which want variety, sample instead.
#
# ## 12. The encoder runs once
#
# Look at the generation loop again: the source never changes, so the encoder's output, the **memory**, is the
# same at every step. Document 000 (§12) stresses it: encode once, then run only the decoder, step after step.
# A naive loop that calls the full model on `(src, prefix)` at every step would re-encode the source each time.
# Let us count the encoder's and the decoder's calls with forward hooks, for one batch of 100 held-out dates.

# %%
calls = {"encoder": 0, "decoder": 0}
hooks = [model.encoder.register_forward_hook(lambda *_: calls.__setitem__("encoder", calls["encoder"] + 1)),
         model.decoder.register_forward_hook(lambda *_: calls.__setitem__("decoder", calls["decoder"] + 1))]


@torch.no_grad()
def naive_greedy(m, src, src_mask, max_new_tokens):
    """Greedy decoding that calls the full model at every step (re-encoding the source each time)."""
    tokens = torch.full((src.shape[0], 1), vocab.bos_id)  # [batch, 1]
    for _ in range(max_new_tokens):
        log_probs = m(src, tokens, src_mask, causal_mask(tokens.shape[1]))  # [batch, t, V]
        tokens = torch.cat([tokens, log_probs[:, -1].argmax(-1, keepdim=True)], dim=1)
        if (tokens == vocab.eos_id).any(1).all():
            break
    return tokens


few_src, few_mask = test_src[:100], test_src_mask[:100]
naive = naive_greedy(model, few_src, few_mask, MAX_NEW_TOKENS)
print(f"naive loop         : {calls}")
calls.update(encoder=0, decoder=0)
library = greedy_decode(model, few_src, few_mask, MAX_NEW_TOKENS, vocab.bos_id, vocab.eos_id)
print(f"greedy_decode      : {calls}")
for h in hooks:
    h.remove()
print("same outputs:", vocab.decode_batch(naive) == vocab.decode_batch(library))

# %% [markdown]
# Eleven encoder runs become one, with the same output. (A step of the naive loop also wastes time on the
# decoder, which is the next section's subject.)
#
# ## 13. The KV cache
#
# The decoder has the same problem on a smaller scale. At step $t$ the naive loop feeds the whole prefix of $t$
# tokens through the decoder, although the first $t - 1$ positions give exactly the same keys and values as at
# step $t - 1$: the causal mask keeps them from seeing anything new. A **KV cache** keeps, in every decoder layer,
# the keys and values already computed; each step feeds only the newest token and appends its key and value.
# Cross-attention's keys and values come from the memory, so they are computed at the first step and simply
# reused (chapter 03's `KVCache`, with `static=True`). `greedy_decode(..., use_cache=True)` is the default.
#
# How many token positions go through the decoder to write an 11-token output?

# %%
steps = T  # 10 characters and <eos>
print(f"without a cache: 1 + 2 + ... + {steps} = {sum(range(1, steps + 1))} positions;  with a cache: {steps}")
with_cache = greedy_decode(model, test_src, test_src_mask, MAX_NEW_TOKENS, vocab.bos_id, vocab.eos_id, use_cache=True)
without = greedy_decode(model, test_src, test_src_mask, MAX_NEW_TOKENS, vocab.bos_id, vocab.eos_id, use_cache=False)
print("same tokens with and without the cache:", torch.equal(with_cache, without))

# %% [markdown]
# Measured on this model and 500 test dates (timings vary from run to run and machine to machine):

# %%
# NBVAL_IGNORE_OUTPUT
def best_time(fn, repeats=3):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


half_src, half_mask = test_src[:500], test_src_mask[:500]
t_naive = best_time(lambda: naive_greedy(model, half_src, half_mask, MAX_NEW_TOKENS))
t_no_cache = best_time(lambda: greedy_decode(model, half_src, half_mask, MAX_NEW_TOKENS, vocab.bos_id,
                                             vocab.eos_id, use_cache=False))
t_cache = best_time(lambda: greedy_decode(model, half_src, half_mask, MAX_NEW_TOKENS, vocab.bos_id,
                                          vocab.eos_id, use_cache=True))
print(f"re-encode every step        : {t_naive * 1000:6.1f} ms")
print(f"encode once, no KV cache    : {t_no_cache * 1000:6.1f} ms")
print(f"encode once, KV cache       : {t_cache * 1000:6.1f} ms   ({t_no_cache / t_cache:.1f}x faster than without the cache)")

# %% [markdown]
# The saving grows with the length of the output: the work without a cache grows as the square of the number of
# tokens, with a cache linearly. For our 11-character dates it is modest; for a chat model writing a thousand
# tokens it is the difference between usable and not.
#
# ## Summary
#
# * The **generator** maps each decoder vector to log-probabilities over the vocabulary: a linear layer, then
#   log-softmax (computed in one step, so that tiny probabilities do not become $\log 0$).
# * The **loss** is the cross-entropy of the correct next token, averaged over the non-padding positions.
#   **Label smoothing** trains towards $1 - \varepsilon$ on the correct token and $\varepsilon / (V - 2)$ on the
#   others (not `<pad>`); the loss can then not go below $H(q)$, the target's entropy.
# * **Teacher forcing** feeds the gold target shifted right behind `<bos>`, so all positions train in one pass.
# * The **warm-up schedule** (eq. 3) rises linearly for `warmup` steps, then decays as $1/\sqrt{step}$; a short
#   run also needs a cool-down at the end.
# * A 2+2-layer Transformer trained for 400 steps writes held-out dates in ISO form with the exact-match
#   accuracy printed in section 8. The same training loop runs data-parallel under `torchrun` with
#   `DistributedDataParallel`.
# * **Exposure bias**: at inference the decoder reads its own outputs; per character, the half-trained model was
#   less accurate free running than teacher forced.
# * **Cross-attention** learned to align each output character with the source characters it comes from.
# * **Decoding**: greedy takes the best token at each step; **beam search** keeps several candidates and finds more
#   probable outputs; **top-k** sampling draws among the $k$ best tokens only.
# * At inference the **encoder runs once**, and a **KV cache** keeps the decoder from recomputing the prefix:
#   the same output, for less work.
#
# ## What's next
#
# Our model reads characters. Real text has far too many words for one id per word and is too long for one id
# per character. Chapter 08, **tokenization**, builds the middle way, subword units learned by byte-pair
# encoding, and looks at the embedding matrix that turns their ids into vectors.

# %% [markdown]
# ## Glossary · 术语表
#
# | English | 中文 | Meaning |
# |---|---|---|
# | generator (output layer) | 生成器 / 输出层 | linear map to the vocabulary, then log-softmax: next-token log-probabilities |
# | log-softmax | 对数 softmax | $z_v - \log\sum_u e^{z_u}$, computed in one step for numerical stability |
# | cross-entropy loss | 交叉熵损失 | mean of $-\log p(\text{correct token})$ over the real target positions |
# | label smoothing | 标签平滑 | train towards $1-\varepsilon$ on the correct token, $\varepsilon$ shared by the others |
# | teacher forcing | 教师强制 | the decoder reads the gold previous tokens during training |
# | shifted right | 右移一位 | decoder input = `<bos>` + the target without its last token |
# | exposure bias | 暴露偏差 | at inference the decoder reads its own (possibly wrong) outputs, never seen in training |
# | warm-up schedule | 学习率预热 | the learning rate grows linearly over the first steps, then decays (eq. 3) |
# | exact match | 完全匹配率 | fraction of outputs identical to the reference, every character right |
# | greedy decoding | 贪心解码 | take the most probable token at every step |
# | beam search | 束搜索 | keep the `beam_size` best partial outputs at every step |
# | top-k sampling | Top-k 采样 | sample the next token among the k most probable ones only |
# | temperature | 温度 | divides the logits before the softmax: < 1 sharper, > 1 flatter |
# | KV cache | KV 缓存 | the keys and values of earlier positions, kept between decoding steps |
# | data parallelism | 数据并行 | several model copies each process a share of the batch and average gradients (DDP) |
