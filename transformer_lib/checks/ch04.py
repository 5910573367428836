"""Checkers for chapter 04, positional encoding: the sinusoidal table, adding it to the
embeddings, the rotation that shifts every position by k, the clipped relative-offset
index, and the relative position bias each head looks up with it.

Each checker compares a learner's function with the library (transformer_lib.positional)
on deterministic cases and knows the wrong answers learners often write ("sin and cos
swapped", "i - j instead of j - i"), so a failure can name what went wrong. Properties
name an error from a trait of the output ("position 0 starts with 1 in the even dims",
"a [d_model, max_len] table"), so two mistakes made at once are still diagnosed.
"""

import math

import torch

from transformer_lib.positional import (add_positions, offset_rotation, relative_offsets, relative_position_bias,
                                        sinusoidal_encoding)

from .core import Case, Checker, Mistake, Property, randn, seeded


def _tensors(expected, actual):
    """Both outputs as float64 tensors, or (None, None) when either is not a tensor."""
    if not (isinstance(expected, torch.Tensor) and isinstance(actual, torch.Tensor)):
        return None, None
    return expected.double(), actual.double()


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


def _table_readings(expected, actual) -> list[torch.Tensor]:
    """The learner's table read with positions down the rows. A [d_model, max_len] answer is turned
    back; a square one could be either way round, so both readings are returned."""
    e, a = _tensors(expected, actual)
    if e is None or a.dim() != 2:
        return []
    if a.shape == e.shape and e.shape[0] == e.shape[1]:
        return [a, a.T]
    if a.shape == e.shape:
        return [a]
    return [a.T] if a.shape == e.T.shape else []


def _table_is_transposed(case, expected, actual):
    e, a = _tensors(expected, actual)
    if e is None or e.shape[0] == e.shape[1]:
        return e is not None and a.shape == e.shape and not torch.allclose(e, e.T) and torch.allclose(a, e.T, atol=1e-4)
    return a.shape == e.T.shape


def _starts_one_zero(table: torch.Tensor) -> bool:
    first = table[0]  # position 0: sin 0 = 0 in the even dims, cos 0 = 1 in the odd ones
    return bool(torch.allclose(first[0::2], torch.ones_like(first[0::2]), atol=1e-4)
                and torch.allclose(first[1::2], torch.zeros_like(first[1::2]), atol=1e-4))


def _even_dims_start_at_one(case, expected, actual):
    return any(_starts_one_zero(t) for t in _table_readings(expected, actual))


def _off_the_circle(table: torch.Tensor) -> bool:
    if table.shape[-1] % 2:
        return True
    radius = table[:, 0::2] ** 2 + table[:, 1::2] ** 2  # [max_len, d/2]: sin^2 + cos^2 of one angle is 1
    return bool(((radius - 1).abs() > 1e-3).any())


def _pairs_off_the_circle(case, expected, actual):
    readings = _table_readings(expected, actual)
    return bool(readings) and all(_off_the_circle(t) for t in readings)


def _outside_unit_range(case, expected, actual):
    e, a = _tensors(expected, actual)
    return e is not None and bool((a.abs() > 1 + 1e-4).any())


TABLE_PROPERTIES = [
    Property(
        "a table of shape [d_model, max_len], the transpose of [max_len, d_model]",
        "Rows are positions: build the angles as positions [max_len, 1] times frequencies [1, d_model/2].",
        _table_is_transposed,
    ),
    Property(
        "a row for position 0 that starts [1, 0, 1, 0, ...]: the even dims start at 1 (cos 0) instead of 0 (sin 0), "
        "so sin and cos are swapped",
        "Even dims 0, 2, 4, ... get the sine, odd dims the cosine: pe[:, 0::2] = sin, pe[:, 1::2] = cos.",
        _even_dims_start_at_one,
    ),
    Property(
        "pairs of dims (2i, 2i+1) whose squares do not add up to 1: the two dims of a pair are not the sine and "
        "cosine of one angle",
        "Dims 2i and 2i+1 hold sin and cos of the same angle pos * omega_i (interleaved, one frequency per pair).",
        _pairs_off_the_circle,
    ),
    Property(
        "entries outside [-1, 1]: raw angles instead of their sines and cosines",
        "Every entry is a sine or a cosine: apply torch.sin / torch.cos to the angles pos * omega_i.",
        _outside_unit_range,
    ),
]


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
    properties=TABLE_PROPERTIES,
    rtol=1e-4,
    atol=1e-4,  # float32 answers: pos * omega carries ~1e-5 of rounding at pos ~ 100
)


