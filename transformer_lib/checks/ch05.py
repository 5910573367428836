"""Checkers for chapter 05, Add & Norm and the feed-forward network: layer_norm, batch_norm,
feed_forward, add_and_norm (post-norm and pre-norm residual sub-layers), encoder_layer_forward
(one encoder layer, from the library's EncoderLayer's parts) and encoder_forward (the stack).

Each checker compares a learner's answer with the library (transformer_lib.layers) on
deterministic cases and knows the wrong answers learners often write: LayerNorm over the
batch, torch.var's unbiased default, eps outside the square root, padding counted in
BatchNorm's statistics, a ReLU too many, the norm on the wrong side of the residual, the
mask dropped, dropout left on, the final LayerNorm of a pre-norm stack forgotten, ...
Properties name the errors a catalogue entry cannot, when two mistakes come together:
vectors that do not come out with mean 0 and variance 1, NaN on a constant vector, a
post-norm layer whose output is not its last LayerNorm's.
"""

import math

import torch
import torch.nn.functional as F

from transformer_lib.layers import (Encoder, EncoderLayer, LayerNorm, PositionwiseFeedForward, add_and_norm,
                                    batch_norm, encoder_forward, encoder_layer_forward, feed_forward, layer_norm)
from transformer_lib.masks import padding_mask

from . import properties
from .core import Case, Checker, Mistake, Property, randn, seeded


def _gamma_beta(g: torch.Generator, d: int, dtype=torch.float32):
    """A gamma near 1 and a beta near 0, but far enough from them that forgetting them shows."""
    return randn(g, d, dtype=dtype, scale=0.5, shift=1.0), randn(g, d, dtype=dtype, scale=0.5)


def _normalised(t: torch.Tensor, dims) -> torch.Tensor:
    """True where the vectors along `dims` have mean 0 and (biased) variance 1, per vector."""
    t = t.double()
    return (t.mean(dims).abs() < 1e-3) & ((t.var(dims, unbiased=False) - 1).abs() < 0.05)


# ---------------------------------------------------------------------------------------
# Exercise 1: layer_norm(x, gamma, beta, eps=1e-5)
# ---------------------------------------------------------------------------------------


def _layer_norm_cases() -> list[Case]:
    g = seeded(501)
    cases = []

    def add(name, x, hidden=False, unit=False, **kwargs):
        gamma, beta = _gamma_beta(g, x.shape[-1], x.dtype)
        if unit:  # gain 1, bias 0: the output itself must have mean 0 and variance 1 per vector
            gamma, beta = torch.ones_like(gamma), torch.zeros_like(beta)
        cases.append(Case(name, (x, gamma, beta), kwargs, hidden))

    add("one sentence, 5 positions x 8 features", randn(g, 5, 8, scale=2.0, shift=1.0))
    add("batch of 3 sentences", randn(g, 3, 4, 6, scale=3.0, shift=-2.0))
    # Variance 1e-6, below eps = 1e-5: where eps goes changes the answer completely.
    add("tiny values (variance below eps)", randn(g, 4, 6, scale=1e-3))
    add("float64, two batch dims", randn(g, 2, 3, 4, 10, dtype=torch.float64, scale=2.0), hidden=True)
    add("large offset, float64", randn(g, 3, 16, dtype=torch.float64, scale=50.0, shift=1000.0), hidden=True)
    add("eps = 0.1 passed by keyword", randn(g, 2, 5, 8, scale=0.5), hidden=True, eps=0.1)
    add("a single feature (d = 1): the output is beta", randn(g, 4, 1), hidden=True)
    add("one vector", randn(g, 12, scale=4.0), hidden=True)
    # Gain 1 and bias 0 (small d, where d and d - 1 differ by a lot): the output's own statistics
    # show a wrong axis or a wrong variance, whatever else is wrong too.
    add("gain 1, bias 0: every row comes out with mean 0, variance 1", randn(g, 4, 6, scale=2.0, shift=3.0),
        unit=True)
    add("gain 1, bias 0, batch of 2", randn(g, 2, 3, 5, scale=4.0, shift=-1.0), unit=True, hidden=True)
    # Constant rows, exactly representable (their mean is exact): variance 0, so only eps keeps
    # the division finite; LayerNorm returns beta there.
    x = randn(g, 4, 6, scale=2.0)
    x[1] = 2.0
    x[3] = -0.5
    add("rows 1 and 3 constant (variance 0)", x)
    x = randn(g, 2, 3, 8, dtype=torch.float64)
    x[0, 2] = 4.0
    add("a constant position, float64", x, hidden=True)
    return cases


def _constant_rows(x: torch.Tensor) -> torch.Tensor:
    """True for the vectors (along the last dim, d > 1) whose entries are all equal."""
    if x.shape[-1] < 2:
        return torch.zeros(x.shape[:-1], dtype=torch.bool)
    return x.amax(dim=-1) == x.amin(dim=-1)


def _nan_on_constant_rows() -> Property:
    def seen(case, expected, actual):
        x = case.args[0]
        if not isinstance(actual, torch.Tensor) or actual.shape != expected.shape:
            return False
        rows = _constant_rows(x)
        bad = ~actual.isfinite().all(dim=-1) & expected.isfinite().all(dim=-1)
        return bool((rows & bad).any())

    return Property(
        "NaN or inf on a constant vector (variance 0), where LayerNorm returns beta",
        "eps keeps the division finite: (x - mean) / torch.sqrt(var + eps), with eps inside the square root.",
        seen,
    )


