"""transformer_lib.masks: the masks themselves, and attention under them held against
`torch.nn.functional.scaled_dot_product_attention` (same convention: True = may attend)."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from transformer_lib.attention import scaled_dot_product_attention
from tensors import TOL, random_qkv
from transformer_lib.masks import causal_mask, combine_masks, padding_mask

DTYPES = [torch.float32, torch.float64]
PAD = 0


def _tokens(lengths, seq, pad_id=PAD):
    """A [batch, seq] batch of token ids; sequence b has lengths[b] real tokens, then padding."""
    tokens = torch.full((len(lengths), seq), pad_id, dtype=torch.long)
    for b, n in enumerate(lengths):
        tokens[b, :n] = torch.arange(n) + pad_id + 1
    return tokens


# ---------------------------------------------------------------- the masks themselves


@pytest.mark.parametrize("size", [1, 2, 5, 7])
def test_causal_mask_is_lower_triangular(size):
    mask = causal_mask(size)
    assert mask.dtype == torch.bool and mask.shape == (size, size)
    for i in range(size):
        for j in range(size):
            assert mask[i, j] == (j <= i), f"query {i} and key {j}: may attend iff j <= i"


def test_causal_mask_accepts_numpy_and_tensor_integers():
    assert torch.equal(causal_mask(np.int64(4)), causal_mask(4))
    assert torch.equal(causal_mask(torch.tensor(4)), causal_mask(4))


def test_causal_mask_device():
    assert causal_mask(3, device="meta").device.type == "meta"


def test_padding_mask_shape_and_values():
    tokens = _tokens([5, 3, 1], seq=5)
    mask = padding_mask(tokens, PAD)
    assert mask.dtype == torch.bool and mask.shape == (3, 1, 1, 5)
    assert torch.equal(mask[:, 0, 0], tokens != PAD)
    assert mask[1, 0, 0].tolist() == [True, True, True, False, False]


def test_padding_mask_uses_the_given_pad_id():
    tokens = torch.tensor([[0, 7, 3, 3], [5, 3, 0, 3]])
    assert padding_mask(tokens, 3)[:, 0, 0].tolist() == [[True, True, False, False], [True, False, True, False]]


def test_padding_mask_hides_keys_not_queries():
    # Broadcast over queries: every query of a sequence, padded or not, sees the same keys.
    mask = padding_mask(_tokens([2], seq=4), PAD).expand(1, 1, 4, 4)
    assert mask[0, 0].tolist() == [[True, True, False, False]] * 4


def test_combine_masks_is_logical_and_with_broadcasting():
    pad = padding_mask(_tokens([4, 2], seq=4), PAD)  # [2, 1, 1, 4]
    combined = combine_masks(causal_mask(4), pad)
    assert combined.shape == (2, 1, 4, 4)
    assert torch.equal(combined[0, 0], causal_mask(4))
    assert combined[1, 0].tolist() == [
        [True, False, False, False],
        [True, True, False, False],
        [True, True, False, False],
        [True, True, False, False],
    ]


def test_combine_masks_skips_none():
    m = causal_mask(3)
    assert combine_masks() is None
    assert combine_masks(None, None) is None
    assert torch.equal(combine_masks(None, m), m)
    assert torch.equal(combine_masks(m, None, m), m)


# ---------------------------------------------------------------- attention under masks


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("batch", [(), (2,), (2, 3)], ids=str)
@pytest.mark.parametrize("scale", [None, 1.0], ids=lambda s: f"scale={s}")
def test_causal_mask_matches_torch_is_causal(batch, dtype, scale):
    q, k, v = random_qkv(batch, 6, 6, 5, 9, dtype)
    out, weights = scaled_dot_product_attention(q, k, v, mask=causal_mask(6), scale=scale)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale), **TOL[dtype])
    torch.testing.assert_close(
        out, F.scaled_dot_product_attention(q, k, v, attn_mask=causal_mask(6), scale=scale), **TOL[dtype]
    )
    assert (weights.triu(diagonal=1) == 0).all(), "a query must give exactly zero weight to later keys"
    torch.testing.assert_close(weights.sum(-1), torch.ones(weights.shape[:-1], dtype=dtype), **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("lengths", [[7, 7], [7, 3, 1], [2, 5]], ids=str)
def test_padding_mask_matches_torch(lengths, dtype):
    batch, heads, seq = len(lengths), 3, 7
    q, k, v = random_qkv((batch, heads), seq, seq, 5, 11, dtype)
    mask = padding_mask(_tokens(lengths, seq), PAD)  # [batch, 1, 1, seq]
    out, weights = scaled_dot_product_attention(q, k, v, mask=mask)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask), **TOL[dtype])
    for b, n in enumerate(lengths):
        assert (weights[b, :, :, n:] == 0).all(), f"sequence {b}: padding keys {n}.. must get zero weight"
    torch.testing.assert_close(weights.sum(-1), torch.ones(batch, heads, seq, dtype=dtype), **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("scale", [None, 1.0], ids=lambda s: f"scale={s}")
def test_combined_causal_and_padding_matches_torch(dtype, scale):
    lengths, heads, seq = [6, 4, 1], 2, 6
    q, k, v = random_qkv((len(lengths), heads), seq, seq, 3, 11, dtype)
    mask = combine_masks(causal_mask(seq), padding_mask(_tokens(lengths, seq), PAD))  # [3, 1, 6, 6]
    out, weights = scaled_dot_product_attention(q, k, v, mask=mask, scale=scale)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    torch.testing.assert_close(out, expected, **TOL[dtype])
    assert (weights[~mask.expand_as(weights)] == 0).all()
    # A causal mask always leaves key 0 visible, so no row is empty: every row sums to one.
    torch.testing.assert_close(weights.sum(-1), torch.ones(len(lengths), heads, seq, dtype=dtype), **TOL[dtype])


def test_padding_mask_with_cross_attention_of_odd_sizes():
    # Decoder queries (5) attending to padded encoder keys (7): only the keys are masked.
    q, k, v = random_qkv((2, 1), 5, 7, 3, 11, torch.float64)
    mask = padding_mask(_tokens([7, 4], seq=7), PAD)
    out, weights = scaled_dot_product_attention(q, k, v, mask=mask)
    assert out.shape == (2, 1, 5, 11) and weights.shape == (2, 1, 5, 7)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask))


def test_float16_under_combined_mask_stays_finite():
    q, k, v = random_qkv((2, 2), 6, 6, 8, 4, torch.float16)
    mask = combine_masks(causal_mask(6), padding_mask(_tokens([6, 2], seq=6), PAD))
    out, weights = scaled_dot_product_attention(q, k, v, mask=mask)
    assert out.isfinite().all() and weights.isfinite().all()
    assert (weights[~mask.expand_as(weights)] == 0).all()


# ---------------------------------------------------------------- clear errors


@pytest.mark.parametrize("size", [0, -3, 2.5, "4", None, True])
def test_causal_mask_rejects_non_positive_or_non_integer_size(size):
    with pytest.raises(ValueError, match=r"causal_mask needs a positive integer size"):
        causal_mask(size)


@pytest.mark.parametrize(
    "tokens, error, message",
    [
        (torch.tensor([1, 2, 0]), ValueError, r"shape \[batch, seq\], got shape \[3\]"),
        (torch.zeros(2, 3, 4, dtype=torch.long), ValueError, r"shape \[batch, seq\], got shape \[2, 3, 4\]"),
        (torch.tensor([[1.0, 2.0, 0.0]]), TypeError, r"integer token ids, got dtype torch.float32"),
        ([[1, 2, 0]], TypeError, r"torch.Tensor of token ids.*got list"),
    ],
    ids=["1-D", "3-D", "float", "list"],
)
def test_padding_mask_rejects_bad_tokens(tokens, error, message):
    with pytest.raises(error, match=message):
        padding_mask(tokens, PAD)


def test_combine_masks_rejects_non_boolean():
    with pytest.raises(TypeError, match=r"boolean masks.*mask 1 is torch.int64"):
        combine_masks(causal_mask(3), torch.ones(3, 3, dtype=torch.long))


def test_combine_masks_rejects_shapes_that_do_not_broadcast():
    with pytest.raises(ValueError, match=r"must broadcast together; got shapes \[3, 3\], \[4, 4\]"):
        combine_masks(causal_mask(3), causal_mask(4))


def test_padding_mask_for_a_different_length_is_caught_by_attention():
    q, k, v = random_qkv((2, 1), 5, 5, 3, 3, torch.float32)
    with pytest.raises(ValueError, match=r"mask of shape \[2, 1, 1, 7\] does not broadcast"):
        scaled_dot_product_attention(q, k, v, mask=padding_mask(_tokens([7, 3], seq=7), PAD))
