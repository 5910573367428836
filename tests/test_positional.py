"""transformer_lib.positional: the sinusoidal table against its formula, the relative-offset
property (one matrix per offset, the same for every position), the encoding modules, and
the relative position bias on both attention paths and with a key/value cache."""

import math

import pytest
import torch

from transformer_lib.attention import KVCache, MultiHeadAttention
from transformer_lib.masks import causal_mask
from transformer_lib.positional import (
    LearnedPositionalEmbedding,
    RelativePositionBias,
    SinusoidalPositionalEncoding,
    add_positions,
    offset_rotation,
    relative_offsets,
    sinusoidal_encoding,
    sinusoidal_frequencies,
)

F64 = torch.float64


# -- the sinusoidal table -------------------------------------------------------------------


@pytest.mark.parametrize("max_len,d_model", [(1, 2), (7, 6), (50, 16), (128, 512)])
def test_sinusoidal_shape_dtype_and_range(max_len, d_model):
    pe = sinusoidal_encoding(max_len, d_model)
    assert pe.shape == (max_len, d_model) and pe.dtype == torch.float32
    assert pe.abs().max() <= 1.0
    assert sinusoidal_encoding(max_len, d_model, dtype=F64).dtype == F64


def test_sinusoidal_matches_the_papers_formula_entry_by_entry():
    max_len, d_model = 30, 10
    pe = sinusoidal_encoding(max_len, d_model, dtype=F64)
    for pos in range(max_len):
        for i in range(d_model // 2):
            angle = pos / 10000 ** (2 * i / d_model)
            assert pe[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-12)  # even dims: sin
            assert pe[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-12)  # odd dims: cos


def test_position_zero_and_frequencies():
    pe = sinusoidal_encoding(3, 8)
    assert torch.equal(pe[0], torch.tensor([0.0, 1.0] * 4))  # sin 0 = 0, cos 0 = 1
    omega = sinusoidal_frequencies(8)
    assert omega[0] == 1.0 and torch.all(omega[1:] < omega[:-1])  # one pair per speed, slower and slower
    assert omega[-1].item() == pytest.approx(10000 ** (-6 / 8))
    # another base changes every frequency but the first
    assert torch.allclose(sinusoidal_frequencies(8, base=100.0), 100.0 ** (-torch.arange(0, 8, 2, dtype=F64) / 8))


@pytest.mark.parametrize("bad", [0, 1, 7, 513])
def test_odd_or_tiny_d_model_raises(bad):
    with pytest.raises(ValueError, match="d_model"):
        sinusoidal_encoding(10, bad)
    with pytest.raises(ValueError, match="d_model"):
        SinusoidalPositionalEncoding(bad, max_len=10)


def test_bad_sizes_raise_clear_errors():
    with pytest.raises(ValueError, match="max_len"):
        sinusoidal_encoding(0, 8)
    with pytest.raises(TypeError, match="d_model"):
        sinusoidal_encoding(10, 8.0)
    with pytest.raises(TypeError, match="offset k"):
        offset_rotation(1.5, 8)


# -- the relative-offset property ------------------------------------------------------------


def _rotation_from_formula(k: int, d_model: int) -> torch.Tensor:
    """M_k built independently of the library: one 2x2 rotation by k * omega_i per pair of dims."""
    m = torch.zeros(d_model, d_model, dtype=F64)
    for i in range(d_model // 2):
        a = k / 10000 ** (2 * i / d_model)
        m[2 * i : 2 * i + 2, 2 * i : 2 * i + 2] = torch.tensor([[math.cos(a), math.sin(a)], [-math.sin(a), math.cos(a)]], dtype=F64)
    return m


@pytest.mark.parametrize("k", [0, 1, 2, 7, 31, 100, -1, -13])
@pytest.mark.parametrize("d_model", [2, 12, 64])
def test_one_matrix_shifts_every_position_by_k(k, d_model):
    max_len = 300
    pe = sinusoidal_encoding(max_len, d_model, dtype=F64)  # [max_len, d]
    m = offset_rotation(k, d_model, dtype=F64)
    assert torch.allclose(m, _rotation_from_formula(k, d_model), atol=1e-12)
    pos = torch.arange(max(0, -k), min(max_len, max_len - k))  # every pos with pos + k in the table
    shifted = pe[pos] @ m.T  # row form of M_k @ PE[pos]
    assert (shifted - pe[pos + k]).abs().max() < 1e-12


def test_rotations_form_a_group():
    d = 16
    m = {k: offset_rotation(k, d, dtype=F64) for k in (-4, 0, 3, 4, 7)}
    assert torch.allclose(m[0], torch.eye(d, dtype=F64))
    assert torch.allclose(m[3] @ m[4], m[7], atol=1e-12)  # shifting by 3 then by 4 = by 7
    assert torch.allclose(m[4].T, m[-4], atol=1e-12)  # the transpose shifts backwards
    assert torch.allclose(m[4] @ m[4].T, torch.eye(d, dtype=F64), atol=1e-12)  # a rotation keeps lengths
    assert offset_rotation(3, d).dtype == torch.float32


@pytest.mark.parametrize("k", [1, 5, 20])
def test_least_squares_finds_the_same_matrix_from_some_positions(k):
    """Fit a free matrix on 100 random positions; it is M_k, and it predicts all the others.

    The positions are spread over 2000 so that even the slowest pair turns enough to pin its block."""
    max_len, d_model = 2000, 16
    pe = sinusoidal_encoding(max_len, d_model, dtype=F64)
    order = torch.randperm(max_len - k, generator=torch.Generator().manual_seed(k))
    fit, rest = order[:100], order[100:]
    m_t = torch.linalg.lstsq(pe[fit], pe[fit + k]).solution  # [d, d]: pe[fit] @ m_t ~ pe[fit + k]
    assert (m_t.T - offset_rotation(k, d_model, dtype=F64)).abs().max() < 1e-9
    assert (pe[rest] @ m_t - pe[rest + k]).abs().max() < 1e-9


def test_dot_products_depend_only_on_the_distance():
    pe = sinusoidal_encoding(64, 32, dtype=F64)
    gram = pe @ pe.T  # [64, 64]
    omega = sinusoidal_frequencies(32)
    i, j = torch.meshgrid(torch.arange(64), torch.arange(64), indexing="ij")
    expected = torch.cos((i - j)[..., None].to(F64) * omega).sum(-1)  # sum_i cos((i - j) omega_i)
    assert torch.allclose(gram, expected, atol=1e-10)
    assert torch.allclose(gram, gram.T)  # symmetric: the distance, not the direction


# -- adding positions and the two absolute encodings -----------------------------------------


def test_add_positions_adds_the_right_rows():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 5, 8, generator=g)
    pe = torch.randn(20, 8, generator=g)
    assert torch.equal(add_positions(x, pe), x + pe[:5])
    assert torch.equal(add_positions(x, pe, offset=3), x + pe[3:8])
    assert torch.equal(add_positions(x[0], pe, offset=15), x[0] + pe[15:20])  # no batch dim, last rows
    assert add_positions(x.double(), pe).dtype == F64


def test_add_positions_errors_name_the_problem():
    x, pe = torch.zeros(2, 5, 8), torch.zeros(6, 8)
    with pytest.raises(ValueError, match=r"max_len=6"):
        add_positions(x, pe, offset=2)
    with pytest.raises(ValueError, match="d_model=8"):
        add_positions(x, torch.zeros(10, 4))
    with pytest.raises(ValueError, match="negative"):
        add_positions(x, pe, offset=-1)


@pytest.mark.parametrize("module_cls", [SinusoidalPositionalEncoding, LearnedPositionalEmbedding])
def test_modules_add_rows_with_an_offset_and_refuse_long_inputs(module_cls):
    d_model, max_len = 8, 12
    module = module_cls(d_model, max_len=max_len)
    table = module.pe if module_cls is SinusoidalPositionalEncoding else module.embedding.weight
    x = torch.randn(3, 4, d_model)
    assert torch.equal(module(x), x + table[:4])
    assert torch.equal(module(x, offset=8), x + table[8:12])  # the last four positions
    # Step-by-step decoding sees the same vectors as the whole sequence at once.
    steps = torch.cat([module(x[:, t : t + 1], offset=t) for t in range(4)], dim=1)
    assert torch.allclose(steps, module(x))
    with pytest.raises(ValueError, match=f"max_len={max_len}"):
        module(torch.randn(1, max_len + 1, d_model))
    with pytest.raises(ValueError, match=f"max_len={max_len}"):
        module(x, offset=9)


def test_sinusoidal_module_has_no_parameters_and_learned_one_trains_only_its_rows():
    sin = SinusoidalPositionalEncoding(16, max_len=50)
    assert list(sin.parameters()) == [] and "pe" not in sin.state_dict()
    assert torch.equal(sin.pe, sinusoidal_encoding(50, 16))
    learned = LearnedPositionalEmbedding(16, max_len=50)
    learned(torch.zeros(2, 7, 16), offset=10).sum().backward()
    rows_with_grad = learned.embedding.weight.grad.abs().sum(-1).nonzero().flatten()
    assert rows_with_grad.tolist() == list(range(10, 17))


# -- permutation equivariance, and positions breaking it -------------------------------------


def test_attention_without_positions_only_permutes_and_positions_break_that():
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 4).eval()
    x = torch.randn(1, 6, 16)
    perm = torch.tensor([5, 2, 0, 1, 4, 3])
    out, out_perm = mha(x, x, x), mha(x[:, perm], x[:, perm], x[:, perm])
    assert torch.allclose(out_perm, out[:, perm], atol=1e-6)
    assert torch.allclose(out_perm.mean(1), out.mean(1), atol=1e-6)  # a pooled vector cannot tell the orders apart
    pos = SinusoidalPositionalEncoding(16, max_len=10)
    y, y_perm = pos(x), pos(x[:, perm])
    assert not torch.allclose(mha(y_perm, y_perm, y_perm).mean(1), mha(y, y, y).mean(1), atol=1e-3)


