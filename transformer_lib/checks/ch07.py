"""Checkers for chapter 07, training and inference: the label-smoothed target distribution and
the loss over the real tokens, the warm-up learning rate (eq. 3 of the paper), the decoder's
teacher-forcing inputs, one training step, greedy decoding with the encoder run once and a
key/value cache, top-k filtering for sampling, and beam search (finished hypotheses kept, the
cache reordered with the beams, a GNMT length penalty at the end).

The training-step and decoding checkers run the learner's function on tiny seeded models that
the checker builds itself (in `invoke`), and return what can be compared outside the learner's
process: losses and every parameter tensor after two steps; tokens and counts of the work done
(encoder runs, decoder runs, positions fed to the decoder); for beam search, each sentence's best
output read up to its first eos.

References are the library's (transformer_lib.training, transformer_lib.decoding); each
checker knows the wrong answers learners often write, so a failure can name what went wrong.
"""

import re
import warnings
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from transformer_lib.decoding import (beam_search, gnmt_length_penalty, greedy_decode, reorder_cache, sequence_log_prob,
                                      top_k_filter)
from transformer_lib.layers import EncoderDecoder, TransformerConfig
from transformer_lib.masks import causal_mask, padding_mask
from transformer_lib.training import (Seq2SeqBatch, label_smoothed_loss, label_smoothed_targets,
                                      make_teacher_forcing_batch, noam_rate, noam_scheduler, prepare_batch, shift_right,
                                      train_step)

from .core import Case, Checker, Mistake, Property, describe_difference, randn, seeded


# ---------------------------------------------------------------------------------------
# Exercise 1: label_smoothed_targets(target, vocab_size, smoothing, pad_id) -> q [..., V]
# ---------------------------------------------------------------------------------------


def _smoothing_cases() -> list[Case]:
    g = seeded(701)
    random_targets = torch.randint(1, 9, (3, 5), generator=g)  # [3, 5], no pad yet
    random_targets[1, 3:] = 0  # padding at the end of the second sequence
    random_targets[2, 4] = 0
    return [
        Case("one sentence with padding, V = 6", (torch.tensor([3, 1, 4, 2, 0, 0]), 6, 0.2, 0)),
        Case("batch of 3, V = 9, smoothing 0.1", (random_targets, 9, 0.1, 0)),
        Case("pad id is not 0", (torch.tensor([[0, 2, 4, 1], [3, 0, 4, 4]]), 5, 0.3, 4)),
        Case("no smoothing: one-hot rows", (torch.tensor([1, 2, 0]), 4, 0.0, 0), hidden=True),
        Case("smallest vocabulary, V = 3", (torch.tensor([[1, 2], [2, 0]]), 3, 0.4, 0), hidden=True),
        Case("longer batch, V = 12", (torch.randint(0, 12, (2, 3, 4), generator=g), 12, 0.15, 0), hidden=True),
    ]


def _onehot(target, vocab_size):
    return torch.nn.functional.one_hot(target, vocab_size).float()


def _ls_spread_over_all(target, vocab_size, smoothing, pad_id):
    q = (1 - smoothing) * _onehot(target, vocab_size) + smoothing / vocab_size
    return q.masked_fill((target == pad_id).unsqueeze(-1), 0.0)


def _ls_pad_column_kept(target, vocab_size, smoothing, pad_id):
    q = torch.full((*target.shape, vocab_size), smoothing / (vocab_size - 2))
    q.scatter_(-1, target.unsqueeze(-1), 1 - smoothing)
    return q.masked_fill((target == pad_id).unsqueeze(-1), 0.0)


def _ls_over_v_minus_1(target, vocab_size, smoothing, pad_id):
    q = torch.full((*target.shape, vocab_size), smoothing / (vocab_size - 1))
    q.scatter_(-1, target.unsqueeze(-1), 1 - smoothing)
    q[..., pad_id] = 0.0
    return q.masked_fill((target == pad_id).unsqueeze(-1), 0.0)


def _ls_gold_gets_one(target, vocab_size, smoothing, pad_id):
    q = torch.full((*target.shape, vocab_size), smoothing / (vocab_size - 2))
    q.scatter_(-1, target.unsqueeze(-1), 1.0)
    q[..., pad_id] = 0.0
    return q.masked_fill((target == pad_id).unsqueeze(-1), 0.0)


def _ls_pad_rows_kept(target, vocab_size, smoothing, pad_id):
    q = torch.full((*target.shape, vocab_size), smoothing / (vocab_size - 2))
    q.scatter_(-1, target.unsqueeze(-1), 1 - smoothing)
    q[..., pad_id] = 0.0
    return q


def _ls_gold_and_rest_swapped(target, vocab_size, smoothing, pad_id):
    q = torch.full((*target.shape, vocab_size), (1 - smoothing) / (vocab_size - 2))
    q.scatter_(-1, target.unsqueeze(-1), smoothing)
    q[..., pad_id] = 0.0
    return q.masked_fill((target == pad_id).unsqueeze(-1), 0.0)


check_label_smoothed_targets = Checker(
    name="label_smoothed_targets",
    reference=label_smoothed_targets,
    make_cases=_smoothing_cases,
    mistakes=[
        Mistake(
            "smoothing spread over all V classes (smoothing / V everywhere, gold and <pad> included, "
            "as torch's label_smoothing= does)",
            "Give the gold class exactly 1 - smoothing and <pad> 0; share `smoothing` among the other "
            "V - 2 classes: smoothing / (vocab_size - 2) each.",
            _ls_spread_over_all,
        ),
        Mistake(
            "the <pad> column not zeroed: <pad> gets smoothing mass like any other class (rows sum to more than 1)",
            "<pad> is never a right answer: set q[..., pad_id] = 0 after filling.",
            _ls_pad_column_kept,
        ),
        Mistake(
            "smoothing divided by V - 1 instead of V - 2 (rows sum to less than 1)",
            "Two classes don't share the smoothing mass, the gold class and <pad>: divide by vocab_size - 2.",
            _ls_over_v_minus_1,
        ),
        Mistake(
            "gold class given 1 instead of 1 - smoothing (rows sum to more than 1)",
            "The confidence in the gold class is 1 - smoothing: the mass given to the others comes out of it.",
            _ls_gold_gets_one,
        ),
        Mistake(
            "rows whose target is <pad> not zeroed",
            "A padded position must not be trained at all: zero the whole row where target == pad_id.",
            _ls_pad_rows_kept,
        ),
        Mistake(
            "gold class and smoothing swapped (gold gets `smoothing`, the others share 1 - smoothing)",
            "The gold class keeps the large share, 1 - smoothing; the others share `smoothing`.",
            _ls_gold_and_rest_swapped,
        ),
    ],
)


# ---------------------------------------------------------------------------------------
# Exercise 2: noam_learning_rate(step, d_model, warmup) -> float
# ---------------------------------------------------------------------------------------


def _noam_cases() -> list[Case]:
    return [
        Case("the paper: step 1", (1, 512, 4000)),
        Case("the paper: middle of the warm-up", (2000, 512, 4000)),
        Case("the paper: the peak, step = warmup", (4000, 512, 4000)),
        Case("the paper: after the peak", (16000, 512, 4000)),
        Case("small model, early", (10, 64, 200)),
        Case("small model, late", (1000, 64, 200)),
        Case("warmup of 1 step", (5, 128, 1), hidden=True),
        Case("big model, long decay", (100_000, 1024, 4000), hidden=True),
        Case("one step before the peak", (399, 256, 400), hidden=True),
    ]


