"""Checkers for chapter 11, long sequences: the sliding-window, dilated and global-token masks,
the receptive field of a stack of sparse layers, banded attention computed block by block,
causal linear attention by prefix sums and as one running state, and one step of the online
softmax behind FlashAttention.

Each checker compares a learner's function with the library (transformer_lib.sparse) on
deterministic cases and knows the wrong answers learners often write: a window off by one, a
causal band on the wrong side, gaps counted from position 0 instead of from the query, global
tokens wired as rows only, a receptive field that never grows, a band whose blocks drop the
keys of the previous block, a prefix sum that includes the future or leaves out the position
itself, a recurrent state read before it is updated, a running sum not rescaled when the
maximum grows... Two exercises are about cost, not only about numbers: banded attention must
never allocate the n x n matrix and the recurrent form must never keep a state per position;
their checkers watch the operators an answer runs on a long case (a TorchDispatchMode, as
chapter 08's embedding lookup does) and refuse one that allocates that much.
Properties name an error from a trait of the output (a band that is not symmetric, a position
that cannot see itself, an output outside the range of the values it may see), so that two
mistakes made at once are still diagnosed in the learner's terms.
"""

import math

import torch
import torch.nn.functional as F

from transformer_lib.sparse import (
    banded_attention,
    causal_linear_attention,
    dilated_mask,
    global_token_mask,
    online_softmax_step,
    receptive_field,
    recurrent_linear_attention,
    sliding_window_mask,
)

from . import properties
from .core import Case, Checker, Mistake, Property, randn, seeded


def _square_bool(case_size, actual):
    """The learner's output if it is a bool [n, n] mask, else None."""
    if not isinstance(actual, torch.Tensor) or actual.dtype != torch.bool:
        return None
    if actual.dim() < 2 or tuple(actual.shape[-2:]) != (case_size, case_size):
        return None
    return actual


def _offsets(n):
    pos = torch.arange(n)
    return pos[None, :] - pos[:, None]  # [n, n]: j - i


# The cases and the catalogue never call a checker's reference: the grader replaces every
# reference with a stub while a learner's code runs (autograder/hiding.py), and the cases are
# built in that process. The few patterns the cases need are written out here instead.


def _pattern(n, window, dilation=1, causal=False):
    """[n, n] bool: keys a multiple of `dilation` away, at most window * dilation (causal: j <= i)."""
    offset = _offsets(n)
    mask = (offset % dilation == 0) & (offset.abs() <= window * dilation)
    return mask & (offset <= 0) if causal else mask


def _hubs(local, g):
    """`local` [..., n, n] with g all-True rows and columns put in front."""
    n = local.shape[-1]
    mask = torch.ones(*local.shape[:-2], g + n, g + n, dtype=torch.bool)
    mask[..., g:, g:] = local
    return mask


def _power(mask, n_layers):
    """Boolean matrix power mask^n_layers (identity for 0)."""
    reach = torch.eye(mask.shape[-1], dtype=torch.bool).expand(mask.shape)
    for _ in range(n_layers):
        reach = (mask.long() @ reach.long()).clamp(max=1).bool()
    return reach


# ---------------------------------------------------------------------------------------
# Exercise 1: sliding_window_mask(size, window, causal=False) -> bool [size, size]
# ---------------------------------------------------------------------------------------


def _window_cases() -> list[Case]:
    return [
        Case("size 6, window 1", (6, 1)),
        Case("size 7, window 2, causal", (7, 2), {"causal": True}),
        Case("size 5, window 0 (each position sees only itself)", (5, 0)),
        Case("size 9, window 3", (9, 3), hidden=True),
        Case("size 10, window 2, causal", (10, 2), {"causal": True}, hidden=True),
        Case("window 5 wider than the sequence (size 4)", (4, 5), hidden=True),
        Case("size 1, window 0", (1, 0), hidden=True),
        Case("size 8, window 0, causal", (8, 0), {"causal": True}, hidden=True),
    ]


def _causal(case):
    return bool(case.kwargs.get("causal", False))


def _win_strict(size, window, causal=False):
    offset = _offsets(size)
    if causal:
        return (offset <= 0) & (offset > -window)
    return offset.abs() < window


def _win_causal_ignored(size, window, causal=False):
    return _offsets(size).abs() <= window


def _win_wrong_side(size, window, causal=False):
    offset = _offsets(size)
    if causal:
        return (offset >= 0) & (offset <= window)
    return offset.abs() <= window


def _win_inverted(size, window, causal=False):
    return ~_pattern(size, window, causal=causal)


def _win_not_symmetric(case, expected, actual):
    a = _square_bool(case.args[0], actual)
    return a is not None and not _causal(case) and not torch.equal(a, a.transpose(-2, -1))


def _hides_itself(case, expected, actual):
    a = _square_bool(case.args[0], actual)
    return a is not None and bool((expected.diagonal(dim1=-2, dim2=-1) & ~a.diagonal(dim1=-2, dim2=-1)).any())


def _win_sees_future(case, expected, actual):
    a = _square_bool(case.args[0], actual)
    return a is not None and _causal(case) and bool((a & (_offsets(case.args[0]) > 0)).any())


def _win_edge_left_out(case, expected, actual):
    a = _square_bool(case.args[0], actual)
    if a is None:
        return False
    size, window = case.args[0], case.args[1]
    edge = (_offsets(size).abs() == window) & expected  # the neighbours exactly `window` steps away
    return window > 0 and bool(edge.any()) and bool((~a[edge]).all())


def _win_too_many(case, expected, actual):
    a = _square_bool(case.args[0], actual)
    if a is None:
        return False
    size, window = case.args[0], case.args[1]
    most = window + 1 if _causal(case) else 2 * window + 1
    return bool((a.sum(-1) > most).any())


WINDOW_EDGE = Property(
    "the neighbours exactly `window` steps away left out (a strict < where <= belongs)",
    "`window` counts the neighbours on each side, ends included: keep |i - j| <= window.",
    _win_edge_left_out,
)
HIDES_ITSELF = Property(
    "a position that cannot see itself (False on the diagonal)",
    "Offset 0 always belongs to the pattern: every query must see its own key, or a row may be empty.",
    _hides_itself,
)

check_sliding_window_mask = Checker(
    name="sliding_window_mask",
    reference=sliding_window_mask,
    make_cases=_window_cases,
    forbidden=("transformer_lib.sparse.dilated_mask",),  # dilation 1 is the answer
    mistakes=[
        Mistake(
            "window off by one: |i - j| < window leaves out the neighbours exactly `window` steps away",
            "`window` neighbours on each side, ends included: keep |i - j| <= window (window 0: the diagonal).",
            _win_strict,
        ),
        Mistake(
            "causal ignored: with causal=True the band still reaches `window` positions into the future",
            "With causal=True keep only the past half of the band: 0 <= i - j <= window.",
            _win_causal_ignored,
        ),
        Mistake(
            "causal band on the wrong side: each query sees the `window` positions after it (the future)",
            "Row i is the query, column j the key: a decoder keeps the keys before the query, j <= i, "
            "so 0 <= i - j <= window.",
            _win_wrong_side,
        ),
        Mistake(
            "True used for 'hide': the mask is inverted",
            "In this course True means 'may attend': return True inside the band, False outside.",
            _win_inverted,
        ),
    ],
    properties=[
        properties.not_a_bool_mask(),
        properties.mask_inverted(),
        Property(
            "a band that is not symmetric although causal=False",
            "An encoder's window looks both ways: query i sees key j exactly when query j sees key i, |i - j| <= window.",
            _win_not_symmetric,
        ),
        HIDES_ITSELF,
        Property(
            "a causal window that sees the future (True above the diagonal)",
            "With causal=True query i sees keys j <= i only: the band's lower half.",
            _win_sees_future,
        ),
        WINDOW_EDGE,
        Property(
            "a row with more keys than the window allows (2 * window + 1; window + 1 when causal)",
            "Keep only the keys with |i - j| <= window (causal: 0 <= i - j <= window).",
            _win_too_many,
        ),
    ],
)


