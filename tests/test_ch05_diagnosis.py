"""Chapter 05's checkers name an error even when a learner makes two at once.

A catalogue entry recognises one exact wrong answer; two mistakes together match none of
them. The properties of transformer_lib/checks/ch05.py still name the error from a trait of
the output: a LayerNorm whose vectors do not come out with mean 0 and variance 1 (on the
cases with gain 1 and bias 0), NaN on a constant vector, a post-norm layer that does not end
with its LayerNorm, a pre-norm stack without its final norm. Each learner function below
combines two catalogued mistakes; the verdict must fail and name the property.
"""

import pytest
import torch

from transformer_lib.checks.ch05 import (check_batch_norm, check_encoder_forward, check_encoder_layer_forward,
                                         check_layer_norm)
from transformer_lib.layers import add_and_norm, encoder_forward

MEAN_VAR = "vectors along dim=-1 that do not come out with mean 0 and variance 1"
NAN_CONSTANT = "NaN or inf on a constant vector"
REAL_TOKENS = "features that do not come out with mean 0 and variance 1 over the batch's real tokens"
POST_NORM_END = "a post-norm output that is not norm2's output"
PRE_NORM_STACK = "a pre-norm stack whose output is not the final LayerNorm's"


# -- learners' LayerNorms, two mistakes each ------------------------------------------------------


def ln_over_batch_and_unbiased(x, gamma, beta, eps=1e-5):
    """Statistics over dim 0 (the batch) AND torch.var's unbiased default."""
    mean = x.mean(dim=0, keepdim=True)
    var = x.var(dim=0, keepdim=True) if x.shape[0] > 1 else torch.zeros_like(mean)
    return gamma * (x - mean) / torch.sqrt(var + eps) + beta


def ln_over_positions_no_eps(x, gamma, beta, eps=1e-5):
    """Statistics over the positions (dim=-2) AND no eps."""
    mean = x.mean(dim=-2, keepdim=True)
    var = ((x - mean) ** 2).mean(dim=-2, keepdim=True)
    return gamma * (x - mean) / torch.sqrt(var) + beta


def ln_over_batch_no_eps(x, gamma, beta, eps=1e-5):
    """Statistics over dim 0 AND no eps."""
    mean = x.mean(dim=0, keepdim=True)
    var = ((x - mean) ** 2).mean(dim=0, keepdim=True)
    return gamma * (x - mean) / torch.sqrt(var) + beta


def ln_unbiased_no_eps(x, gamma, beta, eps=1e-5):
    """The unbiased variance (divided by d - 1, torch.std's default) AND no eps: the right axis,
    but 0 / 0 on a constant vector."""
    mean = x.mean(dim=-1, keepdim=True)
    var = ((x - mean) ** 2).sum(dim=-1, keepdim=True) / (x.shape[-1] - 1)
    return gamma * (x - mean) / torch.sqrt(var) + beta


@pytest.mark.parametrize("hidden", [False, True], ids=["visible", "hidden"])
@pytest.mark.parametrize("learner,trait", [
    (ln_over_batch_and_unbiased, MEAN_VAR),
    (ln_over_positions_no_eps, MEAN_VAR),
    (ln_over_batch_no_eps, MEAN_VAR),
    (ln_unbiased_no_eps, NAN_CONSTANT),
], ids=lambda v: getattr(v, "__name__", "")[:30])
def test_layer_norm_two_mistakes_are_named_by_a_property(learner, trait, hidden):
    verdict = check_layer_norm.judge(check_layer_norm.collect_outputs(learner, hidden), hidden)
    assert not verdict.passed
    assert verdict.mistake not in {m.name for m in check_layer_norm.mistakes}, "no single mistake should match"
    assert trait in verdict.message, verdict.message
    assert "\n" not in verdict.message  # CheckFailed shows it as one line


def test_unbiased_without_eps_names_both_traits():
    verdict = check_layer_norm.judge(check_layer_norm.collect_outputs(ln_unbiased_no_eps))
    assert MEAN_VAR in verdict.message and NAN_CONSTANT in verdict.message, verdict.message


# -- batch_norm: mask ignored AND unbiased variance -----------------------------------------------


def bn_mask_ignored_and_unbiased(x, mask=None, eps=1e-5):
    mean = x.mean(dim=(0, 1), keepdim=True)
    var = x.var(dim=(0, 1), keepdim=True)  # unbiased, and padding counted
    return (x - mean) / torch.sqrt(var + eps)


