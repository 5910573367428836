"""transformer_lib.attention.MultiHeadAttention held against torch.nn.MultiheadAttention.

The trusted implementation is PyTorch's own module. Our four nn.Linear layers are copied
into it (its in_proj_weight is W^Q, W^K and W^V stacked), and both must then give the same
outputs and the same per-head weights, on the fused path (need_weights=False) and on the
readable one (need_weights=True). The mask conventions differ and are translated here:
ours is True = may attend; nn.MultiheadAttention's attn_mask and key_padding_mask are
True = NOT allowed (hidden, or padding).
"""

import pytest
import torch
import torch.nn as nn

from transformer_lib.attention import (
    KVCache,
    MultiHeadAttention,
    merge_heads,
    multi_head_attention_forward,
    scaled_dot_product_attention,
    split_heads,
)
from transformer_lib.masks import causal_mask, padding_mask

TOL = {
    torch.float32: dict(rtol=1e-5, atol=1e-5),
    torch.float64: dict(rtol=1e-10, atol=1e-12),
}
PAD = 0


def _pair(d_model, n_heads, dtype=torch.float32, bias=True, seed=0):
    """Our module and torch's, holding the same weights."""
    torch.manual_seed(seed)
    ours = MultiHeadAttention(d_model, n_heads, bias=bias).to(dtype)
    theirs = nn.MultiheadAttention(d_model, n_heads, bias=bias, batch_first=True).to(dtype)
    with torch.no_grad():
        theirs.in_proj_weight.copy_(torch.cat([ours.w_q.weight, ours.w_k.weight, ours.w_v.weight]))
        theirs.out_proj.weight.copy_(ours.w_o.weight)
        if bias:
            theirs.in_proj_bias.copy_(torch.cat([ours.w_q.bias, ours.w_k.bias, ours.w_v.bias]))
            theirs.out_proj.bias.copy_(ours.w_o.bias)
    return ours.eval(), theirs.eval()


def _randn(*shape, dtype=torch.float32, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)


