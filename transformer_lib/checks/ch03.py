"""Checkers for chapter 03, multi-head attention: cutting d_model into heads and gluing
them back, the whole multi-head computation with plain matrices, its parameter count,
the nn.Module that packages it, and the entropy that measures how sharply a head attends.

Each checker compares a learner's answer with the library (transformer_lib.attention) on
deterministic cases, and knows the wrong answers learners often write ("heads split
without a transpose", "no W^O"), so that a failure can say what went wrong. Properties
(traits of a wrong output, see core.Property) name the errors of a learner who combines
two mistakes: for split_heads they trace every number of the output back to the position
and feature of x it came from.
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from transformer_lib.attention import (
    MultiHeadAttention,
    attention_entropy,
    merge_heads,
    multi_head_attention_forward,
    scaled_dot_product_attention,
    split_heads,
)

from .core import Case, Checker, Mistake, Property, randn, random_mask, seeded
from .properties import rows_do_not_sum_to_one, shape_permuted


def _padding(lengths, max_len) -> torch.Tensor:
    """[batch, 1, max_len]: row b sees its first lengths[b] keys (True = may attend)."""
    return (torch.arange(max_len)[None, :] < torch.tensor(lengths)[:, None])[:, None, :]


# ---------------------------------------------------------------------------------------
# Exercise 1: split_heads(x, n_heads) -> [batch, heads, seq, d_k]
# ---------------------------------------------------------------------------------------


def _split_cases() -> list[Case]:
    g = seeded(301)
    return [
        Case("batch 2, seq 3, d_model 8, 2 heads", (randn(g, 2, 3, 8), 2)),
        Case("batch 1, seq 5, d_model 12, 3 heads", (randn(g, 1, 5, 12), 3)),
        Case("4 heads of size 1", (randn(g, 2, 3, 4), 4)),
        Case("float64, batch 3, seq 4, d_model 6, 3 heads", (randn(g, 3, 4, 6, dtype=torch.float64), 3), hidden=True),
        Case("a single head", (randn(g, 2, 4, 6), 1), hidden=True),
        Case("a single position", (randn(g, 2, 1, 8), 4), hidden=True),
        Case("d_model 64, 8 heads", (randn(g, 2, 6, 64), 8), hidden=True),
    ]


def _split_no_transpose(x, n_heads):
    b, s, d = x.shape
    return x.reshape(b, n_heads, s, d // n_heads)


def _split_transpose_forgotten(x, n_heads):
    b, s, d = x.shape
    return x.reshape(b, s, n_heads, d // n_heads)


def _split_last_two_swapped(x, n_heads):
    b, s, d = x.shape
    return x.reshape(b, s, n_heads, d // n_heads).transpose(-2, -1)


def _split_interleaved(x, n_heads):
    b, s, d = x.shape
    return x.reshape(b, s, d // n_heads, n_heads).permute(0, 3, 1, 2)


# -- properties: where did each number of the output come from? ---------------------------


def _provenance(case: Case, actual):
    """For an output that holds exactly the numbers of x, rearranged: the position t and
    the feature f of x that each of its entries came from (two tensors shaped like the
    output). None when the output changed, dropped or repeated numbers."""
    x = case.args[0]
    if not isinstance(actual, torch.Tensor) or actual.dtype != x.dtype or actual.numel() != x.numel():
        return None
    flat = x.flatten()
    sorted_x, order = flat.sort()
    if sorted_x.unique().numel() != flat.numel():  # repeated numbers: the origin is ambiguous
        return None
    if not torch.equal(sorted_x, actual.flatten().sort().values):
        return None
    source = order[torch.searchsorted(sorted_x, actual.flatten())]  # index into x.flatten()
    _, seq, d_model = x.shape
    return (source // d_model % seq).reshape(actual.shape), (source % d_model).reshape(actual.shape)


def _some_dim_indexes(actual, size: int, label: torch.Tensor) -> bool:
    """True when one dimension of `actual` (past the batch) has `size` entries and the index
    along it equals `label` everywhere: that dimension *is* what `label` names."""
    for dim in range(1, actual.dim()):
        if actual.shape[dim] != size:
            continue
        index = torch.arange(size).view([-1 if i == dim else 1 for i in range(actual.dim())])
        if torch.equal(index.expand(actual.shape), label):
            return True
    return False


def _heads_mixed(case, expected, actual) -> bool:
    found = _provenance(case, actual)
    if found is None:
        return False
    _, feature = found
    n_heads = case.args[1]
    d_k = case.args[0].shape[-1] // n_heads
    return not _some_dim_indexes(actual, n_heads, feature // d_k)


def _positions_scrambled(case, expected, actual) -> bool:
    found = _provenance(case, actual)
    if found is None:
        return False
    position, _ = found
    return not _some_dim_indexes(actual, case.args[0].shape[1], position)


def _memory_order_kept(case, expected, actual) -> bool:
    """The output reads x's numbers in their original order: a view or reshape, no transpose."""
    x = case.args[0]
    return (isinstance(actual, torch.Tensor) and actual.numel() == x.numel() and actual.dtype == x.dtype
            and torch.equal(actual.flatten(), x.flatten()) and not torch.equal(expected.flatten(), x.flatten()))


