"""Checkers for chapter 06, the decoder's masks: the causal mask, the padding mask, the two
combined for the decoder's self-attention, cross-attention over the encoder's memory, and a
softmax that respects a mask (including rows with nothing to attend to), and one decoder layer's
forward pass assembled from the parts of the library's DecoderLayer.

Each checker compares a learner's function with the library (transformer_lib.masks,
transformer_lib.attention) on deterministic cases, and knows the wrong answers learners often
write: a mask upside down, off by one on the diagonal, True meaning "hide", a float mask of
0 / -inf, the padding mask on the query axis, a causal mask in cross-attention, a mask applied
after the softmax... Properties name an error from a trait of the output ("True above the
diagonal", "padding found by comparing with 0"), so two mistakes made at once are still
diagnosed in the learner's terms.
"""

import torch

from transformer_lib.attention import masked_softmax, scaled_dot_product_attention
from transformer_lib.layers import DecoderLayer, add_and_norm, decoder_layer_forward
from transformer_lib.masks import causal_mask, decoder_self_mask, padding_mask

from . import properties
from .core import Case, Checker, Mistake, Property, randn, seeded


def _tokens(lengths, seq, pad_id=0, first_id=None):
    """A [batch, seq] batch of ids; sequence b has lengths[b] real tokens, then padding.
    Real ids never equal pad_id (nor 0, so that a hard-coded 0 is caught when pad_id != 0)."""
    start = max(pad_id, 0) + 1 if first_id is None else first_id
    tokens = torch.full((len(lengths), seq), pad_id, dtype=torch.long)
    for b, n in enumerate(lengths):
        tokens[b, :n] = torch.arange(n) + start + 3 * b
    return tokens


def _tril(n, device=None):
    return torch.ones(n, n, dtype=torch.bool, device=device).tril()


def _visible(mask):
    """Read a learner's mask as 'may attend' booleans, whatever its encoding: a bool tensor as
    it is, a float mask of 0/1 as `!= 0`, an additive float mask of 0/-inf (or a very negative
    number) as `== 0`. None when the output is not a mask at all."""
    if not isinstance(mask, torch.Tensor):
        return None
    if mask.dtype == torch.bool:
        return mask
    values = mask.double()
    if ((values == 0) | (values == 1)).all():
        return values != 0
    if ((values == 0) | (values <= -1e4)).all():
        return values == 0
    return None


# ---------------------------------------------------------------------------------------
# Exercise 1: make_causal_mask(size) -> bool [size, size], True on and below the diagonal
# ---------------------------------------------------------------------------------------


def _mostly_flipped(case, expected, actual):
    """True and False swapped, alone or with a second, smaller error: most of the reference's
    True entries *and* most of its False entries come out the other way. Compared entry by
    entry (flattened), so a mask in another layout is not paired with the wrong tokens, and
    a mask that is merely all True is not called inverted."""
    if not (isinstance(actual, torch.Tensor) and actual.dtype == torch.bool and actual.numel() == expected.numel()):
        return False
    e, a = expected.reshape(-1), actual.reshape(-1)
    flipped = a != e
    return bool(e.any() and (~e).any() and flipped[e].float().mean() > 0.5 and flipped[~e].float().mean() > 0.5)


# The course's generic property, with a test that suits masks of several layouts.
MASK_INVERTED = Property(properties.mask_inverted().name, properties.mask_inverted().fix, _mostly_flipped)


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


def _causal_additive(size):
    # What torch.nn.Transformer.generate_square_subsequent_mask returns: a float mask to *add*.
    return torch.zeros(size, size).masked_fill(~_tril(size), float("-inf"))


def _square_visible(case, actual):
    """The learner's mask as [..., n, n] 'may attend' booleans, or None."""
    vis = _visible(actual)
    n = case.args[0]
    if vis is None or vis.dim() < 2 or tuple(vis.shape[-2:]) != (n, n):
        return None
    return vis


def _sees_the_future(case, expected, actual):
    vis = _square_visible(case, actual)
    if vis is None:
        return False
    n = vis.shape[-1]
    future = torch.ones(n, n, dtype=torch.bool).triu(1)  # [n, n]: key j after query i
    return bool((vis & future).any())


def _hides_the_diagonal(case, expected, actual):
    vis = _square_visible(case, actual)
    return vis is not None and bool((~vis.diagonal(dim1=-2, dim2=-1)).any())