def _ln_over(x, gamma, beta, eps, dims, unbiased=False, eps_outside=False):
    mean = x.mean(dim=dims, keepdim=True)
    squares = ((x - mean) ** 2).sum(dim=dims, keepdim=True)
    n = x.numel() // squares.numel()  # values per statistic
    # Written out rather than x.var(unbiased=True), which warns when n = 1 (and gives NaN, as here).
    var = squares / (n - 1) if unbiased else squares / n
    scale = var.sqrt() + eps if eps_outside else torch.sqrt(var + eps)
    return gamma * (x - mean) / scale + beta


def _ln_over_batch(x, gamma, beta, eps=1e-5):
    return _ln_over(x, gamma, beta, eps, 0)


def _ln_whole_tensor(x, gamma, beta, eps=1e-5):
    return _ln_over(x, gamma, beta, eps, tuple(range(x.dim())))


def _ln_unbiased(x, gamma, beta, eps=1e-5):
    return _ln_over(x, gamma, beta, eps, -1, unbiased=True)


def _ln_eps_outside(x, gamma, beta, eps=1e-5):
    return _ln_over(x, gamma, beta, eps, -1, eps_outside=True)


def _ln_annotated(x, gamma, beta, eps=1e-5):
    return _ln_over(x, gamma, beta, eps, -1, unbiased=True, eps_outside=True)


def _ln_no_eps(x, gamma, beta, eps=1e-5):
    return _ln_over(x, gamma, beta, 0.0, -1)


def _ln_no_affine(x, gamma, beta, eps=1e-5):
    return _ln_over(x, torch.ones_like(gamma), torch.zeros_like(beta), eps, -1)


def _ln_gamma_beta_swapped(x, gamma, beta, eps=1e-5):
    return _ln_over(x, beta, gamma, eps, -1)


check_layer_norm = Checker(
    name="layer_norm",
    reference=layer_norm,
    make_cases=_layer_norm_cases,
    mistakes=[
        Mistake(
            "statistics taken over the first dimension (dim=0, across the batch or the sentence: BatchNorm-style) "
            "instead of over each vector's own features",
            "LayerNorm normalises every position by itself: mean and variance over the last dimension, "
            "x.mean(dim=-1, keepdim=True).",
            _ln_over_batch,
        ),
        Mistake(
            "one mean and one variance for the whole tensor (x.mean() without a dim)",
            "Every position gets its own statistics: reduce over dim=-1 only, with keepdim=True.",
            _ln_whole_tensor,
        ),
        Mistake(
            "unbiased variance (torch.var's default divides by d - 1)",
            "LayerNorm uses the biased variance, dividing by d: x.var(dim=-1, keepdim=True, unbiased=False), "
            "or ((x - mean) ** 2).mean(dim=-1, keepdim=True).",
            _ln_unbiased,
        ),
        Mistake(
            "eps added to the standard deviation instead of to the variance (std + eps)",
            "Put eps inside the square root: (x - mean) / torch.sqrt(var + eps).",
            _ln_eps_outside,
        ),
        Mistake(
            "x.std() + eps: unbiased standard deviation and eps outside the square root "
            "(the Annotated Transformer's variant, not torch.nn.LayerNorm)",
            "Use the biased variance and put eps inside the root: torch.sqrt(x.var(dim=-1, keepdim=True, "
            "unbiased=False) + eps).",
            _ln_annotated,
        ),
        Mistake(
            "eps left out (x - mean) / sqrt(var): a nearly constant vector gets blown up, a constant one gives NaN",
            "Add eps to the variance, inside the square root: torch.sqrt(var + eps).",
            _ln_no_eps,
        ),
        Mistake(
            "gamma and beta not applied (the plain normalised x returned)",
            "Scale and shift at the end: gamma * x_hat + beta. They let the model undo the normalisation "
            "where it needs to.",
            _ln_no_affine,
        ),
        Mistake(
            "gamma and beta swapped (beta * x_hat + gamma)",
            "gamma multiplies, beta is added: gamma * x_hat + beta.",
            _ln_gamma_beta_swapped,
        ),
    ],
    properties=[
        properties.not_zero_mean_unit_variance(
            dim=-1,
            fix="Each vector (the last dimension) is normalised by itself: mean and variance over dim=-1 with "
                "keepdim=True, the variance divided by d (unbiased=False), never over the batch or the positions.",
        ),
        _nan_on_constant_rows(),
        properties.shape_permuted("LayerNorm keeps the input's shape [..., d]: reduce with keepdim=True and "
                                  "never transpose or permute x."),
    ],
)


# ---------------------------------------------------------------------------------------
# Exercise 2: batch_norm(x, mask=None, eps=1e-5), for the LayerNorm-vs-BatchNorm comparison
# ---------------------------------------------------------------------------------------


def _lengths_mask(lengths: list[int], seq: int) -> torch.Tensor:
    return torch.arange(seq)[None, :] < torch.tensor(lengths)[:, None]  # [batch, seq], True = real token


def _padded(g: torch.Generator, lengths: list[int], seq: int, d: int, dtype=torch.float32, **kw):
    """A batch of sequences of the given lengths, zero vectors at the padding (as pad_batch makes)."""
    mask = _lengths_mask(lengths, seq)
    return randn(g, len(lengths), seq, d, dtype=dtype, **kw) * mask[..., None], mask


