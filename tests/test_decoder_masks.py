"""Chapter 06's library pieces: `decoder_self_mask`, `masked_softmax`, and the properties the
decoder's masks exist for (causality of a whole DecoderLayer, source padding that cannot
leak through cross-attention), held against PyTorch where PyTorch has an answer."""

import pytest
import torch

from transformer_lib.attention import (
    MultiHeadAttention,
    attention_scores,
    masked_softmax,
    scaled_dot_product_attention,
    softmax,
)
from transformer_lib.layers import DecoderLayer
from transformer_lib.masks import causal_mask, combine_masks, decoder_self_mask, padding_mask

PAD = 0
DTYPES = [torch.float16, torch.float32, torch.float64]


def _tokens(lengths, seq, pad_id=PAD, left=False):
    """[batch, seq] ids; sequence b has lengths[b] real tokens (never equal to pad_id)."""
    tokens = torch.full((len(lengths), seq), pad_id, dtype=torch.long)
    for b, n in enumerate(lengths):
        real = torch.arange(n) + pad_id + 1
        if left:
            tokens[b, seq - n:] = real
        else:
            tokens[b, :n] = real
    return tokens


def _random_mask(shape, seed, p=0.5):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(shape, generator=g) < p


# ---------------------------------------------------------------- decoder_self_mask


@pytest.mark.parametrize("lengths,seq,pad_id", [([5, 3, 1], 5, 0), ([6, 2], 6, 1), ([1], 1, 0), ([4, 4], 4, 3)])
def test_decoder_self_mask_is_causal_and_padding(lengths, seq, pad_id):
    tokens = _tokens(lengths, seq, pad_id)
    mask = decoder_self_mask(tokens, pad_id)
    assert mask.dtype == torch.bool and mask.shape == (len(lengths), 1, seq, seq)
    for b, n in enumerate(lengths):
        for i in range(seq):
            for j in range(seq):
                assert mask[b, 0, i, j] == (j <= i and j < n), f"sentence {b}, query {i}, key {j}"


def test_decoder_self_mask_equals_combine_masks_of_the_two():
    tokens = _tokens([7, 4, 2], 7)
    expected = combine_masks(causal_mask(7), padding_mask(tokens, PAD))
    assert torch.equal(decoder_self_mask(tokens, PAD), expected)


def test_decoder_self_mask_never_leaves_an_empty_row_with_right_padding():
    mask = decoder_self_mask(_tokens([9, 5, 1, 3], 9), PAD)
    assert mask.any(dim=-1).all()


def test_decoder_self_mask_with_left_padding_has_empty_first_rows():
    mask = decoder_self_mask(_tokens([2], 5, left=True), PAD)
    assert mask[0, 0].sum(-1).tolist() == [0, 0, 0, 1, 2]


def test_decoder_self_mask_follows_the_tokens_device():
    assert decoder_self_mask(torch.ones(2, 3, dtype=torch.long, device="meta"), PAD).device.type == "meta"


@pytest.mark.parametrize(
    "tokens, pad_id, error, message",
    [
        (torch.tensor([1, 2, 0]), PAD, ValueError, r"shape \[batch, seq\], got shape \[3\]"),
        (torch.tensor([[1.0, 0.0]]), PAD, TypeError, r"integer token ids"),
        (torch.tensor([[1, 0]]), 0.5, TypeError, r"integer id as pad_id, got 0.5"),
        (torch.tensor([[1, 0]]), None, TypeError, r"integer id as pad_id, got None"),
    ],
    ids=["1-D", "float ids", "float pad", "None pad"],
)
def test_decoder_self_mask_rejects_bad_input(tokens, pad_id, error, message):
    with pytest.raises(error, match=message):
        decoder_self_mask(tokens, pad_id)


def test_padding_mask_accepts_a_0d_integer_tensor_as_pad_id():
    tokens = _tokens([2, 3], 4)
    assert torch.equal(padding_mask(tokens, torch.tensor(0)), padding_mask(tokens, 0))


