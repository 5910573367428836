"""Checkers for chapter 06, the decoder's masks: the causal mask, the padding mask, the two
combined for the decoder's self-attention, and a softmax that respects a mask (including
rows with nothing to attend to).

Each checker compares a learner's function with the library (transformer_lib.masks,
transformer_lib.attention.masked_softmax) on deterministic cases, and knows the wrong
answers learners often write: a mask upside down, off by one on the diagonal, True meaning
"hide", the padding mask unsqueezed in the wrong place, a mask applied after the softmax...
"""

import torch

from transformer_lib.attention import masked_softmax
from transformer_lib.masks import causal_mask, decoder_self_mask, padding_mask

from .core import Case, Checker, Mistake, randn, seeded


def _tokens(lengths, seq, pad_id=0, first_id=None):
    """A [batch, seq] batch of ids; sequence b has lengths[b] real tokens, then padding.
    Real ids never equal pad_id (nor 0, so that a hard-coded 0 is caught when pad_id != 0)."""
    start = max(pad_id, 0) + 1 if first_id is None else first_id
    tokens = torch.full((len(lengths), seq), pad_id, dtype=torch.long)
    for b, n in enumerate(lengths):
        tokens[b, :n] = torch.arange(n) + start + 3 * b
    return tokens


# ---------------------------------------------------------------------------------------
# Exercise 1: make_causal_mask(size) -> bool [size, size], True on and below the diagonal
# ---------------------------------------------------------------------------------------


def _causal_cases() -> list[Case]:
    return [
        Case("size 4", (4,)),
        Case("size 5", (5,)),
        Case("size 1 (a single token sees itself)", (1,)),
        Case("size 2", (2,), hidden=True),
        Case("size 7", (7,), hidden=True),
        Case("size 12", (12,), hidden=True),
    ]


def _causal_upper(size):
    return torch.ones(size, size, dtype=torch.bool).triu()


def _causal_strict(size):
    return torch.ones(size, size, dtype=torch.bool).tril(diagonal=-1)


def _causal_true_hides(size):
    return torch.ones(size, size, dtype=torch.bool).triu(diagonal=1)


def _causal_float(size):
    return torch.ones(size, size).tril()


check_make_causal_mask = Checker(
    name="make_causal_mask",
    reference=causal_mask,
    make_cases=_causal_cases,
    mistakes=[
        Mistake(
            "upper triangle instead of lower (triu): every position sees the future and none of the past",
            "Row i is the query, column j the key: keep j <= i, the lower triangle, torch.ones(...).tril().",
            _causal_upper,
        ),
        Mistake(
            "diagonal left out (tril(diagonal=-1)): position i may not attend to itself, and row 0 sees nothing",
            "Keep the diagonal: j <= i, not j < i. Use .tril() with the default diagonal=0.",
            _causal_strict,
        ),
        Mistake(
            "True used for 'hide' (triu(diagonal=1), the future marked True): the mask is inverted",
            "In this course True means 'may attend': return the lower triangle with the diagonal, "
            "which is the negation of what you have (~mask).",
            _causal_true_hides,
        ),
        Mistake(
            "a float mask of ones and zeros instead of a boolean one",
            "Build it with dtype=torch.bool (or call .bool()): masked_fill(~mask, ...) needs booleans.",
            _causal_float,
        ),
    ],
)


# ---------------------------------------------------------------------------------------
# Exercise 2: make_padding_mask(tokens, pad_id) -> bool [batch, 1, 1, seq]
# ---------------------------------------------------------------------------------------


def _padding_cases() -> list[Case]:
    left_and_middle = torch.tensor([[0, 0, 4, 5, 6], [7, 0, 8, 0, 9]])
    return [
        Case("3 sentences of lengths 5, 3, 1, pad_id 0", (_tokens([5, 3, 1], 5), 0)),
        Case("pad_id 1 (as in fairseq)", (_tokens([4, 2], 6, pad_id=1), 1)),
        Case("no padding at all", (_tokens([4], 4), 0)),
        Case("padding on the left and in the middle", (left_and_middle, 0), hidden=True),
        Case("pad_id 3, int32 ids", (_tokens([2, 6, 4, 1], 6, pad_id=3).to(torch.int32), 3), hidden=True),
        Case("one token, padded to 7", (_tokens([1], 7, pad_id=2), 2), hidden=True),
    ]


def _pad_2d(tokens, pad_id):
    return tokens != pad_id


def _pad_3d(tokens, pad_id):
    return (tokens != pad_id)[:, None, :]


def _pad_on_queries(tokens, pad_id):
    return (tokens != pad_id)[:, None, :, None]


