"""Chapter 02's checkers name mistakes made two at a time.

A catalogued mistake is recognised only when a learner makes exactly that one. Learners
often make two at once (softmax over dim=0 *and* without the max subtracted), and then the
checker's properties must still name what went wrong: these tests feed such combined answers
to the checkers and assert that the verdict fails and names each property involved.
"""

import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from transformer_lib.attention import scaled_dot_product_attention
from transformer_lib.checks.ch02 import (
    CHECKERS,
    check_attention_scores,
    check_scaled_attention,
    check_self_attention,
    check_self_attention_layer,
    check_softmax,
)

# The properties' names, as the verdicts print them.
SUM_LAST = "weights that do not sum to 1 along the last dimension (dim=-1)"
SOFTMAX_OVERFLOW = "NaN or inf only on rows with large scores"
SUM_KEYS = "weights that do not sum to 1 along the keys (dim=-1)"
WEIGHTS_TRANSPOSED = "weights transposed (keys on the rows, queries on the columns)"
ATTENTION_OVERFLOW = "NaN or inf in the weights, only on rows with large scores"
SCORES_TRANSPOSED_SCALED = "the scores transposed (keys on the rows) and multiplied by a wrong constant"
SCORES_WRONG_CONSTANT = "the right dot products multiplied by a wrong constant"
SCORES_PERMUTED = "a shape with the right sizes in the wrong order"
WEIGHT_ON_PADDING = "weight on padding tokens in a real token's row"


def verdict_of(checker, answer, hidden):
    return checker.judge(checker.collect_outputs(answer, hidden), hidden)


def assert_named(verdict, *names, absent=()):
    assert not verdict.passed, verdict.message
    for name in names:
        assert name in verdict.message, verdict.message
    for name in absent:
        assert name not in verdict.message, verdict.message


def assert_no_catalogued_mistake(checker, verdict):
    """The diagnosis came from the properties: no single catalogued mistake fits."""
    assert verdict.mistake not in {m.name for m in checker.mistakes}, verdict.message
    assert verdict.mistake in {p.name for p in checker.properties}, verdict.message


hidden_or_not = pytest.mark.parametrize("hidden", [False, True], ids=["visible", "hidden"])


# -- softmax ------------------------------------------------------------------------------------


def softmax_dim0_unstable(x):
    """Two catalogued mistakes at once: normalised over dim=0, and no max subtracted."""
    return torch.exp(x) / torch.exp(x).sum(dim=0)


def softmax_whole_tensor_unstable(x):
    """Divided by the sum of the whole tensor, and no max subtracted."""
    return x.exp() / x.exp().sum()


@hidden_or_not
def test_softmax_dim0_without_the_max_names_the_dim_and_the_overflow(hidden):
    verdict = verdict_of(check_softmax, softmax_dim0_unstable, hidden)
    assert_named(verdict, SUM_LAST, SOFTMAX_OVERFLOW)
    assert_no_catalogued_mistake(check_softmax, verdict)
    assert "dim=-1" in verdict.message and "x.amax(dim=-1, keepdim=True)" in verdict.message  # both fixes


@hidden_or_not
def test_softmax_whole_tensor_sum_without_the_max_names_both(hidden):
    verdict = verdict_of(check_softmax, softmax_whole_tensor_unstable, hidden)
    assert_named(verdict, SUM_LAST, SOFTMAX_OVERFLOW)
    assert_no_catalogued_mistake(check_softmax, verdict)


def test_nan_everywhere_is_not_called_an_overflow():
    """The overflow property needs NaN *only* on large scores: NaN on every row is something else."""
    verdict = verdict_of(check_softmax, lambda x: x * float("nan"), hidden=False)
    assert_named(verdict, "NaN at index", absent=[SOFTMAX_OVERFLOW])


# -- scaled dot-product attention ---------------------------------------------------------------


def attention_unscaled_softmax_over_queries(q, k, v, mask=None):
    """No sqrt(d_k) scale AND the softmax over the queries (dim=-2)."""
    scores = q @ k.transpose(-2, -1)  # [..., L_q, L_k]
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-2)
    return weights @ v, weights


def attention_unscaled_mask_after_softmax(q, k, v, mask=None):
    """No sqrt(d_k) scale AND the mask applied to the weights after the softmax."""
    weights = torch.softmax(q @ k.transpose(-2, -1), dim=-1)
    if mask is not None:
        weights = weights.masked_fill(~mask, 0.0)
    return weights @ v, weights


def attention_unscaled_naive_exp(q, k, v, mask=None):
    """No sqrt(d_k) scale AND a softmax written as exp / sum, without the max subtracted."""
    scores = q @ k.transpose(-2, -1)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    e = scores.exp()
    weights = e / e.sum(dim=-1, keepdim=True)
    return weights @ v, weights


