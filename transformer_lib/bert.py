"""BERT: a bidirectional Transformer encoder pre-trained by filling in blanks (Devlin et al., 2019,
"BERT: Pre-training of Deep Bidirectional Transformers for Language Understanding").

Read top to bottom: the input ([CLS] A [SEP] B [SEP], segment ids, padding: build_pair_inputs),
the MLM corruption (mask_tokens: 15% of the ordinary tokens, then 80/10/10), the embeddings
(embedding_sum: token + segment + position, then LayerNorm), the encoder (the library's
post-norm EncoderLayer with GELU and LayerNorm eps 1e-12), the pooler (dense + tanh on [CLS]),
the pre-training heads and losses (mlm_loss over the selected positions, next-sentence
prediction) and one pre-training update (pretrain_step), the fine-tuning heads
(classify_from_cls for sentence labels, token labels, span question answering with best_span),
practice data made from chapter 01's apple sentences (a vocabulary, tagged sentences,
one-sense documents, NSP pairs from nsp_pairs, questions with answer spans), and a converter
from Hugging Face's BertForPreTraining weights. Chapter 09's exercises are the plain functions
here; the modules call them, so there is one copy of each formula.

Every part comes from the library: layers.EncoderLayer (with attention.MultiHeadAttention),
layers.Encoder / LayerNorm, positional.LearnedPositionalEmbedding and add_positions.
Masks follow the course convention: bool, True = may attend (here: a real token, not padding).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn as nn

from .gpt import _StateDict
from .layers import Encoder, EncoderLayer, LayerNorm
from .positional import LearnedPositionalEmbedding, add_positions

IGNORE_INDEX = -100  # MLM labels at positions that are not predicted


@dataclass
class BertConfig:
    """Sizes of a BERT; the defaults are BERT-base (Devlin et al., 2019, section 3)."""

    vocab_size: int = 30522  # the uncased English WordPiece vocabulary
    max_len: int = 512  # learned positions
    n_segments: int = 2  # sentence A and sentence B
    d_model: int = 768
    n_heads: int = 12
    n_layers: int = 12
    d_ff: int = 3072
    dropout: float = 0.1
    layer_norm_eps: float = 1e-12  # BERT's; the library's LayerNorm defaults to PyTorch's 1e-5


# ---------------------------------------------------------------------------------------
# Inputs: [CLS] A [SEP] B [SEP] [PAD] ...
# ---------------------------------------------------------------------------------------

def build_pair_inputs(tokens_a: Sequence[int], tokens_b: Sequence[int] | None, max_len: int,
                      cls_id: int, sep_id: int, pad_id: int):
    """One BERT input from one or two token-id sequences, truncated and padded to max_len.

        ids       [CLS] a1 ... an [SEP] b1 ... bm [SEP] [PAD] ...
        segments    0   0  ...  0   0    1  ...  1   1    0   ...
        padding     T   T  ...  T   T    T  ...  T   T    F   ...

    Too long: tokens are removed from the end of the longer of A and B, one at a time, until
    the pair fits ("longest first", as Hugging Face truncates; on a tie from B). Both [SEP]s
    always stay, so the model always sees where each sentence ends. tokens_b=None gives
    [CLS] A [SEP]. Returns (ids, segment_ids, padding_mask): LongTensor, LongTensor and
    BoolTensor [max_len] (padding_mask True = a real token).
    """
    a, b = list(tokens_a), (None if tokens_b is None else list(tokens_b))
    n_special = 2 if b is None else 3
    if isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < n_special:
        raise ValueError(f"max_len must be an int >= {n_special} to hold [CLS] and the [SEP]s, got {max_len!r}")
    budget = max_len - n_special  # room for real tokens
    if b is None:
        a = a[:budget]
    else:
        while len(a) + len(b) > budget:
            if len(a) > len(b):
                a.pop()
            else:
                b.pop()
    ids = [cls_id, *a, sep_id]
    segments = [0] * len(ids)
    if b is not None:
        ids += [*b, sep_id]
        segments += [1] * (len(b) + 1)
    n_real = len(ids)
    ids += [pad_id] * (max_len - n_real)
    segments += [0] * (max_len - n_real)
    padding = [True] * n_real + [False] * (max_len - n_real)
    return torch.tensor(ids), torch.tensor(segments), torch.tensor(padding)


def special_tokens_mask(ids: torch.Tensor, special_ids: Sequence[int]) -> torch.Tensor:
    """True where ids holds one of special_ids ([CLS], [SEP], [PAD], ...): the positions MLM skips."""
    return torch.isin(ids, torch.as_tensor(list(special_ids), dtype=ids.dtype, device=ids.device))


# ---------------------------------------------------------------------------------------
# Masked language modelling: the corruption
# ---------------------------------------------------------------------------------------

def mask_tokens(ids: torch.Tensor, special_ids: Sequence[int], mask_id: int, vocab_size: int,
                generator: torch.Generator | None = None, p: float = 0.15):
    """BERT's MLM corruption (Devlin et al., 2019, section 3.1, task 1). Returns (inputs, labels).

    Each token that is not special is selected with probability p (15%). A selected token is
    replaced by [MASK] 80% of the time, by a random token 10% of the time, and left unchanged
    10% of the time; the model must predict the original at every selected position. Why not
    always [MASK]: [MASK] never occurs when fine-tuning, so the model must also be ready to
    correct a wrong token and to confirm a right one; it cannot know which tokens were chosen.

    ids: LongTensor [...]; special_ids: the ids of the special tokens ([PAD], [CLS], [SEP],
    [MASK], ...), a property of the vocabulary. Positions holding one of them are never
    selected, and a random token is never one of them nor mask_id, whatever the batch holds:
    a batch without padding still never receives [PAD]. (Devlin et al.'s released data script
    draws the random word from the whole vocabulary; we keep the special tokens out.)
    labels: the original id where selected, -100 elsewhere. All randomness comes from
    `generator`, three draws in a fixed order, so a seeded generator gives the same corruption.
    """
    if not isinstance(ids, torch.Tensor) or ids.is_floating_point() or ids.dtype == torch.bool:
        raise ValueError("mask_tokens expects a tensor of integer token ids")
    if isinstance(special_ids, torch.Tensor) and special_ids.dtype == torch.bool:
        raise ValueError("special_ids is the list of the special tokens' ids (e.g. vocab.special_ids), "
                         "not a boolean mask")
    special_ids = [int(i) for i in special_ids]
    if any(not 0 <= i < vocab_size for i in [*special_ids, mask_id]):
        raise ValueError(f"special_ids {special_ids} and mask_id {mask_id} must be ids of the vocabulary "
                         f"(0 to {vocab_size - 1})")
    if not 0.0 < p <= 1.0:
        raise ValueError(f"p, the share of tokens to predict, must be in (0, 1], got {p}")
    device = ids.device

    def uniform():  # one U(0, 1) per token, from the caller's generator
        return torch.rand(ids.shape, generator=generator, device=device)

    special = special_tokens_mask(ids, special_ids)  # True on [CLS], [SEP], [PAD]...
    selected = (uniform() < p) & ~special  # the 15% to predict
    labels = ids.masked_fill(~selected, IGNORE_INDEX)
    action = uniform()  # one draw decides between [MASK] (< 0.8), random (< 0.9) and unchanged
    to_mask = selected & (action < 0.8)
    to_random = selected & (action >= 0.8) & (action < 0.9)

    allowed = torch.ones(vocab_size, dtype=torch.bool, device=device)  # the ids a random token may take
    allowed[special_ids] = False  # every special id, present in this batch or not
    allowed[mask_id] = False
    candidates = allowed.nonzero().squeeze(-1)  # [n_allowed], increasing
    if len(candidates) == 0:
        raise ValueError("every id of the vocabulary is special: there is no random token to draw")
    pick = torch.randint(len(candidates), ids.shape, generator=generator, device=device)
    inputs = torch.where(to_mask, torch.full_like(ids, mask_id), ids)
    inputs = torch.where(to_random, candidates[pick], inputs)
    return inputs, labels


# ---------------------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------------------

def embedding_sum(ids: torch.Tensor, segment_ids: torch.Tensor, token_table: torch.Tensor,
                  segment_table: torch.Tensor, position_table: torch.Tensor) -> torch.Tensor:
    """BERT's input vectors: token + segment + position embedding, for every position.

    ids, segment_ids: LongTensor [batch, seq]; token_table [vocab, d_model], segment_table
    [n_segments, d_model], position_table [max_len, d_model]. Returns [batch, seq, d_model]:
    out[b, t] = token_table[ids[b, t]] + segment_table[segment_ids[b, t]] + position_table[t].
    Positions count through the whole input, [CLS] at 0, sentence B carrying on where A ends.
    """
    if ids.shape != segment_ids.shape or ids.dim() != 2:
        raise ValueError(f"ids and segment_ids must both be [batch, seq], got {list(ids.shape)} and "
                         f"{list(segment_ids.shape)}")
    x = token_table[ids] + segment_table[segment_ids]  # [batch, seq, d_model]
    return add_positions(x, position_table)  # + position_table[0..seq-1], checks seq <= max_len


class BertEmbeddings(nn.Module):
    """token + segment + position embeddings, summed (embedding_sum), then LayerNorm and dropout.

    Unlike the original Transformer, nothing is scaled by sqrt(d_model), and the sum is
    normalised before the first layer (BERT's layers are post-norm: their input is not).
    `combine` is the function that sums the three (embedding_sum); chapter 09 swaps in the
    learner's version, so that the model it pre-trains runs on the learner's code.
    """

    def __init__(self, config: BertConfig):
        super().__init__()
        c = config
        self.token = nn.Embedding(c.vocab_size, c.d_model)
        self.segment = nn.Embedding(c.n_segments, c.d_model)  # "is this sentence A or B?"
        self.positions = LearnedPositionalEmbedding(c.d_model, c.max_len, dropout=0.0)  # dropout after the norm
        self.norm = LayerNorm(c.d_model, c.layer_norm_eps)
        self.dropout = nn.Dropout(c.dropout)
        self.combine = embedding_sum

    def forward(self, ids: torch.Tensor, segment_ids: torch.Tensor | None = None) -> torch.Tensor:
        if segment_ids is None:
            segment_ids = torch.zeros_like(ids)  # a single sentence: all segment A
        x = self.combine(ids, segment_ids, self.token.weight, self.segment.weight,
                         self.positions.embedding.weight)  # [batch, seq, d_model]
        return self.dropout(self.norm(x))


class BertLayer(EncoderLayer):
    """One BERT layer: the library's post-norm EncoderLayer (layers.encoder_layer_forward) with
    BERT's GELU feed-forward network and LayerNorm eps (1e-12, against PyTorch's 1e-5).

        x = LN1(x + SelfAttn(x)); out = LN2(x + FFN(x))
    """

    def __init__(self, d_model: int, n_heads: int, d_ff: int, dropout: float = 0.0, eps: float = 1e-12):
        super().__init__(d_model, n_heads, d_ff, dropout, norm_first=False, activation="gelu", eps=eps)


class BertPooler(nn.Module):
    """The sentence vector: a dense layer + tanh on the final state of [CLS] (position 0).

    [CLS] carries no word of its own, so with attention it becomes a summary of the whole
    input; NSP (and later sentence classification) reads this one vector.
    """

    def __init__(self, d_model: int):
        super().__init__()
        self.dense = nn.Linear(d_model, d_model)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.dense(hidden[:, 0]))  # [batch, d_model]


class Bert(nn.Module):
    """The encoder: ids [batch, seq] -> (states [batch, seq, d_model], pooled [batch, d_model]).

    padding_mask: bool [batch, seq], True = a real token (build_pair_inputs' third output);
    no key is hidden when it is None. Every position attends both ways: this is what makes
    BERT bidirectional, and why it is trained on blanks rather than on the next word.
    """

    def __init__(self, config: BertConfig):
        super().__init__()
        c = self.config = config
        self.embeddings = BertEmbeddings(c)
        self.encoder = Encoder(BertLayer(c.d_model, c.n_heads, c.d_ff, c.dropout, c.layer_norm_eps), c.n_layers)
        self.pooler = BertPooler(c.d_model)
        self.apply(_init_bert_weights)

    def forward(self, ids: torch.Tensor, segment_ids: torch.Tensor | None = None,
                padding_mask: torch.Tensor | None = None):
        if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.is_floating_point():
            raise ValueError("Bert expects integer token ids of shape [batch, seq]")
        mask = None
        if padding_mask is not None:
            if padding_mask.shape != ids.shape or padding_mask.dtype != torch.bool:
                raise ValueError(f"padding_mask must be bool [batch, seq] = {list(ids.shape)} (True = a real "
                                 f"token), got {padding_mask.dtype} {list(padding_mask.shape)}")
            mask = padding_mask[:, None, None, :]  # [batch, 1, 1, seq]: every query, every head
        hidden = self.encoder(self.embeddings(ids, segment_ids), mask)  # [batch, seq, d_model]
        return hidden, self.pooler(hidden)


def _init_bert_weights(module: nn.Module) -> None:
    """BERT's initialisation: N(0, 0.02) for every matrix and embedding, zero biases."""
    if isinstance(module, nn.Linear):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Embedding):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)