def _pad_inverted(tokens, pad_id):
    return (tokens == pad_id)[:, None, None, :]


def _pad_zero(tokens, pad_id):
    return (tokens != 0)[:, None, None, :]


check_make_padding_mask = Checker(
    name="make_padding_mask",
    reference=padding_mask,
    make_cases=_padding_cases,
    mistakes=[
        Mistake(
            "shape [batch, seq]: the mask has no singleton dims for the heads and the queries, "
            "so it does not broadcast against scores [batch, heads, L_q, L_k]",
            "Add the two singleton dims in the middle: (tokens != pad_id)[:, None, None, :] -> [batch, 1, 1, seq].",
            _pad_2d,
        ),
        Mistake(
            "shape [batch, 1, seq]: broadcast against [batch, heads, L_q, L_k] the batch dim lines up "
            "with the heads dim",
            "Use two singleton dims, not one: (tokens != pad_id)[:, None, None, :] -> [batch, 1, 1, seq].",
            _pad_3d,
        ),
        Mistake(
            "padding put on the query axis, shape [batch, 1, seq, 1]: it hides whole rows (queries) "
            "instead of the padded keys (columns)",
            "The padded tokens must be hidden as *keys*, the last dim: (tokens != pad_id)[:, None, None, :].",
            _pad_on_queries,
        ),
        Mistake(
            "mask inverted: True at the padding tokens",
            "True means 'may attend', so a real token is True: tokens != pad_id, not tokens == pad_id.",
            _pad_inverted,
        ),
        Mistake(
            "padding id hard-coded as 0 instead of the pad_id argument",
            "Compare with the argument: tokens != pad_id (vocabularies put padding at 0, 1, or elsewhere).",
            _pad_zero,
        ),
    ],
)


# ---------------------------------------------------------------------------------------
# Exercise 3: combine_decoder_mask(tokens, pad_id) -> bool [batch, 1, L, L]
# ---------------------------------------------------------------------------------------


def _combine_cases() -> list[Case]:
    return [
        Case("3 targets of lengths 5, 3, 1, pad_id 0", (_tokens([5, 3, 1], 5), 0)),
        Case("pad_id 1, length 6", (_tokens([6, 2], 6, pad_id=1), 1)),
        Case("2 targets of lengths 4, 2, pad_id 0", (_tokens([4, 2], 4), 0)),
        Case("no padding at all", (_tokens([3], 3), 0), hidden=True),
        Case("pad_id 2, length 7, int32 ids", (_tokens([7, 1, 5], 7, pad_id=2).to(torch.int32), 2), hidden=True),
        Case("a single token", (_tokens([1, 1], 1), 0), hidden=True),
    ]


def _tril(n, device=None):
    return torch.ones(n, n, dtype=torch.bool, device=device).tril()


def _combine_or(tokens, pad_id):
    return _tril(tokens.shape[-1]) | (tokens != pad_id)[:, None, None, :]


def _combine_causal_only(tokens, pad_id):
    return _tril(tokens.shape[-1])


def _combine_padding_only(tokens, pad_id):
    return (tokens != pad_id)[:, None, None, :]


def _combine_pad_on_queries(tokens, pad_id):
    return _tril(tokens.shape[-1]) & (tokens != pad_id)[:, None, :, None]


def _combine_upper(tokens, pad_id):
    n = tokens.shape[-1]
    return torch.ones(n, n, dtype=torch.bool).triu() & (tokens != pad_id)[:, None, None, :]


check_combine_decoder_mask = Checker(
    name="combine_decoder_mask",
    reference=decoder_self_mask,
    make_cases=_combine_cases,
    mistakes=[
        Mistake(
            "masks combined with OR (|): a key hidden by only one of the two masks stays visible",
            "A key is visible only if *both* masks allow it: causal & padding.",
            _combine_or,
        ),
        Mistake(
            "padding forgotten: only the causal mask [L, L] is returned",
            "Combine it with the padding mask [batch, 1, 1, L]: causal & padding broadcasts to [batch, 1, L, L].",
            _combine_causal_only,
        ),
        Mistake(
            "causal mask forgotten: only the padding mask [batch, 1, 1, L] is returned",
            "The decoder must not see the future: AND it with the lower-triangular [L, L] causal mask.",
            _combine_padding_only,
        ),
        Mistake(
            "padding applied to the query rows instead of the key columns (shape [batch, 1, L, 1] before the AND)",
            "Hide padded *keys*: the padding mask is (tokens != pad_id)[:, None, None, :], shape [batch, 1, 1, L].",
            _combine_pad_on_queries,
        ),
        Mistake(
            "causal part upside down (upper triangle, triu): each position sees the future, not the past",
            "Keep key j for query i when j <= i: the lower triangle, torch.ones(L, L, dtype=torch.bool).tril().",
            _combine_upper,
        ),
    ],
)