def _tokens_with_padding(lengths, max_len, seed=2):
    """Token ids [batch, max_len] whose row b has lengths[b] real tokens, then PAD."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(1, 20, (len(lengths), max_len), generator=g)
    for b, n in enumerate(lengths):
        tokens[b, n:] = PAD
    return tokens


# -- equivalence with torch.nn.MultiheadAttention ---------------------------------------


@pytest.mark.parametrize("need_weights", [False, True], ids=["fused", "readable"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
def test_causal_self_attention_matches_torch(need_weights, dtype):
    ours, theirs = _pair(12, 3, dtype)  # odd sizes: d_k = 4, seq 7, batch 3
    x = _randn(3, 7, 12, dtype=dtype)
    mask = causal_mask(7)  # True = may attend
    out = ours(x, x, x, mask=mask, need_weights=need_weights)
    ref, ref_weights = theirs(x, x, x, attn_mask=~mask, need_weights=need_weights, average_attn_weights=False)
    torch.testing.assert_close(out, ref, **TOL[dtype])
    if need_weights:
        assert ours.last_weights.shape == (3, 3, 7, 7)  # [batch, heads, L_q, L_k]
        torch.testing.assert_close(ours.last_weights, ref_weights, **TOL[dtype])
        _, averaged = theirs(x, x, x, attn_mask=~mask, need_weights=True, average_attn_weights=True)
        torch.testing.assert_close(ours.last_weights.mean(dim=1), averaged, **TOL[dtype])


@pytest.mark.parametrize("need_weights", [False, True], ids=["fused", "readable"])
@pytest.mark.parametrize("mask_form", ["padding_mask 4-D", "[batch, 1, L_k]", "[batch, L_q, L_k]"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
def test_cross_attention_with_key_padding_matches_torch(need_weights, mask_form, dtype):
    ours, theirs = _pair(16, 4, dtype)
    query = _randn(3, 5, 16, dtype=dtype, seed=3)  # 5 decoder positions
    key = _randn(3, 8, 16, dtype=dtype, seed=4)  # 8 encoder positions
    value = _randn(3, 8, 16, dtype=dtype, seed=5)  # different from key on purpose
    tokens = _tokens_with_padding([8, 5, 2], 8)
    mask = padding_mask(tokens, PAD)  # [batch, 1, 1, L_k], True = real token
    if mask_form == "[batch, 1, L_k]":
        mask = mask[:, 0]
    elif mask_form == "[batch, L_q, L_k]":
        mask = mask[:, 0].expand(-1, 5, -1)
    out = ours(query, key, value, mask=mask, need_weights=need_weights)
    ref, ref_weights = theirs(query, key, value, key_padding_mask=(tokens == PAD), need_weights=need_weights,
                              average_attn_weights=False)
    torch.testing.assert_close(out, ref, **TOL[dtype])
    if need_weights:
        torch.testing.assert_close(ours.last_weights, ref_weights, **TOL[dtype])
        assert (ours.last_weights[2, :, :, 2:] == 0).all(), "padding keys must get exactly zero weight"


def test_matches_torch_fast_inference_path():
    """In eval mode under no_grad, nn.MultiheadAttention runs a separate native kernel."""
    ours, theirs = _pair(32, 8)
    x = _randn(4, 10, 32)
    with torch.no_grad():
        torch.testing.assert_close(ours(x, x, x), theirs(x, x, x, need_weights=False)[0], **TOL[torch.float32])


def test_without_bias_matches_torch():
    ours, theirs = _pair(12, 2, bias=False)
    x = _randn(2, 5, 12)
    torch.testing.assert_close(ours(x, x, x), theirs(x, x, x, need_weights=False)[0], **TOL[torch.float32])


@pytest.mark.parametrize("need_weights", [False, True], ids=["fused", "readable"])
def test_gradients_match_torch(need_weights):
    ours, theirs = _pair(12, 3, torch.float64)
    x1 = _randn(2, 6, 12, dtype=torch.float64).requires_grad_(True)
    x2 = x1.detach().clone().requires_grad_(True)
    mask = causal_mask(6)
    ours(x1, x1, x1, mask=mask, need_weights=need_weights).square().sum().backward()
    theirs(x2, x2, x2, attn_mask=~mask, need_weights=False)[0].square().sum().backward()
    torch.testing.assert_close(x1.grad, x2.grad, **TOL[torch.float64])
    torch.testing.assert_close(ours.w_o.weight.grad, theirs.out_proj.weight.grad, **TOL[torch.float64])
    in_grad = torch.cat([ours.w_q.weight.grad, ours.w_k.weight.grad, ours.w_v.weight.grad])
    torch.testing.assert_close(in_grad, theirs.in_proj_weight.grad, **TOL[torch.float64])


# -- the two paths, the heads, the plain-matrix function --------------------------------


def test_readable_and_fused_paths_agree_with_a_fully_masked_row():
    ours, _ = _pair(8, 2)
    x = _randn(2, 3, 8)
    mask = torch.tensor([[True, True, True], [False, False, False], [True, False, False]])
    fused, readable = ours(x, x, x, mask=mask), ours(x, x, x, mask=mask, need_weights=True)
    assert not fused.isnan().any()
    torch.testing.assert_close(fused, readable, **TOL[torch.float32])


def test_each_head_is_scaled_dot_product_attention_on_its_slice():
    ours, _ = _pair(12, 3, torch.float64)
    x = _randn(2, 5, 12, dtype=torch.float64)
    ours(x, x, x, need_weights=True)
    q, k, v = ours.w_q(x), ours.w_k(x), ours.w_v(x)  # [batch, seq, d_model]
    for i in range(3):
        cols = slice(4 * i, 4 * (i + 1))  # head i owns features 4i .. 4i+3
        _, w_i = scaled_dot_product_attention(q[..., cols], k[..., cols], v[..., cols])
        torch.testing.assert_close(ours.last_weights[:, i], w_i)


def test_function_with_plain_matrices_equals_the_module_without_bias():
    ours, _ = _pair(12, 3, torch.float64, bias=False)
    query, key = _randn(2, 4, 12, dtype=torch.float64), _randn(2, 6, 12, dtype=torch.float64, seed=7)
    mask = padding_mask(_tokens_with_padding([6, 3], 6), PAD)[:, 0]  # [batch, 1, L_k]
    out, weights = multi_head_attention_forward(
        query, key, key, ours.w_q.weight.T, ours.w_k.weight.T, ours.w_v.weight.T, ours.w_o.weight.T, 3, mask)
    torch.testing.assert_close(out, ours(query, key, key, mask=mask, need_weights=True))
    torch.testing.assert_close(weights, ours.last_weights)


def test_split_heads_gives_head_i_its_block_of_features_and_merge_undoes_it():
    x = torch.arange(2 * 3 * 8.0).reshape(2, 3, 8)  # [batch, seq, d_model]
    heads = split_heads(x, 4)  # [batch, 4, seq, 2]
    assert heads.shape == (2, 4, 3, 2)
    for i in range(4):
        assert torch.equal(heads[:, i], x[..., 2 * i: 2 * i + 2])
    assert torch.equal(merge_heads(heads), x)


@pytest.mark.parametrize("seq", [1, 2, 5])
def test_causal_output_does_not_depend_on_the_future(seq):
    ours, _ = _pair(8, 2)
    x = _randn(1, 6, 8)
    changed = x.clone()
    changed[:, seq:] += 10.0
    mask = causal_mask(6)
    before, after = ours(x, x, x, mask=mask), ours(changed, changed, changed, mask=mask)
    torch.testing.assert_close(before[:, :seq], after[:, :seq])
    assert not torch.allclose(before[:, seq:], after[:, seq:])


# -- sizes, parameters, errors ------------------------------------------------------------


@pytest.mark.parametrize("d_model,n_heads", [(512, 8), (64, 4), (12, 3), (7, 1)])
@pytest.mark.parametrize("bias", [True, False])
def test_parameter_count_is_one_full_width_head_plus_w_o(d_model, n_heads, bias):
    with torch.device("meta"):  # shapes only, no memory
        multi = MultiHeadAttention(d_model, n_heads, bias=bias)
        single = MultiHeadAttention(d_model, 1, bias=bias)
    count = sum(p.numel() for p in multi.parameters())
    assert count == 4 * d_model**2 + (4 * d_model if bias else 0)
    assert count == sum(p.numel() for p in single.parameters())


@pytest.mark.parametrize("d_model,n_heads", [(10, 3), (512, 7), (8, 0), (8, -2)])
def test_d_model_not_divisible_by_n_heads_is_refused(d_model, n_heads):
    with pytest.raises(ValueError, match=rf"d_model \({d_model}\) must be divisible by n_heads"):
        MultiHeadAttention(d_model, n_heads)


def test_split_heads_refuses_what_it_cannot_split():
    with pytest.raises(ValueError, match="must be divisible by n_heads"):
        split_heads(torch.zeros(2, 3, 10), 4)
    with pytest.raises(ValueError, match=r"expects \[batch, seq, d_model\], got shape \[3, 8\]"):
        split_heads(torch.zeros(3, 8), 2)
    with pytest.raises(ValueError, match=r"expects \[batch, heads, seq, d_k\]"):
        merge_heads(torch.zeros(2, 3, 8))


x8 = torch.zeros(2, 5, 8)
BAD_INPUTS = [
    ((torch.zeros(5, 8), x8, x8), {}, ValueError, r"query must be \[batch, seq, d_model=8\], got shape \[5, 8\]"),
    ((x8, torch.zeros(2, 5, 6), x8), {}, ValueError, r"key must be \[batch, seq, d_model=8\], got shape \[2, 5, 6\]"),
    ((x8, x8, torch.zeros(2, 4, 8)), {}, ValueError, "key and value must have the same"),
    ((torch.zeros(1, 5, 8), x8, x8), {}, ValueError, "query and key must have the same batch size"),
    ((x8.tolist(), x8, x8), {}, TypeError, "query must be a torch.Tensor"),
    ((x8, x8, x8), {"mask": torch.ones(4, 4, dtype=torch.bool)}, ValueError, r"mask of shape \[4, 4\] does not broadcast"),
    ((x8, x8, x8), {"mask": torch.ones(5, 5)}, TypeError, "mask must be boolean"),
]


@pytest.mark.parametrize("need_weights", [False, True], ids=["fused", "readable"])
@pytest.mark.parametrize("args,kwargs,error,message", BAD_INPUTS, ids=[b[3][:30] for b in BAD_INPUTS])
def test_bad_input_names_the_problem(args, kwargs, error, message, need_weights):
    mha = MultiHeadAttention(8, 2)
    with pytest.raises(error, match=message):
        mha(*args, **kwargs, need_weights=need_weights)


# -- the KV cache ---------------------------------------------------------------------------


@pytest.mark.parametrize("need_weights", [False, True], ids=["fused", "readable"])
def test_kv_cache_token_by_token_equals_causal_attention_at_once(need_weights):
    ours, _ = _pair(16, 4)
    x = _randn(2, 7, 16)
    at_once = ours(x, x, x, mask=causal_mask(7), need_weights=need_weights)
    cache = KVCache()
    steps = []
    for t in range(7):
        x_t = x[:, t: t + 1]  # [batch, 1, d_model]: only the newest token
        steps.append(ours(x_t, x_t, x_t, cache=cache, need_weights=need_weights))  # sees tokens 0..t, no mask needed
        assert cache.length == t + 1
    torch.testing.assert_close(torch.cat(steps, dim=1), at_once, **TOL[torch.float32])


def test_static_cache_reuses_the_memory_keys_and_values():
    ours, _ = _pair(16, 4)
    memory = _randn(2, 9, 16, seed=8)
    cache = KVCache(static=True)
    for t in range(3):
        y = _randn(2, 1, 16, seed=10 + t)
        with_cache = ours(y, memory, memory, cache=cache)
        torch.testing.assert_close(with_cache, ours(y, memory, memory), **TOL[torch.float32])
        assert cache.length == 9  # computed once, never appended to