def _noam_no_d_model(step, d_model, warmup):
    return min(step ** -0.5, step * warmup ** -1.5)


def _noam_max(step, d_model, warmup):
    return d_model ** -0.5 * max(step ** -0.5, step * warmup ** -1.5)


def _noam_warmup_sqrt(step, d_model, warmup):
    return d_model ** -0.5 * min(step ** -0.5, step * warmup ** -0.5)


def _noam_times_sqrt_d_model(step, d_model, warmup):
    return d_model ** 0.5 * min(step ** -0.5, step * warmup ** -1.5)


def _noam_decay_one_over_step(step, d_model, warmup):
    return d_model ** -0.5 * min(step ** -1.0, step * warmup ** -2.0)


check_noam_learning_rate = Checker(
    name="noam_learning_rate",
    reference=noam_rate,
    make_cases=_noam_cases,
    rtol=1e-6,
    atol=1e-12,
    mistakes=[
        Mistake(
            "the d_model^-0.5 factor is missing",
            "Multiply by d_model ** -0.5: bigger models take smaller steps.",
            _noam_no_d_model,
        ),
        Mistake(
            "max instead of min",
            "Take the smaller of the two terms, min(step ** -0.5, step * warmup ** -1.5): the rate is the "
            "rising line before the peak and the falling curve after it.",
            _noam_max,
        ),
        Mistake(
            "warmup ** -0.5 instead of warmup ** -1.5 in the warm-up term",
            "The warm-up line is step * warmup ** -1.5, so that it meets step ** -0.5 exactly at step = warmup.",
            _noam_warmup_sqrt,
        ),
        Mistake(
            "multiplied by d_model ** 0.5 instead of d_model ** -0.5",
            "The exponent of d_model is negative: d_model ** -0.5 = 1 / sqrt(d_model).",
            _noam_times_sqrt_d_model,
        ),
        Mistake(
            "decay as 1 / step instead of 1 / sqrt(step)",
            "After the warm-up the rate decays as step ** -0.5 (the inverse square root), and the warm-up "
            "term is step * warmup ** -1.5.",
            _noam_decay_one_over_step,
        ),
    ],
)


# ---------------------------------------------------------------------------------------
# Exercise 3: teacher_forcing_inputs(tgt, bos_id) -> (decoder_input, target)
# ---------------------------------------------------------------------------------------


def _teacher_forcing_cases() -> list[Case]:
    g = seeded(703)
    # Ids: 0 pad, 1 bos, 2 eos, then real tokens.
    return [
        Case("one target '2021' + eos", (torch.tensor([[5, 3, 5, 4, 2]]), 1)),
        Case("batch of 2 with padding", (torch.tensor([[7, 8, 9, 2], [6, 2, 0, 0]]), 1)),
        Case("bos id 3", (torch.tensor([[4, 5, 6, 2, 0], [9, 8, 7, 6, 2]]), 3)),
        Case("random batch", (torch.randint(3, 20, (4, 7), generator=g), 1), hidden=True),
        Case("a single token", (torch.tensor([[2], [2]]), 1), hidden=True),
        Case("bos id 0", (torch.randint(1, 6, (3, 3), generator=g), 0), hidden=True),
    ]


def _tf_not_shifted(tgt, bos_id):
    return tgt.clone(), tgt


def _tf_as_if_bos_present(tgt, bos_id):
    return tgt[:, :-1], tgt[:, 1:]


def _tf_shifted_left(tgt, bos_id):
    bos = torch.full_like(tgt[:, :1], bos_id)
    return torch.cat([tgt[:, 1:], bos], dim=1), tgt


def _tf_last_token_kept(tgt, bos_id):
    bos = torch.full_like(tgt[:, :1], bos_id)
    return torch.cat([bos, tgt], dim=1), tgt


def _tf_swapped(tgt, bos_id):
    bos = torch.full_like(tgt[:, :1], bos_id)
    return tgt, torch.cat([bos, tgt[:, :-1]], dim=1)


def _tf_target_shifted_too(tgt, bos_id):
    bos = torch.full_like(tgt[:, :1], bos_id)
    shifted = torch.cat([bos, tgt[:, :-1]], dim=1)
    return shifted, shifted.clone()


check_teacher_forcing_inputs = Checker(
    name="teacher_forcing_inputs",
    reference=make_teacher_forcing_batch,
    make_cases=_teacher_forcing_cases,
    mistakes=[
        Mistake(
            "decoder input not shifted (it is the target itself, so each position sees the token it must predict)",
            "Shift right: decoder_input = [<bos>, tgt[:, :-1]] along dim 1; the target stays tgt.",
            _tf_not_shifted,
        ),
        Mistake(
            "treated tgt as if it already started with <bos> (returned tgt[:, :-1] and tgt[:, 1:])",
            "Here tgt has no <bos>: put <bos> in front yourself, torch.cat([bos_column, tgt[:, :-1]], dim=1), "
            "and return the whole tgt as the target.",
            _tf_as_if_bos_present,
        ),
        Mistake(
            "shifted the wrong way: tokens moved left and <bos> appended at the end",
            "<bos> goes first and everything moves one step to the right: torch.cat([bos_column, tgt[:, :-1]], dim=1).",
            _tf_shifted_left,
        ),
        Mistake(
            "the last token not dropped: the decoder input is one longer than the target",
            "Drop the last column after adding <bos>: torch.cat([bos_column, tgt[:, :-1]], dim=1) has tgt's length.",
            _tf_last_token_kept,
        ),
        Mistake(
            "decoder input and target swapped",
            "Return (decoder_input, target): first the shifted sequence starting with <bos>, then tgt itself.",
            _tf_swapped,
        ),
        Mistake(
            "the target shifted as well (both outputs start with <bos>)",
            "Only the decoder's input is shifted; the target is tgt unchanged, so position t learns to predict y_t.",
            _tf_target_shifted_too,
        ),
    ],
)


# ---------------------------------------------------------------------------------------
# Exercise 4: top_k_filter(logits, k) -> logits with all but the k largest of each row at -inf
# ---------------------------------------------------------------------------------------


def _top_k_cases() -> list[Case]:
    g = seeded(704)
    return [
        Case("one row of 6, k = 2", (torch.tensor([1.0, 3.0, -2.0, 0.5, 2.0, -1.0]), 2)),
        Case("batch of 3, V = 8, k = 3", (torch.randn(3, 8, generator=g), 3)),
        Case("k = 1 (greedy)", (torch.randn(2, 5, generator=g) * 3, 1)),
        Case("log-probabilities, two batch dims", (torch.log_softmax(torch.randn(2, 2, 7, generator=g), -1), 4), hidden=True),
        Case("float64, k = 5 of 10", (torch.randn(4, 10, generator=g, dtype=torch.float64), 5), hidden=True),
        Case("k = V - 1", (torch.randn(3, 6, generator=g), 5), hidden=True),
    ]


def _topk_smallest(logits, k):
    values, index = logits.topk(k, dim=-1, largest=False)
    return torch.full_like(logits, float("-inf")).scatter(-1, index, values)


def _topk_zero_fill(logits, k):
    values, index = logits.topk(k, dim=-1)
    return torch.zeros_like(logits).scatter(-1, index, values)


