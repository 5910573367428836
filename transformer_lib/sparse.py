"""Attention for long sequences: sparse masks, banded attention, linear attention, and the
online softmax that FlashAttention is built on.

Dense attention scores every query against every key: n^2 numbers for n tokens, so doubling
the length quadruples the time and the memory of the scores. The remedies here:

* **Sparse patterns** (Prince, *Understanding Deep Learning*, 2023, section 12.9), each a
  boolean mask, True = may attend, as everywhere in the course: a sliding window (the local
  heads of Child et al., 2019, "Generating Long Sequences with Sparse Transformers"; Beltagy
  et al., 2020, "Longformer"), a dilated window (Longformer), selected positions that attend
  globally (Longformer's global attention), and extra global tokens that belong to no word
  (Zaheer et al., 2020, "Big Bird"). `receptive_field` says which positions can reach which
  after several layers of one pattern.
* `banded_attention`: the sliding window computed in O(n w) time and memory, never the
  n x n matrix. Queries are cut into blocks; each block is scored only against the keys its
  band can reach (the "sliding chunks" of the Longformer implementation).
* `linear_attention`: softmax(q . k) replaced by a kernel phi(q) . phi(k), phi = elu + 1
  (Katharopoulos et al., 2020, "Transformers are RNNs"), so that (phi(Q) phi(K)^T) V can be
  computed as phi(Q) (phi(K)^T V) in O(n d^2). The causal form is a prefix sum
  (`causal_linear_attention`), or the same sums carried as one running state, an RNN
  (`recurrent_linear_attention`).
* `online_softmax_attention`: exact attention with the keys taken block by block, keeping a
  running maximum and a running sum and rescaling what was accumulated when the maximum grows
  (Milakov & Gimelshein, 2018, "Online normalizer calculation for softmax"). FlashAttention
  (Dao et al., 2022) runs this loop inside on-chip memory: it saves memory traffic, not
  arithmetic.
"""

from __future__ import annotations

import contextlib
import math
import operator
import os
import sys

import torch
import torch.nn.functional as F

from .attention import _check_attention_inputs, attention_scores, masked_softmax

# banded_attention scores this many query-key pairs at a time (a few MiB of float32).
_CHUNK_SCORES = 2**20

# -- arguments --------------------------------------------------------------------------------


def _integer(value, what: str, minimum: int) -> int:
    """A true integer >= minimum (a numpy or 0-d tensor integer is fine; bool and float are not)."""
    try:
        n = None if isinstance(value, bool) else operator.index(value)
    except TypeError:
        n = None
    if n is None or n < minimum:
        raise ValueError(f"{what} must be an integer >= {minimum}, got {value!r}")
    return n


def _check_window(window) -> int:
    return _integer(window, "window (the number of neighbours on each side a query may see)", 0)


def _offsets(size: int, device=None) -> torch.Tensor:
    """[size, size] integer matrix of j - i: how far key j lies after query i (negative: before)."""
    pos = torch.arange(size, device=device)
    return pos[None, :] - pos[:, None]  # [L_q, L_k]


def _check_square_mask(mask, what: str = "mask") -> torch.Tensor:
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        got = mask.dtype if isinstance(mask, torch.Tensor) else type(mask).__name__
        raise TypeError(f"{what} must be a boolean torch.Tensor (True = may attend), got {got}")
    if mask.dim() < 2 or mask.shape[-1] != mask.shape[-2]:
        raise ValueError(f"{what} must be square in its last two dims [..., n, n], got shape {list(mask.shape)}")
    return mask


# -- sparse patterns as masks -----------------------------------------------------------------


def sliding_window_mask(size: int, window: int, causal: bool = False, device=None) -> torch.Tensor:
    """Each position may attend to its neighbours up to `window` steps away.

    Symmetric (an encoder): True where |i - j| <= window, a band of 2 * window + 1 keys.
    Causal (a decoder): True where 0 <= i - j <= window, the position and `window` before it.
    window = 0 leaves the diagonal only. Returns a bool tensor [size, size].
    """
    size = _integer(size, "size", 1)
    window = _check_window(window)
    offset = _offsets(size, device)  # [size, size]: j - i
    if causal:
        return (offset <= 0) & (offset >= -window)
    return offset.abs() <= window


