"""Scaled dot-product attention, as in "Attention Is All You Need" (Vaswani et al., 2017), eq. 1:

    Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V

Masks follow the course convention (see masks.py): boolean, True = may attend,
broadcastable to [..., L_q, L_k].
"""

import math
import operator
from dataclasses import dataclass

import torch
import torch.nn as nn
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


def masked_softmax(scores: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Softmax over the keys (last dim) in which hidden keys get exactly zero weight.

    scores: [..., L_q, L_k] float; mask: bool broadcastable to it, True = may attend.
    Each row with a visible key sums to one; a row with no visible key is all zeros.
    """
    if not isinstance(scores, torch.Tensor) or not scores.is_floating_point():
        got = scores.dtype if isinstance(scores, torch.Tensor) else type(scores).__name__
        raise TypeError(f"masked_softmax needs floating-point scores, got {got}")
    if mask is None:
        return softmax(scores, dim=-1)
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        got = mask.dtype if isinstance(mask, torch.Tensor) else type(mask).__name__
        raise TypeError(f"mask must be a boolean torch.Tensor (True = may attend), got {got}")
    try:
        torch.broadcast_shapes(mask.shape, scores.shape)
    except RuntimeError:
        raise ValueError(
            f"mask of shape {list(mask.shape)} does not broadcast to the scores {list(scores.shape)}"
        ) from None
    # Mask *before* softmax, so hidden keys get exactly zero weight and the visible
    # weights still sum to one (zeroing after softmax leaves rows that sum to less).
    # The dtype's most negative finite value, not -inf: a row of -inf turns into
    # -inf - (-inf) = NaN inside softmax, and -1e9 is itself -inf in float16.
    scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)  # [..., L_q, L_k]
    weights = softmax(scores, dim=-1)  # [..., L_q, L_k]
    # A query that may see no key at all would get a uniform average over keys it must
    # not see; it gets zero weights (and so a zero output) instead.
    return weights.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)


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


def scaled_dot_product_attention(q, k, v, mask=None, dropout_p=0.0, scale=None, bias=None):
    """Attend from queries q to keys k, and mix the values v.

    q: [..., L_q, d_k]   k: [..., L_k, d_k]   v: [..., L_k, d_v]
    mask: bool, broadcastable to [..., L_q, L_k]; True = may attend.
    scale: multiplies q k^T; default 1/sqrt(d_k) (scale=1.0 gives plain dot-product attention).
    bias: float, broadcastable to [..., L_q, L_k], added to the scores (relative positions, ch. 04).
    Returns (output [..., L_q, d_v], weights [..., L_q, L_k]).
    """
    _check_attention_inputs(q, k, v, mask)
    scores = attention_scores(q, k, scale)  # [..., L_q, L_k]
    if bias is not None:
        scores = scores + bias
    weights = masked_softmax(scores, mask)  # [..., L_q, L_k]
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


def real_tokens(lengths: torch.Tensor, seq: int) -> torch.Tensor:
    """Which positions of a padded batch hold real tokens: [batch, seq] bool, True = real.

    lengths: int [batch], sentence b's tokens are positions 0 .. lengths[b] - 1, the rest of its
    row is padding.
    """
    if not isinstance(lengths, torch.Tensor) or lengths.dim() != 1 or lengths.is_floating_point() \
            or lengths.dtype == torch.bool:
        got = f"shape {list(lengths.shape)}, dtype {lengths.dtype}" if isinstance(lengths, torch.Tensor) \
            else type(lengths).__name__
        raise TypeError(f"lengths must be an integer tensor [batch], one length per sentence; got {got}")
    if len(lengths) and (lengths.min() < 0 or lengths.max() > seq):
        raise ValueError(f"every length must lie in 0 .. {seq} (the padded sequence length); got {lengths.tolist()}")
    return torch.arange(seq, device=lengths.device) < lengths[:, None]  # [batch, seq]


class SelfAttention(nn.Module):
    """Single-head self-attention with learned projections, for a batch of padded sentences.

    W^Q, W^K and W^V are `nn.Linear` layers without bias named w_q, w_k, w_v. `nn.Linear` stores its
    weight as [out, in] and computes x @ weight.T, so the chapter's W^Q is `w_q.weight.T`.

    forward(x, lengths=None): x [batch, seq, d_model]; lengths None (no padding) or int [batch], the
    number of real tokens at the start of each sentence. Padding is hidden as a *key* (no query
    attends to it); a padding position still has a query, which attends over the real tokens.
    Returns (output [batch, seq, d_v], weights [batch, seq, seq]).
    """

    def __init__(self, d_model: int, d_k: int, d_v: int | None = None):
        super().__init__()
        d_v = d_k if d_v is None else d_v
        self.d_k = d_k
        self.w_q = nn.Linear(d_model, d_k, bias=False)
        self.w_k = nn.Linear(d_model, d_k, bias=False)
        self.w_v = nn.Linear(d_model, d_v, bias=False)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor | None = None):
        if not isinstance(x, torch.Tensor) or x.dim() != 3:
            got = list(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"SelfAttention expects x of shape [batch, seq, d_model], got {got}")
        mask = None
        if lengths is not None:
            if len(lengths) != x.shape[0]:
                raise ValueError(f"lengths has {len(lengths)} entries for a batch of {x.shape[0]} sentences")
            # [batch, 1, seq]: one row of visible keys, shared by every query of the sentence
            mask = real_tokens(lengths, x.shape[1])[:, None, :]
        # One algorithm in the library: the matrix form, with W = weight.T.
        return self_attention(x, self.w_q.weight.T, self.w_k.weight.T, self.w_v.weight.T, mask=mask)


def split_heads(x: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Cut the features of every position into n_heads blocks of d_k = d_model / n_heads,
    and move the heads in front of the positions: [batch, seq, d_model] -> [batch, heads, seq, d_k].

    Head i owns the contiguous features i*d_k ... (i+1)*d_k - 1 of each position.
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"split_heads expects a torch.Tensor [batch, seq, d_model], got {type(x).__name__}")
    if x.dim() != 3:
        raise ValueError(f"split_heads expects [batch, seq, d_model], got shape {list(x.shape)}")
    batch, seq, d_model = x.shape
    try:
        h = None if isinstance(n_heads, bool) else operator.index(n_heads)
    except TypeError:
        h = None
    if h is None or h < 1 or d_model % h != 0:
        raise ValueError(
            f"d_model ({d_model}) must be divisible by n_heads ({n_heads!r}): each head gets "
            f"d_model / n_heads features"
        )
    # [batch, seq, heads, d_k] first (cuts the feature axis only), then the transpose puts
    # heads before positions so that each head attends on its own. Viewing straight to
    # [batch, heads, seq, d_k] would cut across positions instead.
    return x.reshape(batch, seq, h, d_model // h).transpose(1, 2)  # [batch, heads, seq, d_k]


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """The inverse of split_heads: concatenate the heads' outputs of every position,
    [batch, heads, seq, d_k] -> [batch, seq, heads * d_k]."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"merge_heads expects a torch.Tensor [batch, heads, seq, d_k], got {type(x).__name__}")
    if x.dim() != 4:
        raise ValueError(f"merge_heads expects [batch, heads, seq, d_k], got shape {list(x.shape)}")
    batch, heads, seq, d_k = x.shape
    # After the transpose the memory is no longer laid out row by row, so view() would
    # fail: reshape copies when it has to.
    return x.transpose(1, 2).reshape(batch, seq, heads * d_k)  # [batch, seq, d_model]


def _mask_for_heads(mask):
    """A [batch, L_q, L_k] mask (or [batch, 1, L_k]) becomes [batch, 1, L_q, L_k]: the same
    mask for every head. 2-D masks [L_q, L_k] and 4-D masks already broadcast correctly."""
    if isinstance(mask, torch.Tensor) and mask.dim() == 3:
        return mask.unsqueeze(1)  # [batch, 1, L_q, L_k]
    return mask


def multi_head_attention_forward(query, key, value, w_q, w_k, w_v, w_o, n_heads, mask=None):
    """Multi-head attention with plain weight matrices (no biases), eq. of section 3.2.2:

        MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O,
        head_i = Attention(Q W^Q_i, K W^K_i, V W^V_i)

    where W^Q_i is the i-th block of d_k columns of w_q (and likewise for K and V).

    query: [batch, L_q, d_model]; key, value: [batch, L_k, d_model].
    w_q, w_k, w_v: [d_model, d_model], w_o: [d_model, d_model], applied as x @ w.
    mask: bool, True = may attend; [L_q, L_k], [batch, L_q, L_k], [batch, 1, L_k], or 4-D per head.
    Returns (output [batch, L_q, d_model], weights [batch, heads, L_q, L_k]).
    """
    q = split_heads(query @ w_q, n_heads)  # [batch, heads, L_q, d_k]
    k = split_heads(key @ w_k, n_heads)  # [batch, heads, L_k, d_k]
    v = split_heads(value @ w_v, n_heads)  # [batch, heads, L_k, d_v]
    out, weights = scaled_dot_product_attention(q, k, v, mask=_mask_for_heads(mask))  # [batch, heads, L_q, d_v]
    return merge_heads(out) @ w_o, weights  # [batch, L_q, d_model], [batch, heads, L_q, L_k]


def attention_entropy(weights: torch.Tensor) -> torch.Tensor:
    """How spread out each query's attention is: H = -sum_j a_j log a_j over the keys, in nats.

    weights: [..., L_q, L_k], each row >= 0 and summing to one (or all zeros, for a query
    that may see no key). Returns [..., L_q]: 0 for a query that puts all its weight on one
    key, log(n) for one that spreads it evenly over n keys. Analyses of trained heads
    (Voita et al., 2019; Clark et al., 2019) use such measures to tell sharp heads from broad ones.
    """
    if not isinstance(weights, torch.Tensor) or not weights.is_floating_point():
        got = weights.dtype if isinstance(weights, torch.Tensor) else type(weights).__name__
        raise TypeError(f"attention_entropy needs floating-point weights [..., L_q, L_k], got {got}")
    if weights.dim() < 1:
        raise ValueError("attention_entropy needs weights with a keys dimension [..., L_k], got a scalar")
    # entr(a) = -a log a, with its limit 0 at a = 0: a masked key (weight exactly 0) adds
    # nothing, where -a * a.log() would give 0 * -inf = NaN.
    return torch.special.entr(weights).sum(dim=-1)  # [..., L_q]


@dataclass
class KVCache:
    """Keys and values one attention layer has already computed, kept across decoding steps.

    Self-attention in a decoder appends the new token's key and value at every step
    (`static=False`); cross-attention computes them once from the encoder memory and
    reuses them (`static=True`). Tensors are [batch, heads, seq, d_k].
    """

    k: torch.Tensor | None = None
    v: torch.Tensor | None = None
    static: bool = False

    @property
    def length(self) -> int:
        return 0 if self.k is None else self.k.shape[-2]


class MultiHeadAttention(nn.Module):
    """Multi-head attention (Vaswani et al., 2017, section 3.2.2).

    h heads, each attending in its own d_k = d_model / h dimensional subspace; their outputs
    are concatenated and mixed by W^O. Same parameter count as one full-width head plus W^O.

    forward(query, key, value, mask=None) takes [batch, seq, d_model] tensors and returns
    [batch, L_q, d_model]. With need_weights=True it takes the readable path and keeps the
    attention weights [batch, heads, L_q, L_k] in `self.last_weights`; otherwise it calls
    PyTorch's fused scaled_dot_product_attention (same result, faster).
    """

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0, bias: bool = True):
        super().__init__()
        if n_heads < 1 or d_model % n_heads != 0:
            raise ValueError(
                f"d_model ({d_model}) must be divisible by n_heads ({n_heads}): each head gets "
                f"d_model / n_heads features"
            )
        self.d_model, self.n_heads, self.d_k = d_model, n_heads, d_model // n_heads
        self.dropout = dropout
        self.w_q = nn.Linear(d_model, d_model, bias=bias)
        self.w_k = nn.Linear(d_model, d_model, bias=bias)
        self.w_v = nn.Linear(d_model, d_model, bias=bias)
        self.w_o = nn.Linear(d_model, d_model, bias=bias)
        self.last_weights: torch.Tensor | None = None

    def split_heads(self, x: torch.Tensor) -> torch.Tensor:
        return split_heads(x, self.n_heads)  # [batch, heads, seq, d_k]

    def merge_heads(self, x: torch.Tensor) -> torch.Tensor:
        return merge_heads(x)  # [batch, seq, d_model]

    def _check(self, query, key, value):
        for name, t in (("query", query), ("key", key), ("value", value)):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{name} must be a torch.Tensor [batch, seq, d_model], got {type(t).__name__}")
            if t.dim() != 3 or t.shape[-1] != self.d_model:
                raise ValueError(
                    f"{name} must be [batch, seq, d_model={self.d_model}], got shape {list(t.shape)}"
                )
        if key.shape[:2] != value.shape[:2]:
            raise ValueError(f"key and value must have the same [batch, seq]: got {list(key.shape)} and {list(value.shape)}")
        if query.shape[0] != key.shape[0]:
            # Would otherwise broadcast silently when one of them has batch 1.
            raise ValueError(
                f"query and key must have the same batch size: got query {list(query.shape)}, key {list(key.shape)}"
            )

    def forward(self, query, key, value, mask=None, bias=None, need_weights=False, cache: KVCache | None = None):
        self._check(query, key, value)
        q = self.split_heads(self.w_q(query))  # [batch, heads, L_q, d_k]
        if cache is not None and cache.static and cache.k is not None:
            k, v = cache.k, cache.v  # the encoder memory's keys and values, computed once
        else:
            k = self.split_heads(self.w_k(key))  # [batch, heads, L_new, d_k]
            v = self.split_heads(self.w_v(value))  # [batch, heads, L_new, d_k]
            if cache is not None:
                if cache.k is not None:
                    k = torch.cat([cache.k, k], dim=2)  # [batch, heads, L_past + L_new, d_k]
                    v = torch.cat([cache.v, v], dim=2)
                cache.k, cache.v = k, v
        mask = _mask_for_heads(mask)  # [batch, 1, L_q, L_k]: the same mask for every head
        dropout_p = self.dropout if self.training else 0.0
        if need_weights:
            out, weights = scaled_dot_product_attention(q, k, v, mask=mask, dropout_p=dropout_p, bias=bias)
            self.last_weights = weights.detach()
        else:
            _check_attention_inputs(q, k, v, mask)
            attn_mask = mask
            if bias is not None:
                attn_mask = bias if mask is None else bias.masked_fill(~mask, float("-inf"))
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p)
        return self.w_o(self.merge_heads(out))  # [batch, L_q, d_model]