def attention_weights_transposed(q, k, v, mask=None):
    """The right output, but the weights handed back transposed."""
    output, weights = scaled_dot_product_attention(q, k, v, mask)
    return output, weights.transpose(-2, -1)


@hidden_or_not
def test_attention_without_scale_and_softmax_over_queries(hidden):
    verdict = verdict_of(check_scaled_attention, attention_unscaled_softmax_over_queries, hidden)
    assert_named(verdict, SUM_KEYS)
    assert_no_catalogued_mistake(check_scaled_attention, verdict)


@hidden_or_not
def test_attention_mask_after_softmax_and_without_scale(hidden):
    verdict = verdict_of(check_scaled_attention, attention_unscaled_mask_after_softmax, hidden)
    assert_named(verdict, SUM_KEYS)
    assert_no_catalogued_mistake(check_scaled_attention, verdict)


@hidden_or_not
def test_attention_without_scale_and_unstable_softmax(hidden):
    verdict = verdict_of(check_scaled_attention, attention_unscaled_naive_exp, hidden)
    assert_named(verdict, ATTENTION_OVERFLOW)
    assert_no_catalogued_mistake(check_scaled_attention, verdict)


@hidden_or_not
def test_attention_weights_transposed(hidden):
    verdict = verdict_of(check_scaled_attention, attention_weights_transposed, hidden)
    assert_named(verdict, WEIGHTS_TRANSPOSED)


# -- attention scores and self-attention ---------------------------------------------------------


@hidden_or_not
def test_scores_transposed_and_unscaled(hidden):
    verdict = verdict_of(check_attention_scores, lambda q, k: k @ q.transpose(-2, -1), hidden)
    assert_named(verdict, SCORES_TRANSPOSED_SCALED)
    assert_no_catalogued_mistake(check_attention_scores, verdict)


@hidden_or_not
def test_scores_divided_by_a_fixed_number(hidden):
    verdict = verdict_of(check_attention_scores, lambda q, k: q @ k.transpose(-2, -1) / 8, hidden)
    assert_named(verdict, SCORES_WRONG_CONSTANT)


def test_scores_with_batch_dimensions_moved():
    def batch_moved(q, k):
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # [..., L_q, L_k]
        return scores.movedim(0, -1) if scores.dim() == 3 else scores  # batch pushed to the end

    assert_named(verdict_of(check_attention_scores, batch_moved, hidden=False), SCORES_PERMUTED)


@hidden_or_not
def test_self_attention_without_scale_and_softmax_over_queries(hidden):
    def answer(x, w_q, w_k, w_v):
        weights = torch.softmax((x @ w_q) @ (x @ w_k).transpose(-2, -1), dim=-2)
        return weights @ (x @ w_v), weights

    verdict = verdict_of(check_self_attention, answer, hidden)
    assert_named(verdict, SUM_KEYS)
    assert_no_catalogued_mistake(check_self_attention, verdict)


# -- the SelfAttention layer: two mistakes at once, and right answers written other ways ----------


class _Layer(nn.Module):
    """The constructor the notebook gives; subclasses write forward as a learner might."""

    def __init__(self, d_model, d_k, d_v=None):
        super().__init__()
        d_v = d_k if d_v is None else d_v
        self.d_k = d_k
        self.w_q = nn.Linear(d_model, d_k, bias=False)
        self.w_k = nn.Linear(d_model, d_k, bias=False)
        self.w_v = nn.Linear(d_model, d_v, bias=False)


class LayerUnscaledLengthsIgnored(_Layer):
    """No sqrt(d_k) scale AND the lengths never used: real tokens attend to the padding."""

    def forward(self, x, lengths=None):
        weights = torch.softmax(self.w_q(x) @ self.w_k(x).transpose(-2, -1), dim=-1)
        return weights @ self.w_v(x), weights


class LayerQueriesHiddenWithSqrtDModel(_Layer):
    """The padding hidden as queries (rows) AND the scores scaled by sqrt(d_model)."""

    def forward(self, x, lengths=None):
        scores = self.w_q(x) @ self.w_k(x).transpose(-2, -1) / math.sqrt(x.shape[-1])
        if lengths is not None:
            real = torch.arange(x.shape[1]) < lengths[:, None]
            scores = scores.masked_fill(~real[:, :, None], -1e9)
        weights = torch.softmax(scores, dim=-1)
        return weights @ self.w_v(x), weights


class LayerMaskAfterSoftmaxUnscaled(_Layer):
    """The padding zeroed in the weights after the softmax AND no scale."""

    def forward(self, x, lengths=None):
        weights = torch.softmax(self.w_q(x) @ self.w_k(x).transpose(-2, -1), dim=-1)
        if lengths is not None:
            weights = weights * (torch.arange(x.shape[1]) < lengths[:, None])[:, None, :]
        return weights @ self.w_v(x), weights