SPLIT_SHAPE_PERMUTED = shape_permuted(
    "The result must be [batch, n_heads, seq, d_k]: heads in dim 1, positions in dim 2. After cutting the "
    "features with view(batch, seq, n_heads, d_k), swap dims 1 and 2."
)
SPLIT_MEMORY_ORDER = Property(
    "the numbers of x in their original memory order (a view or reshape with no transpose)",
    "A view or reshape never moves a number, so alone it cannot put the heads in front of the positions: "
    "add .transpose(1, 2) after view(batch, seq, n_heads, d_k).",
    _memory_order_kept,
)
SPLIT_HEADS_MIXED = Property(
    "heads that do not each hold one block of d_k consecutive features (features of several heads mixed)",
    "Cut the features as (n_heads, d_k), in that order: head i owns features i*d_k ... (i+1)*d_k - 1.",
    _heads_mixed,
)
SPLIT_POSITIONS_SCRAMBLED = Property(
    "tokens scrambled: no dimension runs over the positions t0, t1, ... one per index (a head's rows hold "
    "pieces of several tokens)",
    "Never view straight to [batch, n_heads, seq, d_k]: cut the feature axis only, "
    "view(batch, seq, n_heads, d_k), then transpose.",
    _positions_scrambled,
)


check_split_heads = Checker(
    name="split_heads",
    reference=split_heads,
    make_cases=_split_cases,
    mistakes=[
        Mistake(
            "reshaped straight to [batch, heads, seq, d_k] without a transpose: each 'head' then holds "
            "pieces of several positions",
            "First cut the features only, x.view(batch, seq, n_heads, d_k), then swap heads and positions "
            "with .transpose(1, 2).",
            _split_no_transpose,
        ),
        Mistake(
            "the transpose forgotten: x.view(batch, seq, n_heads, d_k) returned as it is, "
            "[batch, seq, heads, d_k]",
            "Attention runs over the last two dims, so the heads must come before the positions: add .transpose(1, 2).",
            _split_transpose_forgotten,
        ),
        Mistake(
            "transposed the last two dimensions (-2, -1) instead of heads and positions: the result is "
            "[batch, seq, d_k, heads]",
            "After x.view(batch, seq, n_heads, d_k), the heads are dim 2 and the positions dim 1: .transpose(1, 2).",
            _split_last_two_swapped,
        ),
        Mistake(
            "features cut in the wrong order, view(batch, seq, d_k, n_heads): head i then gets every "
            "n_heads-th feature instead of a block",
            "Put n_heads before d_k, x.view(batch, seq, n_heads, d_k): head i owns the contiguous features "
            "i*d_k ... (i+1)*d_k - 1.",
            _split_interleaved,
        ),
    ],
    properties=[SPLIT_SHAPE_PERMUTED, SPLIT_MEMORY_ORDER, SPLIT_HEADS_MIXED, SPLIT_POSITIONS_SCRAMBLED],
)


# ---------------------------------------------------------------------------------------
# Exercise 2: merge_heads(x) -> [batch, seq, heads * d_k]
# ---------------------------------------------------------------------------------------