# ---------------------------------------------------------------------------------------
# Exercise 2: dilated_mask(size, window, dilation) -> bool [size, size]
# ---------------------------------------------------------------------------------------


def _dilated_cases() -> list[Case]:
    return [
        Case("size 9, window 1, dilation 2", (9, 1, 2)),
        Case("size 10, window 2, dilation 3", (10, 2, 3)),
        Case("dilation 1 is the plain window (size 6, window 2)", (6, 2, 1)),
        Case("size 12, window 2, dilation 2", (12, 2, 2), hidden=True),
        Case("window 0 (size 7, dilation 3)", (7, 0, 3), hidden=True),
        Case("size 16, window 3, dilation 4", (16, 3, 4), hidden=True),
        Case("reach beyond the sequence (size 5, window 3, dilation 2)", (5, 3, 2), hidden=True),
        Case("size 1", (1, 1, 1), hidden=True),
    ]


def _dil_from_zero(size, window, dilation):
    offset = _offsets(size)
    key = torch.arange(size)[None, :].expand(size, size)
    return (key % dilation == 0) & (offset.abs() <= window * dilation)


def _dil_reach_not_scaled(size, window, dilation):
    offset = _offsets(size)
    return (offset % dilation == 0) & (offset.abs() <= window)


def _dil_ignored(size, window, dilation):
    return _offsets(size).abs() <= window * dilation


def _dil_strict(size, window, dilation):
    offset = _offsets(size)
    return (offset % dilation == 0) & (offset.abs() < window * dilation)


def _dil_not_symmetric(case, expected, actual):
    a = _square_bool(case.args[0], actual)
    return a is not None and not torch.equal(a, a.transpose(-2, -1))


def _dil_in_the_gaps(case, expected, actual):
    a = _square_bool(case.args[0], actual)
    size, window, dilation = case.args
    return a is not None and dilation > 1 and bool((a & (_offsets(size) % dilation != 0)).any())


def _dil_too_many(case, expected, actual):
    a = _square_bool(case.args[0], actual)
    return a is not None and bool((a.sum(-1) > 2 * case.args[1] + 1).any())


check_dilated_mask = Checker(
    name="dilated_mask",
    reference=dilated_mask,
    make_cases=_dilated_cases,
    mistakes=[
        Mistake(
            "gaps counted from position 0: keys kept where j is a multiple of dilation, not where i - j is",
            "The pattern moves with the query: keep key j when (i - j) is a multiple of dilation, "
            "so that every query sees itself.",
            _dil_from_zero,
        ),
        Mistake(
            "reach not multiplied by the dilation: |i - j| <= window keeps only a few of the window's keys",
            "`window` counts keys, `dilation` steps apart: the farthest one is window * dilation away.",
            _dil_reach_not_scaled,
        ),
        Mistake(
            "dilation ignored: a plain sliding window of width window * dilation, with no gaps",
            "Keep only the keys whose distance i - j is a multiple of dilation: (i - j) % dilation == 0.",
            _dil_ignored,
        ),
        Mistake(
            "the farthest key left out: |i - j| < window * dilation",
            "Ends included: keep |i - j| <= window * dilation.",
            _dil_strict,
        ),
    ],
    properties=[
        properties.not_a_bool_mask(),
        properties.mask_inverted(),
        HIDES_ITSELF,
        Property(
            "a pattern that is not symmetric (query i sees key j but query j does not see key i)",
            "Count the gaps from the query: (i - j) % dilation == 0 and |i - j| <= window * dilation are "
            "both symmetric in i and j.",
            _dil_not_symmetric,
        ),
        Property(
            "keys visible in the gaps (i - j not a multiple of the dilation)",
            "Between two kept keys lie dilation - 1 hidden ones: require (i - j) % dilation == 0.",
            _dil_in_the_gaps,
        ),
        Property(
            "a row with more than 2 * window + 1 keys",
            "A dilated window keeps as many keys as a plain one, spread out: window on each side plus the query.",
            _dil_too_many,
        ),
    ],
)


# ---------------------------------------------------------------------------------------
# Exercise 3: global_token_mask(local_mask, n_global) -> bool [n_global + n, n_global + n]
# ---------------------------------------------------------------------------------------


def _random_local(g, n):
    mask = torch.rand(n, n, generator=g) < 0.4
    return mask | torch.eye(n, dtype=torch.bool)


def _global_cases() -> list[Case]:
    g = seeded(1103)
    return [
        Case("window 1 over 5 tokens, 1 global token", (_pattern(5, 1), 1)),
        Case("window 1 over 6 tokens, 2 global tokens", (_pattern(6, 1), 2)),
        Case("a dilated pattern over 7 tokens, 1 global token", (_pattern(7, 1, 2), 1)),
        Case("a random pattern over 6 tokens, 3 global tokens", (_random_local(g, 6), 3), hidden=True),
        Case("window 0 over 4 tokens, 2 global tokens", (_pattern(4, 0), 2), hidden=True),
        Case("a causal window over 5 tokens, 1 global token", (_pattern(5, 1, causal=True), 1), hidden=True),
        Case("no global token at all", (_pattern(3, 1), 0), hidden=True),
        Case("one token, 2 global tokens", (_pattern(1, 0), 2), hidden=True),
    ]


def _gt_empty(local_mask, n_global):
    n = local_mask.shape[-1]
    mask = torch.zeros(n_global + n, n_global + n, dtype=torch.bool)
    mask[n_global:, n_global:] = local_mask
    return mask


def _gt_rows_only(local_mask, n_global):
    mask = _gt_empty(local_mask, n_global)
    mask[:n_global, :] = True  # the global tokens read everything, nobody reads them
    return mask


def _gt_columns_only(local_mask, n_global):
    mask = _gt_empty(local_mask, n_global)
    mask[:, :n_global] = True  # everybody reads the global tokens, they read only each other
    return mask


def _gt_at_the_end(local_mask, n_global):
    n = local_mask.shape[-1]
    mask = torch.ones(n + n_global, n + n_global, dtype=torch.bool)
    mask[:n, :n] = local_mask
    return mask


def _gt_not_linked(local_mask, n_global):
    mask = _hubs(local_mask, n_global)
    mask[:n_global, :n_global] = torch.eye(n_global, dtype=torch.bool)  # each global token sees only itself
    return mask


def _gt_layout(case, actual):
    local_mask, n_global = case.args
    size = n_global + local_mask.shape[-1]
    return _square_bool(size, actual), n_global


def _gt_tokens_cannot_read(case, expected, actual):
    a, g = _gt_layout(case, actual)
    return a is not None and g > 0 and bool((~a[..., g:, :g]).any())


def _gt_globals_cannot_read(case, expected, actual):
    a, g = _gt_layout(case, actual)
    return a is not None and g > 0 and bool((~a[..., :g, :]).any())


def _gt_local_changed(case, expected, actual):
    a, g = _gt_layout(case, actual)
    return a is not None and not torch.equal(a[..., g:, g:], case.args[0])