def dilated_mask(size: int, window: int, dilation: int, causal: bool = False, device=None) -> torch.Tensor:
    """A sliding window with gaps: `window` keys on each side, `dilation` steps apart.

    True where i - j is a multiple of `dilation` and |i - j| <= window * dilation (causal: and
    j <= i). The gaps are counted from the query itself, so every position sees itself, and
    with the same number of keys as a plain window the reach is `dilation` times longer.
    dilation = 1 is the plain sliding window. Returns a bool tensor [size, size].
    """
    size = _integer(size, "size", 1)
    window = _check_window(window)
    dilation = _integer(dilation, "dilation", 1)
    offset = _offsets(size, device)  # [size, size]: j - i
    mask = (offset % dilation == 0) & (offset.abs() <= window * dilation)
    return mask & (offset <= 0) if causal else mask


def global_positions_mask(size: int, positions, causal: bool = False, device=None) -> torch.Tensor:
    """Selected positions that attend globally: they see every position, and every position
    sees them (their rows AND their columns are True). In a decoder (causal) "every position"
    becomes "every position up to the query".

    This is only the global part: OR it with a local pattern, e.g.
    `sliding_window_mask(n, w) | global_positions_mask(n, [0])`. Returns a bool tensor [size, size].
    """
    size = _integer(size, "size", 1)
    index = torch.as_tensor(positions, dtype=torch.long, device=device).flatten()
    if ((index < 0) | (index >= size)).any():
        raise ValueError(f"global positions must lie in 0 .. {size - 1}, got {index.tolist()}")
    is_global = torch.zeros(size, dtype=torch.bool, device=device)
    is_global[index] = True  # [size]
    # Rows: a global query sees all keys. Columns: every query sees a global key. Both are
    # needed: rows alone collect information that never flows back out.
    mask = is_global[:, None] | is_global[None, :]  # [size, size]
    if causal:
        mask = mask & torch.ones(size, size, dtype=torch.bool, device=device).tril()
    return mask


def global_token_mask(local_mask: torch.Tensor, n_global: int, causal: bool = False) -> torch.Tensor:
    """Put `n_global` extra tokens in front of the sequence that attend to everything and that
    everything attends to, the local pattern `local_mask` unchanged between the real tokens.

    local_mask: bool [..., n, n]. Returns a bool tensor [..., n_global + n, n_global + n]:
    positions 0 .. n_global - 1 are the global tokens (like [CLS], they stand for no word),
    positions n_global .. are the real tokens. With causal=True the result is cut to its lower
    triangle: the global tokens, placed first, then see only each other.
    """
    local_mask = _check_square_mask(local_mask, "local_mask")
    g = _integer(n_global, "n_global", 0)
    n = local_mask.shape[-1]
    mask = torch.ones(*local_mask.shape[:-2], g + n, g + n, dtype=torch.bool, device=local_mask.device)
    # Global rows and columns stay True; only the block between real tokens is local.
    mask[..., g:, g:] = local_mask  # [..., n, n]
    if causal:
        mask = mask & torch.ones(g + n, g + n, dtype=torch.bool, device=local_mask.device).tril()
    return mask


def receptive_field(mask: torch.Tensor, n_layers: int) -> torch.Tensor:
    """Which inputs can influence which outputs after `n_layers` layers that all use `mask`.

    mask: bool [..., n, n], True where query i may attend to key j (one layer: i reads j).
    Returns a bool tensor [..., n, n], True where input position j can reach output position i:
    the boolean matrix power mask^n_layers (n_layers = 0: each position reaches only itself).
    Layer l + 1 reads positions k of layer l, each of which already reached some j, so
    R_{l+1} = mask @ R_l with "or" for "+" and "and" for "*".

    A residual connection also carries each position's own state upward; the course's
    patterns all keep the diagonal, so for them it changes nothing.
    """
    mask = _check_square_mask(mask)
    n_layers = _integer(n_layers, "n_layers", 0)
    step = mask.float()  # [..., n, n]
    reach = torch.eye(mask.shape[-1], dtype=torch.bool, device=mask.device).expand_as(mask)
    for _ in range(n_layers):
        # The matrix product counts paths i <- k <- j; "> 0" keeps only whether one exists,
        # so the counts never grow (they would overflow for long stacks).
        reach = (step @ reach.float()) > 0  # [..., n, n]
    return reach


