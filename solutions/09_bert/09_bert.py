# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Chapter 09 — BERT: pre-train an encoder, then fine-tune it
#
# Chapter 01 ended on a promise. A static word vector gives *apple* (苹果) one point in space, half fruit and
# half company, whatever the sentence; attention can make the vector depend on its context. Chapters 02–08 built
# the machine that does this, the Transformer. This chapter puts it to the use that made it famous outside
# translation: **BERT** (Devlin et al., "BERT: Pre-training of Deep Bidirectional Transformers for Language
# Understanding", NAACL 2019), *Bidirectional Encoder Representations from Transformers*.
#
# BERT is only the **encoder** of Vaswani et al. ("Attention Is All You Need", NeurIPS 2017): no decoder, no
# causal mask. It is trained in two stages (Prince, *Understanding Deep Learning*, MIT Press 2023, section 12.6):
#
# * **pre-training**, on plain text with no labels at all: hide some words and make the model guess them
#   (*masked language modelling*, MLM), and guess whether two sentences follow each other (*next-sentence
#   prediction*, NSP);
# * **fine-tuning**, on a small labelled data set: put one small layer on top and train the whole network on
#   the task, whatever it is.
#
# The plan:
#
# 1. **Encoder-only, bidirectional**, and why that rules out next-word prediction.
# 2. **The published sizes**, built and counted.
# 3. **The input**: `[CLS] A [SEP] B [SEP]`, segment ids and padding. *Exercise 1: `build_pair_inputs`.*
# 4. **The embeddings**: token + segment + position. *Exercise 2: `embedding_sum`.*
# 5. **A corpus where context decides the meaning**: chapter 01's apple sentences, with labels.
# 6. **Masked language modelling**: 15%, then 80/10/10. *Exercise 3: `mask_tokens`.*
# 7. **The MLM loss**, on the selected positions only. *Exercise 4: `mlm_loss`.*
# 8. **Next-sentence prediction**, and why later models dropped it.
# 9. **Pre-training a small BERT** with your functions; its `[MASK]` accuracy against a baseline.
# 10. **One word, two vectors**: what pre-training did to *apple*.
# 11. **Fine-tuning for a sentence label**: the sense of *apple*, pre-trained vs from scratch.
#     *Exercise 5: `classify_from_cls`.*
# 12. **Fine-tuning for a label per token**.
# 13. **Fine-tuning for span question answering**. *Exercise 6: `best_span`.*
#
# Six exercises are autograded. Everything trains on one CPU thread in under a minute, and the model is
# pre-trained **with your functions** once they pass their checks.

# %%
import math
import time

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from transformer_lib import configs
from transformer_lib.bert import (
    SENSES,
    TAGS,
    Bert,
    BertConfig,
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    apple_qa,
    apple_vocab,
    nsp_pairs,
    sense_documents,
    sense_sentences,
    special_tokens_mask,
)
from transformer_lib.checks import exercise_summary, yours_or_reference
from transformer_lib.checks.ch09 import (
    check_best_span,
    check_build_pair_inputs,
    check_classify_from_cls,
    check_embedding_sum,
    check_mask_tokens,
    check_mlm_loss,
)
from transformer_lib.claims import claim
from transformer_lib.corpus import COMPANIES, FRUITS
from transformer_lib.diagrams.ch09 import draw_bert_input
from transformer_lib.layers import count_parameters

torch.manual_seed(0)
torch.set_printoptions(precision=4, sci_mode=False)

# %% [markdown]
# ## 1. Encoder-only and bidirectional
#
# In the encoder every position attends to every position, left and right: there is no causal mask (chapter 06).
# So the output at a position depends on the *whole* input. A small random BERT shows it: change the token at
# position 4, and the output of every position moves. Position 4 moves most, being the token itself; the others
# move less (an untrained model spreads its attention thinly) but they all move, the positions *before* 4
# included. Behind a causal mask (chapter 06), positions 0 to 3 would not move at all.

# %% tags=["nbval-ignore-output"]
tiny_config = BertConfig(vocab_size=20, max_len=16, d_model=16, n_heads=2, n_layers=2, d_ff=32, dropout=0.0)
tiny = Bert(tiny_config).eval()
ids = torch.tensor([[1, 5, 6, 7, 8, 9, 2]])  # [batch=1, seq=7]
changed = ids.clone()
changed[0, 4] = 12  # another token at position 4
with torch.no_grad():
    before, _ = tiny(ids)  # [1, 7, 16]: one vector per position
    after, _ = tiny(changed)
change = (before - after).abs().amax(dim=-1)[0]  # [7]: the largest change of each position's output
print("change of each position's output:", [f"{d:.3f}" for d in change.tolist()])
claim(bool((change > 0).all()), "every position's output moves, positions 0 to 3 included",
      measured=str(change.tolist()))
claim(int(change.argmax()) == 4, "position 4, the changed token, moves most", measured=str(change.tolist()))

# %% [markdown]
# That is what we want from a contextual word vector: *apple* in "apple released a new phone" should know about
# *phone*, which comes after it. A left-to-right model (chapter 10's GPT) only sees the words before.
#
# But it rules out the usual way of training on plain text, predicting the next word. If position $t$ must
# predict word $t+1$ and attention lets it read position $t+1$, the model copies the answer (chapter 06 built
# exactly that cheat). Even "predict word $t$ at position $t$" fails: the word is right there in the input.
# Devlin et al. hide the word instead. Replace it by a `[MASK]` token and ask for it back: a fill-in-the-blank
# exercise, a *cloze* test in the psychologists' term (Taylor, 1953). The model may use both sides, and nothing
# leaks. Prince (section 12.6.1) notes the price: only the hidden positions produce a loss term, so a model learns
# less per sentence than one that predicts every next word.

# %% [markdown]
# ## 2. The published sizes
#
# Devlin et al. trained two models on 3.3 billion words (BooksCorpus and English Wikipedia), with a WordPiece
# vocabulary of about 30,000 tokens (the released English uncased vocabulary has 30,522 entries) and inputs of up
# to 512 tokens:
#
# | model | layers $L$ | $d_{model}$ $H$ | heads $A$ | feed-forward | parameters (paper) |
# |---|---|---|---|---|---|
# | BERT-base | 12 | 768 | 12 | 3072 | 110M |
# | BERT-large | 24 | 1024 | 16 | 4096 | 340M |
#
# BERT-base was made the size of OpenAI's GPT, for a fair comparison. `transformer_lib.configs` builds both as real
# models on PyTorch's `meta` device, where nothing is allocated, so we can count them:

# %%
for name, factory in [("BERT-base", configs.bert_base), ("BERT-large", configs.bert_large)]:
    model = factory(device="meta")
    c = model.config
    parts = {"embeddings": model.embeddings, "layers": model.encoder, "pooler": model.pooler}
    sizes = ", ".join(f"{part} {count_parameters(module):,}" for part, module in parts.items())
    print(f"{name}: L={c.n_layers}, H={c.d_model}, A={c.n_heads}, vocabulary {c.vocab_size:,}: "
          f"{count_parameters(model):,} parameters ({sizes})")
del model

# %% [markdown]
# 109,482,240 and 335,141,888 parameters with the 30,522-token vocabulary, 512 positions and 2 segments; the paper
# rounds them to 110M and 340M. About a fifth of BERT-base is its embedding tables, almost all of it the token
# table ($30{,}522 \times 768$). The pre-training heads add little: the MLM head reuses the token table as its
# output matrix (section 9).

# %% [markdown]
# ## 3. The input: `[CLS] A [SEP] B [SEP]`
#
# One BERT input holds one or two pieces of text, "sentences" A and B (in practice any spans of text), with three
# special tokens:
#
# * `[CLS]` ("classification") first. It stands for no word; through attention its final state becomes a summary
#   of the whole input, which sentence-level heads read;
# * `[SEP]` ("separator") after each sentence;
# * `[PAD]` to fill the input up to a fixed length, so that inputs of different lengths form one tensor.
#
# With the input come two more rows: the **segment ids**, 0 for `[CLS]`, A and its `[SEP]`, 1 for B and the last
# `[SEP]` (0 on padding); and the **padding mask**, True on real tokens, False on padding (the course's convention,
# chapter 06). When the pair is too long, BERT's tokenizer removes tokens one at a time from the end of the
# *longer* sentence ("longest first", as Hugging Face's tokenizers do), never a special token:
#
# ```
# ids       [CLS] a1 a2 a3 [SEP] b1 b2 [SEP] [PAD] [PAD]
# segments    0   0  0  0    0    1  1   1     0     0
# padding     T   T  T  T    T    T  T   T     F     F
# ```

