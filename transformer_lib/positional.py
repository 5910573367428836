"""Positions: attention alone is permutation-equivariant, so order must be added to the input.

Three ways, as in the course's chapter 04: the fixed sinusoidal encoding of "Attention Is
All You Need" (Vaswani et al., 2017, section 3.5), a learned table of absolute positions
(BERT, GPT-2, ViT), and a learned scalar bias per head on the attention scores that depends
only on the offset between two positions. That last one is T5's relative position bias
(Raffel et al., 2020), with the simple clipping of Shaw et al. (2018) in place of T5's
logarithmic buckets. (Shaw et al. themselves add learned relative-position *vectors* to the
keys and values inside attention, not a scalar to the scores.)
"""

import operator

import torch
import torch.nn as nn

DEFAULT_BASE = 10000.0  # the paper's base: wavelengths from 2*pi up to 10000 * 2*pi


def _check_size(name: str, value, minimum: int) -> None:
    # operator.index accepts ints and integer-like values (numpy ints), and rejects 8.0.
    try:
        if isinstance(value, bool):
            raise TypeError
        value = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int, got {type(value).__name__}") from None
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")


def _check_d_model(d_model) -> None:
    _check_size("d_model", d_model, 2)
    if d_model % 2:
        raise ValueError(
            f"the sinusoidal encoding needs an even d_model (sin and cos come in pairs, one pair "
            f"per frequency), got d_model={d_model}"
        )


def sinusoidal_frequencies(d_model: int, base: float = DEFAULT_BASE) -> torch.Tensor:
    """The angular frequency of each (sin, cos) pair: omega_i = base^(-2i / d_model), i < d_model/2.

    Returns [d_model/2] in float64. omega_0 = 1 (wavelength 2*pi positions); the last pair turns
    slowest, wavelength close to base * 2*pi.
    """
    _check_d_model(d_model)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)  # [d/2]: 0, 2, 4, ..., d-2
    return base ** (-two_i / d_model)  # [d/2]