# -- banded attention: the sliding window in O(n w) ------------------------------------------


def banded_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int, causal: bool = False,
                     block: int | None = None) -> torch.Tensor:
    """Self-attention under `sliding_window_mask(n, window, causal)`, in O(n * window) time and memory.

    q, k: [..., n, d_k]; v: [..., n, d_v]. Returns the output [..., n, d_v], equal (to rounding)
    to `scaled_dot_product_attention(q, k, v, mask=sliding_window_mask(n, window, causal))[0]`.

    The queries are cut into blocks of `block` positions (default max(window, 16)). Query block
    c covers positions c*b .. c*b + b - 1; every key its band reaches lies in c*b - window ..
    c*b + b - 1 + window (causal: .. c*b + b - 1). So each block is scored against that span of
    b + 2 * window keys only: b (b + 2w) scores per block, n (b + 2w) in all instead of n^2,
    and never more than about a million of them held at once.
    """
    _check_attention_inputs(q, k, v, None)
    window = _check_window(window)
    n = q.shape[-2]
    if k.shape[-2] != n:
        raise ValueError(
            f"banded_attention is self-attention: queries and keys need the same length, got "
            f"q {list(q.shape)} and k {list(k.shape)}"
        )
    window = min(window, n - 1)  # a band wider than the sequence is the whole sequence
    b = max(window, 16) if block is None else _integer(block, "block", 1)
    left, right = window, (0 if causal else window)  # keys a query may see before / after itself
    n_blocks = math.ceil(n / b)
    n_pad = n_blocks * b  # the last block is filled up with padding queries, cut off at the end
    span = b + left + right  # keys one block of queries can reach

    q_blocks = F.pad(q, (0, 0, 0, n_pad - n)).unflatten(-2, (n_blocks, b))  # [..., n_blocks, b, d_k]
    # Pad the keys so that block c's span starts at padded index c*b (= position c*b - left),
    # then unfold: overlapping windows of `span` keys, `b` apart. unfold makes a view, no copy.
    k_pad = F.pad(k, (0, 0, left, n_pad - n + right))  # [..., n_pad + left + right, d_k]
    v_pad = F.pad(v, (0, 0, left, n_pad - n + right))  # [..., n_pad + left + right, d_v]
    k_blocks = k_pad.unfold(-2, span, b).transpose(-2, -1)  # [..., n_blocks, span, d_k]
    v_blocks = v_pad.unfold(-2, span, b).transpose(-2, -1)  # [..., n_blocks, span, d_v]

    # Which (query, key) pairs of a block lie in the band: the same for every block, since
    # query a sits at c*b + a and key s at c*b - left + s, an offset j - i = s - left - a.
    a = torch.arange(b, device=q.device)[:, None]
    s = torch.arange(span, device=q.device)[None, :]
    offset = s - left - a  # [b, span]
    in_band = (offset >= -window) & (offset <= right)  # [b, span]
    # The padding keys before position 0 and after position n - 1 are not keys at all.
    key_pos = torch.arange(n_blocks, device=q.device)[:, None] * b - left + s  # [n_blocks, span]
    real = (key_pos >= 0) & (key_pos < n)  # [n_blocks, span]
    visible = in_band & real[:, None, :]  # [n_blocks, b, span]

    batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    out = q.new_empty(*batch, n_blocks, b, v.shape[-1])  # [..., n_blocks, b, d_v]
    # A few blocks at a time, about _CHUNK_SCORES scores: the same arithmetic, but the
    # scores of one chunk stay in the processor's cache, so the time per block does not
    # grow with n (one pass over all n/b blocks at once spills to main memory at large n).
    per_chunk = max(1, _CHUNK_SCORES // (b * span))
    for c0 in range(0, n_blocks, per_chunk):
        c1 = min(c0 + per_chunk, n_blocks)
        scores = attention_scores(q_blocks[..., c0:c1, :, :], k_blocks[..., c0:c1, :, :])  # [..., c, b, span]
        weights = masked_softmax(scores, visible[c0:c1])  # [..., c, b, span]
        out[..., c0:c1, :, :] = weights @ v_blocks[..., c0:c1, :, :]  # [..., c, b, d_v]
    return out.flatten(-3, -2)[..., :n, :]  # [..., n, d_v]


# -- linear attention --------------------------------------------------------------------------


def elu_feature_map(x: torch.Tensor) -> torch.Tensor:
    """phi(x) = elu(x) + 1 (Katharopoulos et al., 2020): positive everywhere, so phi(q) . phi(k)
    is a positive similarity and the normaliser below is never 0."""
    return F.elu(x) + 1.0


def linear_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False) -> torch.Tensor:
    """Attention with the similarity phi(q_i) . phi(k_j) instead of exp(q_i . k_j / sqrt(d)):

        out_i = phi(q_i)^T S / phi(q_i)^T z,   S = sum_j phi(k_j) v_j^T  [d_k, d_v],  z = sum_j phi(k_j)  [d_k]

    S and z do not depend on i, so they are computed once: O(n d_k d_v) instead of O(n^2 d).
    causal=True sums over j <= i only (`causal_linear_attention`).

    q, k: [..., L, d_k]; v: [..., L, d_v]. Returns [..., L_q, d_v]. There is no 1/sqrt(d_k):
    the feature map, not a softmax temperature, shapes the weights.
    """
    if causal:
        return causal_linear_attention(q, k, v)
    _check_attention_inputs(q, k, v, None)
    phi_q, phi_k = elu_feature_map(q), elu_feature_map(k)  # [..., L_q, d_k], [..., L_k, d_k]
    kv = phi_k.transpose(-2, -1) @ v  # [..., d_k, d_v]: S, shared by every query
    z = phi_k.sum(dim=-2)  # [..., d_k]
    num = phi_q @ kv  # [..., L_q, d_v]
    den = phi_q @ z.unsqueeze(-1)  # [..., L_q, 1]
    return num / den