# %% [markdown]
# ### Exercise 1 — `build_pair_inputs`
# > **Difficulty** ●●○ · **Importance** ●●● · about 15 minutes
#
# Write `build_pair_inputs(tokens_a, tokens_b, max_len, cls_id, sep_id, pad_id)`:
#
# * `tokens_a`: a list of token ids; `tokens_b`: a list of ids, or `None` for a single sentence
#   (`[CLS] A [SEP]`); `max_len`: the length of every output (at least 3 for a pair, 2 for one sentence).
# * Returns `(ids, segment_ids, padding_mask)`: a LongTensor, a LongTensor and a BoolTensor, each `[max_len]`.
# * Too long: while `len(a) + len(b)` is more than the room left by the special tokens (`max_len - 3` for a pair,
#   `max_len - 2` for one sentence), remove the **last** token of the **longer** sentence; on a tie, of B. Both
#   `[SEP]`s always stay.
# * Padding: ids `pad_id`, segment 0, mask False.
#
# Worked example: `build_pair_inputs([11, 12, 13], [21, 22], 10, cls_id=1, sep_id=2, pad_id=0)` gives
# ids `[1, 11, 12, 13, 2, 21, 22, 2, 0, 0]`, segments `[0, 0, 0, 0, 0, 1, 1, 1, 0, 0]` and mask
# `[True] * 8 + [False] * 2`. With `max_len=7` the pair keeps `[11, 12]` and `[21, 22]`.
#
# <details><summary>Hint 1 — the idea</summary>Truncate first, assemble second. If you assemble the full input and
# cut it at <code>max_len</code>, the cut falls on the last <code>[SEP]</code> (and on B). Work on Python lists, and
# turn them into tensors at the very end.</details>
# <details><summary>Hint 2 — the plan</summary>Copy the two lists (never modify the caller's). The room for real
# tokens is <code>max_len - 3</code> (or <code>- 2</code>); a loop <code>while len(a) + len(b) > room:</code> pops the
# last token of the longer list (B when they are equal). Then build three lists side by side: ids
# <code>[cls_id] + a + [sep_id] + b + [sep_id]</code>, segments (as many 0s as the first part, 1s for the second),
# padding True; extend each to <code>max_len</code>; <code>torch.tensor</code> each (a list of bools gives a
# BoolTensor).</details>

# %% nbgrader={"grade": false, "grade_id": "build_pair_inputs", "locked": false, "schema_version": 3, "solution": true, "task": false}
def build_pair_inputs(tokens_a, tokens_b, max_len, cls_id, sep_id, pad_id):
    """[CLS] A [SEP] B [SEP] (or [CLS] A [SEP]), truncated longest first and padded to max_len.

    Returns (ids, segment_ids, padding_mask): LongTensor, LongTensor, BoolTensor, each [max_len].
    """
    ### BEGIN SOLUTION
    a = list(tokens_a)
    b = None if tokens_b is None else list(tokens_b)
    if b is None:
        a = a[:max_len - 2]
        ids, segments = [cls_id, *a, sep_id], [0] * (len(a) + 2)
    else:
        while len(a) + len(b) > max_len - 3:
            (a if len(a) > len(b) else b).pop()  # the longer one; B on a tie
        ids = [cls_id, *a, sep_id, *b, sep_id]
        segments = [0] * (len(a) + 2) + [1] * (len(b) + 1)
    n_pad = max_len - len(ids)
    padding = [True] * len(ids) + [False] * n_pad
    return torch.tensor(ids + [pad_id] * n_pad), torch.tensor(segments + [0] * n_pad), torch.tensor(padding)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "build_pair_inputs_test", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false} tags=["raises-exception"]
check_build_pair_inputs(build_pair_inputs)
### BEGIN HIDDEN TESTS
check_build_pair_inputs(build_pair_inputs, hidden=True)
### END HIDDEN TESTS

# %%
build_pair_inputs_impl = yours_or_reference(build_pair_inputs, check_build_pair_inputs)

# %% [markdown]
# Here is a pair from this chapter's corpus (section 5), through `build_pair_inputs_impl`. The vocabulary puts the
# four special tokens first: `[PAD]` 0, `[CLS]` 1, `[SEP]` 2, `[MASK]` 3.

# %%
vocab = apple_vocab()
sentence_a = "she ate a ripe apple after lunch".split()
sentence_b = "the apple tasted sweet and juicy".split()
pair = build_pair_inputs_impl(vocab.encode(sentence_a), vocab.encode(sentence_b), 18, vocab.cls_id,
                              vocab.sep_id, vocab.pad_id)
for token, segment, real in zip(vocab.decode(pair[0]), pair[1].tolist(), pair[2].tolist()):
    print(f"{token:>8}  segment {segment}  {'real' if real else 'padding'}")

# %% [markdown]
# ## 4. The embeddings: token + segment + position
#
# Each position's input vector is the sum of three learned vectors: the **token** embedding (what the word is),
# the **segment** embedding (sentence A or B), and the **position** embedding (where it stands, learned as in
# chapter 04, one row per position up to 512). The picture shows the input and the two pre-training heads on
# top, which sections 6 to 8 build.

# %%
fig = draw_bert_input()
plt.show()

# %% [markdown]
# Two differences from the original Transformer (chapter 07): the positions are learned, not sinusoidal, and the
# token embedding is **not** multiplied by $\sqrt{d_{model}}$. A LayerNorm follows the sum instead (and dropout),
# so the scale of the three tables does not matter.

# %% [markdown]
# ### Exercise 2 — `embedding_sum`
# > **Difficulty** ●○○ · **Importance** ●●○ · about 5 minutes
#
# Write `embedding_sum(ids, segment_ids, token_table, segment_table, position_table)`:
#
# * `ids`, `segment_ids`: LongTensors `[batch, seq]`;
# * `token_table` `[vocab, d_model]`, `segment_table` `[2, d_model]`, `position_table` `[max_len, d_model]`, with
#   `seq <= max_len`;
# * returns `[batch, seq, d_model]`: `out[b, t] = token_table[ids[b, t]] + segment_table[segment_ids[b, t]] +
#   position_table[t]`.
#
# Positions run through the whole input: `[CLS]` is position 0, and sentence B goes on where A ends.
#
# Worked example: with `ids = [[5, 5]]`, `segment_ids = [[0, 1]]`, the two outputs are `token_table[5] +
# segment_table[0] + position_table[0]` and `token_table[5] + segment_table[1] + position_table[1]`: the same word,
# two different vectors.
#
# <details><summary>Hint 1 — the idea</summary>Indexing a table with a tensor of ids looks up one row per id:
# <code>table[ids]</code> has the shape of <code>ids</code> followed by <code>d_model</code>. Do it for the tokens
# and the segments; the positions do not depend on the ids at all.</details>
# <details><summary>Hint 2 — the plan</summary>Three <code>[.., d_model]</code> terms: <code>token_table[ids]</code>
# and <code>segment_table[segment_ids]</code> are <code>[batch, seq, d_model]</code>; the first <code>seq</code> rows
# of the position table are <code>[seq, d_model]</code> and broadcast over the batch. Add them.</details>

# %% nbgrader={"grade": false, "grade_id": "embedding_sum", "locked": false, "schema_version": 3, "solution": true, "task": false}
def embedding_sum(ids, segment_ids, token_table, segment_table, position_table):
    """token + segment + position embeddings: [batch, seq] ids -> [batch, seq, d_model]."""
    ### BEGIN SOLUTION
    seq = ids.shape[1]
    return token_table[ids] + segment_table[segment_ids] + position_table[:seq]  # [batch, seq, d_model]
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "embedding_sum_test", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false} tags=["raises-exception"]
check_embedding_sum(embedding_sum)
### BEGIN HIDDEN TESTS
check_embedding_sum(embedding_sum, hidden=True)
### END HIDDEN TESTS

# %%
embedding_sum_impl = yours_or_reference(embedding_sum, check_embedding_sum)

# %% [markdown]
# The library's `BertEmbeddings` computes exactly this sum, then the LayerNorm. Its `combine` attribute is the
# function that adds the three tables; every model of this chapter gets `embedding_sum_impl` there, so the BERT we
# pre-train below runs on your sum. First, the check on the tiny model of section 1:

# %%
emb = tiny.embeddings
segments = torch.tensor([[0, 0, 0, 0, 1, 1, 1]])
with torch.no_grad():
    yours = emb.norm(embedding_sum_impl(ids, segments, emb.token.weight, emb.segment.weight,
                                        emb.positions.embedding.weight))  # [1, 7, 16]
    print("LayerNorm(embedding_sum_impl(...)) == BertEmbeddings(ids, segments):",
          torch.allclose(yours, emb(ids, segments), atol=1e-6))