# -- relative positions ----------------------------------------------------------------------


def test_relative_offsets_values_and_clipping():
    index = relative_offsets(4, 6, max_distance=2)
    assert index.dtype == torch.int64 and index.shape == (4, 6)
    expected = torch.tensor([[min(max(j - i, -2), 2) + 2 for j in range(6)] for i in range(4)])
    assert torch.equal(index, expected)
    assert torch.equal(relative_offsets(3, 3, max_distance=0), torch.zeros(3, 3, dtype=torch.int64))
    # queries placed later (a cache holds the first keys): the last rows of the full matrix
    assert torch.equal(relative_offsets(2, 6, 3, q_offset=4), relative_offsets(6, 6, 3)[4:])
    with pytest.raises(ValueError, match="max_distance"):
        relative_offsets(3, 3, -1)


def test_relative_bias_depends_only_on_clipped_offset():
    torch.manual_seed(0)
    rel = RelativePositionBias(n_heads=3, max_distance=4)
    with torch.no_grad():
        rel.table.normal_()
    bias = rel(7, 9)  # [heads, L_q, L_k]
    assert bias.shape == (3, 7, 9)
    for i in range(7):
        for j in range(9):
            offset = max(-4, min(4, j - i))
            assert torch.equal(bias[:, i, j], rel.table[:, offset + 4])
    # a diagonal (one offset) holds one value per head
    for d in range(-6, 9):
        diagonal = torch.diagonal(bias, offset=d, dim1=1, dim2=2)  # [heads, n]
        assert torch.equal(diagonal, diagonal[:, :1].expand_as(diagonal))
    # cached decoding: one query at the last position = the full matrix's last row
    assert torch.equal(rel(1, 9, q_offset=8), rel(9, 9)[:, -1:])
    assert torch.equal(rel(3, 9, q_offset=6), rel(9, 9)[:, -3:])