def causal_linear_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Linear attention in a decoder: position i sums over keys j <= i only, so S and z become
    running totals, S_i = S_{i-1} + phi(k_i) v_i^T and z_i = z_{i-1} + phi(k_i): prefix sums
    (cumsum). Read one step at a time it is an RNN with the state (S_i, z_i), which is what lets
    a causal linear transformer generate with a fixed-size state (Katharopoulos et al., 2020).

    q, k: [..., n, d_k]; v: [..., n, d_v]. Returns [..., n, d_v]. This form holds S_i for every
    position, [..., n, d_k, d_v]: memory O(n d_k d_v).
    """
    _check_attention_inputs(q, k, v, None)
    if q.shape[-2] != k.shape[-2]:
        raise ValueError(f"causal linear attention needs queries and keys of one length, got q {list(q.shape)}, "
                         f"k {list(k.shape)}")
    phi_q, phi_k = elu_feature_map(q), elu_feature_map(k)  # [..., n, d_k]
    kv = (phi_k.unsqueeze(-1) * v.unsqueeze(-2)).cumsum(dim=-3)  # [..., n, d_k, d_v]: S_i, keys j <= i
    z = phi_k.cumsum(dim=-2)  # [..., n, d_k]: z_i
    num = (phi_q.unsqueeze(-2) @ kv).squeeze(-2)  # [..., n, d_v]
    den = (phi_q * z).sum(dim=-1, keepdim=True)  # [..., n, 1]
    return num / den


def recurrent_linear_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal linear attention as an RNN: one state (S, z), updated position by position.

    The same numbers as `causal_linear_attention` (to rounding), computed the way a decoder
    generates: at position i, first S += phi(k_i) v_i^T and z += phi(k_i) (so that position i
    sees its own key), then out_i = phi(q_i)^T S / phi(q_i)^T z. Only one S [..., d_k, d_v] and
    one z [..., d_k] ever exist, whatever n is (the prefix sums keep one per position); the price
    is a Python loop of n small steps (Katharopoulos et al., 2020, section 3.4).

    q, k: [..., n, d_k]; v: [..., n, d_v]. Returns [..., n, d_v].
    """
    _check_attention_inputs(q, k, v, None)
    if q.shape[-2] != k.shape[-2]:
        raise ValueError(f"causal linear attention needs queries and keys of one length, got q {list(q.shape)}, "
                         f"k {list(k.shape)}")
    phi_q, phi_k = elu_feature_map(q), elu_feature_map(k)  # [..., n, d_k]
    batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    S = q.new_zeros(*batch, q.shape[-1], v.shape[-1])  # [..., d_k, d_v]: all of the past the model keeps
    z = q.new_zeros(*batch, q.shape[-1])  # [..., d_k]
    out = q.new_empty(*batch, q.shape[-2], v.shape[-1])  # [..., n, d_v]
    for i in range(q.shape[-2]):
        # Update before reading: position i attends to keys j <= i, itself included. In place,
        # so that no second state is ever allocated.
        S += phi_k[..., i, :, None] * v[..., i, None, :]  # + phi(k_i) v_i^T, [..., d_k, d_v]
        z += phi_k[..., i, :]
        q_i = phi_q[..., i, :]  # [..., d_k]
        out[..., i, :] = (q_i.unsqueeze(-2) @ S).squeeze(-2) / (q_i * z).sum(dim=-1, keepdim=True)
    return out