def sinusoidal_encoding(max_len: int, d_model: int, base: float = DEFAULT_BASE,
                        dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """PE[pos, 2i] = sin(pos * omega_i), PE[pos, 2i+1] = cos(pos * omega_i), omega_i = base^(-2i/d_model).

    Returns [max_len, d_model] (float32 unless `dtype` says otherwise). Each pair of dims turns
    like a clock hand at its own speed, so PE[pos + k] = offset_rotation(k) @ PE[pos] for every pos.
    """
    _check_size("max_len", max_len, 1)
    omega = sinusoidal_frequencies(d_model, base)  # [d/2]
    # Computed in float64: pos * omega reaches thousands of radians, where float32 would
    # already lose the fourth decimal of the sine.
    angle = torch.arange(max_len, dtype=torch.float64)[:, None] * omega  # [max_len, d/2]
    pe = torch.empty(max_len, d_model, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(angle)  # even dims
    pe[:, 1::2] = torch.cos(angle)  # odd dims: the partner of the sine at the same frequency
    return pe.to(dtype)


def offset_rotation(k: int, d_model: int, base: float = DEFAULT_BASE,
                    dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The matrix M_k with PE[pos + k] = M_k @ PE[pos] for every pos (row form: PE[pos] @ M_k^T).

    Block-diagonal [d_model, d_model]: pair i gets the 2x2 rotation by the angle k * omega_i,
        [[ cos(k w),  sin(k w)],
         [-sin(k w),  cos(k w)]]
    because sin(a + b) = sin a cos b + cos a sin b and cos(a + b) = cos a cos b - sin a sin b.
    It does not depend on pos: that is the whole point. M_{-k} = M_k^T = M_k^{-1}.
    """
    try:
        k = operator.index(k)
    except TypeError:
        raise TypeError(f"the offset k must be an int, got {type(k).__name__}") from None
    angle = k * sinusoidal_frequencies(d_model, base)  # [d/2]
    cos, sin = torch.cos(angle), torch.sin(angle)
    m = torch.zeros(d_model, d_model, dtype=torch.float64)
    m[0::2, 0::2] = torch.diag(cos)  # new sin <- cos(kw) * sin ...
    m[0::2, 1::2] = torch.diag(sin)  # ... + sin(kw) * cos
    m[1::2, 0::2] = torch.diag(-sin)  # new cos <- -sin(kw) * sin ...
    m[1::2, 1::2] = torch.diag(cos)  # ... + cos(kw) * cos
    return m.to(dtype)


def add_positions(x: torch.Tensor, pe: torch.Tensor, offset: int = 0) -> torch.Tensor:
    """x + pe[offset : offset + seq]: the position vectors of positions offset, ..., offset + seq - 1.

    x: [..., seq, d_model] token embeddings; pe: [max_len, d_model] a table of position vectors.
    Returns [..., seq, d_model] in x's dtype. `offset` is the position of x's first token: with a
    key/value cache (chapter 07) a decoder feeds one new token at a time, at position offset.
    """
    if x.dim() < 2 or pe.dim() != 2:
        raise ValueError(f"add_positions needs x [..., seq, d_model] and pe [max_len, d_model], "
                         f"got x {list(x.shape)} and pe {list(pe.shape)}")
    if x.shape[-1] != pe.shape[-1]:
        raise ValueError(f"the embeddings have d_model={x.shape[-1]} but the positional table has "
                         f"{pe.shape[-1]} columns: build it with the model's d_model")
    seq, max_len = x.shape[-2], pe.shape[0]
    if offset < 0:
        raise ValueError(f"offset is the position of the first token and cannot be negative, got {offset}")
    if offset + seq > max_len:
        raise ValueError(
            f"sequence of length {seq} (starting at position {offset}) is longer than the "
            f"positional table (max_len={max_len}); build the model with a larger max_len"
        )
    # Broadcasting adds the same [seq, d_model] rows to every sequence of the batch.
    return x + pe[offset : offset + seq].to(x.dtype)  # [..., seq, d_model]


class SinusoidalPositionalEncoding(nn.Module):
    """Adds the fixed sinusoidal encoding to token embeddings [batch, seq, d_model], then dropout."""

    def __init__(self, d_model: int, max_len: int = 5000, dropout: float = 0.0):
        super().__init__()
        self.d_model, self.max_len = d_model, max_len
        self.dropout = nn.Dropout(dropout)
        # A buffer, not a parameter: it moves with .to(device) but is never trained, and
        # (persistent=False) it is rebuilt rather than stored in checkpoints.
        self.register_buffer("pe", sinusoidal_encoding(max_len, d_model), persistent=False)

    def forward(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        return self.dropout(add_positions(x, self.pe, offset))  # [batch, seq, d_model]


class LearnedPositionalEmbedding(nn.Module):
    """Adds a trained vector per absolute position (BERT, GPT-2, ViT); cannot extrapolate past max_len."""

    def __init__(self, d_model: int, max_len: int = 512, dropout: float = 0.0):
        super().__init__()
        _check_size("d_model", d_model, 1)
        _check_size("max_len", max_len, 1)
        self.d_model, self.max_len = d_model, max_len
        self.embedding = nn.Embedding(max_len, d_model)
        nn.init.normal_(self.embedding.weight, std=0.02)  # BERT's and GPT-2's initialisation
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        # Slicing the weight is the lookup of positions offset..offset+seq-1; only those rows get gradients.
        return self.dropout(add_positions(x, self.embedding.weight, offset))  # [batch, seq, d_model]


def relative_offsets(q_len: int, k_len: int, max_distance: int, device=None, q_offset: int = 0) -> torch.Tensor:
    """index[i, j] = clip(j - i, -max_distance, max_distance) + max_distance, an index into a table.

    Returns int64 [q_len, k_len] with values in [0, 2 * max_distance]: 0 means "max_distance or
    more to the left", max_distance means "the same position", 2 * max_distance "that far or
    more to the right". Queries sit at positions q_offset, ..., q_offset + q_len - 1 (q_offset > 0
    when a key/value cache holds earlier keys); keys at 0, ..., k_len - 1.
    """
    _check_size("q_len", q_len, 0)
    _check_size("k_len", k_len, 0)
    _check_size("max_distance", max_distance, 0)
    _check_size("q_offset", q_offset, 0)
    q_pos = torch.arange(q_offset, q_offset + q_len, device=device)[:, None]  # [L_q, 1]
    k_pos = torch.arange(k_len, device=device)[None, :]  # [1, L_k]
    # Beyond max_distance all offsets share one entry: "far away" is all a model needs to know.
    return (k_pos - q_pos).clamp(-max_distance, max_distance) + max_distance  # [L_q, L_k]


def relative_position_bias(table: torch.Tensor, q_len: int, k_len: int, q_offset: int = 0) -> torch.Tensor:
    """The bias each head adds to its scores: bias[h, i, j] = table[h, clip(j - i, -D, D) + D].

    table: [heads, 2D + 1], one learned scalar per head and clipped offset (D = max_distance,
    read from the table's width). Returns [heads, q_len, k_len], which broadcasts over the
    batch when added to scores [batch, heads, q_len, k_len]. Indexing (a gather) keeps the
    result differentiable with respect to the table, so the table trains.
    """
    if table.dim() != 2 or table.shape[-1] % 2 == 0:
        raise ValueError(f"a relative bias table is [heads, 2 * max_distance + 1] (an odd number of columns), "
                         f"got {list(table.shape)}")
    max_distance = (table.shape[-1] - 1) // 2
    index = relative_offsets(q_len, k_len, max_distance, table.device, q_offset)  # [L_q, L_k]
    return table[:, index]  # [heads, L_q, L_k]


class RelativePositionBias(nn.Module):
    """A learned scalar per head and per (clipped) offset j - i, added to the attention scores (T5's idea).

    Positions further apart than max_distance share one bias. forward(L_q, L_k) returns
    [heads, L_q, L_k], which MultiHeadAttention takes as `bias=`. The bias depends only on
    j - i, never on i itself, so it means the same at position 3 and at position 3000.
    """

    def __init__(self, n_heads: int, max_distance: int = 16):
        super().__init__()
        _check_size("n_heads", n_heads, 1)
        _check_size("max_distance", max_distance, 0)
        self.n_heads, self.max_distance = n_heads, max_distance
        # Zeros: an untrained model starts with no preference for any offset.
        self.table = nn.Parameter(torch.zeros(n_heads, 2 * max_distance + 1))  # [heads, 2D+1]

    def forward(self, q_len: int, k_len: int, q_offset: int = 0) -> torch.Tensor:
        # q_offset: with a key/value cache the queries are the last positions, not the first.
        return relative_position_bias(self.table, q_len, k_len, q_offset)  # [heads, L_q, L_k]