def _batch_norm_cases() -> list[Case]:
    g = seeded(505)
    cases = [Case("3 sentences of 5 tokens, no mask", (randn(g, 3, 5, 4, scale=2.0, shift=1.0),))]
    x, mask = _padded(g, [6, 4, 2], 6, 4, scale=3.0, shift=-1.0)
    cases.append(Case("padded batch (lengths 6, 4, 2) with its mask", (x, mask)))
    x, mask = _padded(g, [3, 5], 5, 8, scale=0.5, shift=2.0)
    cases.append(Case("padded batch (lengths 3, 5) with its mask", (x, mask)))
    x, mask = _padded(g, [7, 1, 4], 7, 6, dtype=torch.float64, scale=2.0)
    cases.append(Case("float64, padded (lengths 7, 1, 4)", (x, mask), hidden=True))
    x = randn(g, 2, 4, 5, scale=10.0, shift=100.0)
    cases.append(Case("no padding, every token marked real", (x, torch.ones(2, 4, dtype=torch.bool)), hidden=True))
    x, mask = _padded(g, [2], 6, 3)
    cases.append(Case("one sentence padded from 2 to 6 tokens", (x, mask), hidden=True))
    cases.append(Case("mask=None and eps=0.1 by keyword", (randn(g, 2, 3, 4, scale=0.3),), {"mask": None, "eps": 0.1},
                      hidden=True))
    return cases


