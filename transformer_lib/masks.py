"""Attention masks: causal ("no peeking at the future"), padding, and their combination
for the decoder (Vaswani et al., 2017, sections 3.2.3 and 3.1).

One convention everywhere in the course, the same as the boolean mask of
`torch.nn.functional.scaled_dot_product_attention`: True means "this query may
attend to this key", False means "hide this key". Masks broadcast to [..., L_q, L_k].

Which mask goes where:
  encoder self-attention      padding_mask(src)           [batch, 1, 1, src_len]
  decoder self-attention      decoder_self_mask(tgt)      [batch, 1, tgt_len, tgt_len]
  encoder-decoder attention   padding_mask(src)           [batch, 1, 1, src_len]
"""

import operator

import torch


def causal_mask(size: int, device=None) -> torch.Tensor:
    """Lower-triangular mask: position i may attend to positions 0..i, never the future.

    Returns a bool tensor of shape [size, size].
    """
    # operator.index accepts any true integer (int, numpy int, 0-d integer tensor) and
    # refuses floats; bool is an int in Python, but causal_mask(True) is surely a mistake.
    try:
        n = None if isinstance(size, bool) else operator.index(size)
    except TypeError:
        n = None
    if n is None or n < 1:
        raise ValueError(f"causal_mask needs a positive integer size, got {size!r}")
    size = n
    return torch.ones(size, size, dtype=torch.bool, device=device).tril()  # [L, L]


def padding_mask(tokens: torch.Tensor, pad_id: int) -> torch.Tensor:
    """Hide padding keys. tokens: [batch, seq] integer ids.

    Returns a bool tensor of shape [batch, 1, 1, seq]: it broadcasts over heads and
    over queries, so every query of sequence b sees exactly the real tokens of b.
    For one head's scores [batch, L_q, L_k] the same mask is `padding_mask(...)[:, 0]`,
    [batch, 1, seq] (MultiHeadAttention accepts either). What matters is the 1 on the
    query axis: [batch, seq, 1] would hide queries, and a bare [batch, seq] would line
    the batch up with the queries.
    Padded *queries* are not hidden: their outputs are ignored by the loss instead,
    and hiding them would leave rows with nothing to attend to.
    """
    if not isinstance(tokens, torch.Tensor):
        raise TypeError(
            f"padding_mask expects a torch.Tensor of token ids [batch, seq], got {type(tokens).__name__}"
        )
    if tokens.dim() != 2:
        raise ValueError(
            f"padding_mask expects token ids of shape [batch, seq], got shape {list(tokens.shape)}"
        )
    if tokens.is_floating_point():
        raise TypeError(f"padding_mask expects integer token ids, got dtype {tokens.dtype}")
    try:
        pad = None if isinstance(pad_id, bool) else operator.index(pad_id)
    except TypeError:
        pad = None
    if pad is None:
        raise TypeError(f"padding_mask needs the padding token's integer id as pad_id, got {pad_id!r}")
    pad_id = pad
    return (tokens != pad_id)[:, None, None, :]  # [batch, 1, 1, seq]


def combine_masks(*masks: torch.Tensor | None) -> torch.Tensor | None:
    """A key is visible only if every mask allows it (logical AND, with broadcasting)."""
    present = [m for m in masks if m is not None]
    if not present:
        return None
    for i, m in enumerate(masks):
        if m is None:
            continue
        if not isinstance(m, torch.Tensor) or m.dtype != torch.bool:
            got = m.dtype if isinstance(m, torch.Tensor) else type(m).__name__
            raise TypeError(f"combine_masks needs boolean masks (True = may attend); mask {i} is {got}")
    try:
        torch.broadcast_shapes(*(m.shape for m in present))
    except RuntimeError:
        raise ValueError(
            "masks to combine must broadcast together; got shapes "
            + ", ".join(str(list(m.shape)) for m in present)
        ) from None
    combined = present[0]
    for m in present[1:]:
        combined = combined & m
    return combined


def decoder_self_mask(tgt_tokens: torch.Tensor, pad_id: int) -> torch.Tensor:
    """The mask of the decoder's self-attention: causal AND padding.

    tgt_tokens: [batch, tgt_len] integer ids. Returns a bool tensor [batch, 1, tgt_len, tgt_len]:
    query i of sequence b may attend to key j iff j <= i and token j of b is not padding.
    With right padding every row keeps key 0, so no query is left with nothing to attend to.
    """
    pad = padding_mask(tgt_tokens, pad_id)  # [batch, 1, 1, L]; also validates tgt_tokens
    causal = causal_mask(tgt_tokens.shape[-1], device=tgt_tokens.device)  # [L, L]
    return combine_masks(causal, pad)  # [batch, 1, L, L]
