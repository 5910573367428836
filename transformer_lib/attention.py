"""Scaled dot-product attention, as in "Attention Is All You Need" (Vaswani et al., 2017), eq. 1:

    Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V

Masks follow the course convention (see masks.py): boolean, True = may attend,
broadcastable to [..., L_q, L_k].
"""

import math

import torch
import torch.nn.functional as F


def _check_attention_inputs(q, k, v, mask):
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"attention input {name} must be a torch.Tensor, got {type(t).__name__}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(
            f"q, k and v must share one dtype, got q {q.dtype}, k {k.dtype}, v {v.dtype}"
        )
    if q.dim() < 2 or k.dim() < 2 or v.dim() < 2:
        raise ValueError(
            "attention inputs need at least 2 dims [..., seq, features]; got q "
            f"{list(q.shape)}, k {list(k.shape)}, v {list(v.shape)}"
        )
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"queries and keys must have the same feature size d_k to be compared: "
            f"q has {q.shape[-1]} (shape {list(q.shape)}), k has {k.shape[-1]} (shape {list(k.shape)})"
        )
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(
            f"every key needs exactly one value: k has {k.shape[-2]} positions "
            f"(shape {list(k.shape)}), v has {v.shape[-2]} (shape {list(v.shape)})"
        )
    try:
        batch_shape = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    except RuntimeError:
        raise ValueError(
            f"the leading (batch, head) dims of q, k and v must broadcast together: got q "
            f"{list(q.shape[:-2])}, k {list(k.shape[:-2])}, v {list(v.shape[:-2])}"
        ) from None
    if mask is not None:
        if not isinstance(mask, torch.Tensor):
            raise TypeError(
                f"mask must be a boolean torch.Tensor (True = may attend), got {type(mask).__name__}"
            )
        if mask.dtype != torch.bool:
            raise TypeError(
                f"mask must be boolean (True = may attend), got dtype {mask.dtype}"
            )
        scores_shape = torch.Size([*batch_shape, q.shape[-2], k.shape[-2]])
        try:
            torch.broadcast_shapes(mask.shape, scores_shape)
        except RuntimeError:
            raise ValueError(
                f"mask of shape {list(mask.shape)} does not broadcast to the attention scores "
                f"[..., L_q, L_k] = {list(scores_shape)}"
            ) from None


def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Numerically stable softmax: exp(x - max) / sum(exp(x - max)).

    Subtracting the maximum changes nothing mathematically (it cancels in the ratio)
    but keeps exp() from overflowing to inf for large scores.
    """
    shifted = x - x.amax(dim=dim, keepdim=True)
    exp = shifted.exp()
    return exp / exp.sum(dim=dim, keepdim=True)


def attention_scores(q: torch.Tensor, k: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    """Similarity of every query with every key: q k^T / sqrt(d_k).

    q: [..., L_q, d_k], k: [..., L_k, d_k] -> scores [..., L_q, L_k].
    """
    if scale is None:
        # Dividing by sqrt(d_k) keeps the scores' variance at 1 whatever d_k is; without
        # it a large d_k pushes softmax into saturation, where its gradients vanish.
        scale = 1.0 / math.sqrt(q.shape[-1])
    # Scale q before the product, not the product afterwards: same numbers, but in
    # float16 the unscaled q k^T can overflow to inf (max 65504) and turn softmax into NaN.
    # (.to keeps integer toy inputs working: q * scale is already floating point.)
    q = q * scale
    return q @ k.transpose(-2, -1).to(q.dtype)  # [..., L_q, L_k]


def scaled_dot_product_attention(q, k, v, mask=None, dropout_p=0.0, scale=None):
    """Attend from queries q to keys k, and mix the values v.

    q: [..., L_q, d_k]   k: [..., L_k, d_k]   v: [..., L_k, d_v]
    mask: bool, broadcastable to [..., L_q, L_k]; True = may attend.
    scale: multiplies q k^T; default 1/sqrt(d_k) (scale=1.0 gives plain dot-product attention).
    Returns (output [..., L_q, d_v], weights [..., L_q, L_k]).
    """
    _check_attention_inputs(q, k, v, mask)
    scores = attention_scores(q, k, scale)  # [..., L_q, L_k]
    if mask is not None:
        # Mask *before* softmax, so hidden keys get exactly zero weight and the
        # visible weights still sum to one. The dtype's most negative finite value,
        # not -inf, so that float16 stays finite.
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    weights = softmax(scores, dim=-1)  # [..., L_q, L_k]
    if mask is not None:
        # A query that may see no key at all gets zero weights (and a zero output)
        # instead of a uniform average over keys it must not see.
        weights = weights.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)
    if dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p)
    output = weights @ v  # [..., L_q, d_v]
    return output, weights


def project_qkv(x, w_q, w_k, w_v):
    """Each token's query ("what am I looking for"), key ("what do I offer") and value
    ("what I pass on"): three learned linear maps of the same embedding.

    x: [..., seq, d_model]; w_q, w_k: [d_model, d_k]; w_v: [d_model, d_v].
    Returns q [..., seq, d_k], k [..., seq, d_k], v [..., seq, d_v].
    """
    for name, w in (("w_q", w_q), ("w_k", w_k), ("w_v", w_v)):
        if w.dim() != 2:
            raise ValueError(
                f"projection matrix {name} must be 2-D [d_model, d_out], got shape {list(w.shape)}"
            )
    if x.shape[-1] != w_q.shape[0] or x.shape[-1] != w_k.shape[0] or x.shape[-1] != w_v.shape[0]:
        raise ValueError(
            f"projection matrices must have d_model = {x.shape[-1]} rows to multiply x of shape "
            f"{list(x.shape)}; got w_q {list(w_q.shape)}, w_k {list(w_k.shape)}, w_v {list(w_v.shape)}"
        )
    if w_q.shape[1] != w_k.shape[1]:
        raise ValueError(
            f"w_q and w_k must have the same number of columns d_k, so that queries and keys "
            f"can be compared; got w_q {list(w_q.shape)}, w_k {list(w_k.shape)}"
        )
    return x @ w_q, x @ w_k, x @ w_v


def self_attention(x, w_q, w_k, w_v, mask=None):
    """Single-head self-attention in matrix form: every position of x attends to every other.

    x: [..., seq, d_model]; w_q, w_k: [d_model, d_k]; w_v: [d_model, d_v].
    Returns (output [..., seq, d_v], weights [..., seq, seq]).
    """
    q, k, v = project_qkv(x, w_q, w_k, w_v)  # [..., seq, d_k], [..., seq, d_k], [..., seq, d_v]
    return scaled_dot_product_attention(q, k, v, mask=mask)