def _gt_wrong_size(case, expected, actual):
    local_mask, n_global = case.args
    if not isinstance(actual, torch.Tensor) or actual.dim() < 2:
        return False
    return actual.shape[-1] != n_global + local_mask.shape[-1] or actual.shape[-2] != actual.shape[-1]


check_global_token_mask = Checker(
    name="global_token_mask",
    reference=global_token_mask,
    make_cases=_global_cases,
    mistakes=[
        Mistake(
            "global tokens only as rows: they read every token, but no token reads them",
            "A global token is a two-way hub: its row AND its column are all True, so that what it "
            "collects flows back to every token.",
            _gt_rows_only,
        ),
        Mistake(
            "global tokens only as columns: every token reads them, but they read none of the tokens",
            "Their rows must be all True as well: a hub that reads nothing has nothing to pass on.",
            _gt_columns_only,
        ),
        Mistake(
            "global tokens appended at the end instead of put in front",
            "Positions 0 .. n_global - 1 are the global tokens: the local pattern goes in the bottom-right "
            "block, mask[n_global:, n_global:].",
            _gt_at_the_end,
        ),
        Mistake(
            "global tokens not connected to each other (each one sees only itself among them)",
            "The top-left n_global x n_global block is all True: global tokens attend to each other too.",
            _gt_not_linked,
        ),
    ],
    properties=[
        properties.not_a_bool_mask(),
        Property(
            "a shape other than [n_global + n, n_global + n]",
            "The global tokens are extra positions: the result is square, n_global + n on each side.",
            _gt_wrong_size,
        ),
        Property(
            "a token that cannot read a global token (a False in the global columns)",
            "Every query sees every global key: mask[:, :n_global] = True.",
            _gt_tokens_cannot_read,
        ),
        Property(
            "a global token that cannot read every position (a False in the global rows)",
            "Every global query sees every key: mask[:n_global, :] = True.",
            _gt_globals_cannot_read,
        ),
        Property(
            "the real tokens' local pattern changed (the bottom-right block is not local_mask)",
            "Copy local_mask unchanged into mask[n_global:, n_global:]: the global tokens only add connections.",
            _gt_local_changed,
        ),
    ],
)


# ---------------------------------------------------------------------------------------
# Exercise 4: receptive_field(mask, n_layers) -> bool [n, n]
# ---------------------------------------------------------------------------------------


def _receptive_cases() -> list[Case]:
    g = seeded(1104)
    no_diagonal = (torch.rand(7, 7, generator=g) < 0.3) & ~torch.eye(7, dtype=torch.bool)
    batched = torch.stack([_pattern(6, 1), _pattern(6, 1, 2)])  # [2, 6, 6]
    return [
        Case("window 1 over 9 positions, 2 layers", (_pattern(9, 1), 2)),
        Case("causal window 1 over 8 positions, 3 layers", (_pattern(8, 1, causal=True), 3)),
        Case("a global token and window 0 over 5 tokens, 2 layers", (_hubs(_pattern(5, 0), 1), 2)),
        Case("dilated (window 1, dilation 3) over 12 positions, 2 layers", (_pattern(12, 1, 3), 2), hidden=True),
        Case("window 2 over 10 positions, 1 layer", (_pattern(10, 2), 1), hidden=True),
        Case("a random mask without the diagonal, 3 layers", (no_diagonal, 3), hidden=True),
        Case("causal window 1 over 16 positions, 5 layers", (_pattern(16, 1, causal=True), 5), hidden=True),
        Case("two masks at once [2, 6, 6], 2 layers", (batched, 2), hidden=True),
    ]


def _rf_elementwise(mask, n_layers):
    return mask.clone()


def _rf_one_too_few(mask, n_layers):
    return _power(mask, n_layers - 1)


def _rf_one_too_many(mask, n_layers):
    return _power(mask, n_layers + 1)


def _rf_transposed(mask, n_layers):
    return _power(mask.transpose(-2, -1), n_layers)


def _rf_counts(mask, n_layers):
    return torch.linalg.matrix_power(mask.long(), n_layers)


def _rf_no_growth(case, expected, actual):
    mask, n_layers = case.args
    return (isinstance(actual, torch.Tensor) and actual.dtype == torch.bool and actual.shape == mask.shape
            and not torch.equal(expected, mask) and torch.equal(actual, mask))


def _rf_transposed_trait(case, expected, actual):
    return (isinstance(actual, torch.Tensor) and actual.dtype == torch.bool and actual.shape == expected.shape
            and not torch.equal(expected, expected.transpose(-2, -1))
            and torch.equal(actual, expected.transpose(-2, -1)))


def _rf_counts_trait(case, expected, actual):
    return (isinstance(actual, torch.Tensor) and actual.dtype != torch.bool and actual.shape == expected.shape
            and torch.equal(actual.double() > 0, expected) and bool((actual.double() > 1).any()))


def _rf_too_small(case, expected, actual):
    # Fewer positions reached than the reference, though everything reached is right: a layer
    # (or more) missing from the product.
    return (isinstance(actual, torch.Tensor) and actual.dtype == torch.bool and actual.shape == expected.shape
            and bool((actual & ~expected).sum() == 0) and bool((expected & ~actual).any()))


check_receptive_field = Checker(
    name="receptive_field",
    reference=receptive_field,
    make_cases=_receptive_cases,
    mistakes=[
        Mistake(
            "an element-wise power (mask ** n_layers, or mask & mask ...): the field never grows beyond one layer",
            "Stacking layers chains the connections: a boolean *matrix* product, reach = (mask @ reach) > 0, "
            "repeated n_layers times.",
            _rf_elementwise,
        ),
        Mistake(
            "one layer too few (the mask multiplied in n_layers - 1 times)",
            "Start from the identity (0 layers: each position reaches itself) and apply the mask n_layers times.",
            _rf_one_too_few,
        ),
        Mistake(
            "one layer too many (n_layers + 1 products)",
            "Start from the identity, not from the mask, if you loop n_layers times.",
            _rf_one_too_many,
        ),
        Mistake(
            "the mask transposed: the result says which outputs position i reaches, not which inputs reach i",
            "Row i is the output (the query), column j the input: reach = mask @ reach, with mask[i, j] "
            "True when i reads j. Do not transpose.",
            _rf_transposed,
        ),
        Mistake(
            "paths counted instead of a yes/no answer (an integer matrix power)",
            "Only whether a path exists matters: turn each product back into booleans with > 0.",
            _rf_counts,
        ),
    ],
    properties=[
        Property(
            "numbers (path counts) instead of booleans",
            "Return a bool tensor: (counts > 0) after each product.",
            _rf_counts_trait,
        ),
        properties.not_a_bool_mask(),
        Property(
            "a receptive field that does not grow with depth (the mask itself after several layers)",
            "Use a matrix product, not an element-wise one: after 2 layers, i reaches j through any k.",
            _rf_no_growth,
        ),
        Property(
            "the reference's answer with rows and columns swapped",
            "Row i is the output position, column j the input: multiply mask @ reach, without a transpose.",
            _rf_transposed_trait,
        ),
        Property(
            "fewer positions reached than n_layers layers reach (a layer missing)",
            "Apply the mask exactly n_layers times, starting from the identity.",
            _rf_too_small,
        ),
    ],
)


# ---------------------------------------------------------------------------------------
# Exercise 5: banded_attention(q, k, v, window, causal=False) -> [..., n, d_v], in blocks
# ---------------------------------------------------------------------------------------