# ---------------------------------------------------------------- masked_softmax


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_masked_softmax_matches_torch_minus_inf_on_rows_with_a_visible_key(dtype):
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(2, 3, 6, 7, generator=g, dtype=dtype) * 3
    mask = _random_mask((2, 1, 6, 7), seed=1)
    mask[..., 0] = True
    expected = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
    torch.testing.assert_close(masked_softmax(scores, mask), expected)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("seed", range(4))
def test_masked_softmax_properties(dtype, seed):
    """Any scores, any mask: hidden keys get exactly 0, rows with a visible key sum to 1,
    rows with none are exactly 0, and nothing is NaN."""
    g = torch.Generator().manual_seed(seed)
    scores = (torch.randn(3, 5, 6, generator=g, dtype=torch.float64) * 10 ** (seed % 3)).to(dtype)
    mask = _random_mask((3, 5, 6), seed=100 + seed, p=0.3)  # sparse: some rows empty
    weights = masked_softmax(scores, mask)
    assert weights.dtype == dtype and weights.shape == scores.shape
    assert not weights.isnan().any()
    assert (weights[~mask] == 0).all()
    has_key = mask.any(-1)
    assert has_key.any() and (~has_key).any(), "the test needs both kinds of rows"
    assert (weights[~has_key] == 0).all()
    tol = 2e-3 if dtype == torch.float16 else 1e-6
    torch.testing.assert_close(weights.sum(-1)[has_key].double(), torch.ones(int(has_key.sum()), dtype=torch.float64),
                               rtol=0, atol=tol)


def test_masked_softmax_is_independent_of_hidden_scores():
    # The point of masking *before* the softmax: what a hidden key scores cannot matter.
    g = torch.Generator().manual_seed(3)
    scores = torch.randn(4, 5, generator=g)
    mask = causal_mask(5)[:4]
    changed = scores.masked_fill(~mask, 1e6)
    assert torch.equal(masked_softmax(scores, mask), masked_softmax(changed, mask))


def test_masked_softmax_without_mask_is_softmax():
    x = torch.randn(3, 4)
    assert torch.equal(masked_softmax(x), softmax(x, dim=-1))


def test_float16_fully_masked_rows_are_zero_not_nan():
    scores = torch.tensor([[1.0, 2.0, 0.5], [0.3, -1.0, 2.0]], dtype=torch.float16)
    mask = torch.tensor([[True, True, False], [False, False, False]])
    weights = masked_softmax(scores, mask)
    assert weights[1].tolist() == [0.0, 0.0, 0.0]
    assert torch.softmax(scores.masked_fill(~mask, float("-inf")), -1)[1].isnan().all(), "the pitfall it avoids"


def test_scaled_dot_product_attention_uses_masked_softmax():
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(2, 3, 5, 4, generator=g) for _ in range(3))
    mask = decoder_self_mask(_tokens([5, 2], 5, left=False), PAD)
    _, weights = scaled_dot_product_attention(q, k, v, mask=mask)
    assert torch.equal(weights, masked_softmax(attention_scores(q, k), mask))


@pytest.mark.parametrize(
    "scores, mask, error, message",
    [
        (torch.zeros(2, 3), torch.ones(2, 3), TypeError, r"boolean torch.Tensor.*got torch.float32"),
        (torch.zeros(2, 3), [[True] * 3] * 2, TypeError, r"boolean torch.Tensor.*got list"),
        (torch.zeros(2, 3), torch.ones(2, 4, dtype=torch.bool), ValueError,
         r"mask of shape \[2, 4\] does not broadcast to the scores \[2, 3\]"),
        (torch.zeros(2, 3, dtype=torch.long), torch.ones(2, 3, dtype=torch.bool), TypeError,
         r"floating-point scores, got torch.int64"),
    ],
    ids=["float mask", "list mask", "wrong shape", "integer scores"],
)
def test_masked_softmax_rejects_bad_input(scores, mask, error, message):
    with pytest.raises(error, match=message):
        masked_softmax(scores, mask)


# ---------------------------------------------------------------- the decoder's properties