SEES_THE_FUTURE = Property(
    "a causal mask that lets a position see the future (True above the diagonal)",
    "Row i is the query, column j the key: only j <= i may be True, the lower triangle (tril).",
    _sees_the_future,
)
HIDES_THE_DIAGONAL = Property(
    "a causal mask that hides the diagonal (a position cannot attend to itself)",
    "Keep j == i: every token must see itself (row 0 has nothing else), so keep tril's default diagonal=0.",
    _hides_the_diagonal,
)

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
        Mistake(
            "an additive float mask (0 on and below the diagonal, -inf above), the kind "
            "torch.nn.Transformer.generate_square_subsequent_mask returns",
            "This course passes boolean masks, True = may attend, and the attention fills the scores itself: "
            "return torch.ones(size, size, dtype=torch.bool).tril().",
            _causal_additive,
        ),
    ],
    properties=[
        properties.not_a_bool_mask(),
        MASK_INVERTED,
        SEES_THE_FUTURE,
        HIDES_THE_DIAGONAL,
    ],
)


# ---------------------------------------------------------------------------------------
# Exercise 2: make_padding_mask(tokens, pad_id) -> bool [batch, 1, 1, seq]
# ---------------------------------------------------------------------------------------


def _padding_cases() -> list[Case]:
    left_and_middle = torch.tensor([[0, 0, 4, 5, 6], [7, 0, 8, 0, 9]])
    return [
        Case("3 sentences of lengths 5, 3, 1, pad_id 0", (_tokens([5, 3, 1], 5), 0)),
        # Id 0 is a real word here, so a hard-coded 0 and a mask of all True differ.
        Case("pad_id 1 (as in fairseq), id 0 a real token", (torch.tensor([[0, 5, 6, 7, 1, 1], [8, 0, 1, 1, 1, 1]]), 1)),
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


def _pad_additive(tokens, pad_id):
    return torch.zeros(tokens.shape).masked_fill(tokens == pad_id, float("-inf"))[:, None, None, :]


def _same_pattern(mask, target):
    """The learner's mask, flattened, holds the True/False pattern of `target` in either
    polarity (so an inverted or additive encoding still counts)."""
    if mask is None or mask.numel() != target.numel():
        return False
    flat, want = mask.reshape(-1), target.reshape(-1)
    return bool(torch.equal(flat, want) or torch.equal(flat, ~want))


def _pad_on_query_axis(case, expected, actual):
    tokens = case.args[0]
    seq = tokens.shape[-1]
    return (isinstance(actual, torch.Tensor) and seq > 1 and actual.dim() >= 2
            and actual.shape[-1] == 1 and actual.shape[-2] == seq)


def _pad_other_layout(case, expected, actual):
    if not isinstance(actual, torch.Tensor) or actual.shape == expected.shape:
        return False
    if _pad_on_query_axis(case, expected, actual):
        return False  # named by its own property
    return _same_pattern(_visible(actual), expected)


def _pad_compared_with_zero(case, expected, actual):
    tokens, pad_id = case.args
    if pad_id == 0 or not (tokens == 0).any():
        return False  # only a case where id 0 is a real word tells the two comparisons apart
    vis = _visible(actual)
    return _same_pattern(vis, tokens != 0) and not _same_pattern(vis, tokens != pad_id)


PAD_ON_QUERIES = Property(
    "padding on the query axis: whole rows (padded queries) hidden instead of columns (padded keys)",
    "The padded tokens must be hidden as *keys*, the last dim, with a 1 on the query axis: "
    "(tokens != pad_id)[:, None, None, :].",
    _pad_on_query_axis,
)
PAD_OTHER_LAYOUT = Property(
    "the right True/False pattern in another shape than [batch, 1, 1, seq]",
    "Keep the keys on the last axis and put 1s on the heads and query axes, so the mask broadcasts over "
    "both: (tokens != pad_id)[:, None, None, :]. A [batch, seq] mask would line its batch axis up with the queries.",
    _pad_other_layout,
)
PAD_COMPARED_WITH_ZERO = Property(
    "padding found by comparing with 0 instead of the pad_id argument",
    "Compare with the argument: tokens != pad_id (vocabularies put padding at 0, 1, or elsewhere).",
    _pad_compared_with_zero,
)

check_make_padding_mask = Checker(
    name="make_padding_mask",
    reference=padding_mask,
    make_cases=_padding_cases,
    mistakes=[
        Mistake(
            "shape [batch, seq]: the mask has no singleton dims for the heads and the queries; against "
            "scores [batch, heads, L_q, L_k] its batch axis lines up with the queries",
            "Add the two singleton dims in the middle: (tokens != pad_id)[:, None, None, :] -> [batch, 1, 1, seq].",
            _pad_2d,
        ),
        Mistake(
            "shape [batch, 1, seq]: the layout for one head's scores [batch, L_q, L_k] (and MultiHeadAttention "
            "accepts it: it adds the heads axis itself), but this exercise asks for the per-head layout",
            "Add the heads axis too: (tokens != pad_id)[:, None, None, :] -> [batch, 1, 1, seq], which also "
            "broadcasts against per-head scores [batch, heads, L_q, L_k].",
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
        Mistake(
            "an additive float mask (0 at real tokens, -inf at padding) instead of a boolean one",
            "Return booleans, True = may attend: (tokens != pad_id)[:, None, None, :]; the attention fills "
            "the hidden scores itself.",
            _pad_additive,
        ),
    ],
    properties=[
        properties.not_a_bool_mask(),
        MASK_INVERTED,
        PAD_ON_QUERIES,
        PAD_OTHER_LAYOUT,
        PAD_COMPARED_WITH_ZERO,
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


def _combined_visible(case, expected, actual):
    """The learner's mask as booleans broadcast to the reference's [batch, 1, L, L], or None."""
    vis = _visible(actual)
    if vis is None:
        return None
    try:
        return vis.broadcast_to(expected.shape)
    except RuntimeError:
        return None


def _combined_sees_the_future(case, expected, actual):
    vis = _combined_visible(case, expected, actual)
    if vis is None:
        return False
    n = vis.shape[-1]
    return bool((vis & torch.ones(n, n, dtype=torch.bool).triu(1)).any())


def _combined_hides_the_diagonal(case, expected, actual):
    vis = _combined_visible(case, expected, actual)
    if vis is None:
        return False
    diag_e, diag_a = expected.diagonal(dim1=-2, dim2=-1), vis.diagonal(dim1=-2, dim2=-1)
    return bool((diag_e & ~diag_a).any())  # a real token that cannot see itself


def _combined_padding_visible(case, expected, actual):
    vis = _combined_visible(case, expected, actual)
    if vis is None:
        return False
    tokens, pad_id = case.args
    padded_key = (tokens == pad_id)[:, None, None, :]  # [batch, 1, 1, L]
    past = _tril(tokens.shape[-1])  # [L, L]: not a question of the future
    return bool((vis & padded_key & past).any())


def _combined_padded_rows_hidden(case, expected, actual):
    vis = _combined_visible(case, expected, actual)
    if vis is None:
        return False
    tokens, pad_id = case.args
    padded_query = (tokens == pad_id)[:, None, :]  # [batch, 1, L]
    emptied = expected.any(-1) & ~vis.any(-1)  # [batch, 1, L]: rows the reference keeps, the learner empties
    return bool((emptied & padded_query).any())


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
    properties=[
        properties.not_a_bool_mask(),
        MASK_INVERTED,
        Property(
            "a position that may see the future (True above the diagonal)",
            "AND with the causal mask, the lower triangle: key j is visible to query i only if j <= i.",
            _combined_sees_the_future,
        ),
        Property(
            "a real token that may not attend to itself (the diagonal hidden)",
            "The causal part keeps the diagonal: tril with the default diagonal=0.",
            _combined_hides_the_diagonal,
        ),
        Property(
            "a padded key left visible",
            "AND with the padding mask (tokens != pad_id)[:, None, None, :], on the keys (last) axis.",
            _combined_padding_visible,
        ),
        Property(
            "padded queries hidden as whole rows (padding applied to the queries, not the keys)",
            "Put the padding on the key axis, [batch, 1, 1, L]; padded queries keep their rows.",
            _combined_padded_rows_hidden,
        ),
    ],
)


# ---------------------------------------------------------------------------------------
# Exercise 4: cross_attention(x, memory, w_q, w_k, w_v, mask) -> (output, weights)
# ---------------------------------------------------------------------------------------


def cross_attention(x, memory, w_q, w_k, w_v, mask=None):
    """Single-head encoder-decoder attention: queries from the decoder states x, keys and
    values from the encoder's output (the memory), masked by the source padding.

    x: [batch, T, d_model]; memory: [batch, S, d_model]; w_q, w_k: [d_model, d_k]; w_v: [d_model, d_v].
    mask: None or bool broadcastable to [batch, T, S] (the source padding mask [batch, 1, S]).
    Returns (output [batch, T, d_v], weights [batch, T, S]).
    """
    q = x @ w_q  # [batch, T, d_k]: what each target position looks for
    k = memory @ w_k  # [batch, S, d_k]: what each source position offers
    v = memory @ w_v  # [batch, S, d_v]
    return scaled_dot_product_attention(q, k, v, mask=mask)


def _cross_case(g, name, batch, t, s, d_model, d_k, d_v, lengths=None, dtype=torch.float32,
                per_query=False, hidden=False):
    x = randn(g, batch, t, d_model, dtype=dtype)
    memory = randn(g, batch, s, d_model, dtype=dtype)
    w_q, w_k = randn(g, d_model, d_k, dtype=dtype), randn(g, d_model, d_k, dtype=dtype)
    w_v = randn(g, d_model, d_v, dtype=dtype)
    mask = None
    if lengths is not None:
        mask = (_tokens(lengths, s) != 0)[:, None, :]  # [batch, 1, S]: the source padding
        if per_query:
            mask = mask & (torch.rand(batch, t, s, generator=g) < 0.7)  # [batch, T, S]
            mask[..., 0] = True  # every query keeps one key
    return Case(name, (x, memory, w_q, w_k, w_v, mask), hidden=hidden)


def _cross_cases() -> list[Case]:
    g = seeded(606)
    return [
        _cross_case(g, "no padding (mask None), T=5, S=4", 2, 5, 4, 8, 4, 6),
        _cross_case(g, "source padding mask [2, 1, 4], T=5", 2, 5, 4, 8, 4, 6, lengths=[4, 2]),
        _cross_case(g, "3 sentences, S=6 > T=3", 3, 3, 6, 6, 3, 5, lengths=[6, 1, 4]),
        _cross_case(g, "T == S == 4, float64", 2, 4, 4, 8, 2, 3, lengths=[3, 4], dtype=torch.float64, hidden=True),
        _cross_case(g, "one target position", 2, 1, 5, 4, 4, 4, lengths=[5, 2], hidden=True),
        _cross_case(g, "a mask [batch, T, S] per query", 2, 4, 6, 8, 4, 8, lengths=[6, 3], per_query=True,
                    hidden=True),
        _cross_case(g, "no padding (mask None), T=7, S=3", 1, 7, 3, 8, 8, 2, hidden=True),
    ]


def _ca_no_mask(x, memory, w_q, w_k, w_v, mask=None):
    return cross_attention(x, memory, w_q, w_k, w_v, mask=None)


def _ca_causal(x, memory, w_q, w_k, w_v, mask=None):
    t, s = x.shape[-2], memory.shape[-2]
    causal = torch.ones(t, s, dtype=torch.bool).tril()  # [T, S]
    return cross_attention(x, memory, w_q, w_k, w_v, mask=causal if mask is None else causal & mask)


def _ca_no_scale(x, memory, w_q, w_k, w_v, mask=None):
    q, k, v = x @ w_q, memory @ w_k, memory @ w_v
    return scaled_dot_product_attention(q, k, v, mask=mask, scale=1.0)


def _ca_scale_d_model(x, memory, w_q, w_k, w_v, mask=None):
    q, k, v = x @ w_q, memory @ w_k, memory @ w_v
    return scaled_dot_product_attention(q, k, v, mask=mask, scale=x.shape[-1] ** -0.5)


def _weights(output):
    return output[1]


def _cross_shapes(case, expected, actual):
    x, memory = case.args[0], case.args[1]
    t, s = x.shape[-2], memory.shape[-2]
    e_w, a_w = expected[1], actual[1]
    if not (isinstance(a_w, torch.Tensor) and isinstance(e_w, torch.Tensor)):
        return None
    return t, s, e_w, a_w, actual[0]


def _cross_kv_from_decoder(case, expected, actual):
    shapes = _cross_shapes(case, expected, actual)
    if shapes is None:
        return False
    t, s, e_w, a_w, a_out = shapes
    return t != s and a_w.dim() >= 2 and tuple(a_w.shape[-2:]) == (t, t)


def _cross_q_from_memory(case, expected, actual):
    shapes = _cross_shapes(case, expected, actual)
    if shapes is None:
        return False
    t, s, e_w, a_w, a_out = shapes
    return t != s and a_w.dim() >= 2 and a_w.shape[-2] == s and a_w.shape[-1] != s


def _cross_weight_on_hidden(case, expected, actual):
    shapes = _cross_shapes(case, expected, actual)
    mask = case.args[5]
    if shapes is None or mask is None:
        return False
    t, s, e_w, a_w, a_out = shapes
    if a_w.shape != e_w.shape:
        return False
    hidden = ~mask.broadcast_to(e_w.shape)  # [batch, T, S]
    return bool((a_w.double().abs()[hidden] > 1e-6).any())


def _cross_causal(case, expected, actual):
    shapes = _cross_shapes(case, expected, actual)
    if shapes is None:
        return False
    t, s, e_w, a_w, a_out = shapes
    if a_w.shape != e_w.shape or min(t, s) < 2:
        return False
    later = torch.ones(t, s, dtype=torch.bool).triu(1)  # [T, S]: source index after the target index
    e_later, a_later = e_w.double()[..., later], a_w.double()[..., later]
    return bool((e_later > 1e-4).any() and (a_later.abs() < 1e-9).all())


check_cross_attention = Checker(
    name="cross_attention",
    reference=cross_attention,
    make_cases=_cross_cases,
    rtol=1e-4,
    atol=1e-5,
    mistakes=[
        Mistake(
            "the source padding mask ignored: target positions read the padded source tokens",
            "Pass the mask on to the attention (or fill the hidden scores before the softmax): padded source "
            "keys must get weight 0.",
            _ca_no_mask,
        ),
        Mistake(
            "a causal mask in cross-attention: target position i reads only source positions 0..i",
            "Cross-attention has no causal mask: the whole source sentence exists before decoding starts. "
            "Use the source padding mask alone.",
            _ca_causal,
        ),
        Mistake(
            "scores not divided by sqrt(d_k)",
            "Scale the scores q k^T by 1 / sqrt(d_k), d_k = w_q.shape[-1], before the softmax.",
            _ca_no_scale,
        ),
        Mistake(
            "scores divided by sqrt(d_model) instead of sqrt(d_k)",
            "The scale belongs to the size of the vectors compared: d_k = w_q.shape[-1], not x.shape[-1].",
            _ca_scale_d_model,
        ),
    ],
    properties=[
        Property(
            "attention over the decoder's own positions (keys and values taken from x, not from memory)",
            "Queries come from the decoder (x @ w_q); keys and values from the encoder's output "
            "(memory @ w_k, memory @ w_v), so the weights are [batch, T, S].",
            _cross_kv_from_decoder,
        ),
        Property(
            "one row of weights per source position (queries taken from memory: the roles swapped)",
            "The decoder asks, the encoder answers: q = x @ w_q, k = memory @ w_k, v = memory @ w_v.",
            _cross_q_from_memory,
        ),
        Property(
            "weight given to source keys the mask hides",
            "Hide the keys where the mask is False (True = may attend) by filling their *scores* before the "
            "softmax, e.g. scores.masked_fill(~mask, torch.finfo(scores.dtype).min).",
            _cross_weight_on_hidden,
        ),
        Property(
            "no weight at all on source positions after the target position (a causal mask in cross-attention)",
            "Cross-attention has no causal mask: every target position may read the whole (unpadded) source.",
            _cross_causal,
        ),
        properties.rows_do_not_sum_to_one(
            what="the source keys", select=_weights,
            fix="Take the softmax over the keys, dim=-1, after the mask is applied to the scores.",
        ),
    ],
)


# ---------------------------------------------------------------------------------------
# Exercise 5: masked_softmax(scores, mask) -> weights, safe for rows with nothing visible
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


def _ms_layout(case, actual):
    """(hidden [..., L_q, L_k], has_key [..., L_q]) for a learner's output of the right shape."""
    scores, mask = case.args
    if not isinstance(actual, torch.Tensor) or actual.shape != scores.shape or not actual.is_floating_point():
        return None
    mask = mask.broadcast_to(scores.shape)
    return ~mask, mask.any(-1)


def _ms_nan(case, expected, actual):
    return _ms_layout(case, actual) is not None and bool((actual.isnan() & ~expected.isnan()).any())


def _ms_weight_on_hidden(case, expected, actual):
    layout = _ms_layout(case, actual)
    if layout is None:
        return False
    hidden, has_key = layout
    leaked = (actual.double().abs() > 1e-6) & hidden & has_key[..., None]  # rows that do have a visible key
    return bool(leaked.any())


def _ms_empty_rows_not_zero(case, expected, actual):
    layout = _ms_layout(case, actual)
    if layout is None:
        return False
    hidden, has_key = layout
    rows = actual.double()[~has_key]  # [n_empty, L_k]
    return bool(rows.numel()) and bool((rows.isfinite().all(-1) & (rows.abs() > 1e-6).any(-1)).any())


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
    properties=[
        Property(
            "NaN where the reference has numbers (a row whose every key is hidden, filled with -inf)",
            "Fill hidden scores with torch.finfo(scores.dtype).min, a finite number, and zero the rows with no "
            "visible key afterwards.",
            _ms_nan,
        ),
        Property(
            "weight given to keys the mask hides",
            "Hide where the mask is False (True = may attend), and do it on the scores, before the softmax, "
            "with a fill far below any score: torch.finfo(scores.dtype).min.",
            _ms_weight_on_hidden,
        ),
        properties.rows_do_not_sum_to_one(
            what="the keys",
            fix="Mask the scores before the softmax, and take the softmax over the keys, dim=-1.",
        ),
        Property(
            "rows with no visible key that are not all zeros",
            "A query that may see nothing gets zero weights: weights.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0).",
            _ms_empty_rows_not_zero,
        ),
    ],
)


# ---------------------------------------------------------------------------------------
# Exercise 6: decoder_layer_forward(x, memory, src_mask, tgt_mask, layer), from a DecoderLayer's parts
# ---------------------------------------------------------------------------------------

_CALL_THE_DECODER_PARTS = ("calling layer(x, memory, ...) runs the library's own decoder layer: build the forward "
                           "pass from its parts (layer.self_attn, layer.cross_attn, layer.feed_forward, "
                           "layer.norm1-3, layer.dropout1-3)")
ERROR_MESSAGES = (_CALL_THE_DECODER_PARTS,)  # raised in the learner's process: translated at judging


class _ExerciseDecoderLayer(DecoderLayer):
    """The library's DecoderLayer with its forward sealed, so that an answer must use the parts."""

    def forward(self, x, memory, src_mask=None, tgt_mask=None, cache=None):
        raise RuntimeError(_CALL_THE_DECODER_PARTS)


def _build_decoder_layer(kw: dict) -> DecoderLayer:
    """The case's layer: dropout 0.1 in eval mode (so dropout must be a no-op), seeded weights
    (gamma near 1 and beta near 0 but not equal, so a misplaced or missing norm shows)."""
    with torch.random.fork_rng(devices=[]):  # nn.Linear's own initialisation must not move the caller's RNG
        layer = _ExerciseDecoderLayer(kw["d_model"], kw["n_heads"], 2 * kw["d_model"], dropout=0.1,
                                      norm_first=kw["norm_first"])
    layer = layer.to(kw["x"].dtype)
    g = seeded(kw["seed"])
    for name, p in layer.named_parameters():
        noise = torch.randn(p.shape, generator=g, dtype=torch.float64)
        p.data.copy_((1.0 + 0.3 * noise if name.endswith("gamma") else noise / p.shape[-1] ** 0.5).to(p.dtype))
    return layer.eval()


def _invoke_decoder_layer(fn, case: Case):
    """The output, and the output again after the last real target token of every sentence changed:
    a causal layer's earlier positions must not move."""
    kw = case.kwargs
    layer = _build_decoder_layer(kw)
    changed = kw["x"].clone()
    changed[torch.arange(len(kw["tgt_lengths"])), torch.tensor(kw["tgt_lengths"]) - 1] = kw["new_last"]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(kw["seed"])  # dropout wrongly left on gives the same numbers on every run
        out = fn(kw["x"], kw["memory"], kw["src_mask"], kw["tgt_mask"], layer)
        out_changed = fn(changed, kw["memory"], kw["src_mask"], kw["tgt_mask"], layer)
    return {"output": out, "output after the last target token changed": out_changed}


def _decoder_layer_cases() -> list[Case]:
    g = seeded(606)
    cases: list[Case] = []

    def case(name, tgt_lengths, src_lengths, t, s, d_model, n_heads, norm_first, tgt_layout="combined",
             dtype=torch.float32, hidden=False):
        batch = len(tgt_lengths)
        x = randn(g, batch, t, d_model, dtype=dtype, scale=1.5)  # [batch, T, d_model]
        memory = randn(g, batch, s, d_model, dtype=dtype, scale=1.5)  # [batch, S, d_model]
        src = _tokens(src_lengths, s)
        tgt = _tokens(tgt_lengths, t)
        # The masks are built here, not with causal_mask, padding_mask or decoder_self_mask: the grader
        # runs the whole chapter with every exercise's reference hidden, and a case may not need one.
        tgt_keys = (tgt != 0)[:, None, None, :]  # [B, 1, 1, T]
        tgt_mask = _tril(t) & tgt_keys if tgt_layout == "combined" else _tril(t)  # [B, 1, T, T] or [T, T]
        kwargs = dict(d_model=d_model, n_heads=n_heads, norm_first=norm_first, x=x, memory=memory,
                      src_mask=(src != 0)[:, None, None, :], tgt_mask=tgt_mask, tgt_lengths=tgt_lengths,
                      new_last=randn(g, batch, d_model, dtype=dtype, scale=1.5), seed=6060 + len(cases))
        cases.append(Case(name, (), kwargs, hidden))

    case("post-norm, 2 sentences, padded source and target", [5, 3], [4, 2], 5, 4, 16, 4, False)
    case("pre-norm, 2 sentences, padded source and target", [4, 2], [6, 3], 4, 6, 16, 4, True)
    case("post-norm, causal mask [T, T], no target padding", [6, 6], [3, 5], 6, 5, 16, 2, False, tgt_layout="causal")
    case("pre-norm, float64, 3 sentences", [3, 5, 1], [7, 2, 4], 5, 7, 8, 2, True, dtype=torch.float64, hidden=True)
    case("post-norm, float64, 8 heads", [4, 4], [2, 5], 4, 5, 32, 8, False, dtype=torch.float64, hidden=True)
    case("pre-norm, one sentence, causal mask [T, T]", [7], [3], 7, 3, 16, 4, True, tgt_layout="causal", hidden=True)
    return cases


def _self_step(x, layer, tgt_mask, norm):
    return add_and_norm(x, lambda y: layer.dropout1(layer.self_attn(y, y, y, tgt_mask)), norm.gamma, norm.beta,
                        layer.norm_first, norm.eps)


def _cross_step(x, layer, memory, src_mask, norm):
    return add_and_norm(x, lambda y: layer.dropout2(layer.cross_attn(y, memory, memory, src_mask)), norm.gamma,
                        norm.beta, layer.norm_first, norm.eps)


def _ffn_step(x, layer, norm):
    return add_and_norm(x, lambda y: layer.dropout3(layer.feed_forward(y)), norm.gamma, norm.beta, layer.norm_first,
                        norm.eps)


def _dl_no_tgt_mask(x, memory, src_mask, tgt_mask, layer):
    return decoder_layer_forward(x, memory, src_mask, None, layer)


def _dl_no_src_mask(x, memory, src_mask, tgt_mask, layer):
    return decoder_layer_forward(x, memory, None, tgt_mask, layer)


def _dl_cross_reads_decoder(x, memory, src_mask, tgt_mask, layer):
    x = _self_step(x, layer, tgt_mask, layer.norm1)
    x = add_and_norm(x, lambda y: layer.dropout2(layer.cross_attn(y, y, y, tgt_mask)), layer.norm2.gamma,
                     layer.norm2.beta, layer.norm_first, layer.norm2.eps)  # keys and values from the decoder
    return _ffn_step(x, layer, layer.norm3)


def _dl_ffn_before_cross(x, memory, src_mask, tgt_mask, layer):
    x = _self_step(x, layer, tgt_mask, layer.norm1)
    x = _ffn_step(x, layer, layer.norm2)
    return _cross_step(x, layer, memory, src_mask, layer.norm3)


def _dl_one_norm(x, memory, src_mask, tgt_mask, layer):
    x = _self_step(x, layer, tgt_mask, layer.norm1)
    x = _cross_step(x, layer, memory, src_mask, layer.norm1)
    return _ffn_step(x, layer, layer.norm1)


def _dl_memory_normalised(x, memory, src_mask, tgt_mask, layer):
    if not layer.norm_first:
        return decoder_layer_forward(x, memory, src_mask, tgt_mask, layer)
    x = _self_step(x, layer, tgt_mask, layer.norm1)
    x = _cross_step(x, layer, layer.norm2(memory), src_mask, layer.norm2)  # the memory through norm2 as well
    return _ffn_step(x, layer, layer.norm3)


def _dl_always_post_norm(x, memory, src_mask, tgt_mask, layer):
    def post(x, sublayer, norm):
        return norm(x + sublayer(x))

    x = post(x, lambda y: layer.dropout1(layer.self_attn(y, y, y, tgt_mask)), layer.norm1)
    x = post(x, lambda y: layer.dropout2(layer.cross_attn(y, memory, memory, src_mask)), layer.norm2)
    return post(x, lambda y: layer.dropout3(layer.feed_forward(y)), layer.norm3)


def _dl_no_cross_residual(x, memory, src_mask, tgt_mask, layer):
    x = _self_step(x, layer, tgt_mask, layer.norm1)
    if layer.norm_first:
        x = layer.dropout2(layer.cross_attn(layer.norm2(x), memory, memory, src_mask))
    else:
        x = layer.norm2(layer.dropout2(layer.cross_attn(x, memory, memory, src_mask)))
    return _ffn_step(x, layer, layer.norm3)


def _dl_dropout_left_on(x, memory, src_mask, tgt_mask, layer):
    def drop(t):
        return torch.nn.functional.dropout(t, layer.dropout1.p)  # training=True by default

    def step(x, sublayer, norm):
        return add_and_norm(x, lambda y: drop(sublayer(y)), norm.gamma, norm.beta, layer.norm_first, norm.eps)

    x = step(x, lambda y: layer.self_attn(y, y, y, tgt_mask), layer.norm1)
    x = step(x, lambda y: layer.cross_attn(y, memory, memory, src_mask), layer.norm2)
    return step(x, layer.feed_forward, layer.norm3)


def _earlier_positions_moved(case, expected, actual):
    """The future leaks: changing each sentence's last real target token moved an earlier output."""
    out, changed = actual["output"], actual["output after the last target token changed"]
    if not isinstance(out, torch.Tensor) or not isinstance(changed, torch.Tensor) or out.shape != changed.shape:
        return False
    lengths = case.kwargs["tgt_lengths"]
    return any(bool((out[b, : n - 1] - changed[b, : n - 1]).abs().max() > 1e-6) for b, n in enumerate(lengths)
               if n > 1)


def _post_norm_not_ending_in_norm3(case, expected, actual):
    kw = case.kwargs
    out, ref = actual["output"], expected["output"]
    if kw["norm_first"] or not isinstance(out, torch.Tensor) or out.shape != ref.shape:
        return False
    norm3 = _build_decoder_layer(kw).norm3
    gamma, beta = norm3.gamma.detach().double(), norm3.beta.detach().double()

    def normalised(t):
        t = ((t.double() - beta) / gamma)
        return bool(((t.mean(-1).abs() < 1e-3) & ((t.var(-1, unbiased=False) - 1).abs() < 0.05)).all())

    return normalised(ref) and not normalised(out)


check_decoder_layer_forward = Checker(
    name="decoder_layer_forward",
    reference=decoder_layer_forward,
    make_cases=_decoder_layer_cases,
    invoke=_invoke_decoder_layer,
    rtol=1e-4,
    atol=1e-5,
    mistakes=[
        Mistake(
            "the target mask not passed to the self-attention: every position reads the target tokens after it",
            "Pass tgt_mask to the masked self-attention, layer.self_attn(y, y, y, tgt_mask): that is what makes "
            "the decoder causal.",
            _dl_no_tgt_mask,
        ),
        Mistake(
            "the source mask not passed to the cross-attention: the target reads the padded source positions",
            "Pass src_mask to the cross-attention, layer.cross_attn(y, memory, memory, src_mask).",
            _dl_no_src_mask,
        ),
        Mistake(
            "the cross-attention reads the decoder's own states instead of the encoder's memory",
            "Queries come from the decoder, keys and values from the memory: layer.cross_attn(y, memory, memory, "
            "src_mask).",
            _dl_cross_reads_decoder,
        ),
        Mistake(
            "the feed-forward network before the cross-attention",
            "The order is masked self-attention, cross-attention, then the FFN, each with its own norm (norm1, "
            "norm2, norm3).",
            _dl_ffn_before_cross,
        ),
        Mistake(
            "the same LayerNorm (norm1) used around all three sub-layers",
            "Each sub-layer has its own LayerNorm: norm1 around the self-attention, norm2 around the "
            "cross-attention, norm3 around the FFN.",
            _dl_one_norm,
        ),
        Mistake(
            "pre-norm: the encoder's memory normalised too (it went through norm2 with the decoder's stream)",
            "Only the decoder's stream is normalised before a sub-layer: layer.cross_attn(layer.norm2(x), memory, "
            "memory, src_mask). The memory is the encoder's output as it is.",
            _dl_memory_normalised,
        ),
        Mistake(
            "norm_first ignored: post-norm even when layer.norm_first is True",
            "If layer.norm_first, normalise before each sub-layer and add the raw input: x = x + sublayer(norm(x)) "
            "(add_and_norm_impl with norm_first does it).",
            _dl_always_post_norm,
        ),
        Mistake(
            "no residual connection around the cross-attention",
            "Wrap the cross-attention like the two other sub-layers: norm2(x + cross(x)) in post-norm, "
            "x + cross(norm2(x)) in pre-norm.",
            _dl_no_cross_residual,
        ),
        Mistake(
            "dropout left on: torch.nn.functional.dropout (training=True by default) used while the layer is in "
            "eval mode",
            "Use the layer's own modules, layer.dropout1, layer.dropout2 and layer.dropout3: they drop only in "
            "training mode.",
            _dl_dropout_left_on,
        ),
    ],
    properties=[
        Property(
            "earlier outputs that change when a later target token changes (the future leaks into the past)",
            "Only the masked self-attention mixes target positions: give it tgt_mask (causal AND padding), and "
            "let the cross-attention read the memory, never the decoder's own states.",
            _earlier_positions_moved,
        ),
        Property(
            "a post-norm output that is not norm3's output (undo norm3's gamma and beta, and its vectors do not "
            "have mean 0 and variance 1)",
            "In post-norm (norm_first False) each sub-layer ends with its LayerNorm, applied to the sum; the last "
            "one is norm3 around the FFN, and nothing is added after it.",
            _post_norm_not_ending_in_norm3,
        ),
        properties.shape_permuted("A decoder layer keeps the shape [batch, T, d_model]: no transpose is needed.",
                                  select=lambda out: out["output"] if isinstance(out, dict) else out),
    ],
)


CHECKERS = [check_make_causal_mask, check_make_padding_mask, check_combine_decoder_mask, check_cross_attention,
            check_masked_softmax, check_decoder_layer_forward]