def _largest_allocation(fn, *args, **kwargs):
    """Run fn(*args, **kwargs); also return the most entries held by the storage of any tensor an
    operator produced meanwhile. A view counts its base's storage (a slice of the n x n matrix
    is still the n x n matrix held); an `expand` of a small tensor allocates nothing and counts
    as small."""
    from torch.utils._python_dispatch import TorchDispatchMode

    largest = 0

    class Watch(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            nonlocal largest
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else [out]:
                if isinstance(t, torch.Tensor):
                    try:
                        size = t.untyped_storage().nbytes() // max(t.element_size(), 1)
                    except Exception:
                        size = t.numel()
                    largest = max(largest, size)
            return out

    with Watch():
        out = fn(*args, **kwargs)
    return out, largest


# The long case: 2,048 positions. An answer that allocates a tensor of n * n / 4 entries or more
# there (the score matrix, or the band's mask, written out in full) gets this instead of its
# output; blocks of a few hundred queries stay far below it.
BANDED_LONG = 2048
N_BY_N = {"__type__": "a tensor of n x n entries allocated on the 2,048-token case (the whole score matrix, "
                      "or a mask of the whole sequence): banded attention must compute scores only inside each "
                      "block's span of keys"}


def _invoke_banded(fn, case: Case):
    q = case.args[0]
    if q.shape[-2] < BANDED_LONG:
        return fn(*case.args, **case.kwargs)
    out, largest = _largest_allocation(fn, *case.args, **case.kwargs)
    n = q.shape[-2]
    return N_BY_N if largest >= n * n // 4 else out


def _banded_block(window):
    """The block size the exercise asks for: `window` queries, at least 16."""
    return max(window, 16)


def _banded_cases() -> list[Case]:
    g = seeded(1107)

    def qkv(*batch, n, d_k, d_v=None, dtype=torch.float32, scale=1.0):
        q, k = randn(g, *batch, n, d_k, dtype=dtype, scale=scale), randn(g, *batch, n, d_k, dtype=dtype, scale=scale)
        # d_v None: the values are the identity, so that the output *is* the weight matrix and the
        # properties can read which keys each query saw.
        v = torch.eye(n, dtype=dtype).expand(*batch, n, n).clone() if d_v is None else randn(g, *batch, n, d_v,
                                                                                             dtype=dtype)
        return q, k, v

    return [
        Case("40 tokens, window 5, values = the identity (the output is the weight matrix)",
             (*qkv(1, n=40, d_k=8), 5)),
        Case("37 tokens, window 5, causal, values = the identity", (*qkv(1, n=37, d_k=8), 5), {"causal": True}),
        Case("batch 2, heads 3, 20 tokens, d_k 4, d_v 3, window 2", (*qkv(2, 3, n=20, d_k=4, d_v=3), 2)),
        Case("a long sequence: 2,048 tokens, window 4 (no n x n tensor allowed)",
             (*qkv(1, n=BANDED_LONG, d_k=4, d_v=4), 4)),
        Case("50 tokens, window 6, values = the identity", (*qkv(1, n=50, d_k=8), 6), hidden=True),
        Case("45 tokens, window 7, causal, values = the identity", (*qkv(n=45, d_k=8), 7), {"causal": True},
             hidden=True),
        Case("float64, 33 tokens, window 6, causal", (*qkv(2, n=33, d_k=5, d_v=3, dtype=torch.float64), 6),
             {"causal": True}, hidden=True),
        Case("window 0: each token sees only itself", (*qkv(1, n=10, d_k=4, d_v=2), 0), hidden=True),
        Case("window 20 wider than the sequence (12 tokens)", (*qkv(2, n=12, d_k=4, d_v=3), 20), hidden=True),
        Case("one token", (*qkv(1, n=1, d_k=4, d_v=2), 3), hidden=True),
        Case("large scores (queries and keys scaled by 3), d_k 16", (*qkv(1, n=30, d_k=16, d_v=4, scale=3.0), 4),
             hidden=True),
        Case("a long sequence, causal: 2,048 tokens, window 8", (*qkv(1, n=BANDED_LONG, d_k=4, d_v=2), 8),
             {"causal": True}, hidden=True),
    ]


def _blocked(q, k, v, left, right, block, drop_previous=False, scale=True):
    """Attention of query i over keys i - left .. i + right, the queries taken `block` at a time,
    each block scored against the span of keys its band reaches (no n x n tensor). With
    drop_previous the span starts at the block's first query: the previous block's keys are lost."""
    n = q.shape[-2]
    pos = torch.arange(n)
    outs = []
    for start in range(0, n, block):
        end = min(start + block, n)
        lo = start if drop_previous else max(0, start - max(left, 0))
        hi = min(n, end + max(right, 0))
        scores = q[..., start:end, :] @ k[..., lo:hi, :].transpose(-2, -1)  # [..., b, span]
        if scale:
            scores = scores / math.sqrt(q.shape[-1])
        offset = pos[None, lo:hi] - pos[start:end, None]  # [b, span]: j - i
        visible = (offset >= -left) & (offset <= right)
        outs.append(torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1) @ v[..., lo:hi, :])
    return torch.cat(outs, dim=-2)  # [..., n, d_v]


def _band_right(window, causal):
    return 0 if causal else window


def _band_off_by_one(q, k, v, window, causal=False):
    return _blocked(q, k, v, window - 1, 0 if causal else window - 1, _banded_block(window))


def _band_whole_width(q, k, v, window, causal=False):
    half = window // 2
    return _blocked(q, k, v, half, _band_right(half, causal), _banded_block(window))


def _band_causal_ignored(q, k, v, window, causal=False):
    return _blocked(q, k, v, window, window, _banded_block(window))


def _band_previous_block_dropped(q, k, v, window, causal=False):
    return _blocked(q, k, v, window, _band_right(window, causal), _banded_block(window), drop_previous=True)


def _band_not_scaled(q, k, v, window, causal=False):
    return _blocked(q, k, v, window, _band_right(window, causal), _banded_block(window), scale=False)


def _band_padding_not_masked(q, k, v, window, causal=False):
    """Keys padded with `window` zeros on each side (one on the left only when causal), every
    query scored against its whole padded span: the padding keys get score 0 and a share of the
    softmax, and give nothing back (their values are 0)."""
    right = _band_right(window, causal)
    span = window + right + 1
    k_pad = F.pad(k, (0, 0, window, right))  # [..., n + window + right, d_k]
    v_pad = F.pad(v, (0, 0, window, right))
    k_span = k_pad.unfold(-2, span, 1)  # [..., n, d_k, span]: a view
    v_span = v_pad.unfold(-2, span, 1).transpose(-2, -1)  # [..., n, span, d_v]
    scores = (q.unsqueeze(-2) @ k_span).squeeze(-2) / math.sqrt(q.shape[-1])  # [..., n, span]
    return (torch.softmax(scores, dim=-1).unsqueeze(-2) @ v_span).squeeze(-2)  # [..., n, d_v]


def _band_dense(q, k, v, window, causal=False):
    """The right numbers the quadratic way: every score, then the band's mask."""
    n = q.shape[-2]
    offset = _offsets(n)
    band = (offset >= -window) & (offset <= _band_right(window, causal))  # [n, n]
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # [..., n, n]
    return torch.softmax(scores.masked_fill(~band, float("-inf")), dim=-1) @ v


_TINY = 1e-9  # a weight above this is "seen"