@pytest.mark.parametrize("with_mask", [False, True])
def test_attention_with_relative_bias_same_on_both_paths(with_mask):
    torch.manual_seed(1)
    mha = MultiHeadAttention(16, 4).eval()
    rel = RelativePositionBias(4, max_distance=3)
    with torch.no_grad():
        rel.table.normal_()
    x = torch.randn(2, 6, 16)
    mask = causal_mask(6) if with_mask else None
    bias = rel(6, 6)
    readable = mha(x, x, x, mask=mask, bias=bias, need_weights=True)
    fused = mha(x, x, x, mask=mask, bias=bias, need_weights=False)
    assert torch.allclose(readable, fused, atol=1e-5)
    assert not torch.allclose(readable, mha(x, x, x, mask=mask), atol=1e-3)  # the bias does something
    weights = mha.last_weights  # [batch, heads, L, L]
    assert torch.allclose(weights.sum(-1), torch.ones(2, 4, 6))


def test_relative_bias_with_kv_cache_matches_the_full_pass():
    torch.manual_seed(2)
    mha = MultiHeadAttention(8, 2).eval()
    rel = RelativePositionBias(2, max_distance=2)
    with torch.no_grad():
        rel.table.normal_()
    x = torch.randn(1, 5, 8)
    full = mha(x, x, x, mask=causal_mask(5), bias=rel(5, 5))
    cache, steps = KVCache(), []
    for t in range(5):
        steps.append(mha(x[:, t : t + 1], x[:, t : t + 1], x[:, t : t + 1], bias=rel(1, t + 1, q_offset=t), cache=cache))
    assert torch.allclose(torch.cat(steps, dim=1), full, atol=1e-6)


def test_relative_bias_is_trainable():
    rel = RelativePositionBias(2, max_distance=3)
    rel(4, 4)[:, 1, 0].sum().backward()  # offset -1 of both heads
    grad = rel.table.grad
    assert grad[:, 3 - 1].tolist() == [1.0, 1.0] and grad.abs().sum() == 2.0
