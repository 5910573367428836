"""Chapter 02: the library reproduces the source documents' numbers, and self-attention has
the properties the chapter claims (variance d_k, rows summing to one, permutation equivariance).

Documents: 000 §5 (112/96 -> 14/12 -> 0.88/0.12; softmax of 3.2, 5.1, -1.7),
001 §1.3 (Var(q.k) = d_k), 003 §2 (the three-token toy example).
"""

import math

import pytest
import torch

from transformer_lib.attention import (
    attention_scores,
    project_qkv,
    scaled_dot_product_attention,
    self_attention,
    softmax,
)
from transformer_lib.checks.ch02 import TOY_W_K, TOY_W_Q, TOY_W_V, TOY_X


def rounded(t: torch.Tensor, decimals: int = 2) -> list[float]:
    return [round(v, decimals) + 0.0 for v in t.tolist()]  # + 0.0 turns -0.0 into 0.0


# -- document 000 §5 ------------------------------------------------------------------------


def test_thinking_machines_scores_scale_and_weights():
    d_k = 64
    q1 = torch.full((1, d_k), 2.0)
    keys = torch.stack([torch.full((d_k,), 112 / 128), torch.full((d_k,), 96 / 128)])
    raw = attention_scores(q1, keys, scale=1.0)[0]
    assert raw.tolist() == [112.0, 96.0]
    assert math.sqrt(d_k) == 8
    scaled = attention_scores(q1, keys)[0]  # default scale 1/sqrt(d_k)
    assert scaled.tolist() == [14.0, 12.0]
    assert rounded(softmax(scaled)) == [0.88, 0.12]
    # without the scale the same scores are nearly one-hot
    assert softmax(raw)[1].item() < 1e-6


def test_softmax_cat_car_frog():
    scores = torch.tensor([3.2, 5.1, -1.7])
    assert rounded(scores.exp(), 1) == [24.5, 164.0, 0.2]
    assert round(scores.exp()[2].item(), 2) == 0.18
    weights = softmax(scores)
    assert rounded(weights) == [0.13, 0.87, 0.00]
    assert weights.sum().item() == pytest.approx(1.0)


# -- document 003 §2 ------------------------------------------------------------------------


def test_toy_example_projections():
    q, k, v = project_qkv(TOY_X, TOY_W_Q, TOY_W_K, TOY_W_V)
    assert q.tolist() == [[1, 0, 2], [2, 2, 2], [2, 1, 3]]
    assert k.tolist() == [[0, 1, 1], [4, 4, 0], [2, 3, 1]]
    assert v.tolist() == [[1, 2, 3], [2, 8, 0], [2, 6, 3]]


def test_toy_example_document_output_uses_rounded_weights():
    q, k, v = project_qkv(TOY_X, TOY_W_Q, TOY_W_K, TOY_W_V)
    scores = attention_scores(q, k, scale=1.0)  # the document does not scale
    assert scores[0].tolist() == [2.0, 4.0, 4.0]
    weights = softmax(scores[0])
    assert rounded(weights, 4) == [0.0634, 0.4683, 0.4683]
    to_half = (weights * 2).round() / 2
    assert to_half.tolist() == [0.0, 0.5, 0.5]
    weighted = to_half[:, None] * v
    assert weighted.tolist() == [[0.0, 0.0, 0.0], [1.0, 4.0, 0.0], [1.0, 3.0, 1.5]]
    assert weighted.sum(dim=0).tolist() == [2.0, 7.0, 1.5]


def test_toy_example_exact_output():
    q, k, v = project_qkv(TOY_X, TOY_W_Q, TOY_W_K, TOY_W_V)
    out, weights = scaled_dot_product_attention(q, k, v, scale=1.0)
    assert rounded(out[0]) == [1.94, 6.68, 1.60]
    # the gap to the document's [2.0, 7.0, 1.5] is exactly the rounding of the weights
    to_half = torch.tensor([0.0, 0.5, 0.5])
    torch.testing.assert_close(out[0] + (to_half - weights[0]) @ v, torch.tensor([2.0, 7.0, 1.5]))


def test_toy_example_with_scale_differs():
    out, _ = self_attention(TOY_X, TOY_W_Q, TOY_W_K, TOY_W_V)  # scaled by 1/sqrt(3)
    assert rounded(out[0]) == [1.86, 6.32, 1.70]


# -- document 001 §1.3 and the properties the chapter shows ---------------------------------


@pytest.mark.parametrize("d_k", [4, 64, 512])
def test_dot_product_variance_is_d_k(d_k):
    g = torch.Generator().manual_seed(d_k)
    q = torch.randn(20000, d_k, generator=g)
    k = torch.randn(20000, d_k, generator=g)
    dots = (q * k).sum(dim=-1)
    assert dots.var().item() == pytest.approx(d_k, rel=0.06)
    assert (dots / math.sqrt(d_k)).var().item() == pytest.approx(1.0, rel=0.06)


@pytest.mark.parametrize("seed", range(5))
def test_self_attention_is_permutation_equivariant(seed):
    g = torch.Generator().manual_seed(seed)
    seq = 3 + seed
    x = torch.randn(2, seq, 6, generator=g)
    w_q, w_k, w_v = (torch.randn(6, 4, generator=g) for _ in range(3))
    perm = torch.randperm(seq, generator=g)
    out, weights = self_attention(x, w_q, w_k, w_v)
    out_p, weights_p = self_attention(x[:, perm], w_q, w_k, w_v)
    torch.testing.assert_close(out_p, out[:, perm])
    torch.testing.assert_close(weights_p, weights[:, perm][:, :, perm])


@pytest.mark.parametrize("seed", range(5))
def test_weights_sum_to_one_and_masked_keys_get_zero(seed):
    g = torch.Generator().manual_seed(100 + seed)
    q, k, v = torch.randn(2, 4, 8, generator=g), torch.randn(2, 5, 8, generator=g), torch.randn(2, 5, 3, generator=g)
    mask = torch.rand(2, 4, 5, generator=g) < 0.5
    mask[..., 0] = True
    _, weights = scaled_dot_product_attention(q, k, v, mask=mask)
    torch.testing.assert_close(weights.sum(dim=-1), torch.ones(2, 4))
    assert (weights[~mask] == 0).all()


def test_stable_softmax_handles_large_scores():
    big = torch.tensor([1000.0, 1001.0, 1002.0])
    assert torch.isnan(big.exp() / big.exp().sum()).all()  # the literal formula fails
    assert rounded(softmax(big)) == [0.09, 0.24, 0.67]
