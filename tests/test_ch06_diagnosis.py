"""Chapter 06's checkers diagnose combined mistakes by property.

tests/test_checkers.py proves that each catalogued mistake is named when it is made alone.
Learners often make two at once (a mask inverted *and* off by one, a float mask *and* the
wrong padding id), and then no catalogue entry matches: the properties must still name
each error from a trait of the output. And correct answers written another way must pass."""

import math

import pytest
import torch

from transformer_lib.attention import scaled_dot_product_attention
from transformer_lib.checks import ch06


def _verdict(checker, fn, hidden=True):
    return checker.judge(checker.collect_outputs(fn, hidden), hidden)


def _ones(n):
    return torch.ones(n, n, dtype=torch.bool)


# ------------------------------------------------------------------- combined mistakes


def causal_inverted_and_off_by_one(size):
    return ~_ones(size).tril(1)  # True = hide, and hides one step too few: i sees i + 2 onwards


def causal_float_future_marked(size):
    return torch.ones(size, size).triu(1)  # the common tutorial mask: 1 on the future, a float


def causal_off_by_one_into_the_future(size):
    return _ones(size).tril(1)  # i sees i + 1


def padding_additive_and_zero_hard_coded(tokens, pad_id):
    return torch.zeros(tokens.shape).masked_fill(tokens == 0, float("-inf"))[:, None, None, :]


def padding_inverted_on_the_query_axis(tokens, pad_id):
    return (tokens == pad_id)[:, None, :, None]


def padding_3d_and_zero_hard_coded(tokens, pad_id):
    return (tokens != 0)[:, None, :]


def combine_inverted_and_off_by_one(tokens, pad_id):
    n = tokens.shape[1]
    return ~(_ones(n).tril(-1) & (tokens != pad_id)[:, None, None, :])


def combine_future_and_queries(tokens, pad_id):
    n = tokens.shape[1]
    return _ones(n).tril(1) & (tokens != pad_id)[:, None, :, None]


def combine_float_and_or(tokens, pad_id):
    n = tokens.shape[1]
    return (_ones(n).tril() | (tokens != pad_id)[:, None, None, :]).float()


def cross_kv_from_decoder_and_unscaled(x, memory, w_q, w_k, w_v, mask=None):
    return scaled_dot_product_attention(x @ w_q, x @ w_k, x @ w_v, mask=mask, scale=1.0)


def cross_causal_and_unscaled(x, memory, w_q, w_k, w_v, mask=None):
    causal = torch.ones(x.shape[-2], memory.shape[-2], dtype=torch.bool).tril()
    mask = causal if mask is None else causal & mask
    return scaled_dot_product_attention(x @ w_q, memory @ w_k, memory @ w_v, mask=mask, scale=1.0)


def cross_unmasked_and_scaled_by_d_model(x, memory, w_q, w_k, w_v, mask=None):
    return scaled_dot_product_attention(x @ w_q, memory @ w_k, memory @ w_v, scale=x.shape[-1] ** -0.5)


def softmax_minus_inf_and_inverted(scores, mask):
    return torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1)


def softmax_after_and_inverted(scores, mask):
    return torch.softmax(scores, dim=-1) * ~mask


def decoder_layer_unmasked_and_ffn_first(x, memory, src_mask, tgt_mask, layer):
    def step(x, sublayer, norm):
        return norm(x + sublayer(x)) if not layer.norm_first else x + sublayer(norm(x))

    x = step(x, lambda y: layer.self_attn(y, y, y), layer.norm1)  # no causal mask
    x = step(x, layer.feed_forward, layer.norm2)  # and the FFN before the cross-attention
    return step(x, lambda y: layer.cross_attn(y, memory, memory, src_mask), layer.norm3)


def decoder_layer_cross_on_decoder_and_one_norm(x, memory, src_mask, tgt_mask, layer):
    def step(x, sublayer):
        return layer.norm1(x + sublayer(x)) if not layer.norm_first else x + sublayer(layer.norm1(x))

    x = step(x, lambda y: layer.self_attn(y, y, y, tgt_mask))
    x = step(x, lambda y: layer.cross_attn(y, y, y))  # the decoder's own states, no mask: reads the future
    return step(x, layer.feed_forward)