@pytest.mark.parametrize("hidden", [False, True], ids=["visible", "hidden"])
def test_batch_norm_two_mistakes_are_named_by_a_property(hidden):
    verdict = check_batch_norm.judge(check_batch_norm.collect_outputs(bn_mask_ignored_and_unbiased, hidden), hidden)
    assert not verdict.passed and REAL_TOKENS in verdict.message, verdict.message


# -- encoder_layer_forward: norm before the residual AND the mask dropped ------------------------


def layer_norm_before_residual_and_no_mask(x, mask, layer):
    def attention(y):
        return layer.dropout1(layer.self_attn(y, y, y))  # the mask is not passed

    if layer.norm_first:
        x = add_and_norm(x, attention, layer.norm1.gamma, layer.norm1.beta, True)
        return add_and_norm(x, layer.feed_forward, layer.norm2.gamma, layer.norm2.beta, True)
    x = x + layer.norm1(attention(x))  # post-norm with the norm before the residual
    return x + layer.norm2(layer.dropout2(layer.feed_forward(x)))


@pytest.mark.parametrize("hidden", [False, True], ids=["visible", "hidden"])
def test_encoder_layer_two_mistakes_are_named_by_a_property(hidden):
    checker = check_encoder_layer_forward
    verdict = checker.judge(checker.collect_outputs(layer_norm_before_residual_and_no_mask, hidden), hidden)
    assert not verdict.passed and POST_NORM_END in verdict.message, verdict.message


def test_calling_the_layer_itself_is_refused_with_a_clear_message():
    verdict = check_encoder_layer_forward.judge(check_encoder_layer_forward.collect_outputs(
        lambda x, mask, layer: layer(x, mask)))
    assert not verdict.passed and "build the forward pass from its parts" in verdict.message, verdict.message


# -- encoder_forward: no final norm AND the mask dropped -----------------------------------------


def stack_without_final_norm_or_mask(x, mask, encoder, layer_forward):
    for layer in encoder.layers:
        x = layer_forward(x, None, layer)
    return x


@pytest.mark.parametrize("hidden", [False, True], ids=["visible", "hidden"])
def test_encoder_stack_two_mistakes_are_named_by_a_property(hidden):
    checker = check_encoder_forward
    verdict = checker.judge(checker.collect_outputs(stack_without_final_norm_or_mask, hidden), hidden)
    assert not verdict.passed and PRE_NORM_STACK in verdict.message, verdict.message


def test_the_stack_must_use_the_given_layer_forward():
    verdict = check_encoder_forward.judge(check_encoder_forward.collect_outputs(
        lambda x, mask, encoder, layer_forward: encoder_forward(x, mask, encoder)))
    assert not verdict.passed and "layer_forward(x, mask, layer)" in verdict.message, verdict.message


def test_dropout_left_on_is_recognised_on_every_run():
    """The checker seeds the random state it runs an answer under (and restores it), so dropout
    wrongly left on gives the same numbers every time, and the notebook's own RNG is untouched."""
    def dropout_on(x, mask, layer):
        drop = torch.nn.Dropout(layer.dropout1.p)  # a fresh module is in training mode
        x = add_and_norm(x, lambda y: drop(layer.self_attn(y, y, y, mask)), layer.norm1.gamma, layer.norm1.beta,
                         layer.norm_first)
        return add_and_norm(x, lambda y: drop(layer.feed_forward(y)), layer.norm2.gamma, layer.norm2.beta,
                            layer.norm_first)

    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    verdicts = [check_encoder_layer_forward.judge(check_encoder_layer_forward.collect_outputs(dropout_on))
                for _ in range(2)]
    assert torch.equal(torch.rand(1), before)
    assert all(v.mistake and v.mistake.startswith("dropout left on") for v in verdicts), verdicts[0].message


# -- the references the new checkers compare with --------------------------------------------------


def test_batch_norm_reference_equals_torch_and_ignores_padding():
    from transformer_lib.layers import batch_norm

    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 5, 4, generator=g, dtype=torch.float64) * 2 + 1
    theirs = torch.nn.BatchNorm1d(4, affine=False).double().train()
    assert torch.allclose(batch_norm(x), theirs(x.transpose(1, 2)).transpose(1, 2), atol=1e-10)
    mask = torch.tensor([[True] * 5, [True] * 3 + [False] * 2, [True] + [False] * 4])
    real = x[mask]  # [real tokens, d]: BatchNorm over these alone
    expected = theirs(real)
    assert torch.allclose(batch_norm(x, mask)[mask], expected, atol=1e-10)
    changed = x.clone()
    changed[~mask] = 100.0  # what the padding holds must not matter
    assert torch.allclose(batch_norm(changed, mask)[mask], expected, atol=1e-10)
