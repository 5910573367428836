"""Attention masks.

One convention everywhere in the course, the same as the boolean mask of
`torch.nn.functional.scaled_dot_product_attention`: True means "this query may
attend to this key", False means "hide this key". Masks broadcast to [..., L_q, L_k].
"""

import torch


def causal_mask(size: int, device=None) -> torch.Tensor:
    """Lower-triangular mask: position i may attend to positions 0..i, never the future.

    Returns a bool tensor of shape [size, size].
    """
    if not isinstance(size, int) or size < 1:
        raise ValueError(f"causal_mask needs a positive integer size, got {size!r}")
    return torch.ones(size, size, dtype=torch.bool, device=device).tril()  # [L, L]


def padding_mask(tokens: torch.Tensor, pad_id: int) -> torch.Tensor:
    """Hide padding keys. tokens: [batch, seq] integer ids.

    Returns a bool tensor of shape [batch, 1, 1, seq]: it broadcasts over heads and
    over queries, so every query of sequence b sees exactly the real tokens of b.
    Padded *queries* are not hidden: their outputs are ignored by the loss instead,
    and hiding them would leave rows with nothing to attend to.
    """
    if tokens.dim() != 2:
        raise ValueError(
            f"padding_mask expects token ids of shape [batch, seq], got shape {list(tokens.shape)}"
        )
    if tokens.is_floating_point():
        raise TypeError(f"padding_mask expects integer token ids, got dtype {tokens.dtype}")
    return (tokens != pad_id)[:, None, None, :]  # [batch, 1, 1, seq]


def combine_masks(*masks: torch.Tensor | None) -> torch.Tensor | None:
    """A key is visible only if every mask allows it (logical AND, with broadcasting)."""
    present = [m for m in masks if m is not None]
    if not present:
        return None
    combined = present[0]
    for m in present[1:]:
        combined = combined & m
    return combined