def decoder_layer_post_norm_with_an_extra_residual(x, memory, src_mask, tgt_mask, layer):
    def step(x, sublayer, norm):
        return x + norm(x + sublayer(x)) if not layer.norm_first else x + sublayer(norm(x))

    x = step(x, lambda y: layer.self_attn(y, y, y, tgt_mask), layer.norm1)
    x = step(x, lambda y: layer.cross_attn(y, memory, memory), layer.norm2)  # and no source mask
    return step(x, layer.feed_forward, layer.norm3)


COMBINED = [
    (ch06.check_make_causal_mask, causal_inverted_and_off_by_one,
     ["a mask with True and False swapped", "see the future"]),
    (ch06.check_make_causal_mask, causal_float_future_marked,
     ["a mask of numbers instead of booleans", "see the future", "hides the diagonal"]),
    (ch06.check_make_causal_mask, causal_off_by_one_into_the_future, ["see the future"]),
    (ch06.check_make_padding_mask, padding_additive_and_zero_hard_coded,
     ["a mask of numbers instead of booleans", "comparing with 0 instead of the pad_id"]),
    (ch06.check_make_padding_mask, padding_inverted_on_the_query_axis,
     ["a mask with True and False swapped", "padding on the query axis"]),
    (ch06.check_make_padding_mask, padding_3d_and_zero_hard_coded,
     ["another shape than [batch, 1, 1, seq]", "comparing with 0 instead of the pad_id"]),
    (ch06.check_combine_decoder_mask, combine_inverted_and_off_by_one,
     ["a mask with True and False swapped", "see the future"]),
    (ch06.check_combine_decoder_mask, combine_future_and_queries,
     ["see the future", "padded queries hidden as whole rows"]),
    (ch06.check_combine_decoder_mask, combine_float_and_or,
     ["a mask of numbers instead of booleans", "a padded key left visible", "see the future"]),
    (ch06.check_cross_attention, cross_kv_from_decoder_and_unscaled,
     ["keys and values taken from x, not from memory"]),
    (ch06.check_cross_attention, cross_causal_and_unscaled, ["a causal mask in cross-attention"]),
    (ch06.check_cross_attention, cross_unmasked_and_scaled_by_d_model, ["source keys the mask hides"]),
    (ch06.check_masked_softmax, softmax_minus_inf_and_inverted,
     ["NaN where the reference has numbers", "weight given to keys the mask hides"]),
    (ch06.check_masked_softmax, softmax_after_and_inverted,
     ["weight given to keys the mask hides", "do not sum to 1"]),
    (ch06.check_decoder_layer_forward, decoder_layer_unmasked_and_ffn_first, ["the future leaks into the past"]),
    (ch06.check_decoder_layer_forward, decoder_layer_cross_on_decoder_and_one_norm,
     ["the future leaks into the past"]),
    (ch06.check_decoder_layer_forward, decoder_layer_post_norm_with_an_extra_residual,
     ["a post-norm output that is not norm3's output"]),
]


@pytest.mark.parametrize("checker,answer,traits", COMBINED, ids=[a.__name__ for _, a, _ in COMBINED])
@pytest.mark.parametrize("hidden", [False, True], ids=["visible", "hidden"])
def test_combined_mistakes_are_named_by_property(checker, answer, traits, hidden):
    verdict = _verdict(checker, answer, hidden)
    assert not verdict.passed
    assert "looks like" not in verdict.message, f"a single catalogue entry matched: {verdict.message}"
    assert verdict.mistake in {p.name for p in checker.properties}, verdict.message
    for trait in traits:
        assert trait in verdict.message, verdict.message
    assert "\n" not in verdict.message


def test_a_mask_in_another_layout_is_not_called_inverted():
    # [batch, 1, seq] broadcast against the reference [batch, 1, 1, seq] pairs one sentence's
    # tokens with another's; the comparison must go entry by entry instead.
    verdict = _verdict(ch06.check_make_padding_mask, padding_3d_and_zero_hard_coded)
    assert "swapped" not in verdict.message, verdict.message


def test_a_mask_of_all_true_is_not_called_a_hard_coded_zero():
    def all_true(tokens, pad_id):
        return torch.ones_like(tokens, dtype=torch.bool)[:, None, None, :]

    verdict = _verdict(ch06.check_make_padding_mask, all_true)
    assert not verdict.passed
    assert "comparing with 0" not in verdict.message and "swapped" not in verdict.message, verdict.message


