"""transformer_lib.sparse: the sparse masks, the receptive field, and three ways around the
n x n matrix, each held against dense attention computed the plain way."""

import itertools

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from tensors import TOL, random_qkv
from transformer_lib import sparse
from transformer_lib.attention import scaled_dot_product_attention


class LargestTensor(TorchDispatchMode):
    """Records the largest number of elements any operation produces while active."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


def _band(n, w, causal):
    """The definition, written out entry by entry."""
    return torch.tensor([[(0 <= i - j <= w) if causal else abs(i - j) <= w for j in range(n)] for i in range(n)])


# ---------------------------------------------------------------------------------- masks


@pytest.mark.parametrize("n,w,causal", list(itertools.product([1, 2, 7, 12], [0, 1, 3, 20], [False, True])))
def test_sliding_window_mask_is_the_band(n, w, causal):
    mask = sparse.sliding_window_mask(n, w, causal=causal)
    assert mask.dtype == torch.bool and mask.shape == (n, n)
    assert torch.equal(mask, _band(n, w, causal))
    assert mask.diagonal().all(), "every position sees itself"
    if causal:
        assert not mask.triu(1).any(), "a causal window never sees the future"
    else:
        assert torch.equal(mask, mask.T), "an encoder's window is symmetric"
    assert (mask.sum(-1) <= (w + 1 if causal else 2 * w + 1)).all()


@pytest.mark.parametrize("n,w,d", [(9, 1, 2), (16, 3, 4), (10, 2, 3), (5, 4, 2), (1, 1, 1)])
@pytest.mark.parametrize("causal", [False, True])
def test_dilated_mask(n, w, d, causal):
    mask = sparse.dilated_mask(n, w, d, causal=causal)
    want = torch.tensor([[(i - j) % d == 0 and abs(i - j) <= w * d and (not causal or j <= i) for j in range(n)]
                         for i in range(n)])
    assert torch.equal(mask, want)
    assert mask.diagonal().all()
    assert (mask.sum(-1) <= 2 * w + 1).all(), "as many keys as a plain window, spread out"


def test_dilation_one_is_the_sliding_window():
    for causal in (False, True):
        assert torch.equal(sparse.dilated_mask(11, 3, 1, causal), sparse.sliding_window_mask(11, 3, causal))


def test_global_positions_are_rows_and_columns():
    mask = sparse.global_positions_mask(8, [0, 5])
    assert mask[[0, 5]].all() and mask[:, [0, 5]].all()
    others = [1, 2, 3, 4, 6, 7]
    assert not mask[others][:, others].any()
    causal = sparse.global_positions_mask(8, [0, 5], causal=True)
    assert torch.equal(causal, mask & torch.ones(8, 8, dtype=torch.bool).tril())
    assert causal[5, :6].all() and not causal[5, 6:].any(), "a global position of a decoder sees all previous tokens"


def test_global_token_mask_adds_two_way_hubs():
    local = sparse.sliding_window_mask(6, 1)
    mask = sparse.global_token_mask(local, 2)
    assert mask.shape == (8, 8)
    assert mask[:2].all() and mask[:, :2].all()
    assert torch.equal(mask[2:, 2:], local)
    assert torch.equal(sparse.global_token_mask(local, 0), local)
    batched = sparse.global_token_mask(torch.stack([local, ~local]), 1)
    assert batched.shape == (2, 7, 7) and torch.equal(batched[1, 1:, 1:], ~local)
    causal = sparse.global_token_mask(sparse.sliding_window_mask(6, 1, causal=True), 2, causal=True)
    assert not causal.triu(1).any() and causal[:, :2].tril().equal(torch.ones(8, 2, dtype=torch.bool).tril())


@pytest.mark.parametrize("call,message", [
    (lambda: sparse.sliding_window_mask(5, -1), "window"),
    (lambda: sparse.sliding_window_mask(5, 1.5), "window"),
    (lambda: sparse.sliding_window_mask(0, 1), "size"),
    (lambda: sparse.sliding_window_mask(True, 1), "size"),
    (lambda: sparse.dilated_mask(5, 1, 0), "dilation"),
    (lambda: sparse.dilated_mask(5, -2, 1), "window"),
    (lambda: sparse.global_positions_mask(5, [5]), "0 .. 4"),
    (lambda: sparse.global_token_mask(torch.ones(3, 4, dtype=torch.bool), 1), "square"),
    (lambda: sparse.global_token_mask(torch.ones(3, 3), 1), "boolean"),
    (lambda: sparse.global_token_mask(torch.ones(3, 3, dtype=torch.bool), -1), "n_global"),
    (lambda: sparse.receptive_field(torch.ones(3, 3, dtype=torch.bool), -1), "n_layers"),
])
def test_bad_arguments_get_a_clear_error(call, message):
    with pytest.raises((ValueError, TypeError), match=message):
        call()


# ------------------------------------------------------------------------ receptive field


def _reach_by_search(mask, n_layers):
    """Which inputs reach which outputs, by following the edges layer by layer (no matrix algebra)."""
    n = mask.shape[-1]
    reach = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        frontier = {i}
        for _ in range(n_layers):
            frontier = {j for k in frontier for j in range(n) if mask[k, j]}
        reach[i, list(frontier)] = True
    return reach


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("n_layers", [0, 1, 2, 3, 5])
def test_receptive_field_follows_the_paths(seed, n_layers):
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(9, 9, generator=g) < 0.25
    assert torch.equal(sparse.receptive_field(mask, n_layers), _reach_by_search(mask, n_layers))


@pytest.mark.parametrize("w", [1, 2, 3])
def test_receptive_field_of_a_window_grows_by_w_per_layer(w):
    n = 40
    mask = sparse.sliding_window_mask(n, w)
    for layers in range(1, 6):
        assert torch.equal(sparse.receptive_field(mask, layers), sparse.sliding_window_mask(n, layers * w))
    causal = sparse.sliding_window_mask(n, w, causal=True)
    assert torch.equal(sparse.receptive_field(causal, 4), sparse.sliding_window_mask(n, 4 * w, causal=True))


def test_a_global_token_connects_everything_in_two_layers():
    mask = sparse.global_token_mask(sparse.sliding_window_mask(30, 1), 1)
    assert not sparse.receptive_field(mask, 1).all()
    assert sparse.receptive_field(mask, 2).all()


def test_receptive_field_keeps_batch_dims():
    masks = torch.stack([sparse.sliding_window_mask(8, 1), sparse.dilated_mask(8, 1, 2)])
    out = sparse.receptive_field(masks, 3)
    assert out.shape == (2, 8, 8)
    for b in range(2):
        assert torch.equal(out[b], sparse.receptive_field(masks[b], 3))


# ------------------------------------------------------------------------ banded attention


@pytest.mark.parametrize("n", [1, 5, 16, 33])
@pytest.mark.parametrize("w", [0, 1, 4, 40])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("block", [None, 1, 7])
def test_banded_attention_equals_dense_attention_under_the_band_mask(n, w, causal, block):
    q, k, v = random_qkv((2, 3), n, n, 8, 5, torch.float64, seed=n + w)
    dense, _ = scaled_dot_product_attention(q, k, v, mask=sparse.sliding_window_mask(n, w, causal))
    banded = sparse.banded_attention(q, k, v, w, causal=causal, block=block)
    assert banded.shape == dense.shape
    torch.testing.assert_close(banded, dense, **TOL[torch.float64])


@pytest.mark.parametrize("chunk_scores", [1, 50, 700])
def test_banded_attention_chunked_equals_dense(chunk_scores, monkeypatch):
    # Long sequences are scored a few blocks at a time; small chunks make short ones do the same.
    monkeypatch.setattr(sparse, "_CHUNK_SCORES", chunk_scores)
    q, k, v = random_qkv((2,), 45, 45, 8, 3, torch.float64, seed=chunk_scores)
    for causal in (False, True):
        dense, _ = scaled_dot_product_attention(q, k, v, mask=sparse.sliding_window_mask(45, 5, causal))
        torch.testing.assert_close(sparse.banded_attention(q, k, v, 5, causal=causal, block=4), dense,
                                   **TOL[torch.float64])


def test_banded_attention_in_float32_and_broadcast_batches():
    q, k, v = random_qkv((2, 4), 50, 50, 16, 16, torch.float32, seed=3)
    dense, _ = scaled_dot_product_attention(q, k[:1], v[:1], mask=sparse.sliding_window_mask(50, 6))
    torch.testing.assert_close(sparse.banded_attention(q, k[:1], v[:1], 6), dense, rtol=1e-5, atol=1e-5)


def test_banded_attention_never_builds_an_n_by_n_matrix():
    n, w = 2048, 8
    q, k, v = random_qkv((1,), n, n, 16, 16, torch.float32)
    with LargestTensor() as seen:
        sparse.banded_attention(q, k, v, w)
    assert seen.largest <= 4 * n * max(w, 16), f"largest tensor {seen.largest} elements, n^2 = {n * n}"


def test_banded_attention_rejects_bad_input():
    q, k, v = random_qkv((1,), 6, 6, 4, 4, torch.float32)
    with pytest.raises(ValueError, match="window"):
        sparse.banded_attention(q, k, v, -1)
    with pytest.raises(ValueError, match="same length"):
        sparse.banded_attention(q, k[..., :5, :], v[..., :5, :], 2)
    with pytest.raises(ValueError, match="d_k"):
        sparse.banded_attention(q, k[..., :3], v, 2)


# ------------------------------------------------------------------------ linear attention


def _explicit_causal_linear(q, k, v):
    """out_i = sum_{j<=i} phi(q_i).phi(k_j) v_j / sum_{j<=i} phi(q_i).phi(k_j), one query at a time."""
    phi_q, phi_k = F.elu(q) + 1, F.elu(k) + 1
    rows = []
    for i in range(q.shape[-2]):
        sim = (phi_k[..., : i + 1, :] * phi_q[..., i : i + 1, :]).sum(-1)  # [..., i + 1]
        rows.append((sim.unsqueeze(-1) * v[..., : i + 1, :]).sum(-2) / sim.sum(-1, keepdim=True))
    return torch.stack(rows, dim=-2)


@pytest.mark.parametrize("n", [1, 4, 17])
def test_causal_linear_attention_equals_the_explicit_formula(n):
    q, k, v = random_qkv((2, 3), n, n, 6, 4, torch.float64, seed=n)
    torch.testing.assert_close(sparse.linear_attention(q, k, v, causal=True), _explicit_causal_linear(q, k, v),
                               **TOL[torch.float64])
    torch.testing.assert_close(sparse.linear_attention(q, k, v, causal=True),
                               sparse.linear_attention_quadratic(q, k, v, causal=True)[0], **TOL[torch.float64])


@pytest.mark.parametrize("n", [1, 4, 17])
def test_recurrent_linear_attention_equals_the_prefix_sums(n):
    q, k, v = random_qkv((2, 3), n, n, 6, 4, torch.float64, seed=n)
    torch.testing.assert_close(sparse.recurrent_linear_attention(q, k, v), _explicit_causal_linear(q, k, v),
                               **TOL[torch.float64])
    q, k, v = random_qkv((2,), 64, 64, 8, 8, torch.float32, seed=n)
    torch.testing.assert_close(sparse.recurrent_linear_attention(q, k, v), sparse.causal_linear_attention(q, k, v),
                               rtol=1e-5, atol=1e-5)


def test_recurrent_linear_attention_broadcasts_batches_and_keeps_one_state():
    q, k, v = random_qkv((2, 3), 9, 9, 4, 5, torch.float64, seed=1)
    torch.testing.assert_close(sparse.recurrent_linear_attention(q, k[:1], v[:1]),
                               sparse.causal_linear_attention(q, k[:1], v[:1]), **TOL[torch.float64])
    n, d = 512, 16
    q, k, v = random_qkv((1,), n, n, d, d, torch.float32)
    with LargestTensor() as seen:
        sparse.recurrent_linear_attention(q, k, v)
    assert seen.largest <= n * d, "no state per position, no n x n matrix"
    with pytest.raises(ValueError, match="one length"):
        sparse.recurrent_linear_attention(q, k[..., :5, :], v[..., :5, :])


def test_linear_attention_is_the_quadratic_form_computed_in_another_order():
    q, k, v = random_qkv((2,), 9, 12, 5, 3, torch.float64)
    out, weights = sparse.linear_attention_quadratic(q, k, v)
    torch.testing.assert_close(sparse.linear_attention(q, k, v), out, **TOL[torch.float64])
    assert (weights > 0).all()
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 9, dtype=torch.float64))


def test_causal_linear_attention_does_not_see_the_future():
    q, k, v = random_qkv((1,), 10, 10, 4, 4, torch.float64)
    k2, v2 = k.clone(), v.clone()
    k2[..., 6:, :] += 5.0
    v2[..., 6:, :] -= 3.0
    a, b = sparse.linear_attention(q, k, v, causal=True), sparse.linear_attention(q, k2, v2, causal=True)
    assert torch.equal(a[..., :6, :], b[..., :6, :])
    assert not torch.allclose(a[..., 6:, :], b[..., 6:, :])


def test_linear_attention_memory_grows_with_n_not_n_squared():
    n = 2048
    q, k, v = random_qkv((1,), n, n, 16, 16, torch.float32)
    with LargestTensor() as seen:
        sparse.linear_attention(q, k, v)
    assert seen.largest <= n * 16


# ------------------------------------------------------------------------ online softmax


@pytest.mark.parametrize("block", [1, 3, 8, 64])
@pytest.mark.parametrize("l_q,l_k", [(1, 1), (7, 7), (5, 13)])
def test_online_softmax_attention_equals_dense(block, l_q, l_k):
    q, k, v = random_qkv((2, 2), l_q, l_k, 8, 3, torch.float64, seed=block)
    want, _ = scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(sparse.online_softmax_attention(q, k, v, block), want, **TOL[torch.float64])


def test_online_softmax_attention_with_large_scores():
    q, k, v = random_qkv((2,), 6, 20, 4, 3, torch.float32, seed=5)
    q = q * 300.0  # scores in the thousands: exp() of a raw score overflows
    want, _ = scaled_dot_product_attention(q, k, v)
    got = sparse.online_softmax_attention(q, k, v, block=4)
    assert got.isfinite().all()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("block", [1, 4, 9])
def test_online_softmax_attention_with_masks(block):
    q, k, v = random_qkv((2, 3), 9, 9, 4, 5, torch.float64, seed=block)
    g = torch.Generator().manual_seed(block)
    mask = torch.rand(2, 1, 9, 9, generator=g) < 0.3
    mask[0, 0, 4] = False  # a query that may see nothing: 0, as in masked_softmax
    want, _ = scaled_dot_product_attention(q, k, v, mask=mask)
    got = sparse.online_softmax_attention(q, k, v, block, mask=mask)
    torch.testing.assert_close(got, want, **TOL[torch.float64])
    assert (got[0, :, 4] == 0).all()
    causal, _ = scaled_dot_product_attention(q, k, v, mask=torch.ones(9, 9, dtype=torch.bool).tril())
    torch.testing.assert_close(sparse.online_softmax_attention(q, k, v, block, causal=True), causal,
                               **TOL[torch.float64])
    keys_only = torch.rand(2, 1, 1, 9, generator=g) < 0.5  # a padding-style mask [batch, 1, 1, L_k]
    want, _ = scaled_dot_product_attention(q, k, v, mask=keys_only)
    torch.testing.assert_close(sparse.online_softmax_attention(q, k, v, block, mask=keys_only), want,
                               **TOL[torch.float64])


def test_online_softmax_attention_uses_the_step_it_is_given():
    calls = []

    def step(m, l, acc, scores, v_block):
        calls.append(scores.shape[-1])
        return sparse.online_softmax_step(m, l, acc, scores, v_block)

    q, k, v = random_qkv((1,), 4, 10, 4, 4, torch.float32)
    sparse.online_softmax_attention(q, k, v, block=4, step=step)
    assert calls == [4, 4, 2]


def test_online_softmax_never_holds_the_n_by_n_matrix():
    n, block = 1024, 64
    q, k, v = random_qkv((1,), n, n, 16, 16, torch.float32)
    with LargestTensor() as seen:
        sparse.online_softmax_attention(q, k, v, block, causal=True)
    assert seen.largest <= n * block


def test_online_softmax_step_from_the_empty_state_is_the_softmax():
    g = torch.Generator().manual_seed(0)
    scores, v = torch.randn(3, 5, generator=g), torch.randn(5, 2, generator=g)
    m0, l0, acc0 = torch.full((3, 1), float("-inf")), torch.zeros(3, 1), torch.zeros(3, 2)
    m, l, acc = sparse.online_softmax_step(m0, l0, acc0, scores, v)
    torch.testing.assert_close(m, scores.amax(-1, keepdim=True))
    torch.testing.assert_close(acc / l, torch.softmax(scores, -1) @ v)


def test_online_softmax_rejects_bad_block():
    q, k, v = random_qkv((1,), 4, 4, 4, 4, torch.float32)
    with pytest.raises(ValueError, match="block"):
        sparse.online_softmax_attention(q, k, v, 0)


def test_peak_memory_sees_torch_allocations():
    n = 512
    q, k, v = random_qkv((1,), n, n, 16, 16, torch.float32)
    dense = sparse.peak_memory(scaled_dot_product_attention, q, k, v)
    assert dense >= 4 * n * n, "at least one n x n float32 matrix is held"
    assert sparse.peak_memory(sparse.linear_attention, q, k, v) < dense / 10


def test_peak_memory_sees_allocations_inside_fused_operators():
    # Given 3-D inputs, PyTorch's scaled_dot_product_attention runs its math path inside one
    # operator: its n x n buffers must be counted all the same.
    n = 512
    q, k, v = random_qkv((1,), n, n, 16, 16, torch.float32)
    assert sparse.peak_memory(F.scaled_dot_product_attention, q, k, v) >= 4 * n * n