def _decoder_layer(seed=0):
    torch.manual_seed(seed)
    return DecoderLayer(d_model=16, n_heads=2, d_ff=32).eval()


@pytest.mark.parametrize("changed", [0, 2, 5])
def test_decoder_layer_is_causal_under_the_decoder_mask(changed):
    """Changing target token t changes no output before t, in every sentence of a padded batch."""
    layer = _decoder_layer()
    tokens = _tokens([6, 6, 4], 6)
    mask = decoder_self_mask(tokens, PAD)
    x = torch.randn(3, 6, 16, dtype=torch.float32)
    memory = torch.randn(3, 5, 16)
    x2 = x.clone()
    x2[:, changed] += torch.randn(16)
    with torch.no_grad():
        y, y2 = layer(x, memory, tgt_mask=mask), layer(x2, memory, tgt_mask=mask)
        assert torch.equal(y[:, :changed], y2[:, :changed])
        assert not torch.allclose(y[:2, changed], y2[:2, changed])
        # Without the mask the same change reaches the past: the test can see a leak.
        if changed > 0:
            assert not torch.allclose(layer(x, memory)[:, :changed], layer(x2, memory)[:, :changed])


def test_decoder_layer_full_run_equals_prefix_runs():
    layer = _decoder_layer(1)
    x, memory = torch.randn(2, 6, 16, dtype=torch.float64), torch.randn(2, 4, 16, dtype=torch.float64)
    layer = layer.double()
    with torch.no_grad():
        full = layer(x, memory, tgt_mask=causal_mask(6))
        for t in range(6):
            prefix = layer(x[:, : t + 1], memory, tgt_mask=causal_mask(t + 1))
            torch.testing.assert_close(prefix[:, t], full[:, t])


def test_padded_source_positions_cannot_reach_the_decoder():
    layer = _decoder_layer(2)
    src = _tokens([5, 3], 5)
    src_mask = padding_mask(src, PAD)  # [2, 1, 1, 5]
    x, memory = torch.randn(2, 4, 16), torch.randn(2, 5, 16)
    memory2 = memory.clone()
    memory2[1, 3:] = torch.randn(2, 16) * 10
    with torch.no_grad():
        assert torch.equal(layer(x, memory, src_mask=src_mask), layer(x, memory2, src_mask=src_mask))
        assert not torch.allclose(layer(x, memory), layer(x, memory2))


def test_cross_attention_shapes_and_weights_under_source_padding():
    attn = MultiHeadAttention(16, 4).eval()
    src_mask = padding_mask(_tokens([5, 2, 4], 5), PAD)
    q, memory = torch.randn(3, 7, 16), torch.randn(3, 5, 16)
    with torch.no_grad():
        out = attn(q, memory, memory, mask=src_mask, need_weights=True)
        fused = attn(q, memory, memory, mask=src_mask)
    w = attn.last_weights
    assert out.shape == (3, 7, 16) and w.shape == (3, 4, 7, 5)
    assert (w[1, :, :, 2:] == 0).all() and (w[2, :, :, 4:] == 0).all()
    torch.testing.assert_close(w.sum(-1), torch.ones(3, 4, 7))
    torch.testing.assert_close(out, fused)


def test_empty_rows_give_a_zero_attention_output_not_nan():
    """Left padding under the decoder mask empties the first rows: the readable path gives them a
    zero attention output (so W^O returns its bias), and agrees with the fused path elsewhere."""
    attn = MultiHeadAttention(8, 2).eval()
    x = torch.randn(1, 5, 8)
    mask = decoder_self_mask(_tokens([2], 5, left=True), PAD)  # rows 0, 1, 2 see nothing
    with torch.no_grad():
        readable = attn(x, x, x, mask=mask, need_weights=True)
        fused = attn(x, x, x, mask=mask)  # PyTorch's kernel: its empty rows differ across versions
    assert not readable.isnan().any()
    torch.testing.assert_close(readable[0, :3], attn.w_o.bias.expand(3, 8))
    torch.testing.assert_close(readable[0, 3:], fused[0, 3:])