# ---------------------------------------------------------------------------------------
# Exercise 2: add_positions(x, pe, offset=0) -> x + pe[offset : offset + seq]
# ---------------------------------------------------------------------------------------


def _add_cases() -> list[Case]:
    g = seeded(402)
    # Any table will do for adding rows; not sinusoidal_encoding's, since the grader runs the whole
    # chapter with every exercise's reference hidden and a case may not need another one.
    table_16x8 = randn(seeded(403), 16, 8)
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


def _added_rows(case, actual):
    """What the learner added to x, as [..., seq, d_model], or None when shapes do not allow it."""
    x = case.args[0]
    if not isinstance(actual, torch.Tensor) or actual.shape != x.shape:
        return None
    return actual.double() - x.double()


def _wrong_block_of_rows(case, expected, actual):
    added = _added_rows(case, actual)
    if added is None:
        return False
    pe, offset, seq = case.args[1].double(), case.kwargs.get("offset", 0), case.args[0].shape[-2]
    for start in range(pe.shape[0] - seq + 1):
        if start != offset and torch.allclose(added, pe[start : start + seq].expand_as(added), atol=1e-5):
            return True
    return False


def _one_row_for_every_token(case, expected, actual):
    added = _added_rows(case, actual)
    if added is None or added.shape[-2] < 2:
        return False
    return bool(torch.allclose(added, added[..., :1, :].expand_as(added), atol=1e-5))


ADD_PROPERTIES = [
    Property(
        "a block of table rows that starts at the wrong position",
        "The first token sits at position `offset`: add pe[offset : offset + seq], with seq = x.shape[1].",
        _wrong_block_of_rows,
    ),
    Property(
        "the same position vector added to every token",
        "Each token t gets its own row, offset + t: slice seq rows, pe[offset : offset + seq] "
        "(seq is x.shape[1]; len(x) is the batch size).",
        _one_row_for_every_token,
    ),
]


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
    properties=ADD_PROPERTIES,
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


def _rotation_without_diag(k, d_model):
    angle = k * _omega(d_model)  # [d/2]
    cos, sin = angle.cos(), angle.sin()
    m = torch.zeros(d_model, d_model, dtype=torch.float64)
    # A vector assigned to a [d/2, d/2] slice broadcasts along its rows: every entry is filled.
    m[0::2, 0::2], m[0::2, 1::2] = cos, sin
    m[1::2, 0::2], m[1::2, 1::2] = -sin, cos
    return m.float()


def _outside_the_blocks(case, expected, actual):
    e, a = _tensors(expected, actual)
    if e is None or a.shape != e.shape:
        return False
    pair = torch.arange(a.shape[-1]) // 2
    off_block = pair[:, None] != pair[None, :]  # [d, d]: True outside the 2x2 blocks on the diagonal
    return bool((a[off_block].abs() > 1e-4).any())


def _not_a_rotation(case, expected, actual):
    e, a = _tensors(expected, actual)
    if e is None or a.dim() != 2 or a.shape[0] != a.shape[1] or a.shape != e.shape:
        return False
    return not torch.allclose(a @ a.T, torch.eye(a.shape[0], dtype=a.dtype), atol=1e-3)