def _topk_k_plus_one(logits, k):
    values, index = logits.topk(min(k + 1, logits.shape[-1]), dim=-1)
    return torch.full_like(logits, float("-inf")).scatter(-1, index, values)


def _topk_returns_values(logits, k):
    return logits.topk(k, dim=-1).values


def _topk_wrong_dim(logits, k):
    kth = logits.topk(min(k, logits.shape[0]), dim=0).values[-1:]  # k-th largest down each column
    return logits.masked_fill(logits < kth, float("-inf"))


def _topk_large_negative(logits, k):
    values, index = logits.topk(k, dim=-1)
    return torch.full_like(logits, -1e9).scatter(-1, index, values)


check_top_k_filter = Checker(
    name="top_k_filter",
    reference=top_k_filter,
    make_cases=_top_k_cases,
    mistakes=[
        Mistake(
            "kept the k smallest logits instead of the k largest",
            "Keep the k most probable tokens: logits.topk(k, dim=-1) (largest=True is the default).",
            _topk_smallest,
        ),
        Mistake(
            "the filtered logits set to 0 instead of -inf (exp(0) = 1: they can still be sampled)",
            "Fill the removed entries with float('-inf'), so that softmax gives them probability exactly 0.",
            _topk_zero_fill,
        ),
        Mistake(
            "kept k + 1 logits (off by one)",
            "Exactly k entries survive in each row: logits.topk(k, dim=-1).",
            _topk_k_plus_one,
        ),
        Mistake(
            "returned only the k largest values ([..., k]) instead of a filtered [..., vocab] tensor",
            "Keep the vocabulary's shape: start from torch.full_like(logits, float('-inf')) and scatter the top-k "
            "values back to their indices along dim=-1.",
            _topk_returns_values,
        ),
        Mistake(
            "top-k taken over the batch dimension (dim=0) instead of over the vocabulary",
            "Each row is one distribution: take topk over dim=-1.",
            _topk_wrong_dim,
        ),
        Mistake(
            "the filtered logits set to -1e9 instead of -inf",
            "Use float('-inf'): then the filtered tokens have probability exactly 0, whatever the temperature.",
            _topk_large_negative,
        ),
    ],
)


CHECKERS = [check_label_smoothed_targets, check_noam_learning_rate, check_teacher_forcing_inputs, check_top_k_filter]


# ---------------------------------------------------------------------------------------
# Tiny seeded models: the training-step and decoding checkers build one per case
# ---------------------------------------------------------------------------------------

TINY_VOCAB = 10  # <pad> 0, <bos> 1, <eos> 2 (unless a case says otherwise), tokens 3..9


@dataclass(frozen=True)
class TinyModel:
    """Which tiny encoder-decoder a case runs on. The checker builds it (seeded, float64,
    no dropout), so the learner's kernel and the grader build exactly the same weights."""

    seed: int
    layers: int = 2

    def __repr__(self) -> str:
        return f"tiny model #{self.seed} ({self.layers} layers)"

    def build(self) -> EncoderDecoder:
        config = TransformerConfig(src_vocab=TINY_VOCAB, tgt_vocab=TINY_VOCAB, d_model=16, n_heads=2, d_ff=32,
                                   n_layers=self.layers, dropout=0.0, max_len=32)
        # A forked RNG: building the model must not move the notebook's own random state.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            model = EncoderDecoder(config)
        return model.double()


# ---------------------------------------------------------------------------------------
# Exercise 5: label_smoothed_loss(log_probs, target, smoothing, pad_id) -> scalar tensor
# ---------------------------------------------------------------------------------------


def _log_probs(g, *shape, dtype=torch.float32):
    return torch.log_softmax(randn(g, *shape, dtype=torch.float64, scale=2.0), dim=-1).to(dtype)


def _loss_cases() -> list[Case]:
    g = seeded(705)
    batch_target = torch.randint(1, 7, (2, 5), generator=g)  # [2, 5]
    batch_target[0, 3:] = 0  # the first sentence is shorter: two padded positions
    pad_last = torch.tensor([[5, 1, 2, 3], [2, 3, 5, 5]])  # pad id 5 (the last class)
    long_target = torch.randint(1, 9, (3, 6), generator=g)  # [3, 6]
    long_target[1, 2:] = 0
    long_target[2, 5:] = 0
    return [
        Case("one sentence of 4, two padded, V = 6", (_log_probs(g, 4, 6), torch.tensor([3, 1, 0, 0]), 0.2, 0)),
        Case("batch of 2 sentences, V = 7", (_log_probs(g, 2, 5, 7), batch_target, 0.1, 0)),
        Case("pad id 5, float64", (_log_probs(g, 2, 4, 6, dtype=torch.float64), pad_last, 0.3, 5)),
        Case("no smoothing", (_log_probs(g, 2, 5, 7), batch_target.flip(1), 0.0, 0), hidden=True),
        Case("mostly padding, V = 9", (_log_probs(g, 3, 6, 9), long_target, 0.15, 0), hidden=True),
        Case("no padding at all", (_log_probs(g, 2, 3, 5, dtype=torch.float64), torch.tensor([[1, 2, 3], [4, 3, 2]]),
                                   0.25, 0), hidden=True),
    ]


def _per_position(log_probs, target, smoothing, pad_id):
    q = label_smoothed_targets(target, log_probs.shape[-1], smoothing, pad_id, log_probs.dtype)  # [..., V]
    return q, -(q * log_probs).sum(-1)  # [...]


def _loss_mean_with_pad(log_probs, target, smoothing, pad_id):
    return _per_position(log_probs, target, smoothing, pad_id)[1].mean()


def _loss_summed(log_probs, target, smoothing, pad_id):
    return _per_position(log_probs, target, smoothing, pad_id)[1].sum()


def _loss_sign_flipped(log_probs, target, smoothing, pad_id):
    return -label_smoothed_loss(log_probs, target, smoothing, pad_id)


def _loss_mean_over_vocab(log_probs, target, smoothing, pad_id):
    return label_smoothed_loss(log_probs, target, smoothing, pad_id) / log_probs.shape[-1]


def _loss_kl(log_probs, target, smoothing, pad_id):
    q, per_position = _per_position(log_probs, target, smoothing, pad_id)
    entropy = -torch.where(q > 0, q * q.log(), 0.0).sum(-1)  # [...]
    return (per_position - entropy).sum() / (target != pad_id).sum()


def _loss_unsmoothed(log_probs, target, smoothing, pad_id):
    return F.nll_loss(log_probs.reshape(-1, log_probs.shape[-1]), target.reshape(-1), ignore_index=pad_id)


def _loss_torch_smoothing(log_probs, target, smoothing, pad_id):
    return F.cross_entropy(log_probs.reshape(-1, log_probs.shape[-1]), target.reshape(-1), ignore_index=pad_id,
                           label_smoothing=smoothing)


def _negative_loss(case, expected, actual):
    return float(expected) > 0 and float(actual) < 0