# ------------------------------------------------------------------- right answers, other ways


def causal_by_comparison(size):
    i = torch.arange(size)
    return i[None, :] <= i[:, None]  # key index <= query index


def padding_by_unsqueeze(tokens, pad_id):
    return tokens.ne(pad_id).unsqueeze(1).unsqueeze(2)


def combine_by_hand(tokens, pad_id):
    return causal_by_comparison(tokens.shape[1]) & padding_by_unsqueeze(tokens, pad_id)


def cross_by_hand(x, memory, w_q, w_k, w_v, mask=None):
    q, k, v = x @ w_q, memory @ w_k, memory @ w_v
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # [batch, T, S]
    if mask is not None:
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    weights = torch.softmax(scores, dim=-1)
    return weights @ v, weights


def softmax_with_torch(scores, mask):
    weights = torch.softmax(scores.masked_fill(~mask, torch.finfo(scores.dtype).min), dim=-1)
    return weights * mask.any(dim=-1, keepdim=True)


def decoder_layer_by_hand(x, memory, src_mask, tgt_mask, layer):
    sublayers = [(lambda y: layer.dropout1(layer.self_attn(y, y, y, mask=tgt_mask)), layer.norm1),
                 (lambda y: layer.dropout2(layer.cross_attn(y, memory, memory, mask=src_mask)), layer.norm2),
                 (lambda y: layer.dropout3(layer.feed_forward(y)), layer.norm3)]
    for sublayer, norm in sublayers:
        x = x + sublayer(norm(x)) if layer.norm_first else norm(x + sublayer(x))
    return x


def decoder_layer_with_the_chapter_05_function(x, memory, src_mask, tgt_mask, layer):
    from transformer_lib.layers import add_and_norm
    for sublayer, norm in [(lambda y: layer.self_attn(y, y, y, tgt_mask), layer.norm1),
                           (lambda y: layer.cross_attn(y, memory, memory, src_mask), layer.norm2),
                           (layer.feed_forward, layer.norm3)]:
        x = add_and_norm(x, sublayer, norm.gamma, norm.beta, layer.norm_first, norm.eps)
    return x


RIGHT = [
    (ch06.check_make_causal_mask, causal_by_comparison),
    (ch06.check_make_padding_mask, padding_by_unsqueeze),
    (ch06.check_combine_decoder_mask, combine_by_hand),
    (ch06.check_cross_attention, cross_by_hand),
    (ch06.check_masked_softmax, softmax_with_torch),
    (ch06.check_decoder_layer_forward, decoder_layer_by_hand),
    (ch06.check_decoder_layer_forward, decoder_layer_with_the_chapter_05_function),
]


@pytest.mark.parametrize("checker,answer", RIGHT, ids=[a.__name__ for _, a in RIGHT])
def test_right_answers_written_differently_pass(checker, answer):
    verdict = _verdict(checker, answer)
    assert verdict.passed, verdict.message


def test_calling_the_decoder_layer_itself_is_refused_with_a_clear_message():
    verdict = _verdict(ch06.check_decoder_layer_forward,
                       lambda x, memory, src_mask, tgt_mask, layer: layer(x, memory, src_mask, tgt_mask))
    assert not verdict.passed and "build the forward pass from its parts" in verdict.message, verdict.message


def test_the_decoder_layer_checker_changes_only_the_last_real_target_token():
    for case in ch06.check_decoder_layer_forward.cases(hidden=True):
        out = ch06._invoke_decoder_layer(ch06.decoder_layer_forward, case)
        before, after = out["output"], out["output after the last target token changed"]
        for b, n in enumerate(case.kwargs["tgt_lengths"]):
            assert torch.equal(before[b, : n - 1], after[b, : n - 1]), case.name  # causal: the past is untouched
            assert not torch.allclose(before[b, n - 1], after[b, n - 1]), case.name


def test_chapter_has_six_exercises_each_with_three_mistakes():
    assert len(ch06.CHECKERS) >= 6
    for checker in ch06.CHECKERS:
        assert len(checker.mistakes) >= 3, checker.name
        assert checker.properties, checker.name