ROTATION_PROPERTIES = [
    Property(
        "nonzero entries outside the 2x2 blocks on the diagonal",
        "Start from torch.zeros(d_model, d_model) and fill only the entries of each pair's block: "
        "assign torch.diag(...) to the strided slices, not the bare vectors.",
        _outside_the_blocks,
    ),
    Property(
        "a matrix that is not a rotation (M @ M.T is not the identity)",
        "Each 2x2 block is [[cos a, sin a], [-sin a, cos a]] with one angle a = k * omega_i in all four entries.",
        _not_a_rotation,
    ),
]


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
        Mistake(
            "cos and sin assigned to the strided slices without torch.diag: every (even, even) entry is filled, "
            "not only the 2x2 blocks on the diagonal",
            "m[0::2, 0::2] is a [d_model/2, d_model/2] grid; a vector assigned to it fills every row. Assign "
            "torch.diag(cos) (and torch.diag(sin), ...) so only the diagonal blocks are set.",
            _rotation_without_diag,
        ),
    ],
    properties=ROTATION_PROPERTIES,
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


def _outside_the_table(case, expected, actual):
    if not isinstance(actual, torch.Tensor) or actual.shape != expected.shape:
        return False
    max_distance = case.args[2]
    return bool(((actual < 0) | (actual > 2 * max_distance)).any())


def _changes_along_a_diagonal(case, expected, actual):
    if not isinstance(actual, torch.Tensor) or actual.dim() != 2 or min(actual.shape) < 2:
        return False
    return not torch.equal(actual[1:, 1:].double(), actual[:-1, :-1].double())


INDEX_PROPERTIES = [
    Property(
        "indices outside 0 .. 2 * max_distance: they cannot index a table of 2 * max_distance + 1 entries",
        "Clip j - i to [-max_distance, max_distance] first, then add max_distance.",
        _outside_the_table,
    ),
    Property(
        "values that change along a diagonal: the index must depend on j - i only",
        "Build j - i from two aranges, keys [1, k_len] minus queries [q_len, 1], and use nothing else.",
        _changes_along_a_diagonal,
    ),
]


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
    properties=INDEX_PROPERTIES,
)


# ---------------------------------------------------------------------------------------
# Exercise 5: relative_position_bias(table, q_len, k_len) -> [heads, q_len, k_len]
# ---------------------------------------------------------------------------------------


def _bias_cases() -> list[Case]:
    g = seeded(405)
    return [
        Case("2 heads, max_distance 2, 5 x 5", (randn(g, 2, 5), 5, 5)),
        Case("3 heads, max_distance 3, 4 queries, 6 keys", (randn(g, 3, 7), 4, 6)),
        Case("1 head, max_distance 1, 6 queries, 3 keys", (randn(g, 1, 3), 6, 3)),
        Case("4 heads, max_distance 4, shorter than the table", (randn(g, 4, 9), 3, 3)),
        Case("max_distance 0: one bias per head", (randn(g, 2, 1), 3, 4), hidden=True),
        Case("8 heads, a single query, 7 keys", (randn(g, 8, 5), 1, 7), hidden=True),
        Case("float64 table, 9 x 9", (randn(g, 2, 7, dtype=torch.float64), 9, 9), hidden=True),
        Case("5 heads, 10 queries, 2 keys", (randn(g, 5, 11), 10, 2), hidden=True),
    ]


def _bias_from_index(table, index):
    return table[:, index]  # [heads, L_q, L_k]