check_label_smoothed_loss = Checker(
    name="label_smoothed_loss",
    reference=label_smoothed_loss,
    make_cases=_loss_cases,
    mistakes=[
        Mistake(
            "averaged over every position, padded ones included (padding dilutes the loss)",
            "Divide the sum over positions by the number of real target tokens, (target != pad_id).sum(), "
            "not by target.numel(): a padded position is not a token.",
            _loss_mean_with_pad,
        ),
        Mistake(
            "summed over the positions instead of averaged",
            "Divide the sum by the number of real target tokens, (target != pad_id).sum(), so the loss does not "
            "grow with the batch size.",
            _loss_summed,
        ),
        Mistake(
            "the sign flipped: sum of q * log p without the minus",
            "The cross-entropy is -sum_v q_v log p_v: log-probabilities are negative, the loss is positive.",
            _loss_sign_flipped,
        ),
        Mistake(
            "averaged over the vocabulary as well (mean instead of sum over the last dim)",
            "Sum q * log p over the vocabulary (dim=-1); average only over the real target positions.",
            _loss_mean_over_vocab,
        ),
        Mistake(
            "the KL divergence KL(q || p) instead of the cross-entropy H(q, p)",
            "This exercise asks for H(q, p) = -sum_v q_v log p_v; the KL divergence subtracts the constant H(q) "
            "(same gradients, different value).",
            _loss_kl,
        ),
        Mistake(
            "smoothing ignored: the plain cross-entropy of the gold token",
            "Use the smoothed distribution q = label_smoothed_targets(target, V, smoothing, pad_id), "
            "not the one-hot target.",
            _loss_unsmoothed,
        ),
        Mistake(
            "PyTorch's label_smoothing= (smoothing / V over every class, <pad> and the gold one included)",
            "Build q with label_smoothed_targets: 1 - smoothing on the gold token, 0 on <pad>, smoothing / (V - 2) "
            "on the others.",
            _loss_torch_smoothing,
        ),
    ],
    properties=[
        Property("a negative loss", "A cross-entropy is never negative: -sum_v q_v log p_v, with the minus sign.",
                 _negative_loss),
    ],
)


# ---------------------------------------------------------------------------------------
# Exercise 6: train_step(model, batch, loss_fn, optimizer, scheduler, max_norm) -> float
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TrainingRun:
    """Two training steps on a tiny model: which model, optimiser, and clipping threshold."""

    model: TinyModel
    optimizer: str = "sgd"  # "sgd" (with momentum) or "adam"
    max_norm: float = 0.5

    def __repr__(self) -> str:
        return f"{self.model!r}, {self.optimizer}, max_norm={self.max_norm}"


def _tiny_batches(seed: int) -> list[Seq2SeqBatch]:
    """Two padded (src, tgt) batches of the tiny vocabulary, as prepare_batch makes them."""
    g = seeded(seed)
    batches = []
    for _ in range(2):
        src = torch.randint(3, TINY_VOCAB, (4, 6), generator=g)  # [4, 6]
        src[1, 4:], src[3, 2:] = 0, 0
        tgt = torch.randint(3, TINY_VOCAB, (4, 5), generator=g)  # [4, 5]
        lengths = torch.tensor([5, 3, 4, 2])
        tgt[torch.arange(4), lengths - 1] = 2  # <eos> ends each target
        tgt[torch.arange(5) >= lengths[:, None]] = 0  # then <pad>
        # shift_right, not make_teacher_forcing_batch (exercise 3's reference, hidden while the grader runs
        # the chapter); prepare_batch then puts <pad> where the target is <pad>, as that function does.
        batches.append(prepare_batch(src, tgt, bos_id=1, pad_id=0,
                                     teacher_forcing=lambda tgt, bos_id: (shift_right(tgt, bos_id), tgt)))
    return batches


def _digest(model) -> dict:
    # Every parameter, by name: a step that updates only some of them (an encoder left out of the
    # graph, gradients dropped for part of the model) must fail, and the message names the tensor.
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def _training_setup(run: TrainingRun):
    model = run.model.build()
    if run.optimizer == "sgd":
        optimizer = torch.optim.SGD(model.parameters(), lr=1.0, momentum=0.9)
    else:
        optimizer = torch.optim.Adam(model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9)
    # A warm-up schedule: the rate changes at every step, so a missed scheduler step shows.
    scheduler = noam_scheduler(optimizer, d_model=16, warmup=4, factor=2.0, rate_fn=_warm_up_rate)
    return model, optimizer, scheduler, _cross_entropy


# The grader runs the whole chapter with every exercise's reference hidden, so the cases' schedule
# and loss do without noam_rate, label_smoothed_targets and label_smoothed_loss.

def _warm_up_rate(step: int, d_model: int, warmup: int) -> float:
    """Eq. 3 while warming up, step * d_model^-0.5 * warmup^-1.5; the cases' two steps never leave it."""
    return step / (d_model ** 0.5 * warmup ** 1.5)