def _band_weights(case, actual):
    """For a case whose values are the identity: (the weight matrix [n, n] of the first batch
    entry, as the learner's output gives it, window, causal); else None."""
    q, _, v, window = case.args
    n = q.shape[-2]
    if v.shape[-1] != n or not torch.equal(v.reshape(-1, n, n)[0], torch.eye(n, dtype=v.dtype)):
        return None
    if not isinstance(actual, torch.Tensor) or not actual.is_floating_point() or actual.shape != v.shape:
        return None
    return actual.reshape(-1, n, n)[0].double(), window, _causal(case)


def _band_sees_future(case, expected, actual):
    found = _band_weights(case, actual)
    if found is None:
        return False
    w, window, causal = found
    return causal and bool((w.triu(1) > _TINY).any())


def _band_too_wide(case, expected, actual):
    found = _band_weights(case, actual)
    if found is None:
        return False
    w, window, causal = found
    offset = _offsets(w.shape[-1])
    beyond = (offset < -window) | ((offset > window) if not causal else torch.zeros_like(offset, dtype=torch.bool))
    return bool((w[beyond] > _TINY).any())


def _band_side(w, window, causal):
    """[n, n] bool: the in-band keys (the past side only when causal)."""
    offset = _offsets(w.shape[-1])
    return (offset >= -window) & (offset <= _band_right(window, causal))


def _band_edge_left_out(case, expected, actual):
    found = _band_weights(case, actual)
    if found is None:
        return False
    w, window, causal = found
    offset = _offsets(w.shape[-1]).abs()
    band = _band_side(w, window, causal)
    edge, inner = band & (offset == window), band & (offset == window - 1)
    return (window >= 2 and bool(edge.any()) and bool((w[edge] <= _TINY).all())
            and bool((w[inner] > _TINY).any()))