def _bias_mirrored(table, q_len, k_len):
    return _bias_from_index(table, _index_i_minus_j(q_len, k_len, (table.shape[-1] - 1) // 2))


def _bias_not_shifted(table, q_len, k_len):
    # Negative indices do not fail in PyTorch: they count from the end of the table.
    return _bias_from_index(table, _index_not_shifted(q_len, k_len, (table.shape[-1] - 1) // 2))


def _bias_distance(table, q_len, k_len):
    return _bias_from_index(table, _index_absolute_distance(q_len, k_len, (table.shape[-1] - 1) // 2))


def _bias_heads_last(table, q_len, k_len):
    return table.T[relative_offsets(q_len, k_len, (table.shape[-1] - 1) // 2)]  # [L_q, L_k, heads]


def _heads_all_alike(case, expected, actual):
    e, a = _tensors(expected, actual)
    if e is None or a.shape != e.shape or a.shape[0] < 2:
        return False
    return torch.allclose(a, a[:1].expand_as(a)) and not torch.allclose(e, e[:1].expand_as(e))


def _bias_changes_along_a_diagonal(case, expected, actual):
    e, a = _tensors(expected, actual)
    if e is None or a.shape != e.shape or min(a.shape[-2:]) < 2:
        return False
    return not torch.allclose(a[..., 1:, 1:], a[..., :-1, :-1])


def _heads_not_first(case, expected, actual):
    if not (isinstance(expected, torch.Tensor) and isinstance(actual, torch.Tensor)):
        return False
    queries_keys_swapped = actual.shape == expected.transpose(-2, -1).shape
    return (actual.shape != expected.shape and sorted(actual.shape) == sorted(expected.shape)
            and not queries_keys_swapped)


def _queries_and_keys_swapped(case, expected, actual):
    e, a = _tensors(expected, actual)
    if e is None:
        return False
    if e.shape[-1] != e.shape[-2]:
        return a.shape == e.transpose(-2, -1).shape
    return a.shape == e.shape and not torch.allclose(e, e.transpose(-2, -1)) and torch.allclose(a, e.transpose(-2, -1))


BIAS_PROPERTIES = [
    Property(
        "the heads not first: the right sizes in the wrong order",
        "The bias is [heads, q_len, k_len], heads first, so that it broadcasts over the batch of scores "
        "[batch, heads, q_len, k_len]: index the table's second dimension, table[:, index].",
        _heads_not_first,
    ),
    Property(
        "queries and keys swapped: a [heads, k_len, q_len] bias, or its entries mirrored across the diagonal",
        "Rows are queries i, columns are keys j: the index matrix is [q_len, k_len] and holds "
        "clip(j - i, -D, D) + D.",
        _queries_and_keys_swapped,
    ),
    Property(
        "every head given the same bias",
        "Each head has its own row of the table: table[:, index] keeps the head dimension first.",
        _heads_all_alike,
    ),
    Property(
        "a bias that changes along a diagonal: it must depend on the offset j - i only",
        "Look every entry up with the index of exercise 4: relative_position_index(q_len, k_len, max_distance).",
        _bias_changes_along_a_diagonal,
    ),
]


check_relative_position_bias = Checker(
    name="relative_position_bias",
    reference=relative_position_bias,
    make_cases=_bias_cases,
    mistakes=[
        Mistake(
            "the index built from i - j: every head's bias is mirrored, a preference for the previous token "
            "becomes one for the next",
            "The table's column D + m holds the bias of offset m = j - i (key position minus query position).",
            _bias_mirrored,
        ),
        Mistake(
            "the clipped offsets used as indices without adding max_distance: negative offsets silently read "
            "the table from its end",
            "Shift the clipped offsets by max_distance, so they run from 0 to 2 * max_distance "
            "(the index of exercise 4 already does).",
            _bias_not_shifted,
        ),
        Mistake(
            "the distance |j - i| used as the index: left and right share a bias and half the table is never read",
            "Keep the sign of j - i: index = clip(j - i, -D, D) + D with D = (table.shape[1] - 1) // 2.",
            _bias_distance,
        ),
        Mistake(
            "the heads placed last ([q_len, k_len, heads], from table.T[index])",
            "Keep the heads first: table[:, index] is [heads, q_len, k_len], which adds to scores "
            "[batch, heads, q_len, k_len].",
            _bias_heads_last,
        ),
    ],
    properties=BIAS_PROPERTIES,
)


CHECKERS = [check_sinusoidal_table, check_add_positions, check_rotation_for_offset, check_relative_position_index,
            check_relative_position_bias]