# %% [markdown]
# ## 5. A corpus where context decides the meaning
#
# BERT was pre-trained on billions of words; we have one CPU thread and a minute. So we use chapter 01's apple
# corpus, made for exactly this chapter's question. Its sentences come from twenty templates, ten about fruit and
# ten about companies; the fruit slots hold *pear*, *cherry*, *mango*... and the company slots *microsoft*,
# *nokia*, *ibm*..., and *apple* fills either kind of slot. Only the context says which *apple* is which.
#
# `transformer_lib.bert` generates them with the labels BERT's tasks need: a tag per word (`FRUIT` and `COMPANY`
# on the slot fillers, `O` elsewhere), the sense of the sentence, and its template. **Documents** are runs of three
# sentences about one sense, the material for next-sentence pairs.

# %%
print(f"vocabulary: {len(vocab)} tokens; the first ones: {vocab.itos[:8]}")
documents = sense_documents(400, sentences_per_document=3, seed=0)
for sentence in documents[1]:
    print(f"[{SENSES[sentence.sense]:>7}, template {sentence.template}]", " ".join(
        f"{w}/{t}" if t != "O" else w for w, t in zip(sentence.words, sentence.tags)))

# %% [markdown]
# ## 6. Masked language modelling: 15%, then 80/10/10
#
# Devlin et al. (section 3.1) choose **15%** of the tokens at random, never a special one, and ask the model to
# predict the original token at each chosen position. Replacing every chosen token by `[MASK]` has a flaw: `[MASK]`
# never occurs in fine-tuning, so the model would learn features for a situation it never meets again, and nothing
# would make it keep good vectors for the tokens it *can* see. So a chosen token is
#
# * replaced by `[MASK]` 80% of the time,
# * replaced by a **random** token 10% of the time,
# * left **unchanged** 10% of the time,
#
# and the model must predict the original in all three cases. It cannot tell which tokens were chosen (an
# unchanged one looks like any other), so it must keep a good vector for every token; and a random token teaches
# it to doubt a word that does not fit. In the paper's ablation (appendix C.2), always using `[MASK]` did
# noticeably worse when BERT's vectors were used as fixed features, without fine-tuning. The rate stays low so
# that most of the context remains visible.
#
# The labels have the shape of the input: the original id where a token was chosen and **−100** elsewhere, the
# value PyTorch's `cross_entropy` skips by default (`ignore_index=-100`).

# %% [markdown]
# ### Exercise 3 — `mask_tokens`
# > **Difficulty** ●●○ · **Importance** ●●● · about 15 minutes
#
# Write `mask_tokens(ids, special_mask, mask_id, vocab_size, generator, p=0.15)` returning `(inputs, labels)`:
#
# * `ids`: LongTensor of any shape, e.g. `[batch, seq]`; `special_mask`: BoolTensor of the same shape, True on
#   `[CLS]`, `[SEP]`, `[PAD]`; `generator`: a `torch.Generator`, the only source of randomness.
# * `inputs`: `ids` after the corruption; `labels`: the original id where selected, −100 elsewhere.
#
# So that a seeded generator gives the same corruption as the reference, draw **three** random tensors, each of
# the shape of `ids`, in this order, always (even if nothing is selected):
#
# 1. `torch.rand(ids.shape, generator=generator)`: a position is **selected** when its number is `< p` and it is
#    not special;
# 2. `torch.rand(ids.shape, generator=generator)`: call it `action`. A selected position becomes `mask_id` when
#    `action < 0.8`, a random token when `0.8 <= action < 0.9`, and stays as it is otherwise;
# 3. `torch.randint(len(candidates), ids.shape, generator=generator)`: indices into `candidates`, the 1-D tensor
#    of the ids a random token may take, in increasing order: every id in `range(vocab_size)` except `mask_id` and
#    the ids that stand at special positions (`ids[special_mask]`).
#
# Worked example: with `p = 1.0` and no special tokens, every position is selected, `labels` equals `ids`, and
# about 80% of `inputs` is `mask_id`.
#
# <details><summary>Hint 1 — the idea</summary>Compute boolean tensors, then combine them with
# <code>torch.where</code>: <code>selected</code>, then <code>to_mask = selected & (action &lt; 0.8)</code> and a
# similar <code>to_random</code>. The labels need only <code>selected</code> and the original <code>ids</code>.
# </details>
# <details><summary>Hint 2 — the plan</summary>(1) <code>selected</code>: bool, shape of ids. (2)
# <code>labels = ids.masked_fill(~selected, -100)</code>. (3) <code>action</code>, then <code>to_mask</code> and
# <code>to_random</code>. (4) <code>candidates</code>: start from <code>torch.ones(vocab_size, dtype=torch.bool)</code>,
# set the forbidden ids to False, and keep the indices of the True entries (<code>.nonzero().squeeze(-1)</code>:
# <code>[n_allowed]</code>). (5) the third draw picks one candidate per position: <code>candidates[picks]</code>
# has the shape of ids. (6) two <code>torch.where</code>: first the masks, then the random tokens.</details>

# %% nbgrader={"grade": false, "grade_id": "mask_tokens", "locked": false, "schema_version": 3, "solution": true, "task": false}
def mask_tokens(ids, special_mask, mask_id, vocab_size, generator, p=0.15):
    """BERT's MLM corruption. Returns (inputs, labels), both of the shape of ids."""
    ### BEGIN SOLUTION
    selected = (torch.rand(ids.shape, generator=generator) < p) & ~special_mask
    labels = ids.masked_fill(~selected, -100)
    action = torch.rand(ids.shape, generator=generator)
    to_mask = selected & (action < 0.8)
    to_random = selected & (action >= 0.8) & (action < 0.9)
    allowed = torch.ones(vocab_size, dtype=torch.bool)
    allowed[ids[special_mask]] = False
    allowed[mask_id] = False
    candidates = allowed.nonzero().squeeze(-1)  # [n_allowed]
    random_ids = candidates[torch.randint(len(candidates), ids.shape, generator=generator)]
    inputs = torch.where(to_mask, torch.full_like(ids, mask_id), ids)
    inputs = torch.where(to_random, random_ids, inputs)
    return inputs, labels
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "mask_tokens_test", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false} tags=["raises-exception"]
check_mask_tokens(mask_tokens)
### BEGIN HIDDEN TESTS
check_mask_tokens(mask_tokens, hidden=True)
### END HIDDEN TESTS

# %%
mask_tokens_impl = yours_or_reference(mask_tokens, check_mask_tokens)

# %% [markdown]
# The corpus as BERT inputs. `nsp_pairs` (section 8) makes 4,000 sentence pairs from the 400 documents; we turn each
# into ids with `build_pair_inputs_impl`, 28 positions long (the longest pair has 25 tokens, so nothing is
# truncated), and corrupt all of them once with `mask_tokens_impl` to see the statistics:

# %%
MAX_LEN = 28


def encode_pairs(pairs):
    """(words_a, words_b, label) triples -> ids, segments, padding [n, MAX_LEN] and the NSP labels [n]."""
    rows = [build_pair_inputs_impl(vocab.encode(a), vocab.encode(b), MAX_LEN, vocab.cls_id, vocab.sep_id,
                                   vocab.pad_id) for a, b, _ in pairs]
    ids, segments, padding = (torch.stack(column) for column in zip(*rows))
    return ids, segments, padding, torch.tensor([label for _, _, label in pairs])


train_pairs = nsp_pairs(documents, 4000, seed=1)
pair_ids, pair_segments, pair_padding, pair_nsp = encode_pairs(train_pairs)
pair_special = special_tokens_mask(pair_ids, vocab.special_ids)  # [4000, 28]: [CLS], [SEP], [PAD]
print(f"pairs: {list(pair_ids.shape)}; longest pair: {int(pair_padding.sum(1).max())} tokens")

inputs, labels = mask_tokens_impl(pair_ids, pair_special, vocab.mask_id, len(vocab), torch.Generator().manual_seed(2))
selected = labels != -100
n = int(selected.sum())
print(f"selected: {n:,} of {int((~pair_special).sum()):,} ordinary tokens = {n / (~pair_special).sum():.3f}; "
      f"special tokens selected: {int((selected & pair_special).sum())}")
for what, where in [("[MASK]", inputs == vocab.mask_id), ("unchanged", inputs == pair_ids)]:
    print(f"{what:>9}: {int((selected & where).sum()) / n:.3f} of the selected")
print(f"   random: {int((selected & (inputs != vocab.mask_id) & (inputs != pair_ids)).sum()) / n:.3f} of the selected "
      f"(a random token can also be the original one)")