def _band_half_width(case, expected, actual):
    found = _band_weights(case, actual)
    if found is None:
        return False
    w, window, causal = found
    offset = _offsets(w.shape[-1]).abs()
    band = _band_side(w, window, causal)
    far, near = band & (offset > window // 2), band & (offset == window // 2)
    return (window >= 3 and bool(far.any()) and bool((w[far] <= _TINY).all())
            and bool((w[near] > _TINY).any()))


def _band_uneven(case, expected, actual):
    """Some in-band distance d that one query sees and another does not (both keys real): the
    band changes from query to query, as when a block loses its neighbour's keys."""
    found = _band_weights(case, actual)
    if found is None:
        return False
    w, window, causal = found
    n = w.shape[-1]
    for d in range(1, window + 1):
        for sign in ((-1,) if causal else (-1, 1)):
            rows = torch.arange(n)
            rows = rows[(rows + sign * d >= 0) & (rows + sign * d < n)]
            if len(rows) < 2:
                continue
            seen = w[rows, rows + sign * d] > _TINY
            if seen.any() and (~seen).any():
                return True
    return False


def _band_weight_to_padding(case, expected, actual):
    found = _band_weights(case, actual)
    if found is None:
        return False
    w, window, causal = found
    n = w.shape[-1]
    short = w.sum(dim=-1) < 1 - 1e-6  # [n]: rows whose real keys got less than all the weight
    if not short.any():
        return False
    pos = torch.arange(n)
    near_an_end = (pos < window) | (pos >= n - window)
    return bool((short <= near_an_end).all())


def _band_built_n_by_n(case, expected, actual):
    return isinstance(actual, dict) and actual == N_BY_N


def _band_nan(case, expected, actual):
    return (isinstance(actual, torch.Tensor) and actual.is_floating_point() and actual.shape == expected.shape
            and bool((~actual.isfinite()).any()) and bool(expected.isfinite().all()))


check_banded_attention = Checker(
    name="banded_attention",
    reference=banded_attention,
    make_cases=_banded_cases,
    invoke=_invoke_banded,
    rtol=1e-5,
    atol=1e-6,
    mistakes=[
        Mistake(
            "the whole n x n score matrix computed (or the whole band's mask built) and then masked: the right "
            "numbers at quadratic cost",
            "Score each block of queries only against the keys its band can reach, from `window` before the "
            "block's first query to `window` after its last (its own last query when causal), and build the "
            "mask of that block only, from the positions' offsets.",
            _band_dense,
        ),
        Mistake(
            "band off by one: |i - j| < window leaves out the keys exactly `window` steps away",
            "`window` counts the neighbours on each side, ends included: keep the keys with "
            "-window <= j - i <= window (causal: -window <= j - i <= 0).",
            _band_off_by_one,
        ),
        Mistake(
            "window counted as the whole width of the band (window // 2 on each side, Longformer's convention)",
            "In this course `window` counts one side: query i sees the keys i - window .. i + window, "
            "2 * window + 1 keys (causal: i - window .. i).",
            _band_whole_width,
        ),
        Mistake(
            "causal ignored: with causal=True the queries still see the `window` keys after them",
            "With causal=True a query sees no key after itself: the span of a block ends at its last query, and "
            "the block's mask keeps -window <= j - i <= 0.",
            _band_causal_ignored,
        ),
        Mistake(
            "each block's keys start at its own first query: the keys of the previous block are dropped, so the "
            "first queries of a block miss their left neighbours",
            "A block of queries starting at position s reaches back to key s - window (not before 0): start its "
            "span there.",
            _band_previous_block_dropped,
        ),
        Mistake(
            "keys padded with zeros and the padding positions not masked: near the ends of the sequence the "
            "softmax gives weight to keys that do not exist",
            "Padding positions are not keys: hide them in the mask (or slice the real keys only, clamping the "
            "span to 0 .. n - 1) so that each row's weights sum to 1 over real keys.",
            _band_padding_not_masked,
        ),
        Mistake(
            "scores not divided by sqrt(d_k)",
            "Banded attention is scaled dot-product attention on fewer pairs: divide q . k by sqrt(d_k) as usual.",
            _band_not_scaled,
        ),
    ],
    properties=[
        Property(
            "an n x n tensor on the long case (the whole score matrix or the whole mask)",
            "Work block by block: scores [..., b, span] for each block of b queries, and a mask of that size.",
            _band_built_n_by_n,
        ),
        Property(
            "NaN or inf where the reference has numbers (a query whose mask hides every key)",
            "Every query sees at least itself: keep offset 0 in the band, and fill the hidden scores before "
            "the softmax, not after.",
            _band_nan,
        ),
        Property(
            "weight on keys after the query although causal=True",
            "With causal=True keep only the keys with -window <= j - i <= 0.",
            _band_sees_future,
        ),
        Property(
            "weight on keys farther than `window` from the query",
            "Hide every key with |i - j| > window in each block's mask.",
            _band_too_wide,
        ),
        Property(
            "no weight on the keys exactly `window` steps away (a strict < where <= belongs)",
            "The band's ends are included: -window <= j - i <= window.",
            _band_edge_left_out,
        ),
        Property(
            "no weight beyond window // 2 steps: the window counted as the whole width",
            "`window` counts the keys on each side of the query, not the band's whole width.",
            _band_half_width,
        ),
        Property(
            "a band that changes from query to query: some queries miss in-band keys that others at the same "
            "distance see (the first queries of a block lose the keys of the previous block)",
            "Give every block the span from its first query - window to its last query + window (clamped to the "
            "sequence), so that each query sees its whole band.",
            _band_uneven,
        ),
        Property(
            "weights that sum to less than 1 over the real keys for the queries near the ends (padding positions "
            "got a share of the softmax)",
            "Hide the padding positions in the mask, or slice only the real keys.",
            _band_weight_to_padding,
        ),
    ],
)


# ---------------------------------------------------------------------------------------
# Exercise 6: causal_linear_attention(q, k, v) -> [..., n, d_v], by prefix sums
# ---------------------------------------------------------------------------------------


def _linear_cases() -> list[Case]:
    g = seeded(1105)

    def qkv(*batch, n, d_k, d_v, dtype=torch.float32, scale=1.0):
        return (randn(g, *batch, n, d_k, dtype=dtype, scale=scale), randn(g, *batch, n, d_k, dtype=dtype, scale=scale),
                randn(g, *batch, n, d_v, dtype=dtype))

    return [
        Case("one sequence of 6, d_k 4, d_v 3", qkv(1, n=6, d_k=4, d_v=3)),
        Case("batch 2, heads 3, seq 5, d_k 4, d_v 2", qkv(2, 3, n=5, d_k=4, d_v=2)),
        Case("float64, seq 7", qkv(n=7, d_k=3, d_v=3, dtype=torch.float64)),
        Case("one position", qkv(2, n=1, d_k=4, d_v=4), hidden=True),
        Case("seq 16, d_k 8, d_v 5", qkv(2, n=16, d_k=8, d_v=5), hidden=True),
        Case("large queries and keys (scale 3)", qkv(1, n=9, d_k=4, d_v=2, scale=3.0), hidden=True),
        Case("float64, batch 3, seq 4", qkv(3, n=4, d_k=2, d_v=6, dtype=torch.float64), hidden=True),
    ]


def _phi(x):
    return F.elu(x) + 1.0


def _lin_prefix(phi_q, phi_k, v, shift=False, normalise=True):
    kv = (phi_k.unsqueeze(-1) * v.unsqueeze(-2)).cumsum(dim=-3)  # [..., n, d_k, d_v]
    z = phi_k.cumsum(dim=-2)  # [..., n, d_k]
    if shift:  # exclusive prefix sums: keys j < i
        kv = torch.cat([torch.zeros_like(kv[..., :1, :, :]), kv[..., :-1, :, :]], dim=-3)
        z = torch.cat([torch.zeros_like(z[..., :1, :]), z[..., :-1, :]], dim=-2)
    num = (phi_q.unsqueeze(-2) @ kv).squeeze(-2)
    if not normalise:
        return num
    return num / (phi_q * z).sum(dim=-1, keepdim=True)


def _lin_future(q, k, v):
    phi_q, phi_k = _phi(q), _phi(k)
    return (phi_q @ (phi_k.transpose(-2, -1) @ v)) / (phi_q @ phi_k.sum(dim=-2).unsqueeze(-1))


def _lin_exclusive(q, k, v):
    return _lin_prefix(_phi(q), _phi(k), v, shift=True)


def _lin_no_normaliser(q, k, v):
    return _lin_prefix(_phi(q), _phi(k), v, normalise=False)


def _lin_elu_only(q, k, v):
    return _lin_prefix(F.elu(q), F.elu(k), v)


def _lin_scaled(q, k, v):
    return _lin_prefix(_phi(q / math.sqrt(q.shape[-1])), _phi(k), v)


def _value_ranges(v, causal):
    """[..., n, d_v] lowest and highest value each output may average over (positions <= i when causal)."""
    if causal:
        return v.cummin(dim=-2).values, v.cummax(dim=-2).values
    lo, hi = v.amin(dim=-2, keepdim=True), v.amax(dim=-2, keepdim=True)
    return lo.expand_as(v), hi.expand_as(v)


def _lin_output(case, actual):
    v = case.args[2]
    if not isinstance(actual, torch.Tensor) or not actual.is_floating_point() or actual.shape != v.shape:
        return None
    return actual.double()


def _lin_not_an_average(case, expected, actual):
    a = _lin_output(case, actual)
    if a is None:
        return False
    lo, hi = _value_ranges(case.args[2].double(), causal=False)
    tol = 1e-4 * (1 + hi.abs())
    return bool(((a < lo - tol) | (a > hi + tol)).any())


def _lin_future_leaked(case, expected, actual):
    a = _lin_output(case, actual)
    if a is None:
        return False
    v = case.args[2].double()
    lo, hi = _value_ranges(v, causal=False)
    plo, phi = _value_ranges(v, causal=True)
    tol = 1e-4 * (1 + hi.abs())
    inside_all = ((a >= lo - tol) & (a <= hi + tol)).all()
    outside_past = ((a < plo - tol) | (a > phi + tol)).any()
    return bool(inside_all and outside_past)


def _lin_nan(case, expected, actual):
    a = _lin_output(case, actual)
    return a is not None and bool((~a.isfinite()).any()) and bool(expected.isfinite().all())


check_causal_linear_attention = Checker(
    name="causal_linear_attention",
    reference=causal_linear_attention,
    make_cases=_linear_cases,
    # Both compute the answer with causal=True.
    forbidden=("transformer_lib.sparse.linear_attention", "transformer_lib.sparse.linear_attention_quadratic"),
    rtol=1e-4,
    atol=1e-5,
    mistakes=[
        Mistake(
            "the prefix sum includes the future: S and z summed over every position (non-causal linear attention)",
            "Position i may use keys j <= i only: running sums along the sequence, .cumsum(dim=-2) "
            "(dim=-3 for the [..., n, d_k, d_v] outer products), not .sum().",
            _lin_future,
        ),
        Mistake(
            "an exclusive prefix sum: position i sums keys j < i, so it never sees itself (and position 0 "
            "divides 0 by 0)",
            "cumsum includes the current position: S_i = sum over j <= i. Do not shift it by one.",
            _lin_exclusive,
        ),
        Mistake(
            "no normaliser: phi(q_i) . S_i is not divided by phi(q_i) . z_i",
            "Divide by phi(q_i) . z_i, with z_i = cumsum of phi(k_j): the weights of each row must sum to 1.",
            _lin_no_normaliser,
        ),
        Mistake(
            "feature map elu(x) without the + 1: similarities can be negative",
            "phi(x) = F.elu(x) + 1 is positive everywhere, so every weight is positive and the normaliser never 0.",
            _lin_elu_only,
        ),
        Mistake(
            "queries divided by sqrt(d_k) as in softmax attention",
            "Linear attention has no 1/sqrt(d_k): apply phi to q and k as they are.",
            _lin_scaled,
        ),
    ],
    properties=[
        Property(
            "NaN or inf where the reference has numbers (a normaliser of 0: a position that sees no key)",
            "Sum over j <= i, the position itself included, with phi = elu + 1 > 0: the normaliser is then never 0.",
            _lin_nan,
        ),
        Property(
            "outputs that are not averages of the values (outside the range of all values: weights negative or "
            "not summing to 1)",
            "Use phi = elu + 1 (positive) and divide by the normaliser phi(q_i) . z_i.",
            _lin_not_an_average,
        ),
        Property(
            "an output outside the range of the values at positions <= i: the future leaked in",
            "Use prefix sums (cumsum along the sequence), so that position i sums only over j <= i.",
            _lin_future_leaked,
        ),
    ],
)


# ---------------------------------------------------------------------------------------
# Exercise 7: recurrent_linear_attention(q, k, v) -> [..., n, d_v], one running state
# ---------------------------------------------------------------------------------------


RECURRENT_LONG = 256
PER_POSITION = {"__type__": "a state for every position (an [n, d_k, d_v] tensor, such as the prefix sums of "
                            "the previous exercise, or the n x n weights) allocated on the 256-position case, "
                            "instead of one running state"}


def _invoke_recurrent(fn, case: Case):
    q, k, v = case.args
    if q.shape[-2] < RECURRENT_LONG:
        return fn(*case.args, **case.kwargs)
    out, largest = _largest_allocation(fn, *case.args, **case.kwargs)
    n, d_k, d_v = q.shape[-2], q.shape[-1], v.shape[-1]
    return PER_POSITION if largest >= n * d_k * d_v // 4 else out


def _recurrent_cases() -> list[Case]:
    g = seeded(1108)

    def qkv(*batch, n, d_k, d_v, dtype=torch.float32, scale=1.0):
        return (randn(g, *batch, n, d_k, dtype=dtype, scale=scale), randn(g, *batch, n, d_k, dtype=dtype, scale=scale),
                randn(g, *batch, n, d_v, dtype=dtype))

    return [
        Case("one sequence of 6, d_k 4, d_v 3", qkv(1, n=6, d_k=4, d_v=3)),
        Case("batch 2, heads 3, seq 5, d_k 4, d_v 2", qkv(2, 3, n=5, d_k=4, d_v=2)),
        Case("a long sequence: 256 positions, d_k = d_v = 16 (one state, not one per position)",
             qkv(1, n=RECURRENT_LONG, d_k=16, d_v=16)),
        Case("float64, seq 7", qkv(n=7, d_k=3, d_v=3, dtype=torch.float64), hidden=True),
        Case("one position", qkv(2, n=1, d_k=4, d_v=4), hidden=True),
        Case("large queries and keys (scale 3)", qkv(1, n=9, d_k=4, d_v=2, scale=3.0), hidden=True),
        Case("float64, a long sequence of 300, d_k 16, d_v 12", qkv(n=300, d_k=16, d_v=12, dtype=torch.float64),
             hidden=True),
    ]


def _recurrent(q, k, v, phi=_phi, read_first=False, normalise=True, reset=False):
    """The recurrent loop with one state, and the switches for the catalogued mistakes."""
    phi_q, phi_k = phi(q), phi(k)
    S = q.new_zeros(*q.shape[:-2], q.shape[-1], v.shape[-1])  # [..., d_k, d_v]
    z = q.new_zeros(*q.shape[:-2], q.shape[-1])  # [..., d_k]
    outs = []
    for i in range(q.shape[-2]):
        def read():
            num = (phi_q[..., i, None, :] @ S).squeeze(-2)  # [..., d_v]
            return num / (phi_q[..., i, :] * z).sum(-1, keepdim=True) if normalise else num
        if read_first:
            outs.append(read())
        outer = phi_k[..., i, :, None] * v[..., i, None, :]  # [..., d_k, d_v]
        S, z = (outer, phi_k[..., i, :]) if reset else (S + outer, z + phi_k[..., i, :])
        if not read_first:
            outs.append(read())
    return torch.stack(outs, dim=-2)  # [..., n, d_v]


def _rec_read_first(q, k, v):
    return _recurrent(q, k, v, read_first=True)


def _rec_no_normaliser(q, k, v):
    return _recurrent(q, k, v, normalise=False)


def _rec_no_feature_map(q, k, v):
    return _recurrent(q, k, v, phi=lambda x: x)


def _rec_reset(q, k, v):
    return _recurrent(q, k, v, reset=True)


def _rec_prefix_sums(q, k, v):
    return _lin_prefix(_phi(q), _phi(k), v)


def _rec_per_position(case, expected, actual):
    return isinstance(actual, dict) and actual == PER_POSITION


def _rec_only_itself(case, expected, actual):
    a = _lin_output(case, actual)
    if a is None:
        return False
    v = case.args[2].double()
    return (not torch.allclose(expected.double(), v, rtol=1e-4, atol=1e-5)
            and torch.allclose(a, v, rtol=1e-4, atol=1e-5))


check_recurrent_linear_attention = Checker(
    name="recurrent_linear_attention",
    reference=recurrent_linear_attention,
    make_cases=_recurrent_cases,
    invoke=_invoke_recurrent,
    forbidden=("transformer_lib.sparse.causal_linear_attention", "transformer_lib.sparse.linear_attention",
               "transformer_lib.sparse.linear_attention_quadratic"),
    rtol=1e-5,
    atol=1e-5,
    mistakes=[
        Mistake(
            "prefix sums over the whole sequence (a state for every position): the right numbers, but not one "
            "running state",
            "Keep one S [..., d_k, d_v] and one z [..., d_k], and loop over the positions: add position i to "
            "them, read out position i, move on.",
            _rec_prefix_sums,
        ),
        Mistake(
            "the state read before it is updated: position i sees keys j < i only, not its own (and position 0 "
            "divides 0 by 0)",
            "Add phi(k_i) v_i^T to S and phi(k_i) to z first, then read out position i: it attends to keys "
            "j <= i, itself included.",
            _rec_read_first,
        ),
        Mistake(
            "no normaliser: phi(q_i) . S is not divided by phi(q_i) . z",
            "Carry z, the running sum of phi(k_j), beside S, and divide by phi(q_i) . z at each position.",
            _rec_no_normaliser,
        ),
        Mistake(
            "feature map not applied: the raw q and k used, so similarities can be negative (or the normaliser 0)",
            "Apply phi(x) = F.elu(x) + 1 to the queries and the keys before anything else.",
            _rec_no_feature_map,
        ),
        Mistake(
            "the state reset at every step (S = instead of S +=): each position sees only itself, and the output "
            "is just v",
            "S and z accumulate: start them at zero once, before the loop, and add to them at each position.",
            _rec_reset,
        ),
    ],
    properties=[
        Property(
            "a state kept for every position on the long case (a tensor of n x d_k x d_v entries, or n x n)",
            "Loop over the positions with one S [..., d_k, d_v] and one z [..., d_k]; collect only the outputs.",
            _rec_per_position,
        ),
        Property(
            "NaN or inf where the reference has numbers (a normaliser of 0: a position that sees no key)",
            "Update the state with position i before reading it, with phi = elu + 1 > 0: the normaliser is then "
            "never 0.",
            _lin_nan,
        ),
        Property(
            "outputs equal to the values themselves: each position sees only its own key",
            "S and z must carry the whole past: add to them, do not overwrite them.",
            _rec_only_itself,
        ),
        Property(
            "outputs that are not averages of the values (outside the range of all values: weights negative or "
            "not summing to 1)",
            "Use phi = elu + 1 (positive) and divide by the normaliser phi(q_i) . z.",
            _lin_not_an_average,
        ),
        Property(
            "an output outside the range of the values at positions <= i: the future leaked in",
            "Read out position i right after adding position i, before any later position is added.",
            _lin_future_leaked,
        ),
    ],
)


# ---------------------------------------------------------------------------------------
# Exercise 8: online_softmax_step(m, l, acc, scores, v_block) -> (m, l, acc)
# ---------------------------------------------------------------------------------------


def _state_after(scores, v_block):
    """The state after one block from the empty state: what the learner's step receives next."""
    m = scores.amax(dim=-1, keepdim=True)  # [..., L_q, 1]
    p = torch.exp(scores - m)  # [..., L_q, B]
    return m, p.sum(dim=-1, keepdim=True), p @ v_block


def _step_case(g, name, *batch, l_q, b1, b2, d_v, shift=0.0, scale=1.0, first=False, dtype=torch.float32,
               hidden=False):
    s1 = randn(g, *batch, l_q, b1, dtype=dtype, scale=scale)
    v1 = randn(g, *batch, b1, d_v, dtype=dtype)
    s2 = randn(g, *batch, l_q, b2, dtype=dtype, scale=scale, shift=shift)
    v2 = randn(g, *batch, b2, d_v, dtype=dtype)
    if first:
        shape = s2.shape[:-1] + (1,)
        m = torch.full(shape, float("-inf"), dtype=dtype)
        state = (m, torch.zeros(shape, dtype=dtype), torch.zeros(*s2.shape[:-1], d_v, dtype=dtype))
    else:
        state = _state_after(s1, v1)
    return Case(name, (*state, s2, v2), hidden=hidden)


def _step_cases() -> list[Case]:
    g = seeded(1106)
    mixed = _step_case(g, "some rows' maximum grows, others' does not", 2, l_q=4, b1=3, b2=3, d_v=2, hidden=True)
    s2 = mixed.args[3].clone()
    s2[..., ::2, :] += 4.0  # rows 0, 2 get a larger maximum; rows 1, 3 keep theirs
    mixed = Case(mixed.name, (*mixed.args[:3], s2, mixed.args[4]), hidden=True)
    return [
        _step_case(g, "the first block, from the empty state (m = -inf, l = 0, acc = 0)", l_q=3, b1=4, b2=4, d_v=2,
                   first=True),
        _step_case(g, "a block whose maximum is larger (the state must be rescaled)", l_q=3, b1=4, b2=4, d_v=2,
                   shift=3.0),
        _step_case(g, "a block whose maximum is smaller", l_q=3, b1=5, b2=2, d_v=3, shift=-3.0),
        _step_case(g, "batch 2, heads 2, larger maximum", 2, 2, l_q=3, b1=4, b2=5, d_v=2, shift=2.0, hidden=True),
        _step_case(g, "float64, smaller maximum", l_q=5, b1=3, b2=4, d_v=4, shift=-2.0, dtype=torch.float64,
                   hidden=True),
        _step_case(g, "large scores (around 500: exp() of a raw score overflows)", l_q=3, b1=4, b2=4, d_v=2,
                   scale=40.0, shift=500.0, hidden=True),
        _step_case(g, "a block of one key", l_q=4, b1=3, b2=1, d_v=2, shift=1.0, hidden=True),
        mixed,
    ]


def _step_no_rescale(m, l, acc, scores, v_block):
    m_new = torch.maximum(m, scores.amax(dim=-1, keepdim=True))
    p = torch.exp(scores - m_new)
    return m_new, l + p.sum(dim=-1, keepdim=True), acc + p @ v_block


def _step_sum_not_rescaled(m, l, acc, scores, v_block):
    m_new = torch.maximum(m, scores.amax(dim=-1, keepdim=True))
    rescale, p = torch.exp(m - m_new), torch.exp(scores - m_new)
    return m_new, l + p.sum(dim=-1, keepdim=True), rescale * acc + p @ v_block


def _step_acc_not_rescaled(m, l, acc, scores, v_block):
    m_new = torch.maximum(m, scores.amax(dim=-1, keepdim=True))
    rescale, p = torch.exp(m - m_new), torch.exp(scores - m_new)
    return m_new, rescale * l + p.sum(dim=-1, keepdim=True), acc + p @ v_block


def _step_upside_down(m, l, acc, scores, v_block):
    m_new = torch.maximum(m, scores.amax(dim=-1, keepdim=True))
    rescale, p = torch.exp(m_new - m), torch.exp(scores - m_new)
    return m_new, rescale * l + p.sum(dim=-1, keepdim=True), rescale * acc + p @ v_block


def _step_block_max(m, l, acc, scores, v_block):
    m_new = scores.amax(dim=-1, keepdim=True)  # this block's maximum only
    rescale, p = torch.exp(m - m_new), torch.exp(scores - m_new)
    return m_new, rescale * l + p.sum(dim=-1, keepdim=True), rescale * acc + p @ v_block


def _step_tensors(expected, actual):
    if not (isinstance(actual, (tuple, list)) and len(actual) == 3):
        return None
    if not all(isinstance(t, torch.Tensor) and t.is_floating_point() and t.shape == e.shape
               for t, e in zip(actual, expected)):
        return None
    return [t.double() for t in actual], [t.double() for t in expected]


def _step_not_finite(case, expected, actual):
    pair = _step_tensors(expected, actual)
    if pair is None:
        return False
    a, e = pair
    return any(bool((~x.isfinite() & y.isfinite()).any()) for x, y in zip(a, e))


def _step_max_went_down(case, expected, actual):
    pair = _step_tensors(expected, actual)
    if pair is None:
        return False
    m_old = case.args[0].double()
    return bool((pair[0][0] < m_old - 1e-9).any())


def _step_out_of_step(case, expected, actual):
    pair = _step_tensors(expected, actual)
    if pair is None:
        return False
    (m_a, l_a, acc_a), (m_e, l_e, acc_e) = pair
    if not torch.allclose(m_a, m_e):
        return False
    so_far_a, so_far_e = acc_a / l_a, acc_e / l_e  # [..., L_q, d_v]: the output if we stopped here
    return bool(so_far_a.isfinite().all()) and not torch.allclose(so_far_a, so_far_e, rtol=1e-4, atol=1e-5)


check_online_softmax_step = Checker(
    name="online_softmax_step",
    reference=online_softmax_step,
    make_cases=_step_cases,
    rtol=1e-4,
    atol=1e-6,
    mistakes=[
        Mistake(
            "running sum and accumulator not rescaled when the maximum changes",
            "l and acc were summed relative to the old maximum m: multiply both by exp(m - m_new) before "
            "adding this block's terms.",
            _step_no_rescale,
        ),
        Mistake(
            "the accumulator rescaled but not the running sum l",
            "Both sums were taken relative to the old maximum: l_new = exp(m - m_new) * l + p.sum(-1, keepdim=True).",
            _step_sum_not_rescaled,
        ),
        Mistake(
            "the running sum rescaled but not the accumulator acc",
            "Both sums were taken relative to the old maximum: acc_new = exp(m - m_new) * acc + p @ v_block.",
            _step_acc_not_rescaled,
        ),
        Mistake(
            "rescale factor upside down: exp(m_new - m) instead of exp(m - m_new)",
            "The maximum only grows, so the factor exp(m - m_new) is at most 1: it shrinks the old terms "
            "(and is exactly 0 at the start, where m = -inf).",
            _step_upside_down,
        ),
        Mistake(
            "the maximum of this block only, not the running maximum",
            "m_new = torch.maximum(m, scores.amax(dim=-1, keepdim=True)): the largest score seen so far.",
            _step_block_max,
        ),
    ],
    properties=[
        Property(
            "NaN or inf on large inputs where the reference stays finite",
            "Subtract the running maximum before exp(): exp(scores - m_new) and exp(m - m_new) are both <= 1.",
            _step_not_finite,
        ),
        Property(
            "a running maximum that went down",
            "The running maximum covers every key seen so far: torch.maximum(m, scores.amax(dim=-1, keepdim=True)).",
            _step_max_went_down,
        ),
        Property(
            "a running sum and an accumulator that disagree (acc / l is not the softmax average of the values seen)",
            "Scale l and acc by the same factor exp(m - m_new), and add p.sum(-1) to l and p @ v_block to acc.",
            _step_out_of_step,
        ),
    ],
)


CHECKERS = [check_sliding_window_mask, check_dilated_mask, check_global_token_mask, check_receptive_field,
            check_banded_attention, check_causal_linear_attention, check_recurrent_linear_attention,
            check_online_softmax_step]
