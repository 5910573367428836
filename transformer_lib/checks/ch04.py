"""Checkers for chapter 04, positional encoding: the sinusoidal table, adding it to the
embeddings, the rotation that shifts every position by k, and the clipped relative-offset
index that a relative position bias looks up.

Each checker compares a learner's function with the library (transformer_lib.positional)
on deterministic cases and knows the wrong answers learners often write ("sin and cos
swapped", "i - j instead of j - i"), so a failure can name what went wrong.
"""

import math

import torch

from transformer_lib.positional import add_positions, offset_rotation, relative_offsets, sinusoidal_encoding

from .core import Case, Checker, Mistake, randn, seeded


# ---------------------------------------------------------------------------------------
# Exercise 1: sinusoidal_table(max_len, d_model) -> [max_len, d_model]
# ---------------------------------------------------------------------------------------


def _table_cases() -> list[Case]:
    return [
        Case("a single pair of dims", (5, 2)),
        Case("8 positions, d_model = 8", (8, 8)),
        Case("d_model = 6 (an odd number of pairs)", (12, 6)),
        Case("50 positions, d_model = 16", (50, 16)),
        Case("position 0 only", (1, 4), hidden=True),
        Case("100 positions, d_model = 128", (100, 128), hidden=True),
        Case("d_model = 10", (33, 10), hidden=True),
    ]


def _table(max_len, d_model, exponents, base=10000.0, sin_first=True, interleave=True):
    """A sinusoidal table whose pair i turns at base^(-exponents[i]); the variations are the mistakes."""
    omega = base ** (-torch.as_tensor(exponents, dtype=torch.float64))  # [d/2]
    angle = torch.arange(max_len, dtype=torch.float64)[:, None] * omega  # [max_len, d/2]
    first, second = (angle.sin(), angle.cos()) if sin_first else (angle.cos(), angle.sin())
    if interleave:
        pe = torch.stack([first, second], dim=-1).reshape(max_len, d_model)
    else:
        pe = torch.cat([first, second], dim=-1)
    return pe.float()


def _paper_exponents(d_model):
    return torch.arange(0, d_model, 2, dtype=torch.float64) / d_model  # 2i / d_model


def _table_sin_cos_swapped(max_len, d_model):
    return _table(max_len, d_model, _paper_exponents(d_model), sin_first=False)