def _merge_cases() -> list[Case]:
    g = seeded(302)
    return [
        Case("batch 2, 2 heads, seq 3, d_k 4", (randn(g, 2, 2, 3, 4),)),
        Case("batch 1, 3 heads, seq 5, d_k 2", (randn(g, 1, 3, 5, 2),)),
        Case("4 heads of size 1", (randn(g, 2, 4, 3, 1),)),
        Case("float64, batch 3, 3 heads, seq 4, d_k 2", (randn(g, 3, 3, 4, 2, dtype=torch.float64),), hidden=True),
        Case("a single head", (randn(g, 2, 1, 4, 6),), hidden=True),
        Case("8 heads of size 8", (randn(g, 2, 8, 6, 8),), hidden=True),
    ]


def _merge_no_transpose(x):
    b, h, s, d_k = x.shape
    return x.reshape(b, s, h * d_k)


def _merge_interleaved(x):
    b, h, s, d_k = x.shape
    return x.permute(0, 2, 3, 1).reshape(b, s, h * d_k)


def _merge_mean(x):
    return x.mean(dim=1)


def _merge_sum(x):
    return x.sum(dim=1)


check_merge_heads = Checker(
    name="merge_heads",
    reference=merge_heads,
    make_cases=_merge_cases,
    mistakes=[
        Mistake(
            "reshaped to [batch, seq, d_model] without transposing back: positions and heads get mixed up",
            "Bring the positions forward first, x.transpose(1, 2) -> [batch, seq, heads, d_k], then "
            ".reshape(batch, seq, heads * d_k).",
            _merge_no_transpose,
        ),
        Mistake(
            "heads interleaved feature by feature (permute(0, 2, 3, 1)) instead of concatenated as blocks",
            "Concatenate whole heads: x.transpose(1, 2).reshape(batch, seq, heads * d_k), so head i fills "
            "features i*d_k ... (i+1)*d_k - 1.",
            _merge_interleaved,
        ),
        Mistake(
            "heads averaged (mean over dim 1) instead of concatenated",
            "Keep every head: concatenate them along the features, x.transpose(1, 2).reshape(batch, seq, heads * d_k).",
            _merge_mean,
        ),
        Mistake(
            "heads summed (sum over dim 1) instead of concatenated",
            "Keep every head: concatenate them along the features, x.transpose(1, 2).reshape(batch, seq, heads * d_k).",
            _merge_sum,
        ),
    ],
    properties=[
        shape_permuted(
            "The result must be [batch, seq, heads * d_k]: transpose heads and positions back first, "
            "x.transpose(1, 2), then reshape."
        ),
        Property(
            "the heads' numbers in their original memory order (a reshape with no transpose)",
            "A reshape alone never moves a number: bring the positions forward with x.transpose(1, 2) "
            "before the reshape.",
            _memory_order_kept,
        ),
    ],
)


# ---------------------------------------------------------------------------------------
# Exercise 3: multi_head_attention_forward(query, key, value, w_q, w_k, w_v, w_o, n_heads, mask)
# ---------------------------------------------------------------------------------------


def _weights(g, d_model, dtype=torch.float32):
    """w_q, w_k, w_v, w_o, scaled like a trained layer's (entries ~ 1/sqrt(d_model))."""
    return tuple(randn(g, d_model, d_model, dtype=dtype, scale=d_model**-0.5) for _ in range(4))


def _mha_cases() -> list[Case]:
    g = seeded(303)
    x = randn(g, 2, 4, 8)
    # 3-D masks only where batch == heads or batch == 1, so that a mask that was not
    # broadcast over the heads still runs (and gives wrong numbers) instead of raising.
    cases = [
        Case("self-attention, batch 2, seq 4, d_model 8, 2 heads", (x, x, x, *_weights(g, 8), 2)),
        Case("causal mask [5, 5], d_model 12, 3 heads", (*(3 * (randn(g, 1, 5, 12, scale=2.0),)), *_weights(g, 12), 3),
             {"mask": torch.ones(5, 5, dtype=torch.bool).tril()}),
        Case("cross-attention, 3 queries, 6 keys, padding mask [2, 1, 6], 2 heads",
             (randn(g, 2, 3, 8), randn(g, 2, 6, 8), randn(g, 2, 6, 8), *_weights(g, 8), 2),
             {"mask": _padding([6, 3], 6)}),
    ]
    y = randn(g, 3, 4, 6, dtype=torch.float64)
    cases += [
        Case("float64, batch 3, 3 heads, random mask [3, 4, 4]", (y, y, y, *_weights(g, 6, torch.float64), 3),
             {"mask": random_mask(g, 3, 4, 4)}, hidden=True),
        Case("a single head", (randn(g, 2, 3, 6), randn(g, 2, 5, 6), randn(g, 2, 5, 6), *_weights(g, 6), 1),
             hidden=True),
        Case("4 heads of size 1, large values", (*(3 * (randn(g, 2, 3, 4, scale=4.0),)), *_weights(g, 4), 4), hidden=True),
        Case("d_model 32, 4 heads, padding mask [4, 1, 7]",
             (randn(g, 4, 7, 32), randn(g, 4, 7, 32), randn(g, 4, 7, 32), *_weights(g, 32), 4),
             {"mask": _padding([7, 5, 2, 1], 7)}, hidden=True),
    ]
    return cases