# ---------------------------------------------------------------------------------------
# Pre-training heads
# ---------------------------------------------------------------------------------------

class MLMHead(nn.Module):
    """Scores every vocabulary token at every position: dense + GELU + LayerNorm, then the
    token embedding matrix (tied) plus a bias of its own. [batch, seq, d_model] -> [batch, seq, vocab]."""

    def __init__(self, config: BertConfig, token_embedding: nn.Embedding):
        super().__init__()
        self.dense = nn.Linear(config.d_model, config.d_model)
        self.norm = LayerNorm(config.d_model, config.layer_norm_eps)
        self.decoder = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.decoder.weight = token_embedding.weight  # tied: a token is scored by its own embedding
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        x = self.norm(nn.functional.gelu(self.dense(hidden)))  # [batch, seq, d_model]
        return self.decoder(x) + self.bias  # [batch, seq, vocab]


class BertForPreTraining(nn.Module):
    """BERT with both pre-training heads: forward -> (mlm_logits [batch, seq, vocab], nsp_logits [batch, 2]).

    NSP: is sentence B the sentence that follows A in the text (class 0, "IsNext") or a random
    one (class 1, "NotNext")? Read from the pooled [CLS] vector.
    """

    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config
        self.bert = Bert(config)
        self.mlm = MLMHead(config, self.bert.embeddings.token)
        self.nsp = nn.Linear(config.d_model, 2)
        _init_bert_weights(self.mlm.dense)
        _init_bert_weights(self.nsp)

    def forward(self, ids, segment_ids=None, padding_mask=None):
        hidden, pooled = self.bert(ids, segment_ids, padding_mask)
        return self.mlm(hidden), self.nsp(pooled)