# ---------------------------------------------------------------------------------------
# Exercise 4: masked_softmax(scores, mask) -> weights, safe for rows with nothing visible
# ---------------------------------------------------------------------------------------


def _masked_softmax_cases() -> list[Case]:
    g = seeded(604)
    causal4 = _tril(4)
    pad = (_tokens([5, 3], 5) != 0)[:, None, None, :]  # [2, 1, 1, 5]
    empty_row = torch.tensor([[True, False, True, True],
                              [False, False, False, False],  # this query may see nothing
                              [False, True, False, False]])
    half_mask = _tril(6) & torch.tensor([True, True, True, False, False, False])  # [6, 6]
    half_mask[0] = False  # and one empty row
    random_mask = torch.rand(2, 5, 6, generator=g) < 0.5
    random_mask[0, 3] = False
    return [
        Case("causal mask on 4 x 4 scores", (randn(g, 4, 4, scale=2.0), causal4)),
        Case("padding mask [2, 1, 1, 5] on scores [2, 2, 3, 5]", (randn(g, 2, 2, 3, 5, scale=2.0), pad)),
        Case("a query that may see no key (row 1)", (randn(g, 3, 4, scale=2.0), empty_row)),
        Case("float16, an empty row", (randn(g, 6, 6, dtype=torch.float16, scale=2.0), half_mask)),
        Case("float64, random mask with an empty row", (randn(g, 2, 5, 6, dtype=torch.float64, scale=3.0),
                                                         random_mask), hidden=True),
        Case("large scores under a causal mask", (randn(g, 5, 5, scale=60.0), _tril(5)), hidden=True),
        Case("mask [L_k] shared by every query", (randn(g, 3, 5), torch.tensor([True, False, True, True, False])),
             hidden=True),
        Case("every key hidden", (randn(g, 2, 3, 3), torch.zeros(3, 3, dtype=torch.bool)), hidden=True),
    ]


def _softmax(x):
    e = (x - x.amax(dim=-1, keepdim=True)).exp()
    return e / e.sum(dim=-1, keepdim=True)


def _ms_after(scores, mask):
    return _softmax(scores).masked_fill(~mask, 0.0)


def _ms_fill_zero(scores, mask):
    return _softmax(scores.masked_fill(~mask, 0.0))


def _ms_minus_inf(scores, mask):
    return _softmax(scores.masked_fill(~mask, float("-inf")))


def _ms_rows_not_zeroed(scores, mask):
    return _softmax(scores.masked_fill(~mask, torch.finfo(scores.dtype).min))


def _ms_inverted(scores, mask):
    return masked_softmax(scores, ~mask)


check_masked_softmax = Checker(
    name="masked_softmax",
    reference=masked_softmax,
    make_cases=_masked_softmax_cases,
    # float16 has ~3 significant digits: a correct answer computed in another order (or with
    # torch.softmax, which works in float32 inside) differs from the reference by ~5e-4.
    rtol=1e-3,
    atol=1e-3,
    mistakes=[
        Mistake(
            "mask applied after the softmax: hidden keys zeroed, the remaining weights no longer sum to 1",
            "Mask the *scores* before the softmax: scores.masked_fill(~mask, torch.finfo(scores.dtype).min).",
            _ms_after,
        ),
        Mistake(
            "hidden scores set to 0 instead of a very negative number (exp(0) = 1: hidden keys still get weight)",
            "Fill them with the dtype's most negative value, torch.finfo(scores.dtype).min, so their exp is 0.",
            _ms_fill_zero,
        ),
        Mistake(
            "hidden scores set to -inf: a row with no visible key becomes -inf - (-inf) = NaN",
            "Fill with torch.finfo(scores.dtype).min (finite), and set rows with no visible key to 0: "
            "weights.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0).",
            _ms_minus_inf,
        ),
        Mistake(
            "rows with no visible key left as they come out of softmax: a uniform average over keys that are all hidden",
            "After the softmax, zero the rows with nothing visible: weights.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0).",
            _ms_rows_not_zeroed,
        ),
        Mistake(
            "mask meaning inverted: the keys marked True were hidden",
            "True means 'may attend': hide where the mask is False, scores.masked_fill(~mask, ...).",
            _ms_inverted,
        ),
    ],
)


CHECKERS = [check_make_causal_mask, check_make_padding_mask, check_combine_decoder_mask, check_masked_softmax]
