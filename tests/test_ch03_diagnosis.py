"""Chapter 03's checkers name the errors of a learner who makes two mistakes at once.

A catalogued mistake is recognised only when the learner's output equals it exactly; the
answers below combine two catalogued mistakes, so no catalogue entry matches, and the
verdict must still name what is wrong from traits of the output (core.Property).
"""

import math

import pytest
import torch

from transformer_lib.attention import attention_entropy, multi_head_attention_forward, split_heads
from transformer_lib.checks.ch03 import (
    SPLIT_HEADS_MIXED,
    SPLIT_MEMORY_ORDER,
    SPLIT_POSITIONS_SCRAMBLED,
    SPLIT_SHAPE_PERMUTED,
    check_attention_entropy,
    check_merge_heads,
    check_multi_head_attention_forward,
    check_split_heads,
)


def _verdict(checker, fn, hidden):
    return checker.judge(checker.collect_outputs(fn, hidden), hidden)


def _no_transpose_and_head_size_first(x, n_heads):
    """Reshape without transpose AND the feature axis cut as (d_k, n_heads)."""
    b, s, d = x.shape
    return x.reshape(b, s, d // n_heads, n_heads)  # [batch, seq, d_k, heads]


def _straight_view_then_transpose(x, n_heads):
    """view(batch, heads, seq, d_k) straight (scrambles the tokens) AND a transpose of
    dims 1, 2 on top, as if it were the recipe's second step."""
    b, s, d = x.shape
    return x.reshape(b, n_heads, s, d // n_heads).transpose(1, 2)  # [batch, seq, heads, d_k]


def _straight_view_last_two_swapped(x, n_heads):
    """view(batch, heads, seq, d_k) straight AND the last two dims swapped."""
    b, s, d = x.shape
    return x.reshape(b, n_heads, s, d // n_heads).transpose(-2, -1)  # [batch, heads, d_k, seq]


COMBINED = [
    (_no_transpose_and_head_size_first, [SPLIT_SHAPE_PERMUTED, SPLIT_MEMORY_ORDER, SPLIT_HEADS_MIXED]),
    (_straight_view_then_transpose, [SPLIT_SHAPE_PERMUTED, SPLIT_HEADS_MIXED, SPLIT_POSITIONS_SCRAMBLED]),
    (_straight_view_last_two_swapped, [SPLIT_SHAPE_PERMUTED, SPLIT_HEADS_MIXED, SPLIT_POSITIONS_SCRAMBLED]),
]


@pytest.mark.parametrize("answer,traits", COMBINED, ids=[fn.__name__ for fn, _ in COMBINED])
@pytest.mark.parametrize("hidden", [False, True], ids=["visible", "hidden"])
def test_split_heads_names_combined_mistakes_by_property(answer, traits, hidden):
    verdict = _verdict(check_split_heads, answer, hidden)
    assert not verdict.passed
    catalogue = {m.name for m in check_split_heads.mistakes}
    assert verdict.mistake not in catalogue, "a combined mistake should not match a single catalogue entry"
    assert verdict.mistake == traits[0].name
    for trait in traits:
        assert trait.name in verdict.message and trait.fix in verdict.message, (trait.name, verdict.message)


def test_split_heads_properties_stay_silent_on_changed_numbers():
    """Right layout, wrong numbers: no rearrangement trait applies, the message says what differs."""

    def doubled(x, n_heads):
        return 2 * split_heads(x, n_heads)

    verdict = _verdict(check_split_heads, doubled, hidden=True)
    assert verdict.mistake is None
    assert "values differ" in verdict.message


def test_split_heads_single_trait_for_the_forgotten_transpose_is_catalogued():
    def forgotten(x, n_heads):
        b, s, d = x.shape
        return x.view(b, s, n_heads, d // n_heads)

    verdict = _verdict(check_split_heads, forgotten, hidden=True)
    assert verdict.mistake.startswith("the transpose forgotten")


def test_merge_heads_names_a_reshape_without_transpose_to_the_wrong_shape():
    def merged(x):
        b, h, s, d_k = x.shape
        return x.reshape(b, h * d_k, s)  # no transpose, and features before positions

    verdict = _verdict(check_merge_heads, merged, hidden=True)
    assert "right sizes in the wrong order" in verdict.message
    assert "original memory order" in verdict.message


def test_multi_head_weights_with_heads_and_queries_swapped_are_named():
    def swapped(*args, **kwargs):
        out, weights = multi_head_attention_forward(*args, **kwargs)
        return out, weights.transpose(1, 2)  # [batch, L_q, heads, L_k]

    verdict = _verdict(check_multi_head_attention_forward, swapped, hidden=True)
    assert "right sizes in the wrong order" in verdict.message


@pytest.mark.parametrize(
    "answer,traits",
    [
        (lambda w: (w * w.log()).sum(dim=-1), ["NaN where a query has keys of weight 0", "negative entropies"]),
        (lambda w: -(w * w.log2()).sum(dim=-1), ["NaN where a query has keys of weight 0", "bits instead of nats"]),
    ],
    ids=["nan_and_no_minus", "nan_and_bits"],
)
def test_attention_entropy_names_combined_mistakes_by_property(answer, traits):
    verdict = _verdict(check_attention_entropy, answer, hidden=True)
    assert not verdict.passed
    assert verdict.mistake not in {m.name for m in check_attention_entropy.mistakes}
    for trait in traits:
        assert trait in verdict.message, verdict.message


def test_attention_entropy_worked_example():
    weights = torch.tensor([[1.0, 0.0, 0.0, 0.0], [0.25, 0.25, 0.25, 0.25], [0.5, 0.5, 0.0, 0.0]])
    torch.testing.assert_close(attention_entropy(weights), torch.tensor([0.0, math.log(4), math.log(2)]))
    assert torch.equal(attention_entropy(torch.zeros(2, 3)).abs(), torch.zeros(2)), "a query that sees no key: 0"