def _mha_variant(query, key, value, w_q, w_k, w_v, w_o, n_heads, mask=None, *, use_w_o=True, scale_dim="d_k",
                 transpose=True, heads_mask=True):
    """Multi-head attention written out, with switches that turn it into a known mistake."""
    b, l_q, d = query.shape
    d_k = d // n_heads

    def split(t):
        if transpose:
            return t.reshape(b, t.shape[1], n_heads, d_k).transpose(1, 2)
        return t.reshape(b, n_heads, t.shape[1], d_k)

    q, k, v = split(query @ w_q), split(key @ w_k), split(value @ w_v)  # [b, h, L, d_k]
    scale = math.sqrt(d_k if scale_dim == "d_k" else d)
    scores = q @ k.transpose(-2, -1) / scale  # [b, h, L_q, L_k]
    if mask is not None:
        if heads_mask and mask.dim() == 3:
            mask = mask.unsqueeze(1)
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    weights = torch.softmax(scores, dim=-1)
    out = weights @ v  # [b, h, L_q, d_k]
    out = out.transpose(1, 2).reshape(b, l_q, d) if transpose else out.reshape(b, l_q, d)
    return (out @ w_o if use_w_o else out), weights


def _mha_no_w_o(*args, **kwargs):
    return _mha_variant(*args, **kwargs, use_w_o=False)


def _mha_sqrt_d_model(*args, **kwargs):
    return _mha_variant(*args, **kwargs, scale_dim="d_model")


def _mha_no_transpose(*args, **kwargs):
    return _mha_variant(*args, **kwargs, transpose=False)


def _mha_mask_not_per_head(*args, **kwargs):
    return _mha_variant(*args, **kwargs, heads_mask=False)


def _mha_one_full_head(query, key, value, w_q, w_k, w_v, w_o, n_heads, mask=None):
    return _mha_variant(query, key, value, w_q, w_k, w_v, w_o, 1, mask)


check_multi_head_attention_forward = Checker(
    name="multi_head_attention_forward",
    reference=multi_head_attention_forward,
    make_cases=_mha_cases,
    mistakes=[
        Mistake(
            "no output projection: the heads are concatenated but W^O is never applied",
            "Finish with the mixing matrix: return merge_heads(out) @ w_o, weights.",
            _mha_no_w_o,
        ),
        Mistake(
            "scores scaled by sqrt(d_model) instead of sqrt(d_k)",
            "Each head compares vectors of size d_k = d_model // n_heads: divide the scores by math.sqrt(d_k).",
            _mha_sqrt_d_model,
        ),
        Mistake(
            "heads split (and merged) without a transpose: viewing straight to [batch, heads, seq, d_k] "
            "mixes positions into the heads",
            "Split with .view(batch, seq, n_heads, d_k).transpose(1, 2) and merge with "
            ".transpose(1, 2).reshape(batch, seq, d_model), as in split_heads and merge_heads.",
            _mha_no_transpose,
        ),
        Mistake(
            "mask not broadcast over the heads: a [batch, L_q, L_k] mask lines its batch dimension up with "
            "the heads of the [batch, heads, L_q, L_k] scores",
            "Give the mask a heads dimension: if mask.dim() == 3, use mask.unsqueeze(1) -> [batch, 1, L_q, L_k].",
            _mha_mask_not_per_head,
        ),
        Mistake(
            "n_heads ignored: one full-width head instead of n_heads heads of size d_k",
            "Cut the projected queries, keys and values into n_heads heads with split_heads before the scores.",
            _mha_one_full_head,
        ),
    ],
    properties=[
        rows_do_not_sum_to_one(
            what="the keys", select=lambda out: out[1],
            fix="Each head's weights are a softmax over the keys (dim=-1), taken after the mask is applied.",
        ),
        shape_permuted(
            "The weights must be [batch, n_heads, L_q, L_k] and the output [batch, L_q, d_model]: "
            "split with view(batch, seq, n_heads, d_k).transpose(1, 2).",
            select=lambda out: out[1],
        ),
    ],
)


