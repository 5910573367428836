"""Checkers for chapter 05, Add & Norm and the feed-forward network: layer_norm, feed_forward,
add_and_norm (post-norm and pre-norm residual sub-layers) and the EncoderBlock class.

Each checker compares a learner's answer with the library (transformer_lib.layers) on
deterministic cases and knows the wrong answers learners often write: LayerNorm over the
batch, torch.var's unbiased default, eps outside the square root, a ReLU too many, the
norm on the wrong side of the residual, the FFN before the attention, ...
"""

import math

import torch

from transformer_lib.layers import EncoderLayer, add_and_norm, feed_forward, layer_norm

from .core import Case, Checker, Mistake, randn, seeded


def _gamma_beta(g: torch.Generator, d: int, dtype=torch.float32):
    """A gamma near 1 and a beta near 0, but far enough from them that forgetting them shows."""
    return randn(g, d, dtype=dtype, scale=0.5, shift=1.0), randn(g, d, dtype=dtype, scale=0.5)


# ---------------------------------------------------------------------------------------
# Exercise 1: layer_norm(x, gamma, beta, eps=1e-5)
# ---------------------------------------------------------------------------------------


def _layer_norm_cases() -> list[Case]:
    g = seeded(501)
    cases = []

    def add(name, x, hidden=False, **kwargs):
        gamma, beta = _gamma_beta(g, x.shape[-1], x.dtype)
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
    return cases


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
            "(the variant in the source's code, not torch.nn.LayerNorm)",
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
)


# ---------------------------------------------------------------------------------------
# Exercise 2: feed_forward(x, w1, b1, w2, b2) = max(0, x w1 + b1) w2 + b2
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
# Exercise 3: add_and_norm(x, sublayer, gamma, beta, norm_first=False, eps=1e-5)
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
# Exercise 4: the EncoderBlock class (its forward method)
# ---------------------------------------------------------------------------------------