def _bn_over(x, mask=None, eps=1e-5, dims=(0, 1), unbiased=False, count_padding=False):
    weight = torch.ones(x.shape[:-1] + (1,), dtype=x.dtype) if mask is None else mask[..., None].to(x.dtype)
    if dims == (0, 1):
        total = weight.sum(dim=dims, keepdim=True)
        n = torch.full_like(total, x.shape[0] * x.shape[1]) if count_padding else total
        mean = (x * weight).sum(dim=dims, keepdim=True) / n
        squares = (((x - mean) ** 2) * weight).sum(dim=dims, keepdim=True)
    else:  # over other axes, every entry counts
        mean = x.mean(dim=dims, keepdim=True)
        squares = ((x - mean) ** 2).sum(dim=dims, keepdim=True)
        n = torch.tensor(float(x.numel() // squares.numel()), dtype=x.dtype)
    var = squares / (n - 1) if unbiased else squares / n
    return (x - mean) / torch.sqrt(var + eps)


def _bn_over_features(x, mask=None, eps=1e-5):
    return _bn_over(x, mask, eps, dims=-1)


def _bn_over_batch_only(x, mask=None, eps=1e-5):
    return _bn_over(x, mask, eps, dims=0)


def _bn_over_positions_only(x, mask=None, eps=1e-5):
    return _bn_over(x, mask, eps, dims=1)


def _bn_unbiased(x, mask=None, eps=1e-5):
    return _bn_over(x, mask, eps, unbiased=True)


def _bn_mask_ignored(x, mask=None, eps=1e-5):
    return _bn_over(x, None, eps)


def _bn_padding_in_the_count(x, mask=None, eps=1e-5):
    return _bn_over(x, mask, eps, count_padding=True)


def _bn_padding_zeroed(x, mask=None, eps=1e-5):
    out = _bn_over(x, mask, eps)
    return out if mask is None else out * mask[..., None]


def _bn_real_tokens_not_normalised() -> Property:
    """Over the real tokens of the batch, each feature must come out with mean 0 and variance 1."""

    def seen(case, expected, actual):
        x = case.args[0]
        mask = case.args[1] if len(case.args) > 1 else case.kwargs.get("mask")
        if mask is None:
            mask = torch.ones(x.shape[:2], dtype=torch.bool)
        if not isinstance(actual, torch.Tensor) or actual.shape != expected.shape or not actual.is_floating_point():
            return False
        real_e, real_a = expected[mask], actual[mask]  # [real tokens, d]
        return bool(_normalised(real_e, 0).all()) and not bool(_normalised(real_a, 0).all())

    return Property(
        "features that do not come out with mean 0 and variance 1 over the batch's real tokens",
        "One mean and one variance per feature, over the batch and the positions together (dims 0 and 1), "
        "counting only the tokens the mask marks True, the variance divided by their number.",
        seen,
    )


check_batch_norm = Checker(
    name="batch_norm",
    reference=batch_norm,
    make_cases=_batch_norm_cases,
    mistakes=[
        Mistake(
            "statistics over each token's own features (dim=-1): that is LayerNorm, not BatchNorm",
            "BatchNorm takes one mean and one variance per feature, across tokens: reduce over dims (0, 1), "
            "the batch and the positions, with keepdim=True.",
            _bn_over_features,
        ),
        Mistake(
            "statistics over the batch dimension only (dim=0): one mean per position and feature",
            "Pool the positions too: every token of every sentence contributes to a feature's statistics, "
            "dims (0, 1).",
            _bn_over_batch_only,
        ),
        Mistake(
            "statistics over the positions only (dim=1): each sentence normalised by itself",
            "Pool the batch too: one mean and variance per feature over dims (0, 1), the same for every sentence.",
            _bn_over_positions_only,
        ),
        Mistake(
            "unbiased variance (divided by the number of tokens minus 1)",
            "Divide by the number of (real) tokens, as BatchNorm's normalisation in training mode does.",
            _bn_unbiased,
        ),
        Mistake(
            "the mask ignored: padding tokens counted in the statistics",
            "Weight every token by mask[..., None] (1 for a real token, 0 for padding) in both sums, and divide "
            "by the number of real tokens, mask.sum().",
            _bn_mask_ignored,
        ),
        Mistake(
            "padding left out of the sums but not out of the count (divided by batch * seq)",
            "Divide the masked sums by the number of real tokens, mask.sum(), not by every position.",
            _bn_padding_in_the_count,
        ),
        Mistake(
            "the padding positions set to zero in the output",
            "Only the statistics ignore the padding: normalise every position, padding included, with them.",
            _bn_padding_zeroed,
        ),
    ],
    properties=[
        _bn_real_tokens_not_normalised(),
        properties.shape_permuted("BatchNorm keeps the input's shape [batch, seq, d]: reduce with keepdim=True."),
    ],
)


# ---------------------------------------------------------------------------------------
# Exercise 3: feed_forward(x, w1, b1, w2, b2) = max(0, x w1 + b1) w2 + b2
# ---------------------------------------------------------------------------------------


def _ffn_cases() -> list[Case]:
    g = seeded(502)

    def weights(d_model, d_ff, dtype=torch.float32):
        return (randn(g, d_model, d_ff, dtype=dtype, scale=1 / math.sqrt(d_model)), randn(g, d_ff, dtype=dtype),
                randn(g, d_ff, d_model, dtype=dtype, scale=1 / math.sqrt(d_ff)), randn(g, d_model, dtype=dtype))

    return [
        Case("one sentence, d_model = 8, d_ff = 32", (randn(g, 5, 8), *weights(8, 32))),
        Case("batch of 2, d_model = 4, d_ff = 16", (randn(g, 2, 3, 4), *weights(4, 16))),
        Case("float64, two batch dims", (randn(g, 2, 2, 3, 6, dtype=torch.float64), *weights(6, 24, torch.float64)),
             hidden=True),
        Case("a single position", (randn(g, 1, 8), *weights(8, 32)), hidden=True),
        Case("large inputs", (randn(g, 4, 8, scale=20.0), *weights(8, 16)), hidden=True),
    ]


def _ffn_relu_on_output(x, w1, b1, w2, b2):
    return torch.relu(torch.relu(x @ w1 + b1) @ w2 + b2)


def _ffn_no_relu(x, w1, b1, w2, b2):
    return (x @ w1 + b1) @ w2 + b2


def _ffn_gelu(x, w1, b1, w2, b2):
    return torch.nn.functional.gelu(x @ w1 + b1) @ w2 + b2


def _ffn_no_b1(x, w1, b1, w2, b2):
    return torch.relu(x @ w1) @ w2 + b2


def _ffn_no_b2(x, w1, b1, w2, b2):
    return torch.relu(x @ w1 + b1) @ w2


def _ffn_b1_after_relu(x, w1, b1, w2, b2):
    return (torch.relu(x @ w1) + b1) @ w2 + b2


check_feed_forward = Checker(
    name="feed_forward",
    reference=feed_forward,
    make_cases=_ffn_cases,
    mistakes=[
        Mistake(
            "a ReLU after the second linear layer too (the output can no longer be negative)",
            "Only the hidden layer has a ReLU: relu(x @ w1 + b1) @ w2 + b2, with nothing applied after.",
            _ffn_relu_on_output,
        ),
        Mistake(
            "no ReLU at all (two linear maps in a row are just one linear map)",
            "Apply torch.relu to the hidden layer: torch.relu(x @ w1 + b1).",
            _ffn_no_relu,
        ),
        Mistake(
            "GELU instead of ReLU (BERT's and GPT's choice, not the paper's)",
            "The paper's FFN uses ReLU, max(0, .): torch.relu(x @ w1 + b1).",
            _ffn_gelu,
        ),
        Mistake(
            "the first bias b1 left out",
            "Add b1 to the hidden layer before the ReLU: torch.relu(x @ w1 + b1).",
            _ffn_no_b1,
        ),
        Mistake(
            "the second bias b2 left out",
            "Add b2 to the output: ... @ w2 + b2.",
            _ffn_no_b2,
        ),
        Mistake(
            "b1 added after the ReLU instead of before it",
            "The bias belongs inside: torch.relu(x @ w1 + b1), so it shifts where the ReLU cuts.",
            _ffn_b1_after_relu,
        ),
    ],
)


# ---------------------------------------------------------------------------------------
# Exercise 4: add_and_norm(x, sublayer, gamma, beta, norm_first=False, eps=1e-5)
# ---------------------------------------------------------------------------------------


class FixedSublayer:
    """A stand-in sub-layer with fixed random weights: y -> 2 * tanh(y @ w + b).

    A plain object (not an nn.Module) so that the checker's cases stay small and printable.
    """

    def __init__(self, d: int, seed: int, dtype=torch.float32):
        g = seeded(seed)
        self.w = randn(g, d, d, dtype=dtype, scale=1 / math.sqrt(d))
        self.b = randn(g, d, dtype=dtype)

    def __call__(self, y: torch.Tensor) -> torch.Tensor:
        return 2.0 * torch.tanh(y @ self.w + self.b)

    def __repr__(self) -> str:
        return f"sublayer(y) = 2 tanh(y @ w + b), w {list(self.w.shape)}"


def _add_norm_cases() -> list[Case]:
    g = seeded(503)

    def case(name, shape, norm_first, seed, dtype=torch.float32, hidden=False, **extra):
        x = randn(g, *shape, dtype=dtype, scale=1.5, shift=0.5)
        gamma, beta = _gamma_beta(g, shape[-1], dtype)
        kwargs = {"norm_first": norm_first, **extra}
        return Case(name, (x, FixedSublayer(shape[-1], seed, dtype), gamma, beta), kwargs, hidden)

    return [
        case("post-norm, batch of 2", (2, 4, 8), False, 1),
        case("pre-norm, batch of 2", (2, 4, 8), True, 2),
        case("post-norm, one sentence", (5, 6), False, 3),
        case("pre-norm, one sentence", (5, 6), True, 4),
        case("post-norm, float64", (2, 3, 10), False, 5, torch.float64, hidden=True),
        case("pre-norm, float64", (2, 3, 10), True, 6, torch.float64, hidden=True),
        case("pre-norm, a single position", (1, 8), True, 7, hidden=True),
        case("post-norm, eps = 0.1", (3, 8), False, 8, hidden=True, eps=0.1),
    ]


def _ln(t, gamma, beta, eps):
    return layer_norm(t, gamma, beta, eps)


def _post(x, f, gamma, beta, eps):
    return _ln(x + f(x), gamma, beta, eps)


def _pre(x, f, gamma, beta, eps):
    return x + f(_ln(x, gamma, beta, eps))


def _an_always_post(x, sublayer, gamma, beta, norm_first=False, eps=1e-5):
    return _post(x, sublayer, gamma, beta, eps)


def _an_always_pre(x, sublayer, gamma, beta, norm_first=False, eps=1e-5):
    return _pre(x, sublayer, gamma, beta, eps)


def _an_swapped(x, sublayer, gamma, beta, norm_first=False, eps=1e-5):
    return (_post if norm_first else _pre)(x, sublayer, gamma, beta, eps)


def _an_no_residual(x, sublayer, gamma, beta, norm_first=False, eps=1e-5):
    if norm_first:
        return sublayer(_ln(x, gamma, beta, eps))
    return _ln(sublayer(x), gamma, beta, eps)


def _an_no_norm(x, sublayer, gamma, beta, norm_first=False, eps=1e-5):
    return x + sublayer(x)


def _an_post_norm_of_sublayer_only(x, sublayer, gamma, beta, norm_first=False, eps=1e-5):
    if norm_first:
        return _pre(x, sublayer, gamma, beta, eps)
    return x + _ln(sublayer(x), gamma, beta, eps)


def _an_residual_added_twice(x, sublayer, gamma, beta, norm_first=False, eps=1e-5):
    if norm_first:
        return _pre(x, sublayer, gamma, beta, eps)
    return x + _ln(x + sublayer(x), gamma, beta, eps)


def _an_pre_residual_from_normalised(x, sublayer, gamma, beta, norm_first=False, eps=1e-5):
    if norm_first:
        normed = _ln(x, gamma, beta, eps)
        return normed + sublayer(normed)
    return _post(x, sublayer, gamma, beta, eps)


def _an_pre_sublayer_on_raw_x(x, sublayer, gamma, beta, norm_first=False, eps=1e-5):
    if norm_first:
        return x + sublayer(x)
    return _post(x, sublayer, gamma, beta, eps)


check_add_and_norm = Checker(
    name="add_and_norm",
    reference=add_and_norm,
    make_cases=_add_norm_cases,
    mistakes=[
        Mistake(
            "norm_first ignored: always post-norm, LayerNorm(x + sublayer(x))",
            "When norm_first is True, normalise first and add the raw x back: x + sublayer(LayerNorm(x)).",
            _an_always_post,
        ),
        Mistake(
            "norm_first ignored: always pre-norm, x + sublayer(LayerNorm(x))",
            "When norm_first is False (the paper), add first, then normalise: LayerNorm(x + sublayer(x)).",
            _an_always_pre,
        ),
        Mistake(
            "post-norm and pre-norm swapped (norm_first=True gave LayerNorm(x + sublayer(x)))",
            "norm_first=True means the norm comes first, before the sub-layer: x + sublayer(LayerNorm(x)); "
            "norm_first=False is the paper's LayerNorm(x + sublayer(x)).",
            _an_swapped,
        ),
        Mistake(
            "no residual: the input x is never added to the sub-layer's output",
            "Add x back: LayerNorm(x + sublayer(x)) in post-norm, x + sublayer(LayerNorm(x)) in pre-norm.",
            _an_no_residual,
        ),
        Mistake(
            "no LayerNorm at all: x + sublayer(x)",
            "Use layer_norm(..., gamma, beta, eps): on the sum in post-norm, LayerNorm(x + sublayer(x)); on the "
            "sub-layer's input in pre-norm, x + sublayer(LayerNorm(x)).",
            _an_no_norm,
        ),
        Mistake(
            "post-norm: only the sub-layer's output normalised, x + LayerNorm(sublayer(x))",
            "Normalise the sum: LayerNorm(x + sublayer(x)).",
            _an_post_norm_of_sublayer_only,
        ),
        Mistake(
            "post-norm: the residual added twice, x + LayerNorm(x + sublayer(x))",
            "Add x once, inside the norm: LayerNorm(x + sublayer(x)).",
            _an_residual_added_twice,
        ),
        Mistake(
            "pre-norm: the residual adds the normalised input, LayerNorm(x) + sublayer(LayerNorm(x))",
            "Only the sub-layer sees the normalised input; add the raw x: x + sublayer(LayerNorm(x)).",
            _an_pre_residual_from_normalised,
        ),
        Mistake(
            "pre-norm: the sub-layer gets x instead of LayerNorm(x) (x + sublayer(x), no norm at all)",
            "Normalise before the sub-layer: x + sublayer(LayerNorm(x)).",
            _an_pre_sublayer_on_raw_x,
        ),
    ],
)


# ---------------------------------------------------------------------------------------
# Exercise 5: encoder_layer_forward(x, mask, layer), from the parts of the library's EncoderLayer
# ---------------------------------------------------------------------------------------

_CALL_THE_PARTS = ("calling layer(x, mask) runs the library's own encoder layer: build the forward pass from "
                   "its parts (layer.self_attn, layer.feed_forward, layer.norm1, layer.norm2, layer.dropout1, "
                   "layer.dropout2)")


class _ExerciseEncoderLayer(EncoderLayer):
    """The library's EncoderLayer with its forward sealed, so that an answer must use the parts."""

    def forward(self, x, mask=None):
        raise RuntimeError(_CALL_THE_PARTS)


# The grader runs the whole chapter with every exercise's reference hidden: layer_norm, feed_forward,
# add_and_norm, encoder_layer_forward. The layers the last two exercises are handed therefore compute
# their norms and FFNs with PyTorch's own functions (the same numbers to float rounding), so that an
# answer that calls layer.norm1(x) or layer.feed_forward(x), as it should, needs none of them.


class _TorchLayerNorm(LayerNorm):
    def forward(self, x):
        return F.layer_norm(x, self.gamma.shape, self.gamma, self.beta, self.eps)


class _TorchFeedForward(PositionwiseFeedForward):
    def forward(self, x):
        return self.linear2(self.dropout(self.activation(self.linear1(x))))  # [..., d_model]


def _without_exercise_parts(module: torch.nn.Module) -> torch.nn.Module:
    for part in module.modules():
        if type(part) is LayerNorm:
            part.__class__ = _TorchLayerNorm
        elif type(part) is PositionwiseFeedForward:
            part.__class__ = _TorchFeedForward
    return module


def _fill_weights(module: torch.nn.Module, seed: int) -> None:
    """Random weights in every parameter, in a fixed order: gamma near 1 and beta near 0 but not
    equal to them (so a misplaced or missing norm shows), matrices scaled by 1/sqrt(fan-in)."""
    g = seeded(seed)
    for name, p in module.named_parameters():
        noise = torch.randn(p.shape, generator=g, dtype=torch.float64)
        value = 1.0 + 0.3 * noise if name.endswith("gamma") else noise / math.sqrt(p.shape[-1])
        p.data.copy_(value.to(p.dtype))


def _build_layer(kw: dict) -> EncoderLayer:
    """The case's layer: dropout 0.1 in eval mode (so dropout must be a no-op), seeded weights."""
    with torch.random.fork_rng(devices=[]):  # nn.Linear's own initialisation must not move the caller's RNG
        layer = _ExerciseEncoderLayer(kw["d_model"], kw["n_heads"], kw["d_ff"], dropout=0.1,
                                      norm_first=kw["norm_first"])
    layer = _without_exercise_parts(layer.to(kw["x"].dtype))
    _fill_weights(layer, kw["seed"])
    return layer.eval()


def _invoke_layer(fn, case: Case):
    kw = case.kwargs
    layer = _build_layer(kw)
    # A fixed seed, restored afterwards, so that dropout wrongly left on gives the same numbers on
    # every run (and can be recognised), without touching the notebook's own random state.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(kw["seed"])
        return fn(kw["x"], kw["mask"], layer)


def _layer_cases() -> list[Case]:
    g = seeded(506)
    cases: list[Case] = []

    def case(name, lengths, seq, d_model, n_heads, norm_first, use_mask=True, dtype=torch.float32, hidden=False):
        x = randn(g, len(lengths), seq, d_model, dtype=dtype, scale=1.5)
        tokens = _lengths_mask(lengths, seq).long()  # 1 = a real token, 0 = padding
        mask = padding_mask(tokens, 0) if use_mask else None  # [batch, 1, 1, seq]
        kwargs = dict(d_model=d_model, n_heads=n_heads, d_ff=4 * d_model, norm_first=norm_first, x=x, mask=mask,
                      seed=5060 + len(cases))
        cases.append(Case(name, (), kwargs, hidden))

    case("post-norm, no mask", [5, 5], 5, 16, 4, False, use_mask=False)
    case("post-norm, padding mask (lengths 5 and 3)", [5, 3], 5, 16, 4, False)
    case("pre-norm, no mask", [5, 5], 5, 16, 4, True, use_mask=False)
    case("pre-norm, padding mask (lengths 2 and 4)", [2, 4], 4, 16, 4, True)
    case("post-norm, float64, padding mask", [6, 1, 4], 6, 8, 2, False, dtype=torch.float64, hidden=True)
    case("pre-norm, one sentence of 7 tokens", [7], 7, 16, 4, True, use_mask=False, hidden=True)
    case("post-norm, a single token", [1, 1], 1, 8, 2, False, use_mask=False, hidden=True)
    case("pre-norm, float64, 8 heads, padding mask", [3, 6], 6, 32, 8, True, dtype=torch.float64, hidden=True)
    return cases


def _attn(layer, mask):
    return lambda y: layer.self_attn(y, y, y, mask)


def _sublayer_step(x, sublayer, norm, drop, norm_first):
    """One residual sub-layer exactly as the reference does it, with a chosen dropout."""
    return add_and_norm(x, lambda y: drop(sublayer(y)), norm.gamma, norm.beta, norm_first, norm.eps)


def _el_norm_before_residual(x, mask, layer):
    if layer.norm_first:
        return encoder_layer_forward(x, mask, layer)
    x = x + layer.norm1(layer.dropout1(layer.self_attn(x, x, x, mask)))
    return x + layer.norm2(layer.dropout2(layer.feed_forward(x)))


def _el_pre_ffn_unnormalised(x, mask, layer):
    if not layer.norm_first:
        return encoder_layer_forward(x, mask, layer)
    y = layer.norm1(x)
    x = x + layer.dropout1(layer.self_attn(y, y, y, mask))
    return x + layer.dropout2(layer.feed_forward(x))


def _el_mask_ignored(x, mask, layer):
    return encoder_layer_forward(x, None, layer)


def _el_dropout_left_on(x, mask, layer):
    def drop(t):
        return torch.nn.functional.dropout(t, layer.dropout1.p)  # training=True by default

    x = _sublayer_step(x, _attn(layer, mask), layer.norm1, drop, layer.norm_first)
    return _sublayer_step(x, layer.feed_forward, layer.norm2, drop, layer.norm_first)


def _el_ffn_first(x, mask, layer):
    x = _sublayer_step(x, layer.feed_forward, layer.norm1, layer.dropout1, layer.norm_first)
    return _sublayer_step(x, _attn(layer, mask), layer.norm2, layer.dropout2, layer.norm_first)


def _el_one_norm_twice(x, mask, layer):
    x = _sublayer_step(x, _attn(layer, mask), layer.norm1, layer.dropout1, layer.norm_first)
    return _sublayer_step(x, layer.feed_forward, layer.norm1, layer.dropout2, layer.norm_first)


def _el_always_post_norm(x, mask, layer):
    x = _sublayer_step(x, _attn(layer, mask), layer.norm1, layer.dropout1, False)
    return _sublayer_step(x, layer.feed_forward, layer.norm2, layer.dropout2, False)


def _el_no_ffn_residual(x, mask, layer):
    x = _sublayer_step(x, _attn(layer, mask), layer.norm1, layer.dropout1, layer.norm_first)
    if layer.norm_first:
        return layer.feed_forward(layer.norm2(x))
    return layer.norm2(layer.feed_forward(x))


def _post_norm_output_not_normalised() -> Property:
    """A post-norm layer ends with norm2: undo its gamma and beta and every vector has mean 0 and
    variance 1. Any answer that does not end with norm2 fails this, whatever else it gets wrong."""

    def seen(case, expected, actual):
        kw = case.kwargs
        if kw["norm_first"] or not isinstance(actual, torch.Tensor) or actual.shape != expected.shape:
            return False
        norm2 = _build_layer(kw).norm2
        gamma, beta = norm2.gamma.detach().double(), norm2.beta.detach().double()
        return (bool(_normalised((expected.double() - beta) / gamma, -1).all())
                and not bool(_normalised((actual.double() - beta) / gamma, -1).all()))

    return Property(
        "a post-norm output that is not norm2's output (undo norm2's gamma and beta, and its vectors do not have "
        "mean 0 and variance 1)",
        "In post-norm (norm_first False) each sub-layer ends with its LayerNorm, applied to the sum: "
        "x = norm1(x + attention(x)), then return norm2(x + ffn(x)); nothing is added after the last norm.",
        seen,
    )


check_encoder_layer_forward = Checker(
    name="encoder_layer_forward",
    reference=encoder_layer_forward,
    make_cases=_layer_cases,
    invoke=_invoke_layer,
    rtol=1e-4,
    atol=1e-5,
    mistakes=[
        Mistake(
            "post-norm with the norm before the residual: x + norm(sublayer(x)) instead of norm(x + sublayer(x))",
            "Add first, then normalise the sum: x = layer.norm1(x + attention(x)), and the same with norm2 around "
            "the FFN.",
            _el_norm_before_residual,
        ),
        Mistake(
            "pre-norm: the FFN applied to the un-normalised stream, x + ffn(x) (norm2 skipped)",
            "In pre-norm each sub-layer reads the normalised stream: x = x + ffn(layer.norm2(x)).",
            _el_pre_ffn_unnormalised,
        ),
        Mistake(
            "the padding mask not passed to the self-attention (padding tokens get attention)",
            "Pass it on: layer.self_attn(y, y, y, mask).",
            _el_mask_ignored,
        ),
        Mistake(
            "dropout left on: torch.nn.functional.dropout (training=True by default) used while the layer is in "
            "eval mode",
            "Use the layer's own modules, layer.dropout1 and layer.dropout2: they drop only in training mode.",
            _el_dropout_left_on,
        ),
        Mistake(
            "the feed-forward network applied before the self-attention",
            "Attention first (positions exchange information), then the FFN (each position on its own).",
            _el_ffn_first,
        ),
        Mistake(
            "the same LayerNorm (norm1) used around both sub-layers",
            "Each sub-layer has its own LayerNorm with its own gamma and beta: norm1 for the attention, "
            "norm2 for the FFN.",
            _el_one_norm_twice,
        ),
        Mistake(
            "norm_first ignored: post-norm even when layer.norm_first is True",
            "If layer.norm_first, normalise before each sub-layer and add the raw input: "
            "x = x + attention(norm1(x)); x = x + ffn(norm2(x)).",
            _el_always_post_norm,
        ),
        Mistake(
            "no residual connection around the feed-forward network",
            "Wrap the FFN like the attention: norm2(x + ffn(x)) in post-norm, x + ffn(norm2(x)) in pre-norm.",
            _el_no_ffn_residual,
        ),
    ],
    properties=[
        _post_norm_output_not_normalised(),
        properties.shape_permuted("An encoder layer keeps the shape [batch, seq, d_model]: no transpose is needed."),
    ],
)


# ---------------------------------------------------------------------------------------
# Exercise 6: encoder_forward(x, mask, encoder, layer_forward), the stack
# ---------------------------------------------------------------------------------------

_CALL_LAYER_FORWARD = ("calling layer(x, mask) skips your own layer: run each layer with "
                       "layer_forward(x, mask, layer)")
ERROR_MESSAGES = (_CALL_THE_PARTS, _CALL_LAYER_FORWARD)  # raised in the learner's process: translated at judging


class _StackedLayer(EncoderLayer):
    """The library's EncoderLayer with its forward sealed: the stack must go through layer_forward."""

    def forward(self, x, mask=None):
        raise RuntimeError(_CALL_LAYER_FORWARD)


def _build_encoder(kw: dict) -> Encoder:
    with torch.random.fork_rng(devices=[]):  # nn.Linear's own initialisation must not move the caller's RNG
        layer = _StackedLayer(kw["d_model"], kw["n_heads"], kw["d_ff"], dropout=0.1, norm_first=kw["norm_first"])
    encoder = _without_exercise_parts(Encoder(layer, kw["n_layers"], norm_first=kw["norm_first"]).to(kw["x"].dtype))
    for i, each in enumerate(encoder.layers):
        _fill_weights(each, kw["seed"] + 100 * i)  # different weights in every layer
    _fill_weights(encoder.norm, kw["seed"] + 99)  # the final LayerNorm (nothing to fill in post-norm)
    return encoder.eval()


def _attention_sublayer(x, mask, layer):
    """The layer function the cases hand in: one pre-norm attention sub-layer of `layer`. Any function
    (x, mask, layer) -> x tests the stack; it is not encoder_layer_forward, hidden while grading."""
    h = layer.norm1(x)
    return x + layer.self_attn(h, h, h, mask)  # [batch, seq, d_model]


def _invoke_encoder(fn, case: Case):
    kw = case.kwargs
    return fn(kw["x"], kw["mask"], _build_encoder(kw), _attention_sublayer)


def _encoder_cases() -> list[Case]:
    g = seeded(507)
    cases: list[Case] = []

    def case(name, lengths, seq, n_layers, norm_first, use_mask=True, d_model=16, n_heads=4, dtype=torch.float32,
             hidden=False):
        x = randn(g, len(lengths), seq, d_model, dtype=dtype, scale=1.5)
        mask = padding_mask(_lengths_mask(lengths, seq).long(), 0) if use_mask else None  # [batch, 1, 1, seq]
        kwargs = dict(n_layers=n_layers, d_model=d_model, n_heads=n_heads, d_ff=2 * d_model, norm_first=norm_first,
                      x=x, mask=mask, seed=5070 + 7 * len(cases))
        cases.append(Case(name, (), kwargs, hidden))

    case("pre-norm, 3 layers, padding mask (lengths 5 and 2)", [5, 2], 5, 3, True)
    case("post-norm, 2 layers, padding mask (lengths 3 and 4)", [3, 4], 4, 2, False)
    case("pre-norm, 4 layers, no mask", [6, 6], 6, 4, True, use_mask=False)
    case("pre-norm, float64, 3 layers", [4, 1, 3], 4, 3, True, dtype=torch.float64, hidden=True)
    case("post-norm, a single layer", [3, 2], 3, 1, False, hidden=True)
    case("pre-norm, a single layer, padding mask", [2, 5], 5, 1, True, hidden=True)
    case("post-norm, 3 layers, one padded sentence", [4], 6, 3, False, d_model=8, n_heads=2, hidden=True)
    return cases


def _enc_no_final_norm(x, mask, encoder, layer_forward):
    for layer in encoder.layers:
        x = layer_forward(x, mask, layer)
    return x


def _enc_not_chained(x, mask, encoder, layer_forward):
    out = x
    for layer in encoder.layers:
        out = layer_forward(x, mask, layer)  # always the encoder's input
    return encoder.norm(out)


def _enc_first_layer_repeated(x, mask, encoder, layer_forward):
    for _ in encoder.layers:
        x = layer_forward(x, mask, encoder.layers[0])
    return encoder.norm(x)


def _enc_mask_dropped(x, mask, encoder, layer_forward):
    return encoder_forward(x, None, encoder, layer_forward)


def _enc_norm_every_layer(x, mask, encoder, layer_forward):
    for layer in encoder.layers:
        x = encoder.norm(layer_forward(x, mask, layer))
    return x


def _enc_reversed(x, mask, encoder, layer_forward):
    for layer in reversed(encoder.layers):
        x = layer_forward(x, mask, layer)
    return encoder.norm(x)


def _pre_norm_stack_not_normalised() -> Property:
    """A pre-norm stack ends with its final LayerNorm: undo its gamma and beta and every vector has
    mean 0 and variance 1."""

    def seen(case, expected, actual):
        kw = case.kwargs
        if not kw["norm_first"] or not isinstance(actual, torch.Tensor) or actual.shape != expected.shape:
            return False
        norm = _build_encoder(kw).norm
        gamma, beta = norm.gamma.detach().double(), norm.beta.detach().double()
        return (bool(_normalised((expected.double() - beta) / gamma, -1).all())
                and not bool(_normalised((actual.double() - beta) / gamma, -1).all()))

    return Property(
        "a pre-norm stack whose output is not the final LayerNorm's (undo encoder.norm's gamma and beta, and its "
        "vectors do not have mean 0 and variance 1)",
        "Apply encoder.norm once, to the last layer's output: return encoder.norm(x).",
        seen,
    )


check_encoder_forward = Checker(
    name="encoder_forward",
    reference=encoder_forward,
    make_cases=_encoder_cases,
    invoke=_invoke_encoder,
    rtol=1e-4,
    atol=1e-5,
    mistakes=[
        Mistake(
            "the final LayerNorm left out (a pre-norm stack's residual stream is then never normalised)",
            "End with return encoder.norm(x): a LayerNorm in pre-norm stacks, the identity in post-norm ones.",
            _enc_no_final_norm,
        ),
        Mistake(
            "every layer fed the encoder's input instead of the previous layer's output",
            "Chain them: x = layer_forward(x, mask, layer), so each layer reads what the one below wrote.",
            _enc_not_chained,
        ),
        Mistake(
            "the first layer run n times (encoder.layers[0] every time)",
            "Loop over the layers themselves: for layer in encoder.layers; each has its own weights.",
            _enc_first_layer_repeated,
        ),
        Mistake(
            "the padding mask not passed on to the layers",
            "Every layer needs it: layer_forward(x, mask, layer).",
            _enc_mask_dropped,
        ),
        Mistake(
            "the final LayerNorm applied after every layer instead of once at the end",
            "Each layer already has its own norms; encoder.norm comes once, after the loop.",
            _enc_norm_every_layer,
        ),
        Mistake(
            "the layers run from the top down (reversed order)",
            "Run encoder.layers in order: layer 0 reads the input, the last one writes the output.",
            _enc_reversed,
        ),
    ],
    properties=[_pre_norm_stack_not_normalised()],
)


CHECKERS = [check_layer_norm, check_batch_norm, check_feed_forward, check_add_and_norm, check_encoder_layer_forward,
            check_encoder_forward]