# ---------------------------------------------------------------------------------------
# Exercise 4: count_mha_parameters(d_model, n_heads, bias=True) -> int
# ---------------------------------------------------------------------------------------


def count_mha_parameters(d_model: int, n_heads: int, bias: bool = True) -> int:
    """The reference: the parameters of the library's MultiHeadAttention, built on the
    meta device (shapes only, no memory), so the count cannot drift from the module."""
    with torch.device("meta"):
        module = MultiHeadAttention(d_model, n_heads, bias=bias)
    return sum(p.numel() for p in module.parameters())


def _count_cases() -> list[Case]:
    return [
        Case("the paper's size: d_model 512, 8 heads", (512, 8)),
        Case("d_model 512, 8 heads, no biases", (512, 8), {"bias": False}),
        Case("d_model 64, 4 heads", (64, 4), {"bias": True}),
        Case("BERT-base: d_model 768, 12 heads", (768, 12), hidden=True),
        Case("d_model 6, 3 heads, no biases", (6, 3), {"bias": False}, hidden=True),
        Case("d_model 1, 1 head", (1, 1), hidden=True),
        Case("d_model 1024, 16 heads", (1024, 16), {"bias": True}, hidden=True),
    ]


def _count_no_w_o(d_model, n_heads, bias=True):
    return 3 * d_model * d_model + (3 * d_model if bias else 0)


def _count_full_width_heads(d_model, n_heads, bias=True):
    per_head = 3 * (d_model * d_model + (d_model if bias else 0))
    return n_heads * per_head + d_model * d_model + (d_model if bias else 0)


def _count_d_k_by_d_k(d_model, n_heads, bias=True):
    d_k = d_model // n_heads
    return n_heads * 3 * (d_k * d_k + (d_k if bias else 0)) + d_model * d_model + (d_model if bias else 0)


def _count_no_bias_ever(d_model, n_heads, bias=True):
    return 4 * d_model * d_model


def _count_bias_always(d_model, n_heads, bias=True):
    return 4 * d_model * d_model + 4 * d_model


check_count_mha_parameters = Checker(
    name="count_mha_parameters",
    reference=count_mha_parameters,
    make_cases=_count_cases,
    mistakes=[
        Mistake(
            "W^O forgotten: only the three input projections counted",
            "Add the output projection W^O: another d_model x d_model matrix (and d_model biases).",
            _count_no_w_o,
        ),
        Mistake(
            "every head counted with full d_model x d_model projections (n_heads times too many)",
            "Each head projects to d_k = d_model / n_heads columns, so all heads together have d_model columns: "
            "3 * d_model * d_model for W^Q, W^K, W^V.",
            _count_full_width_heads,
        ),
        Mistake(
            "each head's projection counted as d_k x d_k instead of d_model x d_k",
            "A head reads the whole d_model-dimensional input: its W^Q_i is d_model x d_k.",
            _count_d_k_by_d_k,
        ),
        Mistake(
            "the biases never counted",
            "With bias=True each of the four layers also has d_model biases: add 4 * d_model.",
            _count_no_bias_ever,
        ),
        Mistake(
            "the biases counted even when bias=False",
            "Add the 4 * d_model biases only when bias is True.",
            _count_bias_always,
        ),
    ],
)


# ---------------------------------------------------------------------------------------
# Exercise 5: class MultiHeadAttentionLayer(nn.Module)
# ---------------------------------------------------------------------------------------


def _layer_state(d_model: int, seed: int, dtype) -> dict:
    """Weights for w_q, w_k, w_v, w_o (nn.Linear layout: weight [out, in], bias [out])."""
    g = seeded(seed)
    state = {}
    for name in ("w_q", "w_k", "w_v", "w_o"):
        state[f"{name}.weight"] = randn(g, d_model, d_model, dtype=dtype, scale=d_model**-0.5)
        state[f"{name}.bias"] = randn(g, d_model, dtype=dtype, scale=0.1)
    return state


