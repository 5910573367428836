"""Checkers for chapter 02, self-attention: Q/K/V projections, scaled scores, softmax,
scaled dot-product attention with a mask, self-attention in matrix form, and the
`SelfAttention` layer (learned projections, a padded batch of sentences).

Each checker compares a learner's function with the library (transformer_lib.attention)
on deterministic cases, and knows the wrong answers learners often write, so that a
failure can say what went wrong ("no sqrt(d_k) scale") instead of only "values differ".
Properties name the traits of a wrong output (rows that do not sum to one, NaN only on
large scores, a transposed result), so two mistakes made at once are still named.
"""

import dataclasses
import math

import torch
import torch.nn as nn

from transformer_lib.attention import (
    SelfAttention,
    attention_scores,
    project_qkv,
    scaled_dot_product_attention,
    self_attention,
    softmax,
)

from .core import Case, Checker, Mistake, Property, randn, random_mask, seeded
from .properties import rows_do_not_sum_to_one, shape_permuted, transposed

# The toy example of Raimi Karim, "Illustrated: Self-Attention" (Towards Data Science, 2019):
# three tokens with four features, projected to d_k = d_v = 3.
TOY_X = torch.tensor([[1.0, 0.0, 1.0, 0.0], [0.0, 2.0, 0.0, 2.0], [1.0, 1.0, 1.0, 1.0]])
TOY_W_Q = torch.tensor([[1.0, 0.0, 1.0], [1.0, 0.0, 0.0], [0.0, 0.0, 1.0], [0.0, 1.0, 1.0]])
TOY_W_K = torch.tensor([[0.0, 0.0, 1.0], [1.0, 1.0, 0.0], [0.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
TOY_W_V = torch.tensor([[0.0, 2.0, 0.0], [0.0, 3.0, 0.0], [1.0, 0.0, 3.0], [1.0, 1.0, 0.0]])


# ---------------------------------------------------------------------------------------
# Properties shared by this chapter's exercises
# ---------------------------------------------------------------------------------------

# A row with a score this far from 0 is where exp() of an unshifted score overflows to inf
# (float32 stops at e^88.7) or underflows to 0 everywhere (0/0 = NaN).
LARGE_SCORE = 50.0


def _weights(output):
    """(output, weights) -> weights."""
    return output[1]


def _nonfinite_only_on_large_rows(large_rows, select=lambda output: output):
    """seen(): NaN or inf where the reference is finite, and only in rows whose scores are
    large. `large_rows(case)` is a bool tensor broadcastable to the rows of the output."""

    def seen(case, expected, actual):
        e, a = select(expected), select(actual)
        if not (isinstance(e, torch.Tensor) and isinstance(a, torch.Tensor)) or a.shape != e.shape:
            return False
        if not a.is_floating_point():
            return False
        bad_rows = (~a.isfinite() & e.isfinite()).any(dim=-1)  # [...rows]
        large = torch.broadcast_to(large_rows(case), bad_rows.shape)
        return bool(bad_rows.any()) and not bool((bad_rows & ~large).any())

    return seen


def _factor(actual, target) -> float | None:
    """The c with actual == c * target, or None when no single non-zero factor fits."""
    if not (isinstance(actual, torch.Tensor) and isinstance(target, torch.Tensor)) or actual.shape != target.shape:
        return None
    if not (actual.is_floating_point() and target.is_floating_point()):
        return None
    a, t = actual.double(), target.double()
    if not (a.isfinite().all() and t.isfinite().all()):
        return None
    norm = (t * t).sum()
    if norm == 0:
        return None
    c = ((a * t).sum() / norm).item()  # least squares
    if abs(c) < 1e-6:
        return None
    tolerance = 1e-5 * (1.0 + abs(c) * t.abs().max().item())
    return c if torch.allclose(a, c * t, rtol=1e-4, atol=tolerance) else None


def _transposed_scores(unit_factor: bool):
    """seen(): the reference's scores transposed, times 1 (unit_factor) or times another number."""

    def seen(case, expected, actual):
        if not isinstance(expected, torch.Tensor) or expected.dim() < 2:
            return False
        swapped = expected.transpose(-2, -1)  # [..., L_k, L_q]
        if swapped.shape == expected.shape and torch.allclose(swapped, expected):
            return False  # a symmetric case cannot show a transpose
        c = _factor(actual, swapped)
        return c is not None and (abs(c - 1.0) < 1e-3) == unit_factor

    return seen


def _scores_times_a_constant(case, expected, actual):
    c = _factor(actual, expected)
    return c is not None and abs(c - 1.0) > 1e-3


_SCORES_PERMUTED = shape_permuted(
    "Queries on the rows, keys on the columns: q @ k.transpose(-2, -1) has shape [..., L_q, L_k]; "
    "transpose only the last two dimensions of k, never the batch dimensions.")


def _permuted_not_transposed(case, expected, actual):
    if not _SCORES_PERMUTED.seen(case, expected, actual):
        return False
    return not (isinstance(expected, torch.Tensor) and expected.dim() >= 2
                and _factor(actual, expected.transpose(-2, -1)) is not None)


def _large_softmax_rows(case):
    return case.args[0].abs().amax(dim=-1) > LARGE_SCORE  # [...rows]


def _large_attention_rows(case):
    q, k = case.args[0].double(), case.args[1].double()
    return (q @ k.transpose(-2, -1)).abs().amax(dim=-1) > LARGE_SCORE  # [..., L_q], unscaled q.k


# ---------------------------------------------------------------------------------------
# Exercise 1: project_qkv(x, w_q, w_k, w_v) -> (q, k, v)
# ---------------------------------------------------------------------------------------


def _projection_cases() -> list[Case]:
    g = seeded(201)
    cases = [Case("toy example of section 6", (TOY_X, TOY_W_Q, TOY_W_K, TOY_W_V))]
    cases.append(Case("one sentence, d_v != d_k", (randn(g, 5, 8), randn(g, 8, 4), randn(g, 8, 4), randn(g, 8, 6))))
    cases.append(Case("batch of 2", (randn(g, 2, 5, 8), randn(g, 8, 3), randn(g, 8, 3), randn(g, 8, 5))))
    cases.append(Case("float64, two batch dims", (
        randn(g, 2, 3, 4, 6, dtype=torch.float64), randn(g, 6, 2, dtype=torch.float64),
        randn(g, 6, 2, dtype=torch.float64), randn(g, 6, 3, dtype=torch.float64)), hidden=True))
    cases.append(Case("a single token", (randn(g, 1, 6), randn(g, 6, 4), randn(g, 6, 4), randn(g, 6, 4)), hidden=True))
    cases.append(Case("d_k = 1", (randn(g, 4, 5), randn(g, 5, 1), randn(g, 5, 1), randn(g, 5, 2)), hidden=True))
    return cases


def _qkv_q_k_swapped(x, w_q, w_k, w_v):
    return x @ w_k, x @ w_q, x @ w_v


def _qkv_one_matrix(x, w_q, w_k, w_v):
    return x @ w_q, x @ w_q, x @ w_q


def _qkv_values_not_projected(x, w_q, w_k, w_v):
    return x @ w_q, x @ w_k, x


check_project_qkv = Checker(
    name="project_qkv",
    reference=project_qkv,
    make_cases=_projection_cases,
    mistakes=[
        Mistake(
            "queries and keys swapped (q made with w_k, k made with w_q)",
            "Each role has its own matrix: q = x @ w_q, k = x @ w_k, v = x @ w_v, returned in that order.",
            _qkv_q_k_swapped,
        ),
        Mistake(
            "the same matrix w_q used for all three projections",
            "Use w_q for the queries, w_k for the keys and w_v for the values.",
            _qkv_one_matrix,
        ),
        Mistake(
            "values not projected (x returned as v)",
            "The values are a learned map of x too: v = x @ w_v.",
            _qkv_values_not_projected,
        ),
    ],
)


# ---------------------------------------------------------------------------------------
# Exercise 2: attention_scores(q, k) -> q k^T / sqrt(d_k)
# ---------------------------------------------------------------------------------------


def _score_cases() -> list[Case]:
    g = seeded(202)
    # Thinking/Machines from Jay Alammar, "The Illustrated Transformer" (2018): d_k = 64,
    # q.k1 = 112, q.k2 = 96, scaled to 14 and 12.
    doc_q = torch.full((1, 64), 2.0)
    doc_k = torch.stack([torch.full((64,), 112 / 128), torch.full((64,), 96 / 128)])
    return [
        Case("Thinking Machines, d_k = 64", (doc_q, doc_k)),
        Case("3 queries, 5 keys, d_k = 4", (randn(g, 3, 4), randn(g, 5, 4))),
        Case("batch of 2", (randn(g, 2, 3, 8), randn(g, 2, 6, 8))),
        Case("float64, two batch dims", (randn(g, 2, 2, 3, 16, dtype=torch.float64),
                                         randn(g, 2, 2, 4, 16, dtype=torch.float64)), hidden=True),
        Case("keys shared across the batch", (randn(g, 3, 2, 5), randn(g, 4, 5)), hidden=True),
        Case("a single query, large values", (randn(g, 1, 32, scale=10.0), randn(g, 7, 32, scale=10.0)), hidden=True),
    ]


def _scores_unscaled(q, k):
    return q @ k.transpose(-2, -1)


def _scores_over_dk(q, k):
    return q @ k.transpose(-2, -1) / q.shape[-1]


def _scores_times_sqrt_dk(q, k):
    return q @ k.transpose(-2, -1) * math.sqrt(q.shape[-1])


def _scores_sqrt_seq_len(q, k):
    return q @ k.transpose(-2, -1) / math.sqrt(k.shape[-2])


def _scores_transposed(q, k):
    return k @ q.transpose(-2, -1) / math.sqrt(q.shape[-1])


check_attention_scores = Checker(
    name="attention_scores",
    reference=attention_scores,
    make_cases=_score_cases,
    mistakes=[
        Mistake(
            "no sqrt(d_k) scale (plain q @ k^T)",
            "Divide the dot products by math.sqrt(d_k), with d_k = q.shape[-1].",
            _scores_unscaled,
        ),
        Mistake(
            "divided by d_k instead of sqrt(d_k)",
            "The scale is the square root: divide by math.sqrt(q.shape[-1]).",
            _scores_over_dk,
        ),
        Mistake(
            "multiplied by sqrt(d_k) instead of dividing",
            "Divide by math.sqrt(d_k): the point is to shrink the scores back to variance 1.",
            _scores_times_sqrt_dk,
        ),
        Mistake(
            "scaled by the square root of the sequence length (size(-2)) instead of d_k (size(-1))",
            "d_k is the feature size of q and k, their last dimension: q.shape[-1].",
            _scores_sqrt_seq_len,
        ),
        Mistake(
            "scores transposed: k @ q^T puts keys on the rows",
            "Queries go on the rows and keys on the columns: q @ k.transpose(-2, -1), shape [..., L_q, L_k].",
            _scores_transposed,
        ),
    ],
    properties=[
        Property(
            "the scores transposed (keys on the rows, queries on the columns)",
            "Queries go on the rows and keys on the columns: q @ k.transpose(-2, -1), shape [..., L_q, L_k].",
            _transposed_scores(unit_factor=True),
        ),
        Property(
            "the scores transposed (keys on the rows) and multiplied by a wrong constant",
            "Queries go on the rows: q @ k.transpose(-2, -1), not k @ q^T; then divide by math.sqrt(q.shape[-1]).",
            _transposed_scores(unit_factor=False),
        ),
        Property(
            "the right dot products multiplied by a wrong constant",
            "The only factor is 1 / math.sqrt(d_k), with d_k = q.shape[-1] "
            "(not the sequence length, not a fixed number).",
            _scores_times_a_constant,
        ),
        dataclasses.replace(_SCORES_PERMUTED, seen=_permuted_not_transposed),
    ],
)


# ---------------------------------------------------------------------------------------
# Exercise 3: softmax(x) over the last dimension, numerically stable
# ---------------------------------------------------------------------------------------


def _softmax_cases() -> list[Case]:
    g = seeded(203)
    return [
        Case("cat, car, frog scores [3.2, 5.1, -1.7]", (torch.tensor([3.2, 5.1, -1.7]),)),
        Case("4 rows of 6 scores", (randn(g, 4, 6, scale=3.0),)),
        Case("large scores next to small ones", (torch.tensor([[1000.0, 1001.0, 1002.0], [0.0, 1.0, 2.0]]),)),
        Case("batch of 2", (randn(g, 2, 3, 5, scale=2.0),)),
        Case("float64", (randn(g, 3, 7, dtype=torch.float64, scale=4.0),), hidden=True),
        Case("very negative scores", (torch.tensor([[-1000.0, -1001.0, -1003.0], [-1.0, 0.0, 1.0]]),), hidden=True),
        Case("a single score", (torch.tensor([[0.5]]),), hidden=True),
        Case("two batch dims, float64", (randn(g, 2, 2, 3, 4, dtype=torch.float64, scale=30.0),), hidden=True),
    ]


def _softmax_dim0(x):
    e = (x - x.amax(dim=0, keepdim=True)).exp()
    return e / e.sum(dim=0, keepdim=True)


def _softmax_unstable(x):
    e = x.exp()
    return e / e.sum(dim=-1, keepdim=True)


def _softmax_exp_only(x):
    return x.exp()


def _softmax_shifted_exp_only(x):
    return (x - x.amax(dim=-1, keepdim=True)).exp()


def _softmax_whole_tensor_sum(x):
    e = (x - x.amax(dim=-1, keepdim=True)).exp()
    return e / e.sum()


# What the softmax exercise may not call: every way PyTorch offers a softmax, at the Python API
# and at the operator level (so an alias or a method reaching the same kernel is seen too).
SOFTMAX_APIS = (
    "torch.softmax", "torch.nn.functional.softmax", "torch.Tensor.softmax", "torch.special.softmax",
    "torch.nn.Softmax", "torch.log_softmax", "torch.nn.functional.log_softmax", "torch.Tensor.log_softmax",
    "torch.special.log_softmax", "torch.nn.LogSoftmax",
    "aten._softmax", "aten.softmax", "aten._log_softmax", "aten.log_softmax", "aten.special_softmax",
    "aten._safe_softmax",
)


def _softmax_global_max(x):
    e = (x - x.max()).exp()
    return e / e.sum(dim=-1, keepdim=True)


check_softmax = Checker(
    name="softmax",
    reference=softmax,
    make_cases=_softmax_cases,
    forbidden=SOFTMAX_APIS,
    mistakes=[
        Mistake(
            "softmax taken over the first dimension (dim=0) instead of the last",
            "Normalise each row of scores: max, exp and sum all over dim=-1 (with keepdim=True).",
            _softmax_dim0,
        ),
        Mistake(
            "softmax not stabilised: exp(x) overflows to inf for large scores, and inf/inf is NaN",
            "Subtract each row's maximum before exp: x - x.amax(dim=-1, keepdim=True). It cancels in the ratio.",
            _softmax_unstable,
        ),
        Mistake(
            "exponentials not normalised (exp(x) returned as it is)",
            "Subtract the row maximum, take exp, then divide by the row sum so each row adds up to 1.",
            _softmax_exp_only,
        ),
        Mistake(
            "exp(x - max) computed but not divided by its sum",
            "Divide by the row sum: e / e.sum(dim=-1, keepdim=True), so each row adds up to 1.",
            _softmax_shifted_exp_only,
        ),
        Mistake(
            "divided by the sum over the whole tensor instead of each row's sum",
            "Sum over the last dimension only: e.sum(dim=-1, keepdim=True).",
            _softmax_whole_tensor_sum,
        ),
        Mistake(
            "subtracted the maximum of the whole tensor instead of each row's maximum "
            "(a row far below that maximum underflows to 0/0 = NaN)",
            "Subtract each row's own maximum: x.amax(dim=-1, keepdim=True).",
            _softmax_global_max,
        ),
    ],
    properties=[
        rows_do_not_sum_to_one(
            dim=-1, what="the last dimension",
            fix="Normalise each row on its own: the max and the sum are both over dim=-1 (keepdim=True), not dim=0.",
        ),
        Property(
            "NaN or inf only on rows with large scores, where the reference stays finite "
            "(exp overflowed to inf, or underflowed to 0/0)",
            "Subtract each row's maximum before exp: x - x.amax(dim=-1, keepdim=True). It cancels in the ratio "
            "and keeps every exp() at most 1.",
            _nonfinite_only_on_large_rows(_large_softmax_rows),
        ),
    ],
)


# ---------------------------------------------------------------------------------------
# Exercise 4: scaled_attention(q, k, v, mask=None) -> (output, weights)
# ---------------------------------------------------------------------------------------


def _attention_cases() -> list[Case]:
    g = seeded(204)
    pad = torch.tensor([[True, True, True, True, True], [True, True, True, False, False]])[:, None, :]  # [2, 1, 5]
    return [
        Case("no mask, 3 queries, 5 keys", (randn(g, 3, 4), randn(g, 5, 4), randn(g, 5, 6))),
        Case("causal mask", (randn(g, 4, 8), randn(g, 4, 8), randn(g, 4, 3)),
             {"mask": torch.ones(4, 4, dtype=torch.bool).tril()}),
        Case("batch of 2, padding mask [2, 1, 5]", (randn(g, 2, 3, 4), randn(g, 2, 5, 4), randn(g, 2, 5, 2)),
             {"mask": pad}),
        Case("float64, random mask", (randn(g, 5, 6, dtype=torch.float64), randn(g, 7, 6, dtype=torch.float64),
                                      randn(g, 7, 3, dtype=torch.float64)), {"mask": random_mask(g, 5, 7)}, hidden=True),
        Case("two batch dims, no mask", (randn(g, 2, 2, 3, 8), randn(g, 2, 2, 4, 8), randn(g, 2, 2, 4, 8)), hidden=True),
        Case("mask broadcast over queries [1, 5]", (randn(g, 2, 4, 16, scale=3.0), randn(g, 2, 5, 16, scale=3.0),
                                                    randn(g, 2, 5, 4)),
             {"mask": torch.tensor([[True, False, True, True, False]])}, hidden=True),
        # Drawn last, so the cases above keep their numbers.
        Case("no mask, 4 queries, 4 keys", (randn(g, 4, 4), randn(g, 4, 4), randn(g, 4, 3))),
        Case("large scores (|q.k| in the hundreds)", (randn(g, 3, 8, scale=10.0), randn(g, 4, 8, scale=10.0),
                                                       randn(g, 4, 3))),
    ]


def _mask_fill(scores, mask):
    if mask is None:
        return scores
    return scores.masked_fill(~mask, torch.finfo(scores.dtype).min)


def _attn_unscaled(q, k, v, mask=None):
    weights = torch.softmax(_mask_fill(q @ k.transpose(-2, -1), mask), dim=-1)
    return weights @ v, weights


def _attn_over_dk(q, k, v, mask=None):
    weights = torch.softmax(_mask_fill(q @ k.transpose(-2, -1) / q.shape[-1], mask), dim=-1)
    return weights @ v, weights


def _attn_softmax_over_queries(q, k, v, mask=None):
    weights = torch.softmax(_mask_fill(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), mask), dim=-2)
    return weights @ v, weights


def _attn_mask_after_softmax(q, k, v, mask=None):
    weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1)
    if mask is not None:
        weights = weights.masked_fill(~mask, 0.0)
    return weights @ v, weights


def _attn_masked_with_zero(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, 0.0)
    weights = torch.softmax(scores, dim=-1)
    return weights @ v, weights


def _attn_mask_inverted(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(mask, torch.finfo(scores.dtype).min)
    weights = torch.softmax(scores, dim=-1)
    return weights @ v, weights


def _attn_keys_as_values(q, k, v, mask=None):
    weights = torch.softmax(_mask_fill(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), mask), dim=-1)
    return weights @ k, weights


check_scaled_attention = Checker(
    name="scaled_attention",
    reference=scaled_dot_product_attention,
    make_cases=_attention_cases,
    mistakes=[
        Mistake(
            "no sqrt(d_k) scale on the scores",
            "Divide q @ k^T by math.sqrt(d_k), with d_k = q.shape[-1], before the softmax.",
            _attn_unscaled,
        ),
        Mistake(
            "scores divided by d_k instead of sqrt(d_k)",
            "The scale is the square root: divide by math.sqrt(q.shape[-1]).",
            _attn_over_dk,
        ),
        Mistake(
            "softmax taken over the queries (dim=-2): the weights don't sum to 1 over the keys",
            "Each query distributes its attention over the keys: softmax over dim=-1.",
            _attn_softmax_over_queries,
        ),
        Mistake(
            "mask applied after the softmax (weights zeroed, the rest no longer sum to 1)",
            "Mask the *scores* before the softmax: scores.masked_fill(~mask, a large negative number), then softmax.",
            _attn_mask_after_softmax,
        ),
        Mistake(
            "masked scores set to 0 instead of a large negative number (exp(0) = 1 still gets weight)",
            "Fill hidden scores with a very negative value, e.g. torch.finfo(scores.dtype).min or float('-inf').",
            _attn_masked_with_zero,
        ),
        Mistake(
            "mask meaning inverted: the positions marked True were hidden",
            "In this course True means 'may attend': hide where the mask is False, masked_fill(~mask, ...).",
            _attn_mask_inverted,
        ),
        Mistake(
            "the keys mixed instead of the values (weights @ k)",
            "The output is a weighted sum of the values: weights @ v.",
            _attn_keys_as_values,
        ),
    ],
    properties=[
        rows_do_not_sum_to_one(
            dim=-1, what="the keys", select=_weights,
            fix="Each query spreads its attention over the keys: mask the scores, then softmax over dim=-1, "
                "and change nothing in the weights afterwards.",
        ),
        dataclasses.replace(
            transposed("The weights are [..., L_q, L_k]: one row per query, one column per key. Build the scores "
                       "as q @ k.transpose(-2, -1) and take the softmax over dim=-1.", select=_weights),
            name="weights transposed (keys on the rows, queries on the columns)",
        ),
        Property(
            "NaN or inf in the weights, only on rows with large scores (exp overflowed)",
            "Use a stable softmax on the scores: torch.softmax(scores, dim=-1), or subtract each row's maximum "
            "before exp.",
            _nonfinite_only_on_large_rows(_large_attention_rows, select=_weights),
        ),
    ],
)


# ---------------------------------------------------------------------------------------
# Exercise 5: self_attention(x, w_q, w_k, w_v) -> (output, weights), matrix form
# ---------------------------------------------------------------------------------------


def _self_attention_cases() -> list[Case]:
    g = seeded(205)
    return [
        Case("toy example of section 6", (TOY_X, TOY_W_Q, TOY_W_K, TOY_W_V)),
        Case("one sentence of 5 tokens", (randn(g, 5, 8), randn(g, 8, 4), randn(g, 8, 4), randn(g, 8, 6))),
        Case("batch of 2", (randn(g, 2, 4, 6), randn(g, 6, 3), randn(g, 6, 3), randn(g, 6, 5))),
        Case("float64, two batch dims", (
            randn(g, 2, 2, 3, 10, dtype=torch.float64), randn(g, 10, 4, dtype=torch.float64),
            randn(g, 10, 4, dtype=torch.float64), randn(g, 10, 2, dtype=torch.float64)), hidden=True),
        Case("a single token", (randn(g, 1, 6), randn(g, 6, 2), randn(g, 6, 2), randn(g, 6, 3)), hidden=True),
        Case("larger embeddings", (randn(g, 7, 16, scale=2.0), randn(g, 16, 8), randn(g, 16, 8), randn(g, 16, 8)),
             hidden=True),
    ]


def _sa(q, k, v, scale, dim=-1):
    weights = torch.softmax(q @ k.transpose(-2, -1) * scale, dim=dim)
    return weights @ v, weights


def _sa_unscaled(x, w_q, w_k, w_v):
    return _sa(x @ w_q, x @ w_k, x @ w_v, 1.0)


def _sa_sqrt_d_model(x, w_q, w_k, w_v):
    return _sa(x @ w_q, x @ w_k, x @ w_v, 1.0 / math.sqrt(x.shape[-1]))


def _sa_softmax_over_queries(x, w_q, w_k, w_v):
    return _sa(x @ w_q, x @ w_k, x @ w_v, 1.0 / math.sqrt(w_q.shape[-1]), dim=-2)


def _sa_keys_from_w_q(x, w_q, w_k, w_v):
    return _sa(x @ w_q, x @ w_q, x @ w_v, 1.0 / math.sqrt(w_q.shape[-1]))


def _sa_values_not_projected(x, w_q, w_k, w_v):
    return _sa(x @ w_q, x @ w_k, x, 1.0 / math.sqrt(w_q.shape[-1]))


check_self_attention = Checker(
    name="self_attention",
    reference=self_attention,
    make_cases=_self_attention_cases,
    mistakes=[
        Mistake(
            "no sqrt(d_k) scale on the scores",
            "Divide Q @ K^T by math.sqrt(d_k), where d_k = w_q.shape[-1].",
            _sa_unscaled,
        ),
        Mistake(
            "scaled by sqrt(d_model) (x.shape[-1]) instead of sqrt(d_k)",
            "d_k is the size of the queries and keys, q.shape[-1] = w_q.shape[-1], not the embedding size.",
            _sa_sqrt_d_model,
        ),
        Mistake(
            "softmax taken over the queries (dim=-2)",
            "Each token distributes its attention over the keys: softmax over dim=-1.",
            _sa_softmax_over_queries,
        ),
        Mistake(
            "keys made with w_q (K = X @ W^Q)",
            "Keys have their own matrix: K = X @ W^K.",
            _sa_keys_from_w_q,
        ),
        Mistake(
            "values not projected (the embeddings x mixed directly)",
            "Mix the projected values V = X @ W^V, not x.",
            _sa_values_not_projected,
        ),
    ],
    properties=[
        rows_do_not_sum_to_one(
            dim=-1, what="the keys", select=_weights,
            fix="Each token spreads its attention over the keys: softmax over dim=-1.",
        ),
    ],
)


# ---------------------------------------------------------------------------------------
# Exercise 6: class SelfAttention(nn.Module), forward(x, lengths=None) -> (output, weights)
# ---------------------------------------------------------------------------------------


def _layer_state(d_model: int, d_k: int, d_v: int, seed: int, dtype) -> dict:
    """Weights for w_q, w_k, w_v in nn.Linear's layout, [out, in], no biases."""
    g = seeded(seed)
    return {"w_q.weight": randn(g, d_k, d_model, dtype=dtype, scale=d_model**-0.5 * 2.0),
            "w_k.weight": randn(g, d_k, d_model, dtype=dtype, scale=d_model**-0.5 * 2.0),
            "w_v.weight": randn(g, d_v, d_model, dtype=dtype, scale=d_model**-0.5)}


def _invoke_layer(cls, case: Case):
    """Build the class the same way for the learner, the reference and the mistakes: the same
    weights are loaded into it, then it runs on the case's batch (with lengths when the case has them)."""
    d_model, d_k, d_v, x = case.args
    kwargs = dict(case.kwargs)
    seed = kwargs.pop("weight_seed")
    layer = cls(d_model, d_k, d_v)
    if not isinstance(layer, nn.Module):
        raise TypeError(f"{type(layer).__name__} must be an nn.Module subclass")
    layer = layer.to(x.dtype)
    try:
        layer.load_state_dict(_layer_state(d_model, d_k, d_v, seed, x.dtype))
    except RuntimeError as exc:
        raise RuntimeError(
            "the checker could not load its weights into your layer: keep the three "
            f"nn.Linear layers w_q, w_k, w_v (no bias) that __init__ creates ({exc})"
        ) from None
    return layer(x, **kwargs)  # no `lengths` keyword at all when the case has none: the default


def _layer_cases() -> list[Case]:
    g = seeded(206)
    return [
        Case("one sentence of 4 tokens, no padding", (6, 3, 3, randn(g, 1, 4, 6)), {"weight_seed": 1}),
        Case("batch of 2, lengths [5, 3], d_v != d_k", (8, 4, 6, randn(g, 2, 5, 8)),
             {"weight_seed": 2, "lengths": torch.tensor([5, 3])}),
        Case("batch of 3, lengths [2, 4, 3]", (5, 2, 2, randn(g, 3, 4, 5)),
             {"weight_seed": 3, "lengths": torch.tensor([2, 4, 3])}),
        Case("float64, batch of 2, lengths [1, 6]: a sentence of one token", (
            6, 4, 4, randn(g, 2, 6, 6, dtype=torch.float64)),
             {"weight_seed": 4, "lengths": torch.tensor([1, 6])}, hidden=True),
        Case("batch of 2, no padding given as full lengths [3, 3]", (4, 4, 2, randn(g, 2, 3, 4)),
             {"weight_seed": 5, "lengths": torch.tensor([3, 3])}, hidden=True),
        Case("large scores, lengths [7, 2, 5]", (16, 8, 8, randn(g, 3, 7, 16, scale=4.0)),
             {"weight_seed": 6, "lengths": torch.tensor([7, 2, 5])}, hidden=True),
        Case("batch of 2, no lengths", (6, 2, 3, randn(g, 2, 5, 6)), {"weight_seed": 7}, hidden=True),
    ]


class _SketchLayer(nn.Module):
    """SelfAttention written out, with class-level switches for the known mistakes."""

    scale_by, mask_on, visible_until, mask_after_softmax, softmax_dim = "d_k", "keys", "<", False, -1

    def __init__(self, d_model, d_k, d_v=None):
        super().__init__()
        d_v = d_k if d_v is None else d_v
        self.d_model, self.d_k = d_model, d_k
        self.w_q = nn.Linear(d_model, d_k, bias=False)
        self.w_k = nn.Linear(d_model, d_k, bias=False)
        self.w_v = nn.Linear(d_model, d_v, bias=False)

    def forward(self, x, lengths=None):
        q, k, v = self.w_q(x), self.w_k(x), self.w_v(x)
        size = {"d_k": self.d_k, "d_model": self.d_model, "none": 1}[self.scale_by]
        scores = q @ k.transpose(-2, -1) / math.sqrt(size)  # [batch, seq, seq]
        mask = None
        if lengths is not None and self.mask_on != "nothing":
            positions = torch.arange(x.shape[-2])
            real = positions < lengths[:, None] if self.visible_until == "<" else positions <= lengths[:, None]
            mask = {"keys": real[:, None, :], "queries": real[:, :, None],
                    "both": real[:, None, :] & real[:, :, None]}[self.mask_on]
        if mask is not None and not self.mask_after_softmax:
            scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
        weights = torch.softmax(scores, dim=self.softmax_dim)
        if mask is not None and self.mask_after_softmax:
            weights = weights.masked_fill(~mask, 0.0)
        return weights @ v, weights


class _LayerLengthsIgnored(_SketchLayer):
    mask_on = "nothing"


class _LayerQueriesHidden(_SketchLayer):
    mask_on = "queries"


class _LayerBothHidden(_SketchLayer):
    mask_on = "both"


class _LayerOneTooMany(_SketchLayer):
    visible_until = "<="


class _LayerMaskAfterSoftmax(_SketchLayer):
    mask_after_softmax = True


class _LayerSqrtDModel(_SketchLayer):
    scale_by = "d_model"


class _LayerUnscaled(_SketchLayer):
    scale_by = "none"


class _LayerSoftmaxOverQueries(_SketchLayer):
    softmax_dim = -2


def _padding_keys(case):
    """[batch, seq] bool, True where the case's key is padding (all False without lengths)."""
    x = case.args[3]
    lengths = case.kwargs.get("lengths")
    if lengths is None:
        return torch.zeros(x.shape[0], x.shape[1], dtype=torch.bool)
    return torch.arange(x.shape[1]) >= lengths[:, None]


def _weight_on_padding(case, expected, actual):
    """A real token's row gives weight to a padding key (the reference gives exactly 0)."""
    weights = actual[1]
    if not isinstance(weights, torch.Tensor) or weights.shape != expected[1].shape:
        return False
    padding = _padding_keys(case)  # [batch, seq]
    real_rows = ~padding[:, :, None]  # [batch, seq, 1]: only the real tokens' queries
    on_padding = weights.double().abs() * (real_rows & padding[:, None, :])  # [batch, seq, seq]
    return bool((on_padding > 1e-6).any())


check_self_attention_layer = Checker(
    name="self_attention_layer",
    reference=SelfAttention,
    make_cases=_layer_cases,
    invoke=_invoke_layer,
    mistakes=[
        Mistake(
            "the lengths were not used: real tokens still attend to the padding",
            "Turn the lengths into a [batch, seq] boolean of real tokens (positions 0 .. seq - 1 compared with "
            "each sentence's length), and hide the other keys in the scores before the softmax.",
            _LayerLengthsIgnored,
        ),
        Mistake(
            "the padding hidden as queries (rows of the scores) instead of as keys (columns)",
            "A padded token must not be attended *to*: hide its column. The mask is [batch, 1, seq], one row of "
            "visible keys shared by every query, not [batch, seq, 1].",
            _LayerQueriesHidden,
        ),
        Mistake(
            "the padding hidden as keys and also as queries (a padding position's whole row hidden)",
            "Hide the padding as keys only, [batch, 1, seq]: a padding position keeps its query and attends over "
            "the real tokens like any other position (its output is simply not used later).",
            _LayerBothHidden,
        ),
        Mistake(
            "one padding token too many stays visible (position == length counted as real)",
            "Sentence b's real tokens are the positions 0 .. lengths[b] - 1: compare with <, not <=.",
            _LayerOneTooMany,
        ),
        Mistake(
            "the padding masked after the softmax (weights zeroed, the rest no longer sum to 1)",
            "Hide the padded keys in the *scores*, before the softmax, with a very negative number "
            "(torch.finfo(scores.dtype).min).",
            _LayerMaskAfterSoftmax,
        ),
        Mistake(
            "scores scaled by sqrt(d_model) instead of sqrt(d_k)",
            "Queries and keys have d_k features, the output size of w_q: divide by math.sqrt(self.d_k).",
            _LayerSqrtDModel,
        ),
        Mistake(
            "no sqrt(d_k) scale on the scores",
            "Divide q @ k^T by math.sqrt(self.d_k) before the softmax.",
            _LayerUnscaled,
        ),
        Mistake(
            "softmax taken over the queries (dim=-2)",
            "Each token spreads its attention over the keys: softmax over dim=-1.",
            _LayerSoftmaxOverQueries,
        ),
    ],
    properties=[
        Property(
            "weight on padding tokens in a real token's row",
            "Real tokens must give padding exactly 0 weight: hide every key at a position >= the sentence's "
            "length in the scores (a [batch, 1, seq] mask), before the softmax.",
            _weight_on_padding,
        ),
        rows_do_not_sum_to_one(
            dim=-1, what="the keys", select=_weights,
            fix="Each token spreads its attention over the keys: mask the scores, then softmax over dim=-1, "
                "and change nothing in the weights afterwards.",
        ),
    ],
)


CHECKERS = [check_project_qkv, check_attention_scores, check_softmax, check_scaled_attention, check_self_attention,
            check_self_attention_layer]