def _table_exponent_i(max_len, d_model):
    return _table(max_len, d_model, torch.arange(d_model // 2, dtype=torch.float64) / d_model)


def _table_exponent_doubled(max_len, d_model):
    return _table(max_len, d_model, 2 * torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)


def _table_base_1000(max_len, d_model):
    return _table(max_len, d_model, _paper_exponents(d_model), base=1000.0)


def _table_no_division(max_len, d_model):
    return _table(max_len, d_model, torch.arange(0, d_model, 2, dtype=torch.float64))


def _table_halves(max_len, d_model):
    return _table(max_len, d_model, _paper_exponents(d_model), interleave=False)


def _table_own_frequency_per_dim(max_len, d_model):
    omega = 10000.0 ** (-torch.arange(d_model, dtype=torch.float64) / d_model)  # [d]: one per dim
    angle = torch.arange(max_len, dtype=torch.float64)[:, None] * omega  # [max_len, d]
    pe = angle.sin()
    pe[:, 1::2] = angle[:, 1::2].cos()
    return pe.float()


check_sinusoidal_table = Checker(
    name="sinusoidal_table",
    reference=sinusoidal_encoding,
    make_cases=_table_cases,
    mistakes=[
        Mistake(
            "sin and cos swapped (cos in the even dims, sin in the odd ones)",
            "Even dims 0, 2, 4, ... get the sine, odd dims 1, 3, 5, ... the cosine: pe[:, 0::2] = sin, pe[:, 1::2] = cos.",
            _table_sin_cos_swapped,
        ),
        Mistake(
            "the pair index i used in the exponent instead of 2i (10000^(-i/d_model)): the frequencies fall too slowly",
            "The exponent is 2i/d_model, i.e. the even dimension index itself: torch.arange(0, d_model, 2) / d_model.",
            _table_exponent_i,
        ),
        Mistake(
            "the exponent doubled (2 * dim / d_model with dim = 0, 2, 4, ...): the frequencies fall twice too fast",
            "torch.arange(0, d_model, 2) already counts 2i; divide it by d_model without multiplying by 2 again.",
            _table_exponent_doubled,
        ),
        Mistake(
            "base 1000 instead of 10000",
            "The paper's frequencies are 10000^(-2i/d_model).",
            _table_base_1000,
        ),
        Mistake(
            "the exponent not divided by d_model (10000^(-2i)): every pair but the first is frozen at sin 0, cos 1",
            "Divide by d_model: omega_i = 10000^(-2i/d_model), so the frequencies spread from 1 down to about 1/10000.",
            _table_no_division,
        ),
        Mistake(
            "the sines and cosines concatenated as two halves [sin | cos] instead of interleaved",
            "Interleave them: dim 2i holds sin(pos * omega_i) and dim 2i+1 holds cos(pos * omega_i) (pe[:, 0::2] and pe[:, 1::2]).",
            _table_halves,
        ),
        Mistake(
            "every dimension given its own frequency 10000^(-dim/d_model): the cosine of a pair turns at a different speed than its sine",
            "The two dims of a pair share one frequency: dims 2i and 2i+1 both use omega_i = 10000^(-2i/d_model).",
            _table_own_frequency_per_dim,
        ),
    ],
    rtol=1e-4,
    atol=1e-4,  # float32 answers: pos * omega carries ~1e-5 of rounding at pos ~ 100
)


# ---------------------------------------------------------------------------------------
# Exercise 2: add_positions(x, pe, offset=0) -> x + pe[offset : offset + seq]
# ---------------------------------------------------------------------------------------


def _add_cases() -> list[Case]:
    g = seeded(402)
    table_16x8 = sinusoidal_encoding(16, 8)
    return [
        Case("batch of 2, 5 tokens, table of 16", (randn(g, 2, 5, 8), table_16x8)),
        Case("offset 3", (randn(g, 2, 4, 8), table_16x8), {"offset": 3}),
        Case("one new token at position 7 (cached decoding)", (randn(g, 3, 1, 8), table_16x8), {"offset": 7}),
        Case("a random table, sequence as long as the table", (randn(g, 1, 6, 4), randn(g, 6, 4))),
        Case("float64 embeddings, float32 table", (randn(g, 2, 3, 8, dtype=torch.float64), table_16x8), {"offset": 2},
             hidden=True),
        Case("batch of 1, random table", (randn(g, 1, 5, 6), randn(g, 9, 6)), {"offset": 4}, hidden=True),
        Case("last rows of the table", (randn(g, 4, 3, 8), table_16x8), {"offset": 13}, hidden=True),
    ]


def _add_offset_ignored(x, pe, offset=0):
    return x + pe[: x.shape[-2]].to(x.dtype)


def _add_from_position_1(x, pe, offset=0):
    seq = x.shape[-2]
    rows = pe[offset + 1 : offset + seq + 1]
    if rows.shape[0] < seq:  # ran off the end of the table: keep the shapes, the values are wrong anyway
        rows = torch.cat([rows, pe[: seq - rows.shape[0]]])
    return x + rows.to(x.dtype)


def _add_last_rows(x, pe, offset=0):
    return x + pe[pe.shape[0] - x.shape[-2] :].to(x.dtype)


def _add_scaled_embeddings(x, pe, offset=0):
    return x * math.sqrt(x.shape[-1]) + pe[offset : offset + x.shape[-2]].to(x.dtype)


check_add_positions = Checker(
    name="add_positions",
    reference=add_positions,
    make_cases=_add_cases,
    mistakes=[
        Mistake(
            "offset ignored: the rows of positions 0 .. seq-1 added whatever the offset",
            "The first token sits at position `offset`: add pe[offset : offset + seq].",
            _add_offset_ignored,
        ),
        Mistake(
            "positions counted from 1 (pe[offset + 1 : offset + seq + 1]): every token gets its right neighbour's vector",
            "Positions start at 0: the first token gets row `offset`, so slice pe[offset : offset + seq].",
            _add_from_position_1,
        ),
        Mistake(
            "the last seq rows of the table added (pe[-seq:])",
            "Take the rows from the start, shifted by the offset: pe[offset : offset + seq].",
            _add_last_rows,
        ),
        Mistake(
            "x multiplied by sqrt(d_model) before adding",
            "Only add here: x + pe[offset : offset + seq]. (Scaling the embeddings belongs to the embedding layer, chapter 08.)",
            _add_scaled_embeddings,
        ),
    ],
)


# ---------------------------------------------------------------------------------------
# Exercise 3: rotation_for_offset(k, d_model) -> M_k [d_model, d_model]
# ---------------------------------------------------------------------------------------


def _rotation_cases() -> list[Case]:
    return [
        Case("k = 1, d_model = 4", (1, 4)),
        Case("k = 3, d_model = 8", (3, 8)),
        Case("k = -2, d_model = 6 (a shift backwards)", (-2, 6)),
        Case("k = 0 (no shift)", (0, 4)),
        Case("k = 7, d_model = 16", (7, 16), hidden=True),
        Case("k = -10, d_model = 10", (-10, 10), hidden=True),
        Case("k = 100, d_model = 64", (100, 64), hidden=True),
    ]


def _rotation(d_model, angle, sign=1.0, with_sin=True):
    """Block-diagonal: pair i gets [[cos a, sign * sin a], [-sign * sin a, cos a]] with a = angle[i]."""
    cos, sin = angle.cos(), angle.sin() * sign * (1.0 if with_sin else 0.0)
    m = torch.zeros(d_model, d_model, dtype=torch.float64)
    m[0::2, 0::2], m[0::2, 1::2] = torch.diag(cos), torch.diag(sin)
    m[1::2, 0::2], m[1::2, 1::2] = torch.diag(-sin), torch.diag(cos)
    return m.float()


def _omega(d_model):
    return 10000.0 ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)  # [d/2]


def _rotation_transposed(k, d_model):
    return _rotation(d_model, k * _omega(d_model), sign=-1.0)


def _rotation_k_forgotten(k, d_model):
    return _rotation(d_model, _omega(d_model))


def _rotation_no_frequencies(k, d_model):
    return _rotation(d_model, torch.full((d_model // 2,), float(k), dtype=torch.float64))


def _rotation_cos_only(k, d_model):
    return _rotation(d_model, k * _omega(d_model), with_sin=False)


check_rotation_for_offset = Checker(
    name="rotation_for_offset",
    reference=offset_rotation,
    make_cases=_rotation_cases,
    mistakes=[
        Mistake(
            "each 2x2 block transposed (the signs of the sines swapped): that matrix shifts by -k, not by k",
            "Row 2i (the new sine) is [cos(k w), sin(k w)] and row 2i+1 (the new cosine) is [-sin(k w), cos(k w)], "
            "from sin(a+b) = sin a cos b + cos a sin b and cos(a+b) = cos a cos b - sin a sin b.",
            _rotation_transposed,
        ),
        Mistake(
            "the angle is omega_i instead of k * omega_i: the matrix always shifts by one position",
            "Shifting by k turns pair i by k times its frequency: angle = k * omega_i.",
            _rotation_k_forgotten,
        ),
        Mistake(
            "the angle is k for every pair: the frequencies omega_i = 10000^(-2i/d_model) were left out",
            "Each pair turns at its own speed: angle_i = k * 10000^(-2i/d_model).",
            _rotation_no_frequencies,
        ),
        Mistake(
            "only the cosines on the diagonal, the sine terms left out",
            "Each 2x2 block is a full rotation: [[cos, sin], [-sin, cos]] of the angle k * omega_i.",
            _rotation_cos_only,
        ),
    ],
    rtol=1e-4,
    atol=1e-4,  # float32 answers: k * omega carries ~1e-5 of rounding at k ~ 100
)


# ---------------------------------------------------------------------------------------
# Exercise 4: relative_position_index(q_len, k_len, max_distance) -> int64 [q_len, k_len]
# ---------------------------------------------------------------------------------------


def _index_cases() -> list[Case]:
    return [
        Case("5 x 5, max_distance 2", (5, 5, 2)),
        Case("4 queries, 7 keys, max_distance 3", (4, 7, 3)),
        Case("6 queries, 3 keys, max_distance 1", (6, 3, 1)),
        Case("max_distance larger than the sequence", (3, 4, 10)),
        Case("max_distance 0", (3, 3, 0), hidden=True),
        Case("9 x 9, max_distance 4", (9, 9, 4), hidden=True),
        Case("a single query, 8 keys", (1, 8, 3), hidden=True),
    ]


def _offsets(q_len, k_len):
    return torch.arange(k_len)[None, :] - torch.arange(q_len)[:, None]  # [L_q, L_k]: j - i


def _index_i_minus_j(q_len, k_len, max_distance):
    return (-_offsets(q_len, k_len)).clamp(-max_distance, max_distance) + max_distance


def _index_not_clipped(q_len, k_len, max_distance):
    return _offsets(q_len, k_len) + max_distance


def _index_not_shifted(q_len, k_len, max_distance):
    return _offsets(q_len, k_len).clamp(-max_distance, max_distance)


def _index_absolute_distance(q_len, k_len, max_distance):
    return _offsets(q_len, k_len).abs().clamp(max=max_distance)


def _index_as_floats(q_len, k_len, max_distance):
    return (_offsets(q_len, k_len).clamp(-max_distance, max_distance) + max_distance).float()


check_relative_position_index = Checker(
    name="relative_position_index",
    reference=relative_offsets,
    make_cases=_index_cases,
    mistakes=[
        Mistake(
            "i - j instead of j - i: left and right are mirrored",
            "The offset is key position minus query position, j - i (negative = the key is to the left).",
            _index_i_minus_j,
        ),
        Mistake(
            "offsets not clipped to [-max_distance, max_distance]: far positions index outside the table",
            "Clamp j - i to [-max_distance, max_distance] before shifting: .clamp(-max_distance, max_distance).",
            _index_not_clipped,
        ),
        Mistake(
            "offsets not shifted by max_distance: negative values cannot index a table",
            "Add max_distance after clipping, so the indices run from 0 to 2 * max_distance.",
            _index_not_shifted,
        ),
        Mistake(
            "the absolute distance |j - i| used: a key 2 to the left and one 2 to the right share one bias",
            "Keep the sign: clip(j - i, -max_distance, max_distance) + max_distance has 2 * max_distance + 1 values.",
            _index_absolute_distance,
        ),
        Mistake(
            "indices returned as floats",
            "Indices must be integers (torch.long) to index a table: build them from torch.arange, which gives int64.",
            _index_as_floats,
        ),
    ],
)


CHECKERS = [check_sinusoidal_table, check_add_positions, check_rotation_for_offset, check_relative_position_index]