def linear_attention_quadratic(q, k, v, causal: bool = False):
    """The same linear attention the slow way, O(n^2): the weight matrix written out.

    weights_ij = phi(q_i) . phi(k_j) / sum_j' phi(q_i) . phi(k_j')  (causal: j, j' <= i).
    Returns (output [..., L_q, d_v], weights [..., L_q, L_k]), like scaled_dot_product_attention.
    """
    _check_attention_inputs(q, k, v, None)
    sim = elu_feature_map(q) @ elu_feature_map(k).transpose(-2, -1)  # [..., L_q, L_k], all > 0
    if causal:
        sim = sim * torch.ones(sim.shape[-2:], dtype=torch.bool, device=sim.device).tril()
    weights = sim / sim.sum(dim=-1, keepdim=True)  # [..., L_q, L_k]
    return weights @ v, weights


# -- the online softmax ------------------------------------------------------------------------


def online_softmax_step(m: torch.Tensor, l: torch.Tensor, acc: torch.Tensor, scores: torch.Tensor,
                        v_block: torch.Tensor):
    """Fold one block of keys into the running state of the online softmax.

    State, for each query: m [..., L_q, 1] the largest score seen so far (-inf at the start);
    l [..., L_q, 1] the sum of exp(score - m) over the keys seen; acc [..., L_q, d_v] the sum of
    exp(score - m) * value. scores: [..., L_q, B], the (finite) scores of this block;
    v_block: [..., B, d_v]. Returns the new (m, l, acc).

    When the maximum grows from m to m_new, every term already in l and acc was computed
    relative to the old m: multiplying by exp(m - m_new) <= 1 re-expresses them relative to
    the new one. At the end, acc / l is exactly softmax(scores) @ v.
    """
    m_new = torch.maximum(m, scores.amax(dim=-1, keepdim=True))  # [..., L_q, 1]
    rescale = torch.exp(m - m_new)  # [..., L_q, 1]: 1 if the max stayed, 0 at the start (m = -inf)
    p = torch.exp(scores - m_new)  # [..., L_q, B]: every exponent <= 0, nothing overflows
    l_new = rescale * l + p.sum(dim=-1, keepdim=True)  # [..., L_q, 1]
    acc_new = rescale * acc + p @ v_block  # [..., L_q, d_v]
    return m_new, l_new, acc_new