print("one corrupted pair:", " ".join(vocab.decode(inputs[0][pair_padding[0]])))

# %% [markdown]
# ## 7. The loss: on the selected positions only
#
# The MLM head turns each final state into scores over the vocabulary, `[batch, seq, vocab]`. The loss is the
# cross-entropy at the **selected** positions, averaged over those positions. The others carry no information
# about what was hidden: counting them would train the model to copy its input, and dividing by their number
# would make the loss depend on how much of the batch is padding.

# %% [markdown]
# ### Exercise 4 — `mlm_loss`
# > **Difficulty** ●○○ · **Importance** ●●● · about 5 minutes
#
# Write `mlm_loss(logits, labels)`: `logits` `[batch, seq, vocab]` (float), `labels` `[batch, seq]` (long, −100 at
# unselected positions). Return a scalar tensor: the mean over the selected positions of $-\log
# \mathrm{softmax}(\text{logits})[\text{label}]$.
#
# Worked example: one selected position whose logits are all equal over a vocabulary of 7 gives $\log 7 \approx
# 1.946$, whatever the other positions hold.
#
# <details><summary>Hint 1 — the idea</summary><code>F.cross_entropy</code> does the log-softmax and the average,
# but it wants the classes on the second axis of a 2-D input, and it can be told which label value to skip.
# </details>
# <details><summary>Hint 2 — the plan</summary>Flatten: logits to <code>[batch * seq, vocab]</code>
# (<code>.reshape(-1, logits.shape[-1])</code>), labels to <code>[batch * seq]</code>; then one call of
# <code>F.cross_entropy</code> with <code>ignore_index</code> set to the value of the unselected labels (the default
# reduction, the mean, then counts only the others).</details>

# %% nbgrader={"grade": false, "grade_id": "mlm_loss", "locked": false, "schema_version": 3, "solution": true, "task": false}
def mlm_loss(logits, labels):
    """Mean cross-entropy over the positions whose label is not -100. Returns a scalar tensor."""
    ### BEGIN SOLUTION
    vocab_size = logits.shape[-1]
    return F.cross_entropy(logits.reshape(-1, vocab_size), labels.reshape(-1), ignore_index=-100)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "mlm_loss_test", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false} tags=["raises-exception"]
check_mlm_loss(mlm_loss)
### BEGIN HIDDEN TESTS
check_mlm_loss(mlm_loss, hidden=True)
### END HIDDEN TESTS

# %%
mlm_loss_impl = yours_or_reference(mlm_loss, check_mlm_loss)

# %% [markdown]
# The worked example, and what happens to the loss of an untrained model (uniform guesses) when padding is added:

# %%
flat = torch.zeros(1, 4, 7)  # [batch=1, seq=4, vocab=7]: every score equal
one_label = torch.tensor([[-100, 3, -100, -100]])
print(f"one selected position, uniform scores: {mlm_loss_impl(flat, one_label):.4f} (log 7 = {math.log(7):.4f})")
padded = torch.cat([one_label, torch.full((1, 20), -100)], dim=1)  # 20 more unselected positions
print(f"the same with 20 more unselected positions: {mlm_loss_impl(torch.zeros(1, 24, 7), padded):.4f}")

# %% [markdown]
# ## 8. Next-sentence prediction
#
# Some tasks are about two pieces of text: does this answer fit this question, does this sentence follow from that
# one? Devlin et al. add a second pre-training task for them. Each input is a pair A, B: half the time B is the
# sentence that follows A in the text (label 0, *IsNext*), otherwise a random sentence from another document
# (label 1, *NotNext*). A small head reads the pooled `[CLS]` state (a dense layer and tanh, the *pooler*) and
# says which.
#
# Whether this helps has been questioned since. Liu et al. ("RoBERTa: A Robustly Optimized BERT Pretraining
# Approach", 2019) pre-trained without NSP, on inputs of contiguous full sentences, and matched or slightly
# improved the downstream results; BERT's own ablation had found a loss when NSP was removed. Lan et al.
# (ALBERT, 2020) argued that NSP is mostly solved by **topic**: a random sentence from another document is usually
# about something else. Our documents make that explicit: consecutive sentences share their sense and nothing
# else, so a model can only tell *IsNext* from *NotNext* by the topic. A *NotNext* B about the same sense looks
# exactly like a next sentence, and since half of the random Bs share A's sense, no model can exceed
# $0.5 + 0.5 \times 0.5 = 75\%$ on our pairs.

# %%
examples = [next(p for p in train_pairs if p[2] == label) for label in (0, 0, 1, 1)]
examples[1] = next(p for p in train_pairs if p[2] == 0 and p != examples[0])
examples[3] = next(p for p in train_pairs if p[2] == 1 and p != examples[2])
for a, b, label in examples:
    print(f"{['IsNext ', 'NotNext'][label]}  A: {' '.join(a)}\n          B: {' '.join(b)}")

# %% [markdown]
# ## 9. Pre-training a small BERT
#
# Two layers, $d_{model} = 64$, four heads and a feed-forward width of 128: 85,886 parameters, more than a thousand
# times smaller than BERT-base (the count is printed below). No dropout: the generated corpus never repeats a batch exactly. The MLM head scores
# a token by the dot product with its own embedding (the token table is tied to the output matrix, as in BERT).
#
# Every part of the training runs on your functions where they pass: `build_pair_inputs_impl` built the inputs,
# `embedding_sum_impl` sums the embeddings inside the model, `mask_tokens_impl` corrupts each batch anew
# (RoBERTa's *dynamic masking*: the same sentence gets a new mask each time it is seen), and `mlm_loss_impl` is the
# loss, plus the NSP cross-entropy. The optimiser is AdamW with a linear warm-up over the first tenth of the
# steps and a linear decay to zero.

# %%
config = BertConfig(vocab_size=len(vocab), max_len=32, d_model=64, n_heads=4, n_layers=2, d_ff=128, dropout=0.0)
PRETRAIN_STEPS, BATCH = 500, 32


def with_your_embeddings(model):
    """Point the model's embedding layer at embedding_sum_impl (yours when it passes)."""
    bert = model.bert if hasattr(model, "bert") else model
    bert.embeddings.combine = embedding_sum_impl
    return model