def mlm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The masked-language-model loss: the mean cross-entropy over the selected positions only.

    logits: [batch, seq, vocab]; labels: [batch, seq], the original id where a token was
    selected (mask_tokens) and -100 (IGNORE_INDEX) elsewhere. Unselected positions add nothing,
    not even to the count: the loss is the average over the ~15% that were selected.
    Returns a scalar tensor.
    """
    if logits.dim() != 3 or logits.shape[:2] != labels.shape:
        raise ValueError(f"mlm_loss needs logits [batch, seq, vocab] and labels [batch, seq], got "
                         f"{list(logits.shape)} and {list(labels.shape)}")
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1),
                                       ignore_index=IGNORE_INDEX)


def pretraining_loss(mlm_logits, nsp_logits, mlm_labels, nsp_labels) -> torch.Tensor:
    """BERT's pre-training loss: mlm_loss (mean over the selected positions) plus the NSP
    cross-entropy."""
    return mlm_loss(mlm_logits, mlm_labels) + nn.functional.cross_entropy(nsp_logits, nsp_labels)


def pretrain_step(model: BertForPreTraining, batch, vocab, mask_tokens, generator: torch.Generator | None,
                  optimizer: torch.optim.Optimizer, scheduler=None, max_grad_norm: float | None = None):
    """One pre-training update of a BertForPreTraining; returns (mlm_loss, nsp_loss) as floats.

    batch: (ids, segment_ids, padding_mask, nsp_labels), [batch, seq] three times and [batch].
    vocab: what the corruption needs, vocab.special_ids, vocab.mask_id and len(vocab) (a WordVocab).
    mask_tokens: the corruption, mask_tokens' signature (chapter 09 passes the learner's); it is
    called with `generator` on every step, so a batch seen twice gets a new mask each time
    (RoBERTa's dynamic masking).

    The order is chapter 07's train_step: corrupt, forward on the corrupted ids, the two losses
    (MLM over the selected positions only, NSP on every pair), clear the old gradients, backward
    on their sum, clip the gradient's norm (before the step, or it protects nothing), step the
    optimizer, then the scheduler.
    """
    ids, segment_ids, padding_mask, nsp_labels = batch
    inputs, labels = mask_tokens(ids, vocab.special_ids, vocab.mask_id, len(vocab), generator)
    mlm_logits, nsp_logits = model(inputs, segment_ids, padding_mask)  # [batch, seq, vocab], [batch, 2]
    mlm = mlm_loss(mlm_logits, labels)
    nsp = nn.functional.cross_entropy(nsp_logits, nsp_labels)
    optimizer.zero_grad(set_to_none=True)
    (mlm + nsp).backward()
    if max_grad_norm is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    optimizer.step()
    if scheduler is not None:
        scheduler.step()
    return mlm.item(), nsp.item()


# ---------------------------------------------------------------------------------------
# Fine-tuning heads: one small layer on top of the pre-trained encoder
# ---------------------------------------------------------------------------------------

def classify_from_cls(hidden: torch.Tensor, pooler: BertPooler, classifier: nn.Linear,
                      dropout: nn.Module | None = None) -> torch.Tensor:
    """Sentence logits from the encoder's final states: the pooler's dense layer and tanh on
    the state of [CLS] (position 0), then (dropout and) the classifier.
    hidden: [batch, seq, d_model] -> logits [batch, n_classes].

    Only [CLS] is read: attention has already mixed the whole input into it, and pre-training
    (NSP) taught the pooler to summarise the pair there. The same formula as BertPooler.
    """
    if hidden.dim() != 3:
        raise ValueError(f"classify_from_cls needs hidden states [batch, seq, d_model], got {list(hidden.shape)}")
    pooled = torch.tanh(pooler.dense(hidden[:, 0]))  # [batch, d_model]: the [CLS] state, pooled
    if dropout is not None:
        pooled = dropout(pooled)
    return classifier(pooled)  # [batch, n_classes]


class BertForSequenceClassification(nn.Module):
    """One label per input (sentiment, entailment...): dropout + linear on the pooled [CLS]
    (classify_from_cls). forward -> logits [batch, n_classes]."""

    def __init__(self, config: BertConfig, n_classes: int):
        super().__init__()
        self.bert = Bert(config)
        self.dropout = nn.Dropout(config.dropout)
        self.classifier = nn.Linear(config.d_model, n_classes)
        _init_bert_weights(self.classifier)

    def forward(self, ids, segment_ids=None, padding_mask=None):
        hidden, _ = self.bert(ids, segment_ids, padding_mask)
        return classify_from_cls(hidden, self.bert.pooler, self.classifier, self.dropout)  # [batch, n_classes]


class BertForTokenClassification(nn.Module):
    """One label per token (named entities, parts of speech): dropout + linear on every final
    state. forward -> logits [batch, seq, n_labels]."""

    def __init__(self, config: BertConfig, n_labels: int):
        super().__init__()
        self.bert = Bert(config)
        self.dropout = nn.Dropout(config.dropout)
        self.classifier = nn.Linear(config.d_model, n_labels)
        _init_bert_weights(self.classifier)

    def forward(self, ids, segment_ids=None, padding_mask=None):
        hidden, _ = self.bert(ids, segment_ids, padding_mask)
        return self.classifier(self.dropout(hidden))  # [batch, seq, n_labels]


class BertForQuestionAnswering(nn.Module):
    """Extractive QA (SQuAD): input [CLS] question [SEP] passage [SEP]; the answer is a span of
    the passage. Two learned vectors score every token as the answer's start and as its end:
    forward -> (start_logits [batch, seq], end_logits [batch, seq]); best_span picks the span."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.bert = Bert(config)
        self.qa = nn.Linear(config.d_model, 2)  # column 0: start score, column 1: end score
        _init_bert_weights(self.qa)

    def forward(self, ids, segment_ids=None, padding_mask=None):
        hidden, _ = self.bert(ids, segment_ids, padding_mask)
        start, end = self.qa(hidden).unbind(dim=-1)  # [batch, seq] each
        return start, end


def best_span(start_logits: torch.Tensor, end_logits: torch.Tensor, passage_mask: torch.Tensor,
              max_answer_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The answer span with the highest start_logits[s] + end_logits[e] among the allowed ones:
    s <= e, at most max_answer_len tokens (e - s + 1), s and e both in the passage.

    start_logits, end_logits: [batch, seq]; passage_mask: bool [batch, seq], True on passage
    tokens (segment B without its [SEP]). Returns (start, end), LongTensors [batch], inclusive.
    Taking the argmax of each separately could give end < start, or a span in the question.
    """
    if start_logits.shape != end_logits.shape or start_logits.shape != passage_mask.shape or start_logits.dim() != 2:
        raise ValueError(f"best_span needs start_logits, end_logits and passage_mask of one shape [batch, seq], got "
                         f"{list(start_logits.shape)}, {list(end_logits.shape)}, {list(passage_mask.shape)}")
    if isinstance(max_answer_len, bool) or not isinstance(max_answer_len, int) or max_answer_len < 1:
        raise ValueError(f"max_answer_len must be a positive int, got {max_answer_len!r}")
    if not passage_mask.any(dim=1).all():
        raise ValueError("every row of passage_mask needs at least one passage token")
    batch, seq = start_logits.shape
    scores = start_logits[:, :, None] + end_logits[:, None, :]  # [batch, seq (start), seq (end)]
    ones = torch.ones(seq, seq, dtype=torch.bool, device=scores.device)
    # end - start in 0 .. max_answer_len - 1: on or above the diagonal, within a band.
    allowed = ones.triu() & ~ones.triu(diagonal=max_answer_len)  # [seq, seq]
    allowed = allowed & passage_mask[:, :, None] & passage_mask[:, None, :]  # [batch, seq, seq]
    best = scores.masked_fill(~allowed, float("-inf")).view(batch, -1).argmax(dim=1)  # [batch]
    return best // seq, best % seq


# ---------------------------------------------------------------------------------------
# Practice data: chapter 01's apple sentences, labelled for pre-training and fine-tuning
# ---------------------------------------------------------------------------------------
# The sentences come from corpus.py's templates (the fruit and the company senses of "apple",
# 苹果), with the labels BERT's tasks need: which slot each word fills (token classification),
# the sense of the sentence (sentence classification), documents that keep to one sense (for
# next-sentence pairs), and questions whose answer is a word of a passage (span QA).

SPECIAL_TOKENS = ("[PAD]", "[CLS]", "[SEP]", "[MASK]")  # ids 0, 1, 2, 3
SENSES = ("fruit", "company")  # sense 0 and sense 1
TAGS = ("O", "FRUIT", "COMPANY")  # token labels: no entity, a fruit, a company
QUESTION_WORDS = ("which",)  # questions are "which fruit" and "which company"
_SLOT_TAG = {"fruit": "FRUIT", "company": "COMPANY"}


class WordVocab:
    """Words <-> ids: the special tokens first ([PAD] 0, [CLS] 1, [SEP] 2, [MASK] 3), then the
    words in alphabetical order. `apple_vocab()` builds the one that covers every apple sentence."""

    pad_id, cls_id, sep_id, mask_id = 0, 1, 2, 3

    def __init__(self, words: Sequence[str]):
        self.itos = list(SPECIAL_TOKENS) + sorted(set(words) - set(SPECIAL_TOKENS))
        self.stoi = {w: i for i, w in enumerate(self.itos)}

    def __len__(self) -> int:
        return len(self.itos)

    @property
    def special_ids(self) -> list[int]:
        return list(range(len(SPECIAL_TOKENS)))

    def encode(self, words: Sequence[str]) -> list[int]:
        unknown = [w for w in words if w not in self.stoi]
        if unknown:
            raise KeyError(f"words not in the vocabulary: {unknown[:5]}")
        return [self.stoi[w] for w in words]

    def decode(self, ids) -> list[str]:
        return [self.itos[int(i)] for i in ids]


def _templates(sense: int) -> list[str]:
    from .corpus import _COMPANY_TEMPLATES, _FRUIT_TEMPLATES

    if sense not in (0, 1):
        raise ValueError(f"sense must be 0 (fruit) or 1 (company), got {sense!r}")
    return _FRUIT_TEMPLATES if sense == 0 else _COMPANY_TEMPLATES


def apple_vocab() -> WordVocab:
    """The vocabulary of every apple sentence and question (the same on every machine)."""
    from .corpus import _PRODUCTS, _TASTES, COMPANIES, FRUITS

    words = [w for sense in (0, 1) for t in _templates(sense) for w in t.split() if not w.startswith("{")]
    return WordVocab(words + FRUITS + COMPANIES + _TASTES + _PRODUCTS + list(QUESTION_WORDS) + list(SENSES))


@dataclass
class SenseSentence:
    """One generated sentence: its words, a tag per word, its sense and its template."""

    words: list[str]
    tags: list[str]  # FRUIT / COMPANY on the words that fill a fruit / company slot, O elsewhere
    sense: int  # 0 fruit, 1 company
    template: int  # index of the template within its sense (0..9)


def apple_sentence(rng: random.Random, sense: int, template: int | None = None,
                   apple_share: float = 0.3) -> SenseSentence:
    """One sentence of the given sense. Each fruit (company) slot holds "apple" with probability
    apple_share, another fruit (company) otherwise; taste and product slots are drawn too."""
    from .corpus import _PRODUCTS, _TASTES, COMPANIES, FRUITS

    templates = _templates(sense)
    index = rng.randrange(len(templates)) if template is None else template
    fillers = FRUITS if sense == 0 else COMPANIES
    words, tags = [], []
    for word in templates[index].split():
        slot = word.strip("{}") if word.startswith("{") else None
        if slot in _SLOT_TAG:
            others = [f for f in fillers if f != "apple"]
            words.append("apple" if rng.random() < apple_share else rng.choice(others))
        elif slot == "taste":
            words.append(rng.choice(_TASTES))
        elif slot == "product":
            words.append(rng.choice(_PRODUCTS))
        else:
            words.append(word)
        tags.append(_SLOT_TAG.get(slot, "O"))
    return SenseSentence(words, tags, sense, index)


def sense_sentences(n: int, seed: int = 0, apple_share: float = 0.3,
                    templates: Sequence[int] | None = None) -> list[SenseSentence]:
    """n sentences, fruit and company in turn (as corpus.apple_corpus), from a seeded generator.
    templates: restrict both senses to these template indices (default: all ten)."""
    if not 0.0 <= apple_share <= 1.0:
        raise ValueError(f"apple_share must be in [0, 1], got {apple_share}")
    rng = random.Random(seed)
    pool = list(range(10)) if templates is None else list(templates)
    return [apple_sentence(rng, i % 2, rng.choice(pool), apple_share) for i in range(n)]


def sense_documents(n_documents: int, sentences_per_document: int = 3, seed: int = 0,
                    apple_share: float = 0.3) -> list[list[SenseSentence]]:
    """Short "documents" that keep to one sense: every other one about fruit, the rest about
    companies. Consecutive sentences share their topic and nothing else, as in a story."""
    rng = random.Random(seed)
    return [[apple_sentence(rng, d % 2, apple_share=apple_share) for _ in range(sentences_per_document)]
            for d in range(n_documents)]


def nsp_pairs(documents: Sequence[Sequence], n_pairs: int, seed: int = 0) -> list[tuple]:
    """BERT's sentence pairs for next-sentence prediction (Devlin et al., 2019, section 3.1, task 2).

    documents: a list of documents, each a list of at least two sentences (any objects: chapter
    09 passes lists of words). A is a sentence of a random document, never its last one; half the
    time B is the sentence after it (label 0, IsNext), otherwise a random sentence of a random
    *other* document (label 1, NotNext). Returns n_pairs tuples (a, b, label).

    All randomness comes from random.Random(seed), drawn in a fixed order for each pair: the
    document (randrange), the sentence A within it (randrange over all but the last), the coin
    (random() < 0.5 is IsNext), and for NotNext the other document (choice among the others)
    and its sentence (choice), so the same seed gives the same pairs.
    """
    if len(documents) < 2 or any(len(d) < 2 for d in documents):
        raise ValueError("nsp_pairs needs at least two documents of at least two sentences each")
    rng = random.Random(seed)
    pairs = []
    for _ in range(n_pairs):
        d = rng.randrange(len(documents))
        i = rng.randrange(len(documents[d]) - 1)  # A is never the last sentence: it must have a next one
        a = documents[d][i]
        if rng.random() < 0.5:
            pairs.append((a, documents[d][i + 1], 0))
        else:
            other = rng.choice([j for j in range(len(documents)) if j != d])  # never A's own document
            pairs.append((a, rng.choice(documents[other]), 1))
    return pairs


@dataclass
class QAExample:
    """A question, a passage, and the answer: the passage's words start..end (inclusive)."""

    question: list[str]
    passage: list[str]
    start: int
    end: int

    @property
    def answer(self) -> list[str]:
        return self.passage[self.start:self.end + 1]


def apple_qa(n: int, seed: int = 0, apple_share: float = 0.3) -> list[QAExample]:
    """Reading comprehension on apple sentences: the passage is a fruit sentence and a company
    sentence (in either order); the question is "which fruit" or "which company"; the answer is
    the word that fills that sense's slot, with its taste when one comes before it ("ripe apple"):
    one or two words. When both slots hold "apple", only the context says which is meant."""
    from .corpus import _TASTES

    rng = random.Random(seed)
    examples = []
    for _ in range(n):
        sentences = []
        for sense in (0, 1):  # templates with exactly one slot of their sense
            one_slot = [i for i, t in enumerate(_templates(sense)) if t.count("{" + SENSES[sense] + "}") == 1]
            sentences.append(apple_sentence(rng, sense, rng.choice(one_slot), apple_share))
        asked = rng.randrange(2)
        if rng.random() < 0.5:
            sentences.reverse()
        passage = sentences[0].words + sentences[1].words
        tags = sentences[0].tags + sentences[1].tags
        end = tags.index(_SLOT_TAG[SENSES[asked]])
        start = end - 1 if end > 0 and passage[end - 1] in _TASTES else end  # "a ripe apple": ripe apple
        examples.append(QAExample(["which", SENSES[asked]], passage, start, end))
    return examples


# ---------------------------------------------------------------------------------------
# Loading Hugging Face's weights
# ---------------------------------------------------------------------------------------

def _hf_bert_trunk(sd: dict, n_layers: int, prefix: str = "") -> dict:
    """Hugging Face BertModel names -> ours, for the embeddings, the layers and the pooler."""
    e = f"{prefix}embeddings."
    ours = {
        "embeddings.token.weight": sd[e + "word_embeddings.weight"],
        "embeddings.segment.weight": sd[e + "token_type_embeddings.weight"],
        "embeddings.positions.embedding.weight": sd[e + "position_embeddings.weight"],
        "embeddings.norm.gamma": sd[e + "LayerNorm.weight"],
        "embeddings.norm.beta": sd[e + "LayerNorm.bias"],
        "pooler.dense.weight": sd[f"{prefix}pooler.dense.weight"],
        "pooler.dense.bias": sd[f"{prefix}pooler.dense.bias"],
    }
    # Both store nn.Linear weights as [out, in]: names change, matrices do not.
    names = {
        "attention.self.query": "self_attn.w_q", "attention.self.key": "self_attn.w_k",
        "attention.self.value": "self_attn.w_v", "attention.output.dense": "self_attn.w_o",
        "intermediate.dense": "feed_forward.linear1", "output.dense": "feed_forward.linear2",
    }
    for i in range(n_layers):
        theirs, mine = f"{prefix}encoder.layer.{i}.", f"encoder.layers.{i}."
        for their_name, my_name in names.items():
            ours[f"{mine}{my_name}.weight"] = sd[f"{theirs}{their_name}.weight"]
            ours[f"{mine}{my_name}.bias"] = sd[f"{theirs}{their_name}.bias"]
        for their_norm, my_norm in (("attention.output.LayerNorm", "residual1.norm"), ("output.LayerNorm", "residual2.norm")):
            ours[f"{mine}{my_norm}.gamma"] = sd[f"{theirs}{their_norm}.weight"]
            ours[f"{mine}{my_norm}.beta"] = sd[f"{theirs}{their_norm}.bias"]
    if f"{prefix}encoder.layer.{n_layers}.output.dense.weight" in sd:
        raise ValueError(f"the state dict has more layers than the model's n_layers={n_layers}")
    return ours


def load_hf_bert_state_dict(model: Bert | BertForPreTraining, hf_state_dict: dict):
    """Copy a Hugging Face BertForPreTraining state dict (or a BertModel one, into a Bert) into
    `model`, in place. Only names change: Hugging Face's BERT uses nn.Linear too. Buffers such
    as position_ids are skipped; a missing or misshapen weight is an error."""
    if not isinstance(model, (Bert, BertForPreTraining)):
        raise TypeError(f"load_hf_bert_state_dict loads into Bert or BertForPreTraining, got {type(model).__name__}")
    sd = _StateDict(hf_state_dict, f"a Hugging Face {'BertForPreTraining' if isinstance(model, BertForPreTraining) else 'BERT'} "
                                   f"state dict with n_layers={model.config.n_layers}")
    if isinstance(model, BertForPreTraining):
        trunk = _hf_bert_trunk(sd, model.config.n_layers, prefix="bert.")
        ours = {f"bert.{k}": v for k, v in trunk.items()}
        t = "cls.predictions.transform."
        ours.update({
            "mlm.dense.weight": sd[t + "dense.weight"], "mlm.dense.bias": sd[t + "dense.bias"],
            "mlm.norm.gamma": sd[t + "LayerNorm.weight"], "mlm.norm.beta": sd[t + "LayerNorm.bias"],
            "mlm.decoder.weight": sd["bert.embeddings.word_embeddings.weight"],  # tied
            "mlm.bias": sd["cls.predictions.bias"],
            "nsp.weight": sd["cls.seq_relationship.weight"], "nsp.bias": sd["cls.seq_relationship.bias"],
        })
    else:
        prefix = "bert." if "bert.embeddings.word_embeddings.weight" in sd else ""
        ours = _hf_bert_trunk(sd, model.config.n_layers, prefix)
    model.load_state_dict({k: v.contiguous() for k, v in ours.items()}, strict=True)
    return model


def bert_config_from_hf(hf_config) -> BertConfig:
    """The BertConfig of a Hugging Face BertConfig (dropout: its hidden dropout)."""
    if getattr(hf_config, "hidden_act", "gelu") != "gelu":
        raise ValueError(f"the course's BERT uses the exact (erf) GELU, got {hf_config.hidden_act!r}")
    return BertConfig(vocab_size=hf_config.vocab_size, max_len=hf_config.max_position_embeddings,
                      n_segments=hf_config.type_vocab_size, d_model=hf_config.hidden_size,
                      n_heads=hf_config.num_attention_heads, n_layers=hf_config.num_hidden_layers,
                      d_ff=hf_config.intermediate_size, dropout=hf_config.hidden_dropout_prob,
                      layer_norm_eps=hf_config.layer_norm_eps)


__all__ = [
    "BertConfig", "IGNORE_INDEX", "build_pair_inputs", "special_tokens_mask", "mask_tokens", "embedding_sum",
    "BertEmbeddings", "BertLayer", "BertPooler", "Bert", "MLMHead", "BertForPreTraining", "mlm_loss",
    "pretraining_loss", "pretrain_step", "classify_from_cls",
    "BertForSequenceClassification", "BertForTokenClassification", "BertForQuestionAnswering", "best_span",
    "SPECIAL_TOKENS", "SENSES", "TAGS", "WordVocab", "apple_vocab", "SenseSentence", "apple_sentence",
    "sense_sentences", "sense_documents", "nsp_pairs", "QAExample", "apple_qa",
    "load_hf_bert_state_dict", "bert_config_from_hf",
]