def _invoke_layer(cls, case: Case):
    """Build the class the same way for the learner, the reference and the mistakes: the
    same weights are loaded into it, then it runs in eval mode on the case's inputs."""
    d_model, n_heads, query, key, value = case.args
    kwargs = dict(case.kwargs)
    if kwargs.pop("expect_error", False):
        try:
            cls(d_model, n_heads)
        except NotImplementedError:
            raise
        except Exception as exc:  # the type is the answer: ValueError is expected
            return type(exc).__name__
        return "no error raised"
    layer = cls(d_model, n_heads)
    if not isinstance(layer, nn.Module):
        raise TypeError(f"{type(layer).__name__} must be an nn.Module subclass")
    layer = layer.to(query.dtype)
    try:
        layer.load_state_dict(_layer_state(d_model, kwargs.pop("weight_seed"), query.dtype))
    except RuntimeError as exc:
        raise RuntimeError(
            "the checker could not load its weights into your layer: it needs four "
            f"nn.Linear(d_model, d_model) layers with biases named w_q, w_k, w_v, w_o ({exc})"
        ) from None
    layer.eval()
    return layer(query, key, value, **kwargs)


def _layer_cases() -> list[Case]:
    g = seeded(305)
    x = randn(g, 2, 4, 8)
    dummy = torch.zeros(1, 1, 1)
    y = randn(g, 3, 5, 6, dtype=torch.float64)
    return [
        Case("self-attention, batch 2, seq 4, d_model 8, 2 heads", (8, 2, x, x, x), {"weight_seed": 1}),
        Case("cross-attention, padding mask [2, 1, 6], 2 heads",
             (8, 2, randn(g, 2, 3, 8), randn(g, 2, 6, 8), randn(g, 2, 6, 8)),
             {"weight_seed": 2, "mask": _padding([6, 4], 6)}),
        Case("d_model 10 is not divisible by 3 heads: must raise ValueError", (10, 3, dummy, dummy, dummy),
             {"expect_error": True}),
        Case("causal mask [5, 5], batch 1, d_model 12, 4 heads", (12, 4, *(3 * (randn(g, 1, 5, 12),))),
             {"weight_seed": 3, "mask": torch.ones(5, 5, dtype=torch.bool).tril()}, hidden=True),
        Case("float64, batch 3, 3 heads, random mask [3, 5, 5]", (6, 3, y, y, y),
             {"weight_seed": 4, "mask": random_mask(g, 3, 5, 5)}, hidden=True),
        Case("a single head", (6, 1, randn(g, 2, 3, 6), randn(g, 2, 4, 6), randn(g, 2, 4, 6)),
             {"weight_seed": 5}, hidden=True),
        Case("d_model 7 is not divisible by 2 heads", (7, 2, dummy, dummy, dummy), {"expect_error": True}, hidden=True),
    ]


class _SketchLayer(nn.Module):
    """Multi-head attention written out, with class-level switches for the known mistakes."""

    check = "value"  # "value": raise ValueError; "assert": assert; "none": no check
    use_w_o, scale_dim, transpose, heads_mask = True, "d_k", True, True

    def __init__(self, d_model, n_heads):
        super().__init__()
        if self.check == "value" and d_model % n_heads != 0:
            raise ValueError("d_model must be divisible by n_heads")
        if self.check == "assert":
            assert d_model % n_heads == 0
        self.d_model, self.n_heads, self.d_k = d_model, n_heads, d_model // n_heads
        self.w_q, self.w_k, self.w_v, self.w_o = (nn.Linear(d_model, d_model) for _ in range(4))

    def _split(self, t):
        b, s, _ = t.shape
        if self.transpose:
            return t.reshape(b, s, self.n_heads, self.d_k).transpose(1, 2)
        return t.reshape(b, self.n_heads, s, self.d_k)

    def forward(self, query, key, value, mask=None):
        q, k, v = self._split(self.w_q(query)), self._split(self.w_k(key)), self._split(self.w_v(value))
        if mask is not None and mask.dim() == 3 and self.heads_mask:
            mask = mask.unsqueeze(1)
        scale = 1 / math.sqrt(self.d_k if self.scale_dim == "d_k" else self.d_model)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)  # [b, h, L_q, d_k]
        b, _, l_q, _ = out.shape
        out = out.transpose(1, 2).reshape(b, l_q, self.d_model) if self.transpose else out.reshape(b, l_q, self.d_model)
        return self.w_o(out) if self.use_w_o else out