def train(model, loss_of_batch, n_steps, lr, seed, desc):
    """AdamW, linear warm-up (first tenth) and linear decay; loss_of_batch(g) draws a batch with the generator g
    and returns the loss. Returns the list of losses."""
    g = torch.Generator().manual_seed(seed)
    optimiser = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    warmup = max(1, n_steps // 10)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimiser, lambda s: min(1.0, (s + 1) / warmup) * (1 - s / n_steps))
    model.train()
    losses = []
    for _ in tqdm(range(n_steps), desc=desc):
        loss = loss_of_batch(g)
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        schedule.step()
        losses.append(loss.item())
    return losses


def batch_of(g, *tensors):
    """BATCH random rows of each tensor, cut after the longest real input of the batch (less padding, less work)."""
    rows = torch.randint(len(tensors[0]), (BATCH,), generator=g)
    length = int(tensors[0][rows].ne(vocab.pad_id).sum(dim=1).max())
    return [t[rows, :length] if t.dim() == 2 else t[rows] for t in tensors]


torch.manual_seed(0)
pretrained = with_your_embeddings(BertForPreTraining(config))
print(f"parameters: {count_parameters(pretrained):,}")
mlm_history, nsp_history = [], []


def pretraining_batch_loss(g):
    ids, segments, padding, special, nsp = batch_of(g, pair_ids, pair_segments, pair_padding, pair_special, pair_nsp)
    inputs, labels = mask_tokens_impl(ids, special, vocab.mask_id, len(vocab), g)
    mlm_logits, nsp_logits = pretrained(inputs, segments, padding)
    mlm = mlm_loss_impl(mlm_logits, labels)
    nsp_loss = F.cross_entropy(nsp_logits, nsp)
    mlm_history.append(mlm.item())
    nsp_history.append(nsp_loss.item())
    return mlm + nsp_loss


# %% tags=["nbval-ignore-output", "timing"]
start = time.perf_counter()
train(pretrained, pretraining_batch_loss, PRETRAIN_STEPS, lr=3e-3, seed=3, desc="pre-training")
pretrained.eval()
print(f"{PRETRAIN_STEPS} steps in {time.perf_counter() - start:.1f} s")

# %% [markdown]
# The losses, smoothed over 25 steps. MLM starts at $\log 124 \approx 4.8$ (a uniform guess over the vocabulary);
# NSP at $\log 2 \approx 0.69$:

# %% tags=["nbval-ignore-output"]
def smooth(values, k=25):
    return torch.tensor(values).unfold(0, k, 1).mean(dim=1)


fig, ax = plt.subplots(figsize=(7, 3))
ax.plot(smooth(mlm_history), label="MLM loss (selected positions)")
ax.plot(smooth(nsp_history), label="NSP loss")
ax.set_xlabel("step")
ax.set_ylabel("cross-entropy")
ax.legend(fontsize=8)
fig.tight_layout()
plt.show()
final_mlm, final_nsp = sum(mlm_history[-25:]) / 25, sum(nsp_history[-25:]) / 25
print(f"MLM loss, mean of the last 25 steps: {final_mlm:.3f}; NSP: {final_nsp:.3f}")

# %% [markdown]
# The last digits of these losses depend on your processor: it adds floats in its own order, and 500 steps of
# training amplify the difference. What the chapter reads from them holds on any machine:

# %%
measured = f"MLM {final_mlm:.3f}, NSP {final_nsp:.3f}"  # shown if a claim fails
perfect_topic = 0.75 * (math.log(3) - 2 / 3 * math.log(2))  # NSP loss of a model that knows only the topic
claim(abs(mlm_history[0] - math.log(len(vocab))) < 0.2 and abs(nsp_history[0] - math.log(2)) < 0.05,
      "both start at a uniform guess: MLM within 0.2 of log 124 = 4.82, NSP within 0.05 of log 2 = 0.69",
      measured=f"first step: MLM {mlm_history[0]:.3f}, NSP {nsp_history[0]:.3f}")
claim(final_mlm < 1.5, "the MLM loss ends below 1.5, less than a third of the uniform guess log 124 = 4.82",
      measured=measured)
claim(perfect_topic < final_nsp < math.log(2), f"the NSP loss ends below log 2 = 0.69, but above the "
      f"{perfect_topic:.2f} of a perfect topic detector", measured=measured)
claim(sum(nsp_history[-50:]) < sum(nsp_history[-100:-50]), "and it is still falling: its last 50 steps are lower "
      "than the 50 before", measured=f"{sum(nsp_history[-100:-50]) / 50:.3f} -> {sum(nsp_history[-50:]) / 50:.3f}")

# %% [markdown]
# ### How well does it fill in the blanks?
#
# We corrupt 1,000 pairs from documents the model never saw, once, with a fixed generator, and measure the
# accuracy **at the `[MASK]` positions** (the 80% of the selected positions that show no hint of the word).
# The baseline is the best guess that ignores the context: the most frequent token of the training text, at
# every `[MASK]`.

# %%
test_pairs = nsp_pairs(sense_documents(200, sentences_per_document=3, seed=10), 1000, seed=11)
test_ids, test_segments, test_padding, test_nsp = encode_pairs(test_pairs)
test_special = special_tokens_mask(test_ids, vocab.special_ids)
test_inputs, test_labels = mask_tokens_impl(test_ids, test_special, vocab.mask_id, len(vocab),
                                            torch.Generator().manual_seed(12))
at_mask = (test_inputs == vocab.mask_id) & (test_labels != -100)  # [1000, 28]
most_frequent = torch.bincount(pair_ids[~pair_special], minlength=len(vocab)).argmax()
baseline = (test_labels[at_mask] == most_frequent).float().mean().item()
print(f"[MASK] positions: {int(at_mask.sum())}; baseline (always '{vocab.itos[most_frequent]}'): {baseline:.3f}")

# %% tags=["nbval-ignore-output"]
with torch.no_grad():
    mlm_logits, nsp_logits = pretrained(test_inputs, test_segments, test_padding)
mask_accuracy = (mlm_logits.argmax(dim=-1)[at_mask] == test_labels[at_mask]).float().mean().item()
nsp_accuracy = (nsp_logits.argmax(dim=-1) == test_nsp).float().mean().item()
print(f"[MASK] accuracy: {mask_accuracy:.3f}")
print(f"NSP accuracy: {nsp_accuracy:.3f}   (chance 0.5, best possible on these pairs about 0.75)")

# %%
measured = f"[MASK] {mask_accuracy:.3f}, NSP {nsp_accuracy:.3f}"  # shown if a claim fails
claim(mask_accuracy >= 0.7, f"the model fills at least 70% of the [MASK] positions (the baseline: {baseline:.1%})",
      measured=measured)
claim(0.55 <= nsp_accuracy <= 0.72, "NSP accuracy is between 55% and 72%: above chance, short of the 75% ceiling",
      measured=measured)

# %% [markdown]
# The model fills more than 70% of the blanks, against 10.5% for always guessing *the*: it has learned the
# templates, and much of what it misses cannot be known even with the context (which fruit, which taste, which
# product). NSP is harder: between 55% and 72%, above chance but short of the 75% ceiling, and its loss (above the
# 0.48 of a perfect topic detector) was still falling. It learns the topic from the pooled `[CLS]` alone, one bit
# per pair, while MLM gets a signal at every selected position.
#
# The real test of a contextual model: the same blank in two contexts. Top three guesses for the `[MASK]` in a
# fruit sentence and in a company sentence:

# %% tags=["nbval-ignore-output"]
def top_guesses(words, k=3):
    ids_, segments_, padding_ = build_pair_inputs_impl(vocab.encode(words), None, MAX_LEN, vocab.cls_id, vocab.sep_id,
                                                       vocab.pad_id)
    with torch.no_grad():
        logits, _ = pretrained(ids_[None], segments_[None], padding_[None])
    where = words.index("[MASK]") + 1  # + 1 for [CLS]
    probs = logits[0, where].softmax(dim=-1)
    top = probs.topk(k)
    return [(vocab.itos[i], p) for p, i in zip(top.values.tolist(), top.indices.tolist())]


guesses = {}
for text in ["she ate a ripe [MASK] after lunch", "[MASK] released a new phone at its launch event",
             "shares of [MASK] rose after the company reported record profit"]:
    guesses[text] = top_guesses(text.split())
    print(f"{text:<66} -> {', '.join(f'{word} {p:.2f}' for word, p in guesses[text])}")
fruit_guesses, *company_guesses = [[word for word, _ in top] for top in guesses.values()]
claim(set(fruit_guesses) <= set(FRUITS), "in the fruit sentence, the three guesses are fruits",
      measured=str(fruit_guesses))
claim(all(set(top) <= set(COMPANIES) for top in company_guesses),
      "in the two company sentences, the three guesses are companies", measured=str(company_guesses))

# %% [markdown]
# ## 10. One word, two vectors
#
# Chapter 01 gave *apple* a single static vector, halfway between the fruits and the companies. Here is what
# pre-training did. We take 400 new sentences in which every fruit or company slot holds *apple*, run the
# pre-trained encoder, and keep the final state at the position of *apple*: one 64-dimensional vector per
# occurrence. Projected on its two main directions (PCA), coloured by the sense the template gave it:

# %% tags=["nbval-ignore-output"]
apple_sentences = sense_sentences(400, seed=20, apple_share=1.0)
apple_id = vocab.stoi["apple"]


def encode_sentences(sentences):
    """Single sentences -> ids, segments, padding [n, MAX_LEN]."""
    rows = [build_pair_inputs_impl(vocab.encode(s.words), None, MAX_LEN, vocab.cls_id, vocab.sep_id, vocab.pad_id)
            for s in sentences]
    return [torch.stack(column) for column in zip(*rows)]


s_ids, s_segments, s_padding = encode_sentences(apple_sentences)
with torch.no_grad():
    states, _ = pretrained.bert(s_ids, s_segments, s_padding)  # [400, 28, 64]
first_apple = (s_ids == apple_id).float().argmax(dim=1)  # [400]: where the first apple stands
apple_vectors = states[torch.arange(len(s_ids)), first_apple]  # [400, 64]
senses = torch.tensor([s.sense for s in apple_sentences])
centred = apple_vectors - apple_vectors.mean(dim=0)
_, _, v = torch.linalg.svd(centred, full_matrices=False)
xy = centred @ v[:2].T  # [400, 2]

fig, ax = plt.subplots(figsize=(5, 4))
for sense, colour in [(0, "tab:green"), (1, "tab:blue")]:
    ax.scatter(*xy[senses == sense].T, s=8, color=colour, label=f"apple, {SENSES[sense]} sentence")
ax.set_xlabel("first principal direction")
ax.set_ylabel("second principal direction")
ax.set_title("the final state of 'apple' in 400 sentences", fontsize=9)
ax.legend(fontsize=8)
fig.tight_layout()
plt.show()
centre_fruit, centre_company = apple_vectors[senses == 0].mean(0), apple_vectors[senses == 1].mean(0)
nearest = ((apple_vectors - centre_company).norm(dim=1) < (apple_vectors - centre_fruit).norm(dim=1)).long()
own_centre = (nearest == senses).float().mean().item()
print(f"'apple' closer to its own sense's centre than to the other: {own_centre:.3f}")

# %%
claim(own_centre >= 0.95, "in at least 95% of the sentences, 'apple' is closer to its own sense's centre",
      measured=f"{own_centre:.3f}")

# %% [markdown]
# No label was used in pre-training, yet the vectors of *apple* split by sense: filling in blanks forced the
# encoder to work out which *apple* each sentence meant. This is the contextual vector chapter 01 asked for.

# %% [markdown]
# ## 11. Fine-tuning for a sentence label: the sense of *apple*
#
# Fine-tuning adds one small layer and trains **everything** on a labelled task (Devlin et al., section 4;
# Prince, section 12.6.2). For a label per input, the layer reads the pooled `[CLS]` state: the pooler's dense
# layer and tanh (pre-trained by NSP), then a fresh linear classifier, `[d_model] -> [n_classes]`.
#
# Our task: given a sentence in which every fruit or company slot holds *apple*, say which sense it is. We give the
# model only **40 labelled sentences, from 3 of the 10 templates of each sense**, and test it on 400 sentences from
# the **other 7 templates**, sentence patterns it has never seen labelled. Two models get exactly the same data and
# the same 40 steps: one starts from the pre-trained encoder, the other from random weights.

# %% [markdown]
# ### Exercise 5 — `classify_from_cls`
# > **Difficulty** ●○○ · **Importance** ●●○ · about 5 minutes
#
# Write `classify_from_cls(hidden, pooler, classifier)`:
#
# * `hidden`: the encoder's final states, `[batch, seq, d_model]`, with `[CLS]` at position 0;
# * `pooler`: a `BertPooler`; use its linear layer `pooler.dense` (`[d_model] -> [d_model]`) and apply `torch.tanh`
#   yourself (do not call `pooler(hidden)`: the checker refuses it);
# * `classifier`: an `nn.Linear(d_model, n_classes)`;
# * returns the logits, `[batch, n_classes]`.
#
# Worked example: for a batch of 2 inputs of 5 positions with `d_model = 8` and 3 classes, the output is
# `[2, 3]` and depends only on `hidden[:, 0]`.
#
# <details><summary>Hint 1 — the idea</summary>Three steps: pick the state of <code>[CLS]</code> in every input, pool
# it (dense, then tanh), classify it.</details>
# <details><summary>Hint 2 — the plan</summary><code>cls_state = hidden[:, 0]</code> is <code>[batch, d_model]</code>
# (all inputs, position 0); the pooled vector has the same shape; the classifier maps it to
# <code>[batch, n_classes]</code>.</details>

# %% nbgrader={"grade": false, "grade_id": "classify_from_cls", "locked": false, "schema_version": 3, "solution": true, "task": false}
def classify_from_cls(hidden, pooler, classifier):
    """Logits [batch, n_classes] from the final state of [CLS] (position 0): pooled (pooler.dense, then tanh),
    then classified."""
    ### BEGIN SOLUTION
    pooled = torch.tanh(pooler.dense(hidden[:, 0]))  # [batch, d_model]
    return classifier(pooled)  # [batch, n_classes]
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "classify_from_cls_test", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false} tags=["raises-exception"]
check_classify_from_cls(classify_from_cls)
### BEGIN HIDDEN TESTS
check_classify_from_cls(classify_from_cls, hidden=True)
### END HIDDEN TESTS