def _cross_entropy(log_probs: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The cases' loss: cross-entropy over the real (non-<pad>) targets, without smoothing."""
    return F.nll_loss(log_probs.flatten(0, -2), target.flatten(), ignore_index=0)


def _invoke_train_step(fn, case: Case):
    run = case.args[0]
    model, optimizer, scheduler, loss_fn = _training_setup(run)
    out = {}
    # Checkers run under no_grad; a training step needs gradients. PyTorch's warning about the
    # scheduler stepped first would otherwise print whenever that catalogued mistake is tried.
    with torch.enable_grad(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=re.escape("Detected call of `lr_scheduler.step()` before"))
        for step, batch in enumerate(_tiny_batches(700 + run.model.seed), start=1):
            loss = fn(model, batch, loss_fn, optimizer, scheduler, run.max_norm)
            out[f"loss of step {step}"] = loss.detach() if isinstance(loss, torch.Tensor) else loss
            out[f"parameters after step {step}"] = _digest(model)
    out["learning rate after step 2"] = optimizer.param_groups[0]["lr"]
    return out


def _train_cases() -> list[Case]:
    return [
        Case("two SGD steps, clipping at 0.5", (TrainingRun(TinyModel(1)),)),
        Case("two SGD steps, another model", (TrainingRun(TinyModel(2, layers=1), max_norm=0.2),)),
        Case("two Adam steps", (TrainingRun(TinyModel(3), "adam", 1.0),), hidden=True),
        Case("two SGD steps, clipping at 0.05", (TrainingRun(TinyModel(4), max_norm=0.05),), hidden=True),
    ]


def _step_no_zero_grad(model, batch, loss_fn, optimizer, scheduler, max_norm):
    loss = loss_fn(model(batch.src, batch.decoder_input, batch.src_mask, batch.tgt_mask), batch.target)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    optimizer.step()
    scheduler.step()
    return loss.item()


def _step_clip_after_step(model, batch, loss_fn, optimizer, scheduler, max_norm):
    optimizer.zero_grad()
    loss = loss_fn(model(batch.src, batch.decoder_input, batch.src_mask, batch.tgt_mask), batch.target)
    loss.backward()
    optimizer.step()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scheduler.step()
    return loss.item()


def _step_no_scheduler(model, batch, loss_fn, optimizer, scheduler, max_norm):
    optimizer.zero_grad()
    loss = loss_fn(model(batch.src, batch.decoder_input, batch.src_mask, batch.tgt_mask), batch.target)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    optimizer.step()
    return loss.item()


def _step_scheduler_first(model, batch, loss_fn, optimizer, scheduler, max_norm):
    optimizer.zero_grad()
    loss = loss_fn(model(batch.src, batch.decoder_input, batch.src_mask, batch.tgt_mask), batch.target)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scheduler.step()
    optimizer.step()
    return loss.item()


def _step_not_shifted(model, batch, loss_fn, optimizer, scheduler, max_norm):
    optimizer.zero_grad()
    loss = loss_fn(model(batch.src, batch.target, batch.src_mask, batch.tgt_mask), batch.target)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    optimizer.step()
    scheduler.step()
    return loss.item()


def _step_no_tgt_mask(model, batch, loss_fn, optimizer, scheduler, max_norm):
    optimizer.zero_grad()
    loss = loss_fn(model(batch.src, batch.decoder_input, batch.src_mask), batch.target)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    optimizer.step()
    scheduler.step()
    return loss.item()


def _step_zero_grad_before_step(model, batch, loss_fn, optimizer, scheduler, max_norm):
    loss = loss_fn(model(batch.src, batch.decoder_input, batch.src_mask, batch.tgt_mask), batch.target)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    optimizer.zero_grad()
    optimizer.step()
    scheduler.step()
    return loss.item()


def _step_encoder_without_gradients(model, batch, loss_fn, optimizer, scheduler, max_norm):
    optimizer.zero_grad()
    with torch.no_grad():  # "encode once", as in decoding: but now the encoder never learns
        memory = model.encode(batch.src, batch.src_mask)
    log_probs = model.generator(model.decode(memory, batch.src_mask, batch.decoder_input, batch.tgt_mask))
    loss = loss_fn(log_probs, batch.target)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    optimizer.step()
    scheduler.step()
    return loss.item()


def _unchanged(case, actual) -> set[str]:
    """Names of the parameters that are, after two steps, exactly what the model started with."""
    initial = _digest(case.args[0].model.build())
    after = actual["parameters after step 2"]
    return {name for name in initial if torch.equal(initial[name], after[name])}


def _params_never_moved(case, expected, actual):
    return _unchanged(case, actual) == set(_digest(case.args[0].model.build()))


def _some_params_never_moved(case, expected, actual):
    left_behind = _unchanged(case, actual) - _unchanged(case, expected)  # the reference moves them
    return bool(left_behind) and not _params_never_moved(case, expected, actual)


def _first_step_right_second_wrong(case, expected, actual):
    first_ok = describe_difference(expected["parameters after step 1"], actual["parameters after step 1"]) is None
    second_ok = describe_difference(expected["parameters after step 2"], actual["parameters after step 2"]) is None
    return first_ok and not second_ok


def _loss_right_update_wrong(case, expected, actual):
    loss_ok = describe_difference(expected["loss of step 1"], actual["loss of step 1"]) is None
    params_ok = describe_difference(expected["parameters after step 1"], actual["parameters after step 1"]) is None
    return loss_ok and not params_ok


check_train_step = Checker(
    name="train_step",
    reference=train_step,
    make_cases=_train_cases,
    invoke=_invoke_train_step,
    mistakes=[
        Mistake(
            "no optimizer.zero_grad(): the second step's gradients are added to the first step's",
            "PyTorch accumulates gradients in .grad: call optimizer.zero_grad() at the start of every step.",
            _step_no_zero_grad,
        ),
        Mistake(
            "the gradient clipped after optimizer.step() (so the step used the unclipped gradient)",
            "Clip between loss.backward() and optimizer.step(): "
            "torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm).",
            _step_clip_after_step,
        ),
        Mistake(
            "the scheduler never stepped: the learning rate stays at its first value",
            "Call scheduler.step() once per training step, after optimizer.step().",
            _step_no_scheduler,
        ),
        Mistake(
            "scheduler.step() called before optimizer.step(): every step uses the next step's learning rate",
            "Step the optimizer first, then the scheduler: scheduler.step() sets the rate for the next step.",
            _step_scheduler_first,
        ),
        Mistake(
            "the decoder reads the target instead of the shifted input (it sees the token it must predict)",
            "Feed batch.decoder_input (<bos> + the target shifted right) to the model and compare its output "
            "with batch.target.",
            _step_not_shifted,
        ),
        Mistake(
            "the decoder's mask not passed: every position sees the future tokens",
            "Call model(batch.src, batch.decoder_input, batch.src_mask, batch.tgt_mask): tgt_mask is the causal "
            "and padding mask.",
            _step_no_tgt_mask,
        ),
        Mistake(
            "optimizer.zero_grad() between loss.backward() and optimizer.step(): the gradients are erased "
            "before they are used",
            "Clear the gradients at the start of the step, before the forward pass, never between backward() "
            "and step().",
            _step_zero_grad_before_step,
        ),
        Mistake(
            "the encoder never learns: the memory is computed without gradients (under torch.no_grad())",
            "Encoding once is for decoding, not for training: run the whole model with gradients, "
            "model(batch.src, batch.decoder_input, batch.src_mask, batch.tgt_mask), so that loss.backward() "
            "reaches the encoder's weights too.",
            _step_encoder_without_gradients,
        ),
    ],
    properties=[
        Property(
            "parameters that never changed",
            "The step must update the weights: loss.backward() fills .grad, optimizer.step() uses it; nothing "
            "may clear the gradients in between.",
            _params_never_moved,
        ),
        Property(
            "some parameters that never changed, where the reference's step changes them",
            "Every weight of the model must take part in the update: compute the loss from the full forward "
            "pass with gradients (no torch.no_grad(), no .detach()), and leave every .grad that backward() "
            "filled in place until optimizer.step().",
            _some_params_never_moved,
        ),
        Property(
            "a first step that matches and a second that does not",
            "Something carries over wrongly from one step to the next: clear the old gradients "
            "(optimizer.zero_grad()) and step the scheduler once per step, after the optimizer.",
            _first_step_right_second_wrong,
        ),
        Property(
            "the right loss but the wrong update",
            "The forward pass and the loss are right; check the order: zero_grad, forward, loss, backward, "
            "clip_grad_norm_, optimizer.step(), scheduler.step().",
            _loss_right_update_wrong,
        ),
    ],
)


# ---------------------------------------------------------------------------------------
# Exercise 7: greedy_decode(model, src, src_mask, max_len, bos_id, eos_id) with a KV cache
# ---------------------------------------------------------------------------------------


class _WorkCounter:
    """Counts, with forward hooks on a real model, how often the encoder runs, how often the
    decoder runs, and how many token positions it is fed in all."""

    def __init__(self, model):
        self.counts = {"encoder runs": 0, "decoder runs": 0, "positions fed to the decoder": 0}
        self.hooks = [model.encoder.register_forward_hook(self._encoder),
                      model.decoder.register_forward_pre_hook(self._decoder)]

    def _encoder(self, module, args, output):
        self.counts["encoder runs"] += 1

    def _decoder(self, module, args):
        self.counts["decoder runs"] += 1
        self.counts["positions fed to the decoder"] += args[0].shape[1]  # x: [batch, new positions, d_model]

    def remove(self):
        for hook in self.hooks:
            hook.remove()


def _invoke_decode(fn, case: Case):
    tiny, *rest = case.args
    model = tiny.build().eval()
    counter = _WorkCounter(model)
    try:
        tokens = fn(model, *rest, **case.kwargs)
    finally:
        counter.remove()
    return tokens, counter.counts


def _decode_cases() -> list[Case]:
    cases = []
    for name, seed, layers, batch, max_len, eos, hidden in _DECODE_CASES:
        g = seeded(1000 + 10 * seed + batch)
        src = torch.randint(3, TINY_VOCAB, (batch, 6), generator=g)  # [batch, 6]
        if batch > 1:
            src[1, 4:] = 0  # the second sentence is shorter: two padded positions
        cases.append(Case(name, (TinyModel(seed, layers), src, padding_mask(src, 0), max_len, 1, eos), hidden=hidden))
    return cases


# (name, model seed, layers, batch, max_len, eos id, hidden). An untrained model writes some
# tokens more than others; the eos id decides where each row stops. These are chosen so that
# rows stop at different steps, some before max_len and some never.
_DECODE_CASES = [
    ("3 sentences, finished after 4, 2 and 3 tokens", 11, 2, 3, 7, 8, False),
    ("4 sentences, the first never finishes", 12, 1, 4, 5, 5, False),
    ("4 sentences, finished after 1, 2, 3 and 6 tokens", 21, 2, 4, 7, 7, True),
    ("4 sentences, 1 layer", 14, 1, 4, 7, 4, True),
    ("one sentence", 5, 2, 1, 6, 3, True),
]


def _decode_rerun_encoder(model, src, src_mask, max_len, bos_id, eos_id):
    cache = model.new_cache()
    tokens = torch.full((src.shape[0], 1), bos_id, dtype=torch.long)
    finished = torch.zeros(src.shape[0], dtype=torch.bool)
    for _ in range(max_len):
        memory = model.encode(src, src_mask)
        hidden = model.decode(memory, src_mask, tokens[:, -1:], cache=cache)
        next_token = model.generator(hidden[:, -1]).argmax(-1).masked_fill(finished, eos_id)
        tokens = torch.cat([tokens, next_token[:, None]], dim=1)
        finished |= next_token == eos_id
        if finished.all():
            break
    return tokens


def _decode_no_cache(model, src, src_mask, max_len, bos_id, eos_id):
    memory = model.encode(src, src_mask)
    tokens = torch.full((src.shape[0], 1), bos_id, dtype=torch.long)
    finished = torch.zeros(src.shape[0], dtype=torch.bool)
    for _ in range(max_len):
        hidden = model.decode(memory, src_mask, tokens, causal_mask(tokens.shape[1]))
        next_token = model.generator(hidden[:, -1]).argmax(-1).masked_fill(finished, eos_id)
        tokens = torch.cat([tokens, next_token[:, None]], dim=1)
        finished |= next_token == eos_id
        if finished.all():
            break
    return tokens


def _decode_full_model(model, src, src_mask, max_len, bos_id, eos_id):
    tokens = torch.full((src.shape[0], 1), bos_id, dtype=torch.long)
    finished = torch.zeros(src.shape[0], dtype=torch.bool)
    for _ in range(max_len):
        log_probs = model(src, tokens, src_mask, causal_mask(tokens.shape[1]))  # [batch, t, V]
        next_token = log_probs[:, -1].argmax(-1).masked_fill(finished, eos_id)
        tokens = torch.cat([tokens, next_token[:, None]], dim=1)
        finished |= next_token == eos_id
        if finished.all():
            break
    return tokens


def _decode_prefix_with_cache(model, src, src_mask, max_len, bos_id, eos_id):
    memory = model.encode(src, src_mask)
    cache = model.new_cache()
    tokens = torch.full((src.shape[0], 1), bos_id, dtype=torch.long)
    finished = torch.zeros(src.shape[0], dtype=torch.bool)
    for _ in range(max_len):
        hidden = model.decode(memory, src_mask, tokens, cache=cache)  # the whole prefix, on top of the cache
        next_token = model.generator(hidden[:, -1]).argmax(-1).masked_fill(finished, eos_id)
        tokens = torch.cat([tokens, next_token[:, None]], dim=1)
        finished |= next_token == eos_id
        if finished.all():
            break
    return tokens


def _decode_after_eos(model, src, src_mask, max_len, bos_id, eos_id):
    memory = model.encode(src, src_mask)
    cache = model.new_cache()
    tokens = torch.full((src.shape[0], 1), bos_id, dtype=torch.long)
    finished = torch.zeros(src.shape[0], dtype=torch.bool)
    for _ in range(max_len):
        hidden = model.decode(memory, src_mask, tokens[:, -1:], cache=cache)
        next_token = model.generator(hidden[:, -1]).argmax(-1)  # finished rows go on writing
        tokens = torch.cat([tokens, next_token[:, None]], dim=1)
        finished |= next_token == eos_id
        if finished.all():
            break
    return tokens


def _decode_one_late(model, src, src_mask, max_len, bos_id, eos_id):
    memory = model.encode(src, src_mask)
    cache = model.new_cache()
    tokens = torch.full((src.shape[0], 1), bos_id, dtype=torch.long)
    for _ in range(max_len):
        finished = (tokens == eos_id).any(dim=1)  # looked at before this step's token exists
        hidden = model.decode(memory, src_mask, tokens[:, -1:], cache=cache)
        next_token = model.generator(hidden[:, -1]).argmax(-1).masked_fill(finished, eos_id)
        tokens = torch.cat([tokens, next_token[:, None]], dim=1)
        if finished.all():
            break
    return tokens


def _decode_never_stops(model, src, src_mask, max_len, bos_id, eos_id):
    memory = model.encode(src, src_mask)
    cache = model.new_cache()
    tokens = torch.full((src.shape[0], 1), bos_id, dtype=torch.long)
    finished = torch.zeros(src.shape[0], dtype=torch.bool)
    for _ in range(max_len):
        hidden = model.decode(memory, src_mask, tokens[:, -1:], cache=cache)
        next_token = model.generator(hidden[:, -1]).argmax(-1).masked_fill(finished, eos_id)
        tokens = torch.cat([tokens, next_token[:, None]], dim=1)
        finished |= next_token == eos_id
    return tokens


def _decode_argmax_positions(model, src, src_mask, max_len, bos_id, eos_id):
    memory = model.encode(src, src_mask)
    cache = model.new_cache()
    tokens = torch.full((src.shape[0], 1), bos_id, dtype=torch.long)
    finished = torch.zeros(src.shape[0], dtype=torch.bool)
    for _ in range(max_len):
        log_probs = model.generator(model.decode(memory, src_mask, tokens[:, -1:], cache=cache))  # [batch, 1, V]
        next_token = log_probs.argmax(dim=1)[:, -1].masked_fill(finished, eos_id)  # over the positions
        tokens = torch.cat([tokens, next_token[:, None]], dim=1)
        finished |= next_token == eos_id
        if finished.all():
            break
    return tokens


def _decode_without_bos(model, src, src_mask, max_len, bos_id, eos_id):
    return greedy_decode(model, src, src_mask, max_len, bos_id, eos_id)[:, 1:]


def _encoder_ran_again(case, expected, actual):
    return actual[1]["encoder runs"] > 1


def _prefix_re_decoded(case, expected, actual):
    counts = actual[1]
    return counts["positions fed to the decoder"] > counts["decoder runs"]


def _tokens_after_eos(case, expected, actual):
    tokens, eos_id = actual[0], case.args[5]
    is_eos = tokens == eos_id
    after = (is_eos.long().cumsum(dim=1) - is_eos.long()) > 0  # strictly after a row's first eos
    return bool((after & ~is_eos).any())


def _no_bos_first(case, expected, actual):
    tokens, bos_id = actual[0], case.args[4]
    return bool((tokens[:, 0] != bos_id).any())


check_greedy_decode = Checker(
    name="greedy_decode",
    reference=greedy_decode,
    make_cases=_decode_cases,
    invoke=_invoke_decode,
    mistakes=[
        Mistake(
            "the encoder re-run at every step",
            "The source does not change while you decode: compute memory = model.encode(src, src_mask) once, "
            "before the loop.",
            _decode_rerun_encoder,
        ),
        Mistake(
            "no cache: the whole prefix re-decoded at every step",
            "Make cache = model.new_cache() before the loop and feed only the newest token, "
            "model.decode(memory, src_mask, tokens[:, -1:], cache=cache).",
            _decode_no_cache,
        ),
        Mistake(
            "the full model called at every step (source re-encoded and prefix re-decoded)",
            "Encode once before the loop, then call model.decode on the newest token with a cache "
            "and model.generator on its output.",
            _decode_full_model,
        ),
        Mistake(
            "the whole prefix fed on top of the cache (its keys and values are cached twice)",
            "With a cache, feed only the newest token, tokens[:, -1:]: the earlier ones are already in the cache.",
            _decode_prefix_with_cache,
        ),
        Mistake(
            "finished sequences keep generating after their <eos>",
            "Keep a `finished` flag per row and replace the next token of finished rows by eos_id: "
            "next_token.masked_fill(finished, eos_id).",
            _decode_after_eos,
        ),
        Mistake(
            "stops one step late: `finished` is computed before the newest token is added",
            "Update finished with the token just chosen, finished |= next_token == eos_id, and stop as soon "
            "as finished.all().",
            _decode_one_late,
        ),
        Mistake(
            "never stops early: always max_len steps, even when every sequence has finished",
            "Break out of the loop as soon as every row has produced eos_id: if finished.all(): break.",
            _decode_never_stops,
        ),
        Mistake(
            "argmax over the positions (dim=1) instead of over the vocabulary",
            "The generator's output is [batch, 1, V]: take the argmax over the vocabulary, dim=-1, "
            "at the last position.",
            _decode_argmax_positions,
        ),
        Mistake(
            "the output does not start with <bos>",
            "Return the whole token tensor, <bos> first: [batch, 1 + steps].",
            _decode_without_bos,
        ),
    ],
    properties=[
        Property("an encoder that ran more than once",
                 "Encode the source once, before the loop, and reuse the memory at every step.", _encoder_ran_again),
        Property("more positions fed to the decoder than decoding steps",
                 "With a cache, feed only the newest token at every step, tokens[:, -1:].", _prefix_re_decoded),
        Property("tokens other than <eos> after a sequence's <eos>",
                 "A finished row writes eos_id from then on: next_token.masked_fill(finished, eos_id).",
                 _tokens_after_eos),
        Property("an output that does not start with <bos>",
                 "Start from a column of bos_id and return every token, <bos> included.", _no_bos_first),
    ],
)


CHECKERS += [check_label_smoothed_loss, check_train_step, check_greedy_decode]


# ---------------------------------------------------------------------------------------
# Exercise 8: beam_search(model, src, src_mask, max_len, bos_id, eos_id, beam_size, length_penalty)
# ---------------------------------------------------------------------------------------


def _best_outputs(tokens, eos_id) -> list:
    """Each row of a decoder's output up to and including its first eos (bos first): what the
    row says, whatever the padding after it."""
    if not isinstance(tokens, torch.Tensor) or tokens.dim() != 2 or tokens.is_floating_point():
        got = f"{tokens.dtype} {list(tokens.shape)}" if isinstance(tokens, torch.Tensor) else type(tokens).__name__
        raise TypeError(f"beam_search must return a LongTensor [batch, 1 + steps] of token ids, got {got}")
    rows = []
    for row in tokens.long():
        ends = (row[1:] == eos_id).nonzero()
        rows.append(row[: 2 + int(ends[0])] if len(ends) else row)
    return rows


def _invoke_beam(fn, case: Case):
    tiny, src, src_mask, max_len, bos_id, eos_id = case.args
    model = tiny.build().eval()
    counter = _WorkCounter(model)
    largest = [0]
    hook = model.decoder.register_forward_pre_hook(lambda m, args: largest.__setitem__(0, max(largest[0], args[0].shape[1])))
    try:
        tokens = fn(model, src, src_mask, max_len, bos_id, eos_id, **case.kwargs)
    finally:
        counter.remove()
        hook.remove()
    counts = counter.counts
    return {"best output of each sentence": _best_outputs(tokens, eos_id),
            "encoder runs": counts["encoder runs"], "decoder runs": counts["decoder runs"],
            "most positions fed to the decoder at once": largest[0]}


# (name, model seed, layers, batch, max_len, eos id, beam_size, length_penalty, hidden). Untrained
# models whose next-token distributions vary with the prefix, and eos ids they write now and then,
# so that hypotheses finish at different steps, beams change places, and beam search and greedy
# decoding disagree: every catalogued mistake changes the output of at least one visible case.
_BEAM_CASES = [
    ("2 sentences, 3 beams, length penalty 1.0", 27, 1, 2, 6, 8, 3, 1.0, False),
    ("3 sentences, 4 beams, no length penalty", 14, 1, 3, 6, 2, 4, 0.0, False),
    ("2 sentences, 3 beams, length penalty 0.6", 39, 1, 2, 6, 7, 3, 0.6, True),
    ("2 sentences, 3 beams, 2 layers, length penalty 1.0", 17, 1, 2, 6, 9, 3, 1.0, True),
    ("3 sentences, 4 beams, 2 layers, no length penalty", 27, 2, 3, 6, 8, 4, 0.0, True),
    ("3 sentences, 4 beams, stopped by max_len", 27, 2, 3, 3, 8, 4, 0.6, True),
    ("2 sentences, one beam (greedy)", 21, 2, 2, 6, 9, 1, 0.6, True),
]


def _beam_cases() -> list[Case]:
    cases = []
    for name, seed, layers, batch, max_len, eos, beam, alpha, hidden in _BEAM_CASES:
        g = seeded(2000 + 10 * seed + batch)
        src = torch.randint(3, TINY_VOCAB, (batch, 6), generator=g)  # [batch, 6]
        if batch > 1:
            src[1, 4:] = 0  # the second sentence is shorter: two padded positions
        cases.append(Case(name, (TinyModel(seed, layers), src, padding_mask(src, 0), max_len, 1, eos),
                          dict(beam_size=beam, length_penalty=alpha), hidden=hidden))
    return cases


def _beam_variant(model, src, src_mask, max_len, bos_id, eos_id, beam_size=4, length_penalty=0.6, *,
                  freeze_finished=True, normalise=True, step_score=None, reorder_kv=True, reorder_tokens=True,
                  per_beam=False, all_start_at_zero=False):
    """Beam search as the reference does it, with one switch per catalogued mistake."""
    beam = beam_size
    memory = model.encode(src, src_mask)
    batch = memory.shape[0]
    memory = memory.repeat_interleave(beam, dim=0)
    src_mask = src_mask.repeat_interleave(beam, dim=0)
    cache = model.new_cache()
    tokens = torch.full((batch * beam, 1), bos_id, dtype=torch.long)
    scores = torch.zeros(batch, beam, dtype=torch.float64)
    if not all_start_at_zero:
        scores[:, 1:] = float("-inf")
    finished = torch.zeros(batch, beam, dtype=torch.bool)
    lengths = torch.zeros(batch, beam, dtype=torch.long)
    offsets = torch.arange(batch)[:, None] * beam
    for step in range(max_len):
        hidden = model.decode(memory, src_mask, tokens[:, -1:], cache=cache)
        log_probs = model.generator(hidden[:, -1])  # [batch * beam, V]
        vocab = log_probs.shape[-1]
        if step_score is not None:
            log_probs = step_score(log_probs)
        if freeze_finished:
            only_eos = torch.full((vocab,), float("-inf"), dtype=log_probs.dtype)
            only_eos[eos_id] = 0.0
            log_probs = torch.where(finished.view(-1, 1), only_eos, log_probs)
        candidates = scores[:, :, None] + log_probs.view(batch, beam, vocab)  # [batch, beam, V]
        if per_beam and step > 0:
            scores, token = candidates.max(dim=-1)  # each beam follows its own best token
            parent = torch.arange(beam).expand(batch, beam)
        else:
            scores, index = candidates.view(batch, beam * vocab).topk(beam, dim=-1)
            parent, token = index // vocab, index % vocab
        rows = (offsets + parent).view(-1)
        tokens = torch.cat([tokens[rows] if reorder_tokens else tokens, token.view(-1, 1)], dim=1)
        if reorder_kv:
            reorder_cache(cache, rows)
        was_finished = finished.gather(1, parent)
        grows = ~was_finished if freeze_finished else torch.ones_like(was_finished)
        lengths = lengths.gather(1, parent) + grows.long()
        finished = was_finished | (token == eos_id)
        if finished.all():
            break
    ranking = scores / gnmt_length_penalty(lengths, length_penalty) if normalise else scores
    best = ranking.argmax(dim=-1)
    return tokens[offsets[:, 0] + best]


def _beam_finished_extended(*args, **kwargs):
    return _beam_variant(*args, **kwargs, freeze_finished=False)


def _beam_no_length_penalty(*args, **kwargs):
    return _beam_variant(*args, **kwargs, normalise=False)


def _beam_sum_of_probabilities(*args, **kwargs):
    return _beam_variant(*args, **kwargs, step_score=torch.exp)


def _beam_cache_not_reordered(*args, **kwargs):
    return _beam_variant(*args, **kwargs, reorder_kv=False)


def _beam_tokens_not_reordered(*args, **kwargs):
    return _beam_variant(*args, **kwargs, reorder_tokens=False)


def _beam_per_beam(*args, **kwargs):
    return _beam_variant(*args, **kwargs, per_beam=True)


def _beam_all_start_at_zero(*args, **kwargs):
    return _beam_variant(*args, **kwargs, all_start_at_zero=True)


def _sentence_log_probs(case, outputs) -> torch.Tensor:
    """log P of each sentence's best output under the case's model: [batch]."""
    tiny, src, src_mask, max_len, bos_id, eos_id = case.args
    width = max(len(row) for row in outputs)
    tokens = torch.stack([torch.cat([row, row.new_full((width - len(row),), eos_id)]) for row in outputs])
    return sequence_log_prob(tiny.build().eval(), src, src_mask, tokens, eos_id)


def _less_probable_than_the_reference(case, expected, actual):
    if case.kwargs["length_penalty"] != 0:
        return False
    mine = _sentence_log_probs(case, actual["best output of each sentence"])
    best = _sentence_log_probs(case, expected["best output of each sentence"])
    return bool((mine < best - 1e-6).any())


def _greedy_where_beam_differs(case, expected, actual):
    tiny, src, src_mask, max_len, bos_id, eos_id = case.args
    greedy = _best_outputs(greedy_decode(tiny.build().eval(), src, src_mask, max_len, bos_id, eos_id), eos_id)
    same = lambda a, b: len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))  # noqa: E731
    return (case.kwargs["beam_size"] > 1 and not same(expected["best output of each sentence"], greedy)
            and same(actual["best output of each sentence"], greedy))


