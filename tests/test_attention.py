"""transformer_lib.attention held against PyTorch's own attention.

The trusted implementation is `torch.nn.functional.scaled_dot_product_attention`
(same equation, same boolean mask convention: True = may attend). It returns only the
output, so the weights are checked against `torch.softmax` of the reference scores.
Mask-specific comparisons (causal, padding, combined) live in test_masks.py.
"""

import math

import pytest
import torch
import torch.nn.functional as F

from transformer_lib.attention import (
    SelfAttention,
    attention_scores,
    project_qkv,
    real_tokens,
    scaled_dot_product_attention,
    self_attention,
    softmax,
)
from tensors import TOL, random_qkv
from transformer_lib.masks import causal_mask


def _reference_weights(q, k, mask=None, scale=None):
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = (q @ k.transpose(-2, -1)) * scale
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1)


def _random_mask(shape, seed=1):
    """A random boolean mask in which every query still sees at least one key."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(shape, generator=g) > 0.4
    mask[..., 0] = True
    return mask


# (batch dims, L_q, L_k, d_k, d_v): odd sizes on purpose, so that a transposed
# or swapped dimension cannot go unnoticed.
SHAPES = [
    ((), 5, 7, 3, 11),
    ((2,), 4, 4, 8, 8),
    ((2, 3), 5, 7, 3, 11),
    ((3, 2), 7, 5, 11, 3),
    ((1,), 1, 1, 1, 1),
]
DTYPES = [torch.float32, torch.float64]
SCALES = [None, 1.0, 0.3]


@pytest.mark.parametrize("scale", SCALES, ids=lambda s: f"scale={s}")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_matches_torch_without_mask(shape, dtype, scale):
    q, k, v = random_qkv(*shape, dtype)
    out, weights = scaled_dot_product_attention(q, k, v, scale=scale)
    expected = F.scaled_dot_product_attention(q, k, v, scale=scale)
    assert out.shape == expected.shape and out.dtype == dtype
    torch.testing.assert_close(out, expected, **TOL[dtype])
    torch.testing.assert_close(weights, _reference_weights(q, k, scale=scale), **TOL[dtype])


@pytest.mark.parametrize("scale", SCALES, ids=lambda s: f"scale={s}")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_matches_torch_with_random_mask(shape, dtype, scale):
    batch, l_q, l_k = shape[0], shape[1], shape[2]
    q, k, v = random_qkv(*shape, dtype)
    mask = _random_mask((*batch, l_q, l_k))
    out, weights = scaled_dot_product_attention(q, k, v, mask=mask, scale=scale)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    torch.testing.assert_close(out, expected, **TOL[dtype])
    torch.testing.assert_close(weights, _reference_weights(q, k, mask, scale), **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_mask_broadcasts_over_batch_and_heads(dtype):
    q, k, v = random_qkv((2, 3), 5, 7, 3, 11, dtype)
    mask = _random_mask((5, 7))  # one mask shared by every batch element and head
    out, _ = scaled_dot_product_attention(q, k, v, mask=mask)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(out, expected, **TOL[dtype])


def test_scale_one_is_plain_dot_product():
    q, k, v = random_qkv((2,), 5, 7, 16, 4, torch.float64)
    _, w_default = scaled_dot_product_attention(q, k, v)
    _, w_plain = scaled_dot_product_attention(q, k, v, scale=1.0)
    torch.testing.assert_close(w_plain, torch.softmax(q @ k.transpose(-2, -1), dim=-1))
    torch.testing.assert_close(attention_scores(q, k), attention_scores(q, k, scale=1.0) / 4.0)
    assert not torch.allclose(w_default, w_plain), "scale=1.0 must differ from 1/sqrt(d_k) = 1/4"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_weights_rows_sum_to_one_and_masked_keys_get_exactly_zero(dtype):
    q, k, v = random_qkv((2, 3), 5, 7, 3, 11, dtype)
    mask = _random_mask((2, 1, 5, 7))
    _, weights = scaled_dot_product_attention(q, k, v, mask=mask)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 3, 5, dtype=dtype), **TOL[dtype])
    hidden = ~mask.expand_as(weights)
    assert (weights[hidden] == 0).all(), "a hidden key must get exactly zero weight, not a tiny one"
    assert (weights[~hidden] > 0).all()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_fully_masked_row_gives_zeros_not_nan(dtype):
    q, k, v = random_qkv((2,), 5, 7, 3, 11, dtype)
    mask = _random_mask((2, 5, 7))
    mask[0, 2] = False  # query 2 of sequence 0 may see no key at all
    out, weights = scaled_dot_product_attention(q, k, v, mask=mask)
    assert not out.isnan().any() and not weights.isnan().any()
    assert (out[0, 2] == 0).all() and (weights[0, 2] == 0).all()
    # Every other row is ordinary attention. (PyTorch's own answer for the empty row has
    # been NaN in some versions, so that row is left out of the comparison.)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    keep = mask.any(-1)  # [2, 5]
    torch.testing.assert_close(out[keep], expected[keep], **TOL[dtype])
    torch.testing.assert_close(weights.sum(-1)[keep], torch.ones(int(keep.sum()), dtype=dtype))


def test_float16_with_mask_stays_finite():
    q, k, v = random_qkv((2, 2), 6, 6, 8, 4, torch.float16)
    mask = causal_mask(6)
    mask_with_empty_row = _random_mask((6, 6)).clone()
    mask_with_empty_row[3] = False
    for m in (mask, mask_with_empty_row):
        out, weights = scaled_dot_product_attention(q, k, v, mask=m)
        assert out.dtype == torch.float16
        assert out.isfinite().all() and weights.isfinite().all()
        assert (weights[..., ~m] == 0).all()
    expected = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=mask)
    torch.testing.assert_close(
        scaled_dot_product_attention(q, k, v, mask=mask)[0].double(), expected, rtol=1e-2, atol=1e-2
    )


def test_float16_large_scores_do_not_overflow():
    # q.k = 4 * 150 * 150 = 90000 overflows float16 (max 65504) if computed before the
    # 1/sqrt(d_k) scale; scaled first it is 45000, representable.
    q = torch.full((1, 4), 150.0, dtype=torch.float16)
    k = q.expand(3, 4)
    v = torch.arange(6, dtype=torch.float16).reshape(3, 2)
    mask = torch.tensor([[True, True, False]])
    out, weights = scaled_dot_product_attention(q, k, v, mask=mask)
    assert out.isfinite().all() and weights.isfinite().all()
    torch.testing.assert_close(weights, torch.tensor([[0.5, 0.5, 0.0]], dtype=torch.float16))


def test_dropout_changes_weights_but_keeps_shapes():
    q, k, v = random_qkv((2, 3), 5, 7, 3, 11, torch.float64)
    out0, w0 = scaled_dot_product_attention(q, k, v)
    torch.manual_seed(0)
    out, w = scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    assert out.shape == out0.shape and w.shape == w0.shape
    assert not torch.equal(w, w0), "dropout_p=0.5 should zero some weights"
    dropped = w == 0
    assert dropped.any() and (~dropped).any()
    # Inverted dropout: the survivors are scaled by 1 / (1 - p) so the expectation is unchanged.
    torch.testing.assert_close(w[~dropped], w0[~dropped] * 2.0)
    torch.testing.assert_close(out, w @ v)


def test_no_dropout_is_deterministic():
    q, k, v = random_qkv((2,), 5, 7, 3, 11, torch.float32)
    a = scaled_dot_product_attention(q, k, v, dropout_p=0.0)
    b = scaled_dot_product_attention(q, k, v, dropout_p=0.0)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


# ---------------------------------------------------------------- properties


def _weights(d_model=8, d_k=6, d_v=5, seed=3):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(d_model, d, generator=g, dtype=torch.float64) for d in (d_k, d_k, d_v))


def test_project_qkv_is_three_matrix_products():
    x = torch.randn(2, 7, 8, dtype=torch.float64)
    w_q, w_k, w_v = _weights()
    q, k, v = project_qkv(x, w_q, w_k, w_v)
    assert q.shape == (2, 7, 6) and k.shape == (2, 7, 6) and v.shape == (2, 7, 5)
    torch.testing.assert_close(q, torch.einsum("bsd,de->bse", x, w_q))
    torch.testing.assert_close(v, torch.einsum("bsd,de->bse", x, w_v))


def test_self_attention_matches_torch():
    x = torch.randn(2, 7, 8, dtype=torch.float64)
    w_q, w_k, w_v = _weights()
    out, weights = self_attention(x, w_q, w_k, w_v, mask=causal_mask(7))
    expected = F.scaled_dot_product_attention(x @ w_q, x @ w_k, x @ w_v, is_causal=True)
    torch.testing.assert_close(out, expected, **TOL[torch.float64])
    assert weights.shape == (2, 7, 7)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_self_attention_is_permutation_equivariant(seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 7, 8, generator=g, dtype=torch.float64)
    perm = torch.randperm(7, generator=g)
    w_q, w_k, w_v = _weights(seed=seed)
    out, weights = self_attention(x, w_q, w_k, w_v)
    out_p, weights_p = self_attention(x[:, perm], w_q, w_k, w_v)
    # Without positions, attention sees a set: shuffling the tokens shuffles the outputs.
    torch.testing.assert_close(out_p, out[:, perm])
    torch.testing.assert_close(weights_p, weights[:, perm][:, :, perm])


@pytest.mark.parametrize("changed", [0, 3, 6])
def test_causal_mask_makes_attention_causal(changed):
    x = torch.randn(1, 7, 8, dtype=torch.float64)
    w_q, w_k, w_v = _weights()
    x2 = x.clone()
    x2[:, changed] += torch.randn(8, dtype=torch.float64)
    out, _ = self_attention(x, w_q, w_k, w_v, mask=causal_mask(7))
    out2, _ = self_attention(x2, w_q, w_k, w_v, mask=causal_mask(7))
    # Changing token t changes nothing before t (exactly: hidden keys weigh exactly zero) ...
    assert torch.equal(out[:, :changed], out2[:, :changed])
    # ... and does change what comes at and after t, so the test can see a leak.
    assert not torch.allclose(out[:, changed:], out2[:, changed:])


def test_causality_check_catches_a_missing_mask():
    # Without the mask the same check must fail: a future token leaks into the past.
    x = torch.randn(1, 7, 8, dtype=torch.float64)
    w_q, w_k, w_v = _weights()
    x2 = x.clone()
    x2[:, 5] += 1.0
    out, _ = self_attention(x, w_q, w_k, w_v)
    out2, _ = self_attention(x2, w_q, w_k, w_v)
    assert not torch.allclose(out[:, :5], out2[:, :5])


# ---------------------------------------------------------------- the SelfAttention layer


def _layer(d_model=8, d_k=6, d_v=5, seed=4):
    torch.manual_seed(seed)
    return SelfAttention(d_model, d_k, d_v).double()


def test_self_attention_layer_is_the_matrix_form_with_its_weights():
    layer = _layer()
    x = torch.randn(2, 7, 8, dtype=torch.float64)
    out, weights = layer(x)
    expected = self_attention(x, layer.w_q.weight.T, layer.w_k.weight.T, layer.w_v.weight.T)
    torch.testing.assert_close(out, expected[0])
    torch.testing.assert_close(weights, expected[1])
    assert out.shape == (2, 7, 5) and weights.shape == (2, 7, 7)
    assert [name for name, _ in layer.named_parameters()] == ["w_q.weight", "w_k.weight", "w_v.weight"]


def test_self_attention_layer_hides_the_padding_as_keys():
    layer = _layer(d_v=6)
    x = torch.randn(3, 5, 8, dtype=torch.float64)
    lengths = torch.tensor([5, 2, 4])
    out, weights = layer(x, lengths)
    q, k, v = layer.w_q(x), layer.w_k(x), layer.w_v(x)
    hide = torch.arange(5) >= lengths[:, None]  # [batch, seq]: the padding
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=~hide[:, None, :])  # keys hidden, every query
    torch.testing.assert_close(out, expected, **TOL[torch.float64])
    assert (weights.masked_select(hide[:, None, :].expand_as(weights)) == 0).all()  # exactly 0 on padding
    torch.testing.assert_close(weights.sum(-1), torch.ones(3, 5, dtype=torch.float64))


def test_self_attention_layer_gives_a_sentence_the_same_vectors_in_any_batch():
    layer = _layer()
    sentence = torch.randn(1, 3, 8, dtype=torch.float64)
    padded = torch.cat([sentence, torch.randn(1, 4, 8, dtype=torch.float64)], dim=1)  # 4 positions of padding
    other = torch.randn(1, 7, 8, dtype=torch.float64)
    out, _ = layer(torch.cat([padded, other]), torch.tensor([3, 7]))
    alone, _ = layer(sentence)
    torch.testing.assert_close(out[0, :3], alone[0])


def test_real_tokens_and_bad_lengths_are_named():
    assert real_tokens(torch.tensor([3, 1, 0]), 3).tolist() == [[True, True, True], [True, False, False],
                                                                 [False, False, False]]
    layer = _layer()
    x = torch.randn(2, 4, 8, dtype=torch.float64)
    with pytest.raises(ValueError, match="0 .. 4"):
        layer(x, torch.tensor([5, 2]))
    with pytest.raises(ValueError, match="lengths has 3 entries for a batch of 2"):
        layer(x, torch.tensor([1, 2, 3]))
    with pytest.raises(TypeError, match="integer tensor"):
        layer(x, torch.tensor([1.0, 2.0]))
    with pytest.raises(ValueError, match=r"\[batch, seq, d_model\]"):
        layer(x[0])


# ---------------------------------------------------------------- softmax


@pytest.mark.parametrize(
    "values",
    [[1000.0, 1001.0], [-1000.0, -1001.0], [1e30, 0.0, -1e30], [0.0, 0.0, 0.0], [3.0]],
    ids=["huge", "huge-negative", "extreme", "equal", "single"],
)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_softmax_is_stable_for_huge_inputs(values, dtype):
    x = torch.tensor(values, dtype=dtype)
    y = softmax(x)
    assert y.isfinite().all(), f"softmax overflowed on {values}: {y}"
    torch.testing.assert_close(y, torch.softmax(x, dim=-1), **TOL[dtype])
    torch.testing.assert_close(y.sum(), torch.tensor(1.0, dtype=dtype), **TOL[dtype])


def test_softmax_of_1000_and_1001():
    y = softmax(torch.tensor([1000.0, 1001.0]))
    expected = torch.tensor([1 / (1 + math.e), math.e / (1 + math.e)])  # [0.2689, 0.7311]
    torch.testing.assert_close(y, expected)


@pytest.mark.parametrize("dim", [0, 1, 2, -1])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_softmax_matches_torch_along_any_dim(dim, dtype):
    x = torch.randn(3, 4, 5, dtype=dtype) * 50
    torch.testing.assert_close(softmax(x, dim=dim), torch.softmax(x, dim=dim), **TOL[dtype])


def test_softmax_gives_minus_inf_zero_weight():
    y = softmax(torch.tensor([float("-inf"), 0.0, 0.0]))
    torch.testing.assert_close(y, torch.tensor([0.0, 0.5, 0.5]))


# ---------------------------------------------------------------- clear errors


def _t(*shape, dtype=torch.float32):
    return torch.zeros(*shape, dtype=dtype)


BAD_ATTENTION_INPUTS = {
    "d_k mismatch": (
        dict(q=_t(2, 5, 3), k=_t(2, 7, 4), v=_t(2, 7, 11)),
        ValueError,
        r"same feature size d_k.*q has 3.*k has 4",
    ),
    "k/v length mismatch": (
        dict(q=_t(5, 3), k=_t(7, 3), v=_t(6, 11)),
        ValueError,
        r"every key needs exactly one value: k has 7 positions.*v has 6",
    ),
    "mask does not broadcast": (
        dict(q=_t(5, 3), k=_t(7, 3), v=_t(7, 11), mask=torch.ones(4, 4, dtype=torch.bool)),
        ValueError,
        r"mask of shape \[4, 4\] does not broadcast.*\[5, 7\]",
    ),
    "mask transposed": (
        dict(q=_t(2, 5, 3), k=_t(2, 7, 3), v=_t(2, 7, 11), mask=torch.ones(7, 5, dtype=torch.bool)),
        ValueError,
        r"mask of shape \[7, 5\] does not broadcast",
    ),
    "float mask": (
        dict(q=_t(5, 3), k=_t(7, 3), v=_t(7, 11), mask=torch.ones(5, 7)),
        TypeError,
        r"mask must be boolean.*torch.float32",
    ),
    "0/1 integer mask": (
        dict(q=_t(5, 3), k=_t(7, 3), v=_t(7, 11), mask=torch.ones(5, 7, dtype=torch.uint8)),
        TypeError,
        r"mask must be boolean.*torch.uint8",
    ),
    "1-D query": (
        dict(q=_t(3), k=_t(7, 3), v=_t(7, 11)),
        ValueError,
        r"at least 2 dims",
    ),
    "batch dims disagree": (
        dict(q=_t(2, 5, 3), k=_t(3, 7, 3), v=_t(3, 7, 11)),
        ValueError,
        r"batch, head\) dims of q, k and v must broadcast.*q \[2\], k \[3\]",
    ),
    "mixed dtypes": (
        dict(q=_t(5, 3), k=_t(7, 3, dtype=torch.float64), v=_t(7, 11)),
        TypeError,
        r"share one dtype.*k torch.float64",
    ),
}


@pytest.mark.parametrize("case", BAD_ATTENTION_INPUTS, ids=str)
def test_bad_attention_input_names_the_problem(case):
    kwargs, error, message = BAD_ATTENTION_INPUTS[case]
    with pytest.raises(error, match=message):
        scaled_dot_product_attention(**kwargs)


BAD_PROJECTIONS = {
    "wrong d_model rows": ((_t(8, 6), _t(8, 6), _t(7, 5)), r"d_model = 8 rows.*w_v \[7, 5\]"),
    "all transposed": ((_t(6, 8), _t(6, 8), _t(5, 8)), r"d_model = 8 rows"),
    "w_q and w_k columns differ": ((_t(8, 6), _t(8, 4), _t(8, 5)), r"same number of columns d_k"),
    "1-D weight": ((_t(8), _t(8, 6), _t(8, 5)), r"w_q must be 2-D"),
}


@pytest.mark.parametrize("case", BAD_PROJECTIONS, ids=str)
def test_project_qkv_with_wrong_weights_names_the_problem(case):
    weights, message = BAD_PROJECTIONS[case]
    with pytest.raises(ValueError, match=message):
        project_qkv(_t(2, 7, 8), *weights)