class _LayerNoWO(_SketchLayer):
    use_w_o = False


class _LayerSqrtDModel(_SketchLayer):
    scale_dim = "d_model"


class _LayerNoTranspose(_SketchLayer):
    transpose = False


class _LayerMaskNotPerHead(_SketchLayer):
    heads_mask = False


class _LayerAssert(_SketchLayer):
    check = "assert"


class _LayerNoCheck(_SketchLayer):
    check = "none"


check_multi_head_attention_layer = Checker(
    name="multi_head_attention_layer",
    reference=MultiHeadAttention,
    make_cases=_layer_cases,
    invoke=_invoke_layer,
    mistakes=[
        Mistake(
            "no output projection: self.w_o is created but never applied in forward",
            "End forward with self.w_o(...) on the merged heads.",
            _LayerNoWO,
        ),
        Mistake(
            "scores scaled by sqrt(d_model) instead of sqrt(d_k)",
            "Each head compares vectors of size d_k = d_model // n_heads: scale by 1 / math.sqrt(self.d_k).",
            _LayerSqrtDModel,
        ),
        Mistake(
            "heads split and merged without a transpose",
            "Split with .view(batch, seq, n_heads, d_k).transpose(1, 2); merge with .transpose(1, 2).reshape(...).",
            _LayerNoTranspose,
        ),
        Mistake(
            "mask not broadcast over the heads",
            "A [batch, L_q, L_k] (or [batch, 1, L_k]) mask needs a heads dimension: mask.unsqueeze(1).",
            _LayerMaskNotPerHead,
        ),
        Mistake(
            "divisibility checked with assert (AssertionError) instead of raising ValueError",
            "Raise a ValueError whose message says d_model must be divisible by n_heads: asserts vanish "
            "under python -O, and the error type tells the caller it passed a bad argument.",
            _LayerAssert,
        ),
        Mistake(
            "no check that d_model is divisible by n_heads (d_model // n_heads silently drops features)",
            "In __init__, raise ValueError when d_model % n_heads != 0.",
            _LayerNoCheck,
        ),
    ],
)


# ---------------------------------------------------------------------------------------
# Exercise 6: attention_entropy(weights) -> [..., L_q]
# ---------------------------------------------------------------------------------------


def _softmax_weights(g, batch, heads, l_q, l_k, mask=None, dtype=torch.float32, sharpness=1.0):
    """Attention weights [batch, heads, L_q, L_k] as a layer makes them (rows sum to one;
    masked keys get exactly 0)."""
    q = randn(g, batch, heads, l_q, 4, dtype=dtype, scale=sharpness)
    k = randn(g, batch, heads, l_k, 4, dtype=dtype)
    return scaled_dot_product_attention(q, k, k, mask=mask)[1]


def _entropy_cases() -> list[Case]:
    g = seeded(306)
    hand_made = torch.tensor([[1.0, 0.0, 0.0, 0.0], [0.25, 0.25, 0.25, 0.25], [0.5, 0.5, 0.0, 0.0]])
    causal = torch.ones(5, 5, dtype=torch.bool).tril()
    padding = _padding([6, 4], 6)[:, None]  # [batch, 1, 1, L_k]
    no_key = torch.ones(2, 1, 3, 4, dtype=torch.bool)
    no_key[1, :, 2] = False  # the last query of sentence 1 may see no key: its row is all zeros
    return [
        Case("softmax weights, batch 2, 3 heads, 4 queries, 5 keys", (_softmax_weights(g, 2, 3, 4, 5),)),
        Case("causal mask: hidden keys have weight exactly 0, [1, 2, 5, 5]",
             (_softmax_weights(g, 1, 2, 5, 5, mask=causal),)),
        Case("the worked example: one-hot, uniform over 4, half-half, [3, 4]", (hand_made,)),
        Case("float64, padding mask, [2, 4, 3, 6]",
             (_softmax_weights(g, 2, 4, 3, 6, mask=padding, dtype=torch.float64),), hidden=True),
        Case("a query that may see no key (all-zero row)", (_softmax_weights(g, 2, 1, 3, 4, mask=no_key),),
             hidden=True),
        Case("sharp heads: nearly one-hot rows", (_softmax_weights(g, 2, 2, 3, 7, sharpness=20.0),), hidden=True),
        Case("a single key", (_softmax_weights(g, 2, 2, 3, 1),), hidden=True),
        Case("more leading dims, [2, 2, 2, 3, 4]", (_softmax_weights(g, 4, 2, 3, 4).reshape(2, 2, 2, 3, 4),),
             hidden=True),
    ]