check_beam_search = Checker(
    name="beam_search",
    reference=beam_search,
    make_cases=_beam_cases,
    invoke=_invoke_beam,
    mistakes=[
        Mistake(
            "finished hypotheses not kept: a hypothesis that has written <eos> goes on growing, and the tokens "
            "after its <eos> lower its score",
            "Keep a `finished` flag per hypothesis; give a finished one a single continuation, eos_id, with "
            "log-probability 0 (every other token -inf), so it keeps its score and its place in the beam.",
            _beam_finished_extended,
        ),
        Mistake(
            "no length normalisation: the best hypothesis chosen by its summed log-probability even though "
            "length_penalty > 0",
            "At the end divide each hypothesis's score by gnmt_length_penalty(length, length_penalty), with length "
            "the number of tokens it generated up to and including its <eos>, and take the argmax of that.",
            _beam_no_length_penalty,
        ),
        Mistake(
            "probabilities added up instead of log-probabilities (the score of a hypothesis must be the log of a "
            "product of probabilities: a sum of log-probabilities)",
            "Add the generator's output as it is: it already is a log-probability, and log P(y1 y2) = "
            "log P(y1) + log P(y2 | y1).",
            _beam_sum_of_probabilities,
        ),
        Mistake(
            "the key/value cache not reordered with the beams: a hypothesis that moves to another row keeps "
            "reading the keys and values of the hypothesis that was there before",
            "After choosing the new beams, call reorder_cache(cache, rows) with the same row index you used for "
            "the tokens, so that every row's cache belongs to its hypothesis.",
            _beam_cache_not_reordered,
        ),
        Mistake(
            "the tokens written so far not reordered with the beams: the new token is appended to whatever "
            "hypothesis sat in that row",
            "Pick the parent rows first (tokens indexed by the row each new hypothesis continues), then append "
            "the new tokens.",
            _beam_tokens_not_reordered,
        ),
        Mistake(
            "top-k taken per beam: every hypothesis follows only its own best continuation (beam_size greedy "
            "searches side by side)",
            "Rank all beam_size x vocab candidates of a sentence together: flatten them to [batch, beam_size * "
            "vocab] and keep the beam_size best, so that a strong hypothesis can fill several places and a weak "
            "one can drop out.",
            _beam_per_beam,
        ),
        Mistake(
            "every beam started with score 0: the first step fills the beam with copies of one hypothesis, and "
            "the search is greedy decoding",
            "At the start all beams hold the same <bos>: give beam 0 the score 0 and the others -inf, so the "
            "first step keeps the beam_size best distinct first tokens.",
            _beam_all_start_at_zero,
        ),
    ],
    properties=[
        Property("an encoder that ran more than once",
                 "Encode the source once, before the loop, and repeat the memory for the beams.",
                 lambda case, e, a: a["encoder runs"] > 1),
        Property("more than one position fed to the decoder in one step",
                 "With a cache, feed only the newest token of every hypothesis at every step.",
                 lambda case, e, a: a["most positions fed to the decoder at once"] > 1),
        Property("more decoder runs than the search needs",
                 "Decode the whole batch of sentences together (batch x beam_size rows), one decoder run per step, "
                 "and stop as soon as every hypothesis has written <eos>.",
                 lambda case, e, a: a["decoder runs"] > e["decoder runs"]),
        Property("a best output less probable than the reference's, with no length penalty",
                 "The search lost a better hypothesis: rank all beam_size x vocab candidates by their summed "
                 "log-probabilities, keep finished hypotheses in the beam, and reorder the tokens and the cache "
                 "with the same rows.",
                 _less_probable_than_the_reference),
        Property("the output of greedy decoding where beam search finds a better one",
                 "Your beams never parted: start beam 0 at score 0 and the others at -inf, and take the top-k "
                 "over all beam_size x vocab candidates of a sentence together.",
                 _greedy_where_beam_differs),
    ],
)


CHECKERS += [check_beam_search]
