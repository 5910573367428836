"""Checkers for chapter 07, training and inference: the label-smoothed target distribution,
the warm-up learning rate (eq. 3 of the paper), the decoder's teacher-forcing inputs and
top-k filtering for sampling.

References are the library's (transformer_lib.training, transformer_lib.decoding); each
checker knows the wrong answers learners often write, so a failure can name what went wrong.
"""

import torch

from transformer_lib.decoding import top_k_filter
from transformer_lib.training import label_smoothed_targets, make_teacher_forcing_batch, noam_rate

from .core import Case, Checker, Mistake, seeded


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