def _entropy_nan_at_zero(weights):
    return -(weights * weights.log()).sum(dim=-1)


def _entropy_bits(weights):
    return -torch.xlogy(weights, weights).sum(dim=-1) / math.log(2)


def _entropy_no_minus(weights):
    return torch.xlogy(weights, weights).sum(dim=-1)


def _entropy_over_queries(weights):
    return -torch.xlogy(weights, weights).sum(dim=-2)


def _entropy_mean_over_keys(weights):
    return -torch.xlogy(weights, weights).mean(dim=-1)


def _nan_where_reference_finite(case, expected, actual) -> bool:
    return (isinstance(actual, torch.Tensor) and actual.is_floating_point() and actual.shape == expected.shape
            and bool((actual.isnan() & expected.isfinite()).any()))


def _negative_entropy(case, expected, actual) -> bool:
    if not (isinstance(actual, torch.Tensor) and actual.is_floating_point() and actual.shape == expected.shape):
        return False
    return bool((actual.nan_to_num(0.0) < -1e-6).any())


def _in_bits(case, expected, actual) -> bool:
    """The reference's numbers divided by log 2, wherever both are finite and not tiny."""
    if not (isinstance(actual, torch.Tensor) and actual.is_floating_point() and actual.shape == expected.shape):
        return False
    e, a = expected.double(), actual.double().abs()  # abs: the sign is another property's business
    ok = e.isfinite() & a.isfinite() & (e > 1e-3)
    return bool(ok.any()) and torch.allclose(a[ok], e[ok] / math.log(2), rtol=1e-4, atol=1e-6)


check_attention_entropy = Checker(
    name="attention_entropy",
    reference=attention_entropy,
    make_cases=_entropy_cases,
    rtol=1e-4,
    atol=1e-5,
    mistakes=[
        Mistake(
            "0 * log(0) computed as NaN: keys with weight exactly 0 (masked keys) turn the whole sum into NaN",
            "A key with weight 0 adds nothing (p log p tends to 0 as p tends to 0): use torch.xlogy(p, p), "
            "torch.special.entr(p), or torch.where(p > 0, ..., 0).",
            _entropy_nan_at_zero,
        ),
        Mistake(
            "the entropy in bits (log base 2) instead of nats",
            "Use the natural log (torch.log, torch.xlogy): one key gives 0, two equal keys give log 2 = 0.693.",
            _entropy_bits,
        ),
        Mistake(
            "the minus sign missing: every entropy comes out negative",
            "H = -sum p log p: log p <= 0 for a weight p <= 1, so the minus sign makes H >= 0.",
            _entropy_no_minus,
        ),
        Mistake(
            "summed over the queries (dim=-2) instead of over the keys",
            "Each query has its own distribution over the keys: sum over dim=-1, which gives [..., L_q].",
            _entropy_over_queries,
        ),
        Mistake(
            "averaged over the keys (mean) instead of summed",
            "The entropy is a sum over the keys, not a mean: .sum(dim=-1).",
            _entropy_mean_over_keys,
        ),
    ],
    properties=[
        Property(
            "NaN where a query has keys of weight 0 (0 * log 0)",
            "Give a weight of 0 the contribution 0: torch.xlogy(p, p) or torch.special.entr(p) do it for you.",
            _nan_where_reference_finite,
        ),
        Property(
            "negative entropies (the minus sign is missing)",
            "H = -sum p log p is never negative.",
            _negative_entropy,
        ),
        Property(
            "numbers 1/log(2) = 1.44 times the reference's (bits instead of nats)",
            "Use the natural log.",
            _in_bits,
        ),
    ],
)


CHECKERS = [
    check_split_heads,
    check_merge_heads,
    check_multi_head_attention_forward,
    check_count_mha_parameters,
    check_multi_head_attention_layer,
    check_attention_entropy,
]