# %%
classify_from_cls_impl = yours_or_reference(classify_from_cls, check_classify_from_cls)

# %% [markdown]
# The data: 40 training sentences from templates 0–2 of each sense, 400 test sentences from templates 3–9.

# %%
SEEN_TEMPLATES = [0, 1, 2]
sense_train = sense_sentences(40, seed=21, apple_share=1.0, templates=SEEN_TEMPLATES)
sense_test = sense_sentences(400, seed=22, apple_share=1.0, templates=[t for t in range(10) if t not in SEEN_TEMPLATES])
train_x = encode_sentences(sense_train) + [torch.tensor([s.sense for s in sense_train])]
test_x = encode_sentences(sense_test) + [torch.tensor([s.sense for s in sense_test])]
print("a training sentence:", " ".join(sense_train[0].words), f"({SENSES[sense_train[0].sense]})")
print("a test sentence:    ", " ".join(sense_test[1].words), f"({SENSES[sense_test[1].sense]})")


def sense_model(from_pretrained):
    torch.manual_seed(4)  # the same classifier initialisation for both
    model = with_your_embeddings(BertForSequenceClassification(config, n_classes=2))
    if from_pretrained:
        model.bert.load_state_dict(pretrained.bert.state_dict())
    return model


def sense_logits(model, ids, segments, padding):
    hidden, _ = model.bert(ids, segments, padding)  # [batch, seq, d_model]
    return classify_from_cls_impl(hidden, model.bert.pooler, model.classifier)  # [batch, 2]


SENSE_STEPS = 40
sense_models = {"pre-trained": sense_model(True), "from scratch": sense_model(False)}

# %% tags=["nbval-ignore-output", "timing"]
for name, model in sense_models.items():
    def loss_of_batch(g, model=model):
        ids, segments, padding, y = batch_of(g, *train_x)
        return F.cross_entropy(sense_logits(model, ids, segments, padding), y)

    train(model, loss_of_batch, SENSE_STEPS, lr=1e-3, seed=5, desc=name)
    model.eval()

# %% tags=["nbval-ignore-output"]
sense_accuracy = {}  # name -> (training sentences, unseen templates)
with torch.no_grad():
    for name, model in sense_models.items():
        train_accuracy = (sense_logits(model, *train_x[:3]).argmax(-1) == train_x[3]).float().mean().item()
        test_accuracy = (sense_logits(model, *test_x[:3]).argmax(-1) == test_x[3]).float().mean().item()
        sense_accuracy[name] = train_accuracy, test_accuracy
        print(f"{name:>12}: training sentences {train_accuracy:.3f}, unseen templates {test_accuracy:.3f}")

# %%
(pre_train, pre_test), (scratch_train, scratch_test) = sense_accuracy["pre-trained"], sense_accuracy["from scratch"]
measured = f"pre-trained {pre_train:.3f} / {pre_test:.3f}, from scratch {scratch_train:.3f} / {scratch_test:.3f}"
claim(min(pre_train, scratch_train) >= 0.95, "both models learn the 40 training sentences (at least 95% right)",
      measured=measured)
claim(pre_test >= 0.9, "on the unseen templates, the pre-trained model gets at least 90% right", measured=measured)
claim(scratch_test <= 0.88, "the model from scratch at most 88%", measured=measured)
claim(pre_test >= scratch_test + 0.05, "pre-training is worth at least 5 points", measured=measured)

# %% [markdown]
# Both models learn the 40 training sentences. On the templates they never saw labelled, the model from scratch
# gets at most 88% right: the taste and product words of its training sentences (*ripe*, *phone*...) come back in
# some new templates, but *orchard*, *juice*, *shares* or *regulators* mean nothing to it. The pre-trained model
# gets at least 90%: it had grouped those words with the fruits and the companies while it filled in blanks, and a
# few labels were enough to name the two groups. (Other seeds, like other processors, give other numbers with the
# same gap.) This is the whole argument for pre-training: unlabelled text is plentiful, labels are scarce.

# %% [markdown]
# ## 12. Fine-tuning for a label per token
#
# For a label per token (named entities, parts of speech) the head is a linear layer on **every** final state,
# `[batch, seq, d_model] -> [batch, seq, n_labels]`, and the loss is the cross-entropy over the real tokens. Our
# labels are the tags of section 5: `FRUIT`, `COMPANY` or `O`, which makes this a miniature named-entity
# recogniser whose hard case is *apple* (an organisation or not?). The special tokens and the padding get the label
# −100 and are skipped, as in the MLM loss. 300 sentences and 40 steps, again from the pre-trained encoder and from
# scratch:

# %%
def tagging_data(sentences):
    ids, segments, padding = encode_sentences(sentences)
    tags = torch.full(ids.shape, -100)  # [n, MAX_LEN]: -100 on [CLS], [SEP] and padding
    for row, s in enumerate(sentences):
        tags[row, 1:1 + len(s.tags)] = torch.tensor([TAGS.index(t) for t in s.tags])
    return [ids, segments, padding, tags]


tag_test_sentences = sense_sentences(400, seed=31)
tag_train, tag_test = tagging_data(sense_sentences(300, seed=30)), tagging_data(tag_test_sentences)
gold = tag_test[3]  # [400, 28]
real = gold != -100
groups = {"all words": real, "fruit and company words": real & (gold != TAGS.index("O")),
          "'apple' only": tag_test[0] == apple_id}