def online_softmax_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block: int,
                             mask: torch.Tensor | None = None, causal: bool = False, step=None) -> torch.Tensor:
    """Exact scaled dot-product attention, the keys taken `block` at a time.

    q: [..., L_q, d_k]; k: [..., L_k, d_k]; v: [..., L_k, d_v]; mask: bool broadcastable to
    [..., L_q, L_k], True = may attend; causal: query i sees keys j <= i (top-left aligned, as
    torch's is_causal). Returns the output [..., L_q, d_v], equal (to rounding) to
    `scaled_dot_product_attention(q, k, v, mask)[0]`, a query with no visible key included (0).

    Only one block of scores, [..., L_q, block], exists at a time, never [..., L_q, L_k].
    `step` folds a block into the running state (default `online_softmax_step`; pass your own).
    """
    _check_attention_inputs(q, k, v, mask)
    block = _integer(block, "block", 1)
    step = online_softmax_step if step is None else step
    l_q, l_k = q.shape[-2], k.shape[-2]
    batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    kw = dict(dtype=q.dtype, device=q.device)
    m = torch.full((*batch, l_q, 1), float("-inf"), **kw)  # [..., L_q, 1]: nothing seen yet
    l = torch.zeros(*batch, l_q, 1, **kw)  # [..., L_q, 1]
    acc = torch.zeros(*batch, l_q, v.shape[-1], **kw)  # [..., L_q, d_v]
    has_key = torch.zeros((), dtype=torch.bool, device=q.device)  # grows to [..., L_q, 1] with the mask
    rows = torch.arange(l_q, device=q.device)[:, None]  # [L_q, 1]
    for start in range(0, l_k, block):
        end = min(start + block, l_k)
        scores = attention_scores(q, k[..., start:end, :])  # [..., L_q, B]
        visible = None
        if mask is not None:
            # A mask of size 1 on the key axis is shared by every key: it is not sliced.
            visible = mask if mask.shape[-1] == 1 else mask[..., start:end]  # [..., L_q or 1, B]
        if causal:
            later = torch.arange(start, end, device=q.device)[None, :] <= rows  # [L_q, B]
            visible = later if visible is None else visible & later
        if visible is not None:
            # A finite fill, as in masked_softmax: a block hidden entirely from a query keeps
            # its running max finite, and the first visible key rescales the junk to exactly 0.
            scores = scores.masked_fill(~visible, torch.finfo(scores.dtype).min)
            has_key = has_key | visible.any(dim=-1, keepdim=True)
        m, l, acc = step(m, l, acc, scores, v[..., start:end, :])
    out = acc / l  # [..., L_q, d_v]
    if mask is not None or causal:
        out = out.masked_fill(~has_key, 0.0)  # a query that may see nothing gets 0, as in masked_softmax
    return out


# -- measuring ----------------------------------------------------------------------------------


@contextlib.contextmanager
def _native_stderr_silenced():
    """Send what C++ code writes to file descriptor 2 to /dev/null for a moment: the profiler logs
    a line each time it starts and stops, which no environment variable turns off."""
    sys.stderr.flush()
    saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def peak_memory(fn, *args, **kwargs) -> int:
    """Bytes: the most memory held through torch's CPU allocator while fn(*args, **kwargs) runs,
    beyond what was held before (the inputs are not counted; the output is).

    tracemalloc cannot see these allocations (torch does not allocate through Python), so this
    asks torch's profiler: with profile_memory=True it records every allocation (+ bytes) and
    free (- bytes) of the CPU allocator with its time, also inside fused and composite operators.
    In time order, the running sum of the records is the memory held; its maximum is the peak.
    """
    from torch.profiler import ProfilerActivity, profile

    prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
    with _native_stderr_silenced():
        prof.__enter__()
    try:
        with torch.no_grad():
            out = fn(*args, **kwargs)
            del out
    finally:
        with _native_stderr_silenced():
            prof.__exit__(None, None, None)
    records, stack = [], list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        size = getattr(node.extra_fields, "alloc_size", None)  # only allocation records have one
        if size is not None:
            records.append((node.start_time_ns, size))
        stack.extend(node.children)
    held = peak = 0
    for _, size in sorted(records):
        held += size
        peak = max(peak, held)
    return peak