class ReferenceEncoderBlock(EncoderLayer):
    """The library's EncoderLayer under the exercise's constructor and attribute names:
    EncoderBlock(d_model, n_heads, d_ff, norm_first=False) with self_attn, feed_forward,
    norm1 (around the attention) and norm2 (around the FFN)."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int, norm_first: bool = False):
        super().__init__(d_model, n_heads, d_ff, dropout=0.0, norm_first=norm_first)
        self.norm_first = norm_first

    @property
    def norm1(self):
        return self.residual1.norm

    @property
    def norm2(self):
        return self.residual2.norm


def _fill_weights(block, seed: int) -> None:
    """The same random weights in the learner's block and the reference: module by module,
    in a fixed order, with gamma near 1 and beta near 0 but not equal to them."""
    g = seeded(seed)
    for module in (block.self_attn, block.feed_forward, block.norm1, block.norm2):
        for name, p in module.named_parameters():
            noise = torch.randn(p.shape, generator=g, dtype=torch.float64)
            value = 1.0 + 0.3 * noise if name == "gamma" else noise / math.sqrt(p.shape[-1])
            p.data.copy_(value.to(p.dtype))


def _invoke_block(cls, case: Case):
    kw = case.kwargs
    block = cls(kw["d_model"], kw["n_heads"], kw["d_ff"], norm_first=kw["norm_first"])
    block = block.to(kw["x"].dtype)
    _fill_weights(block, kw["seed"])
    block.eval()
    return block(kw["x"], kw["mask"])


def _block_cases() -> list[Case]:
    g = seeded(504)

    def case(name, batch, seq, d_model, n_heads, norm_first, lengths=None, dtype=torch.float32, hidden=False):
        seed = 5040 + len(cases)  # the weights of this case
        x = randn(g, batch, seq, d_model, dtype=dtype, scale=1.5)
        mask = None
        if lengths is not None:
            mask = (torch.arange(seq)[None, :] < torch.tensor(lengths)[:, None])[:, None, :]  # [batch, 1, seq]
        kwargs = dict(d_model=d_model, n_heads=n_heads, d_ff=4 * d_model, norm_first=norm_first, x=x, mask=mask,
                      seed=seed)
        cases.append(Case(name, (), kwargs, hidden))

    cases: list[Case] = []
    for args in [
        ("post-norm, no mask", 2, 5, 16, 4, False),
        ("post-norm, padding mask (lengths 5 and 3)", 2, 5, 16, 4, False, [5, 3]),
        ("pre-norm, no mask", 2, 5, 16, 4, True),
        ("pre-norm, padding mask (lengths 2 and 4)", 2, 4, 16, 4, True, [2, 4]),
        ("post-norm, float64, padding mask", 3, 6, 8, 2, False, [6, 1, 4], torch.float64, True),
        ("pre-norm, one sentence of 7 tokens", 1, 7, 16, 4, True, None, torch.float32, True),
        ("post-norm, a single token", 2, 1, 8, 2, False, None, torch.float32, True),
        ("pre-norm, float64, 8 heads", 2, 6, 32, 8, True, [3, 6], torch.float64, True),
    ]:
        case(*args)
    return cases


class _BlockFfnFirst(ReferenceEncoderBlock):
    def forward(self, x, mask=None):
        x = add_and_norm(x, self.feed_forward, self.norm1.gamma, self.norm1.beta, self.norm_first)
        return add_and_norm(x, lambda y: self.self_attn(y, y, y, mask), self.norm2.gamma, self.norm2.beta,
                            self.norm_first)


class _BlockNoFfnResidual(ReferenceEncoderBlock):
    def forward(self, x, mask=None):
        x = add_and_norm(x, lambda y: self.self_attn(y, y, y, mask), self.norm1.gamma, self.norm1.beta,
                         self.norm_first)
        if self.norm_first:
            return self.feed_forward(self.norm2(x))
        return self.norm2(self.feed_forward(x))


class _BlockNoAttentionResidual(ReferenceEncoderBlock):
    def forward(self, x, mask=None):
        if self.norm_first:
            y = self.norm1(x)
            x = self.self_attn(y, y, y, mask)
        else:
            x = self.norm1(self.self_attn(x, x, x, mask))
        return add_and_norm(x, self.feed_forward, self.norm2.gamma, self.norm2.beta, self.norm_first)


class _BlockMaskIgnored(ReferenceEncoderBlock):
    def forward(self, x, mask=None):
        return super().forward(x, None)


class _BlockAlwaysPostNorm(ReferenceEncoderBlock):
    def forward(self, x, mask=None):
        x = self.norm1(x + self.self_attn(x, x, x, mask))
        return self.norm2(x + self.feed_forward(x))


class _BlockOneNormTwice(ReferenceEncoderBlock):
    def forward(self, x, mask=None):
        x = add_and_norm(x, lambda y: self.self_attn(y, y, y, mask), self.norm1.gamma, self.norm1.beta,
                         self.norm_first)
        return add_and_norm(x, self.feed_forward, self.norm1.gamma, self.norm1.beta, self.norm_first)


check_encoder_block = Checker(
    name="encoder_block",
    reference=ReferenceEncoderBlock,
    make_cases=_block_cases,
    invoke=_invoke_block,
    rtol=1e-4,
    atol=1e-5,
    mistakes=[
        Mistake(
            "the feed-forward network applied before the self-attention",
            "Attention first (positions exchange information), then the FFN (each position on its own).",
            _BlockFfnFirst,
        ),
        Mistake(
            "no residual connection around the feed-forward network",
            "Wrap the FFN like the attention: norm2(x + feed_forward(x)) in post-norm, "
            "x + feed_forward(norm2(x)) in pre-norm.",
            _BlockNoFfnResidual,
        ),
        Mistake(
            "no residual connection around the self-attention",
            "Add the block's input back: norm1(x + attention(x)) in post-norm, x + attention(norm1(x)) in pre-norm.",
            _BlockNoAttentionResidual,
        ),
        Mistake(
            "the padding mask not passed to the self-attention (padding tokens get attention)",
            "Pass it on: self.self_attn(y, y, y, mask).",
            _BlockMaskIgnored,
        ),
        Mistake(
            "norm_first ignored: post-norm even when norm_first=True",
            "If self.norm_first, normalise before each sub-layer and add the raw input: "
            "x = x + self_attn(norm1(x)); x = x + feed_forward(norm2(x)).",
            _BlockAlwaysPostNorm,
        ),
        Mistake(
            "the same LayerNorm (norm1) used around both sub-layers",
            "Each sub-layer has its own LayerNorm with its own gamma and beta: norm1 for the attention, "
            "norm2 for the FFN.",
            _BlockOneNormTwice,
        ),
    ],
)


CHECKERS = [check_layer_norm, check_feed_forward, check_add_and_norm, check_encoder_block]