print("test words:", ", ".join(f"{what} {int(where.sum())}" for what, where in groups.items()))
print(f"baseline 'always O', all words: {(gold[real] == TAGS.index('O')).float().mean():.3f}")


def tagger_model(from_pretrained):
    torch.manual_seed(6)
    model = with_your_embeddings(BertForTokenClassification(config, n_labels=len(TAGS)))
    if from_pretrained:
        model.bert.load_state_dict(pretrained.bert.state_dict())
    return model


taggers = {"pre-trained": tagger_model(True), "from scratch": tagger_model(False)}

# %% tags=["nbval-ignore-output", "timing"]
for name, model in taggers.items():
    def loss_of_batch(g, model=model):
        ids, segments, padding, tags = batch_of(g, *tag_train)
        logits = model(ids, segments, padding)  # [batch, seq, 3]
        return F.cross_entropy(logits.reshape(-1, len(TAGS)), tags.reshape(-1), ignore_index=-100)

    train(model, loss_of_batch, 40, lr=3e-3, seed=7, desc=name)
    model.eval()

# %% tags=["nbval-ignore-output"]
tag_accuracy = {}  # name -> {group: accuracy}
print(f"{'':>12}  " + "  ".join(f"{what} ({int(where.sum())})" for what, where in groups.items()))
with torch.no_grad():
    for name, model in taggers.items():
        predicted = model(*tag_test[:3]).argmax(dim=-1)  # [400, 28]
        tag_accuracy[name] = {what: (predicted[where] == gold[where]).float().mean().item()
                              for what, where in groups.items()}
        print(f"{name:>12}  " + "  ".join(f"{tag_accuracy[name][what]:>{len(what) + 6}.3f}" for what in groups))
    row = next(i for i, s in enumerate(tag_test_sentences) if "apple" in s.words and s.sense == 1)
    predicted = taggers["pre-trained"](*(t[row:row + 1] for t in tag_test[:3])).argmax(dim=-1)[0]
words = vocab.decode(tag_test[0][row][real[row]])
print("pre-trained:", " ".join(f"{w}/{TAGS[t]}" if TAGS[t] != "O" else w
                               for w, t in zip(words, predicted[real[row]].tolist())))

# %%
pre, scratch = tag_accuracy["pre-trained"], tag_accuracy["from scratch"]
measured = f"pre-trained {pre}, from scratch {scratch}"  # shown if a claim fails
claim(min(pre["all words"], scratch["all words"]) >= 0.98, "both taggers get at least 98% of all the words right",
      measured=measured)
claim(pre["'apple' only"] >= 0.99, "the pre-trained tagger gets at least 99% of the 121 'apple' tokens right",
      measured=measured)
claim(scratch["'apple' only"] <= pre["'apple' only"] - 0.02,
      "the one from scratch gets at least 2 points fewer of them right", measured=measured)

# %% [markdown]
# Tagging is easy here: the fruit and company names other than *apple* always carry the same tag, and 88.2% of the
# words are `O`. Both models learn it in 40 steps, with at least 98% of the words right. The difference is in the
# one word whose tag depends on its context: the pre-trained tagger gets at least 99% of the 121 *apple* tokens of
# the test set right, the one from scratch at least 2 points fewer.

# %% [markdown]
# ## 13. Fine-tuning for span question answering
#
# Extractive question answering (the SQuAD task) gives a question and a passage that contains the answer; the
# answer is a **span** of the passage, from a start token to an end token. The input is
# `[CLS] question [SEP] passage [SEP]`. Devlin et al. (section 4.2) add just two learned vectors, a start vector
# $S$ and an end vector $E$: the score of token $i$ as the start is $S \cdot T_i$, as the end $E \cdot T_i$, where
# $T_i$ is its final state. Training takes a softmax over the positions for each and the cross-entropy of the true
# start and end. To answer, take the span $i \le j$ with the largest $S \cdot T_i + E \cdot T_j$.
#
# Our questions are "which fruit" and "which company", on a passage made of one fruit sentence and one company
# sentence; the answer is the filler of that sense's slot, with its taste when it has one ("ripe apple"). When
# both sentences hold *apple*, only the context says which one is the company:

# %%
qa_train, qa_test = apple_qa(400, seed=40), apple_qa(400, seed=41)
for example in qa_test[:3]:
    print(f"Q: {' '.join(example.question):<14} passage: {' '.join(example.passage)}\n"
          f"{'':17} answer: {' '.join(example.answer)} (words {example.start}..{example.end})")

# %% [markdown]
# ### Exercise 6 — `best_span`
# > **Difficulty** ●●○ · **Importance** ●●○ · about 15 minutes
#
# Write `best_span(start_logits, end_logits, passage_mask, max_answer_len)`:
#
# * `start_logits`, `end_logits`: `[batch, seq]` scores; `passage_mask`: bool `[batch, seq]`, True on the passage's
#   tokens (not on `[CLS]`, the question, the `[SEP]`s or padding); `max_answer_len`: a positive int;
# * returns `(start, end)`, two LongTensors `[batch]`: for each input, the pair with the largest
#   `start_logits[s] + end_logits[e]` among the **allowed** pairs: `s <= e`, at most `max_answer_len` tokens
#   (`e - s + 1 <= max_answer_len`), `s` and `e` both in the passage.
#
# Each row has at least one passage token. Two separate argmaxes are not enough: they can give an end before the
# start, or a "span" inside the question.
#
# Worked example: `start_logits = [[0, 0, 9]]`, `end_logits = [[0, 9, 0]]`, every token in the passage,
# `max_answer_len = 5`: the separate argmaxes give start 2 and end 1; the best allowed pair scores 9, and the first
# such pair in row-major order of (start, end) is `(0, 1)`. Ties are broken that way: take the first maximum of
# the flattened `[seq * seq]` scores, as `argmax` does.
#
# <details><summary>Hint 1 — the idea</summary>Score all pairs at once: a <code>[batch, seq, seq]</code> table with
# the start on the middle axis and the end on the last. Give every forbidden pair the score −∞, and take the
# argmax over the flattened table.</details>
# <details><summary>Hint 2 — the plan</summary><code>scores = start_logits[:, :, None] + end_logits[:, None, :]</code>.
# The allowed pairs: <code>torch.ones(seq, seq, dtype=torch.bool)</code> with <code>.triu()</code> (s ≤ e) and
# without <code>.triu(diagonal=max_answer_len)</code> (too long), AND the passage on both axes
# (<code>passage_mask[:, :, None]</code>, <code>passage_mask[:, None, :]</code>). After
# <code>masked_fill</code> and <code>.view(batch, -1).argmax(dim=1)</code>, the flat index <code>k</code> is the pair
# <code>(k // seq, k % seq)</code>.</details>

# %% nbgrader={"grade": false, "grade_id": "best_span", "locked": false, "schema_version": 3, "solution": true, "task": false}
def best_span(start_logits, end_logits, passage_mask, max_answer_len):
    """The allowed (start, end) with the largest start_logits[s] + end_logits[e]: two LongTensors [batch]."""
    ### BEGIN SOLUTION
    batch, seq = start_logits.shape
    scores = start_logits[:, :, None] + end_logits[:, None, :]  # [batch, seq (start), seq (end)]
    ones = torch.ones(seq, seq, dtype=torch.bool)
    short_and_ordered = ones.triu() & ~ones.triu(diagonal=max_answer_len)  # 0 <= e - s < max_answer_len
    allowed = short_and_ordered & passage_mask[:, :, None] & passage_mask[:, None, :]  # [batch, seq, seq]
    flat = scores.masked_fill(~allowed, float("-inf")).reshape(batch, -1).argmax(dim=1)  # [batch]
    return flat // seq, flat % seq
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "best_span_test", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false} tags=["raises-exception"]
check_best_span(best_span)
### BEGIN HIDDEN TESTS
check_best_span(best_span, hidden=True)
### END HIDDEN TESTS

# %%
best_span_impl = yours_or_reference(best_span, check_best_span)

# %% [markdown]
# Training: `BertForQuestionAnswering` holds the encoder and one linear layer with two outputs per token (the start
# and the end score: the vectors $S$ and $E$). The loss is the mean of the two cross-entropies over the positions.
# The answer's word indices move by the length of the question plus 2 (`[CLS]` and the first `[SEP]`). The same
# 150 steps for a model from the pre-trained encoder and one from scratch:

# %%
def qa_data(examples):
    rows = [build_pair_inputs_impl(vocab.encode(e.question), vocab.encode(e.passage), MAX_LEN, vocab.cls_id,
                                   vocab.sep_id, vocab.pad_id) for e in examples]
    ids, segments, padding = (torch.stack(column) for column in zip(*rows))
    shift = torch.tensor([len(e.question) + 2 for e in examples])  # [CLS] question [SEP] before the passage
    starts = torch.tensor([e.start for e in examples]) + shift
    ends = torch.tensor([e.end for e in examples]) + shift
    return [ids, segments, padding, starts, ends]


qa_train_x, qa_test_x = qa_data(qa_train), qa_data(qa_test)
QA_STEPS, MAX_ANSWER = 150, 3


def qa_model(from_pretrained):
    torch.manual_seed(8)
    model = with_your_embeddings(BertForQuestionAnswering(config))
    if from_pretrained:
        model.bert.load_state_dict(pretrained.bert.state_dict())
    return model


qa_models = {"pre-trained": qa_model(True), "from scratch": qa_model(False)}

# %% tags=["nbval-ignore-output", "timing"]
for name, model in qa_models.items():
    def loss_of_batch(g, model=model):
        ids, segments, padding, starts, ends = batch_of(g, *qa_train_x)
        start_logits, end_logits = model(ids, segments, padding)  # [batch, seq] each
        return (F.cross_entropy(start_logits, starts) + F.cross_entropy(end_logits, ends)) / 2

    train(model, loss_of_batch, QA_STEPS, lr=2e-3, seed=9, desc=name)
    model.eval()

# %% [markdown]
# **Exact match** counts the test questions whose predicted span is the answer, word for word and at the right
# place. The passage mask is segment 1 without its `[SEP]` and the padding:

# %%
ids, segments, padding, starts, ends = qa_test_x
passage_mask = (segments == 1) & padding & (ids != vocab.sep_id)  # [400, 28]
both_apple = torch.tensor([e.passage.count("apple") == 2 for e in qa_test])  # [400]
print(f"test questions: {len(qa_test)}, of which {int(both_apple.sum())} with 'apple' in both sentences")

# %% tags=["nbval-ignore-output"]
qa_results = {}  # name -> (exact match, exact match when both hold 'apple', backward spans of separate argmaxes)
with torch.no_grad():
    for name, model in qa_models.items():
        start_logits, end_logits = model(ids, segments, padding)
        s, e = best_span_impl(start_logits, end_logits, passage_mask, MAX_ANSWER)
        right = (s == starts) & (e == ends)  # [400]
        exact, both = right.float().mean().item(), right[both_apple].float().mean().item()
        s_alone, e_alone = start_logits.argmax(dim=1), end_logits.argmax(dim=1)
        qa_results[name] = exact, both, int((s_alone > e_alone).sum())
        print(f"{name:>12}: exact match {exact:.3f}, when both slots hold 'apple' {both:.3f}   "
              f"(separate argmaxes: {qa_results[name][2]} spans end before they start)")
    start_logits, end_logits = qa_models["pre-trained"](ids, segments, padding)
    s, e = best_span_impl(start_logits, end_logits, passage_mask, MAX_ANSWER)
for i in [0, *both_apple.nonzero().flatten()[:2].tolist()]:
    words = vocab.decode(ids[i])
    print(f"Q: {' '.join(qa_test[i].question)}   passage: {' '.join(qa_test[i].passage)}\n"
          f"   predicted: {' '.join(words[s[i]:e[i] + 1])} at {int(s[i])}..{int(e[i])};   "
          f"gold: {' '.join(qa_test[i].answer)} at {int(starts[i])}..{int(ends[i])}")

# %%
(pre_exact, pre_both, pre_backward), (scratch_exact, scratch_both, scratch_backward) = qa_results.values()
measured = f"{qa_results}"  # shown if a claim fails
claim(pre_exact >= 0.97 and pre_both >= 0.7, "from the pre-trained encoder, at least 97% of the answers are exact, "
      "and at least 70% of those with 'apple' twice", measured=measured)
claim(scratch_exact <= 0.7, "from scratch, at most 70%", measured=measured)
claim(scratch_backward >= 50 and pre_backward <= scratch_backward / 3, "with separate argmaxes, the model from "
      "scratch would give at least 50 spans that end before they start, the pre-trained one a third of that or fewer",
      measured=measured)

# %% [markdown]
# From the pre-trained encoder, at least 97% of the 400 answers are exact, and at least 70% of the 27 questions
# whose passage holds *apple* twice, where only the context tells the fruit from the company. From scratch, the same
# 150 steps give at most 70%. The search over pairs matters too: taking the argmax of the start scores and of the
# end scores separately would have produced at least 50 spans that end before they start for the model from
# scratch, and a third of that or fewer for the pre-trained one.

# %% [markdown]
# ## Summary
#
# * **BERT** is the Transformer's encoder alone. Every position attends both ways, so its vectors use the context
#   on both sides; the price is that it cannot be trained to predict the next word.
# * BERT-base and BERT-large have 109,482,240 and 335,141,888 parameters with the 30,522-token vocabulary (110M and
#   340M in the paper).
# * The input is `[CLS] A [SEP] B [SEP]` with **segment ids** and a **padding mask**; truncation removes words from
#   the longer sentence and never a special token. Each position's vector is the sum of a **token**, a
#   **segment** and a **position** embedding, then a LayerNorm.
# * **Masked language modelling** selects 15% of the ordinary tokens; 80% of them become `[MASK]`, 10% a random
#   token, 10% stay; the loss is the mean cross-entropy over the selected positions only (labels −100 elsewhere).
#   Our small BERT filled more than 70% of the `[MASK]` positions of unseen text (the most frequent token: 10.5%),
#   and its vectors for *apple* split by sense with no label at all.
# * **Next-sentence prediction** reads `[CLS]`; on our corpus it can only learn the topic, and RoBERTa (Liu et al.,
#   2019) found it could be dropped.
# * **Fine-tuning** adds one layer and trains everything: a classifier on the pooled `[CLS]` for sentence labels, a
#   classifier on every token for token labels, start and end scores with the best allowed span for question
#   answering. With 40 labelled sentences, the pre-trained encoder recognised the sense of *apple* in kinds of
#   sentences it had never seen labelled (at least 90%, against at most 88% from scratch); it tagged at least 99% of
#   the *apple* tokens right; and it answered at least 97% of the questions exactly (at most 70% from scratch).
#
# ## What's next
#
# Chapter 10 keeps the other half of the Transformer: **GPT**, a decoder-only model with the causal mask, trained to
# predict the next token. It reads only to the left, but every position produces a loss term, and it can generate
# text.

# %% [markdown]
# ## Where you stand
#
# Which of this chapter's exercises pass, as last checked (run the test cells again after a change):

# %%
exercise_summary(check_build_pair_inputs, check_embedding_sum, check_mask_tokens, check_mlm_loss,
                 check_classify_from_cls, check_best_span)

# %% [markdown]
# ## Glossary · 术语表
#
# | English | 中文 | Meaning |
# |---|---|---|
# | BERT (Bidirectional Encoder Representations from Transformers) | BERT（基于 Transformer 的双向编码器表示） | the Transformer's encoder, pre-trained on unlabelled text |
# | encoder-only | 仅编码器 | a model without a decoder: every position attends to every position |
# | bidirectional | 双向 | using the context on both sides of a word |
# | pre-training | 预训练 | self-supervised training on plain text, before any task |
# | fine-tuning | 微调 | training the pre-trained network, plus a small head, on a labelled task |
# | self-supervised learning | 自监督学习 | the labels come from the text itself (the hidden word, the next sentence) |
# | masked language model (MLM) | 掩码语言模型 | hide 15% of the tokens and predict them from both sides |
# | cloze task | 完形填空 | a fill-in-the-blank exercise, MLM's older name |
# | next-sentence prediction (NSP) | 下一句预测 | does sentence B follow sentence A? read from `[CLS]` |
# | `[CLS]` token | 分类标记 [CLS] | the first token; its final state summarises the input |
# | `[SEP]` token | 分隔标记 [SEP] | ends each sentence of the input |
# | `[MASK]` token | 掩码标记 [MASK] | stands for a hidden token during pre-training |
# | segment embedding | 片段嵌入（句子嵌入） | says whether a token is in sentence A or sentence B |
# | pooler | 池化层 | dense layer + tanh on the `[CLS]` state |
# | sequence classification | 句子分类 | one label per input, from `[CLS]` |
# | token classification (named-entity recognition) | 词元分类（命名实体识别） | one label per token |
# | extractive question answering | 抽取式问答（阅读理解） | the answer is a span of the passage: a start and an end |
# | exact match | 完全匹配 | the share of answers predicted exactly right |
