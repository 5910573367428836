"""Positions: attention alone is permutation-equivariant, so order must be added to the input.

Three ways, as in the course's chapter 04: the fixed sinusoidal encoding of "Attention Is
All You Need" (section 3.5), a learned table of absolute positions (BERT, GPT, ViT), and a
learned bias on the attention scores that depends only on the offset between two positions
(relative positions, in the spirit of Shaw et al., 2018 and T5's bias).
"""

import math

import torch
import torch.nn as nn


def sinusoidal_encoding(max_len: int, d_model: int) -> torch.Tensor:
    """PE[pos, 2i] = sin(pos / 10000^(2i/d_model)), PE[pos, 2i+1] = cos(pos / 10000^(2i/d_model)).

    Returns [max_len, d_model]. Each pair of dims is a rotation at its own frequency, so
    PE[pos + k] is a fixed linear map (a rotation by k * frequency) of PE[pos], for every pos.
    """
    if max_len < 1 or d_model < 2 or d_model % 2:
        raise ValueError(f"sinusoidal_encoding needs max_len >= 1 and an even d_model >= 2, got {max_len}, {d_model}")
    position = torch.arange(max_len, dtype=torch.float64)[:, None]  # [max_len, 1]
    frequency = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float64) * (-math.log(10000.0) / d_model))  # [d/2]
    angle = position * frequency  # [max_len, d_model/2]
    pe = torch.empty(max_len, d_model, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(angle)  # even dims
    pe[:, 1::2] = torch.cos(angle)  # odd dims
    return pe.float()


def _check_length(seq_len: int, offset: int, max_len: int) -> None:
    if offset + seq_len > max_len:
        raise ValueError(
            f"sequence of length {seq_len} (starting at position {offset}) is longer than the "
            f"positional table (max_len={max_len}); build the model with a larger max_len"
        )


class SinusoidalPositionalEncoding(nn.Module):
    """Adds the fixed sinusoidal encoding to token embeddings [batch, seq, d_model], then dropout."""

    def __init__(self, d_model: int, max_len: int = 5000, dropout: float = 0.0):
        super().__init__()
        self.max_len = max_len
        self.dropout = nn.Dropout(dropout)
        # A buffer, not a parameter: it moves with .to(device) but is never trained.
        self.register_buffer("pe", sinusoidal_encoding(max_len, d_model), persistent=False)

    def forward(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        _check_length(x.shape[1], offset, self.max_len)
        return self.dropout(x + self.pe[offset : offset + x.shape[1]].to(x.dtype))  # [batch, seq, d_model]


class LearnedPositionalEmbedding(nn.Module):
    """Adds a trained vector per absolute position (BERT, GPT-2, ViT); cannot extrapolate past max_len."""

    def __init__(self, d_model: int, max_len: int = 512, dropout: float = 0.0):
        super().__init__()
        self.max_len = max_len
        self.embedding = nn.Embedding(max_len, d_model)
        nn.init.normal_(self.embedding.weight, std=0.02)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        _check_length(x.shape[1], offset, self.max_len)
        positions = torch.arange(offset, offset + x.shape[1], device=x.device)  # [seq]
        return self.dropout(x + self.embedding(positions))  # [batch, seq, d_model]


def relative_offsets(q_len: int, k_len: int, max_distance: int, device=None) -> torch.Tensor:
    """offset[i, j] = clip(j - i, -max_distance, max_distance) + max_distance, an index into a table."""
    q_pos = torch.arange(q_len, device=device)[:, None]  # [L_q, 1]
    k_pos = torch.arange(k_len, device=device)[None, :]  # [1, L_k]
    return (k_pos - q_pos).clamp(-max_distance, max_distance) + max_distance  # [L_q, L_k]


class RelativePositionBias(nn.Module):
    """A learned scalar per head and per (clipped) offset j - i, added to the attention scores.

    Positions further apart than max_distance share one bias: beyond some range, "far to the
    left" is all a model needs to know. forward(L_q, L_k) returns [heads, L_q, L_k], which
    MultiHeadAttention takes as `bias=`.
    """

    def __init__(self, n_heads: int, max_distance: int = 16):
        super().__init__()
        self.max_distance = max_distance
        self.table = nn.Parameter(torch.zeros(n_heads, 2 * max_distance + 1))  # [heads, 2D+1]

    def forward(self, q_len: int, k_len: int, q_offset: int = 0) -> torch.Tensor:
        # q_offset: with a key/value cache the queries start later than the keys.
        index = relative_offsets(q_len + q_offset, k_len, self.max_distance, self.table.device)[q_offset:]
        return self.table[:, index]  # [heads, L_q, L_k]