class LayerOneTooManyUnscaled(_Layer):
    """One padding key left visible (<= instead of <) AND no scale."""

    def forward(self, x, lengths=None):
        scores = self.w_q(x) @ self.w_k(x).transpose(-2, -1)
        if lengths is not None:
            real = torch.arange(x.shape[1]) <= lengths[:, None]
            scores = scores.masked_fill(~real[:, None, :], float("-inf"))
        weights = torch.softmax(scores, dim=-1)
        return weights @ self.w_v(x), weights


@hidden_or_not
def test_layer_without_scale_and_without_the_lengths_names_the_padding(hidden):
    verdict = verdict_of(check_self_attention_layer, LayerUnscaledLengthsIgnored, hidden)
    assert_named(verdict, WEIGHT_ON_PADDING)
    assert_no_catalogued_mistake(check_self_attention_layer, verdict)


@hidden_or_not
def test_layer_masking_the_queries_with_the_wrong_scale_names_the_padding(hidden):
    verdict = verdict_of(check_self_attention_layer, LayerQueriesHiddenWithSqrtDModel, hidden)
    assert_named(verdict, WEIGHT_ON_PADDING)
    assert_no_catalogued_mistake(check_self_attention_layer, verdict)


@hidden_or_not
def test_layer_masking_after_the_softmax_without_scale_names_the_sums(hidden):
    verdict = verdict_of(check_self_attention_layer, LayerMaskAfterSoftmaxUnscaled, hidden)
    assert_named(verdict, SUM_KEYS, absent=[WEIGHT_ON_PADDING])
    assert_no_catalogued_mistake(check_self_attention_layer, verdict)


@hidden_or_not
def test_layer_one_padding_key_too_many_without_scale_names_the_padding(hidden):
    verdict = verdict_of(check_self_attention_layer, LayerOneTooManyUnscaled, hidden)
    assert_named(verdict, WEIGHT_ON_PADDING)
    assert_no_catalogued_mistake(check_self_attention_layer, verdict)


class LayerThroughScaledAttention(_Layer):
    """Right: the projections, then chapter 02's scaled attention with a [batch, 1, seq] mask."""

    def forward(self, x, lengths=None):
        mask = None
        if lengths is not None:
            mask = (torch.arange(x.shape[1])[None, :] < lengths.unsqueeze(1)).unsqueeze(1)  # [batch, 1, seq]
        return scaled_dot_product_attention(self.w_q(x), self.w_k(x), self.w_v(x), mask=mask)


class LayerWithMinusInfAndFusedOutput(_Layer):
    """Right: -inf for the padding, the weights by hand and the output from PyTorch's fused kernel."""

    def forward(self, x, lengths=None):
        q, k, v = self.w_q(x), self.w_k(x), self.w_v(x)
        bias = torch.zeros(x.shape[0], 1, x.shape[1], dtype=x.dtype)
        if lengths is not None:
            bias = bias.masked_fill(torch.arange(x.shape[1]) >= lengths[:, None, None], float("-inf"))
        weights = torch.softmax(q @ k.mT * self.d_k**-0.5 + bias, dim=-1)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias), weights


class LayerLoopOverSentences(_Layer):
    """Right: one sentence at a time, attention over its real keys only, padded rows included."""

    def forward(self, x, lengths=None):
        outputs, all_weights = [], []
        for b in range(x.shape[0]):
            n = x.shape[1] if lengths is None else int(lengths[b])
            q, k, v = self.w_q(x[b]), self.w_k(x[b, :n]), self.w_v(x[b, :n])  # keys and values: real only
            weights = torch.softmax(q @ k.T / math.sqrt(self.d_k), dim=-1)  # [seq, n]
            outputs.append(weights @ v)
            all_weights.append(F.pad(weights, (0, x.shape[1] - n)))  # zero columns for the padding
        return torch.stack(outputs), torch.stack(all_weights)


@pytest.mark.parametrize("answer", [LayerThroughScaledAttention, LayerWithMinusInfAndFusedOutput,
                                    LayerLoopOverSentences], ids=lambda a: a.__name__)
@hidden_or_not
def test_layer_written_another_way_is_accepted(answer, hidden):
    verdict = verdict_of(check_self_attention_layer, answer, hidden)
    assert verdict.passed, verdict.message


# -- and never on a right answer ---------------------------------------------------------------


@pytest.mark.parametrize("checker", [c for c in CHECKERS if c.properties], ids=lambda c: c.name)
def test_no_property_is_seen_on_the_reference(checker):
    cases = checker.cases(hidden=True)
    outputs = checker.collect_outputs(checker.reference, hidden=True)
    for prop in checker.properties:
        for case, output in zip(cases, outputs):
            assert not prop.seen(case, output, output), f"{prop.name} fires on the reference, {case.describe()}"
