# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Chapter 05 — Add & Norm, the feed-forward network, and the encoder layer
#
# Chapters 02–04 built the part of the Transformer everybody talks about: attention, split into heads, with
# positions added to the input. But an attention layer on its own is not a Transformer layer. In the
# architecture diagram every attention block is followed by a small box labelled **Add & Norm**, then a
# **Feed Forward** block, then another **Add & Norm**. Those boxes look like plumbing. They are what makes it
# possible to stack six layers (the paper), twelve (BERT-base), or ninety-six (GPT-3) and still train the
# stack.
#
# This chapter takes the plumbing apart:
#
# 1. **Residual connections** ("Add"): what $x + F(x)$ does to the gradients of a 30-layer stack, measured.
# 2. **LayerNorm** ("Norm"): the formula, to the last detail (which variance? where does $\epsilon$ go?).
# 3. **LayerNorm vs BatchNorm** on padded batches of sentences of different lengths: the same sentence should
#    give the same output whatever else is in the batch.
# 4. **The position-wise feed-forward network**: expand to $d_{ff} = 4\,d_{model}$, ReLU, project back; why it
#    is a $1 \times 1$ convolution, and how much of the model it is.
# 5. **Post-norm vs pre-norm**: where the norm goes, what that does to gradients at initialisation, and why
#    the paper needed a learning-rate warm-up.
# 6. **The encoder layer**, assembled from these parts and checked against PyTorch's own.
# 7. **The stack**: six layers run by your code, and the parameter count of the paper's base encoder.
#
# Six exercises are autograded: `layer_norm`, `batch_norm`, `feed_forward`, `add_and_norm`,
# `encoder_layer_forward` and `encoder_forward`; together they take about 75 minutes. Each builds on the ones
# before: the encoder stack at the end runs on your layer, your add & norm and your LayerNorm where they pass
# their checks. When an answer is wrong, the test cell says which common mistake it looks like.
#
# The textbook treatment of this chapter's material is Simon J. D. Prince, *Understanding Deep Learning* (MIT
# Press, 2023), section 12.4; the paper is Vaswani et al., "Attention Is All You Need" (NeurIPS 2017),
# sections 3.1 and 3.3.

# %%
import math

import matplotlib.pyplot as plt
import torch
import torch.nn as nn

from transformer_lib.checks import exercise_summary, yours_or_reference
from transformer_lib.checks.ch05 import (
    check_add_and_norm,
    check_batch_norm,
    check_encoder_forward,
    check_encoder_layer_forward,
    check_feed_forward,
    check_layer_norm,
)
from transformer_lib.claims import claim
from transformer_lib.diagrams.ch05 import draw_norm_axes, draw_post_vs_pre_norm
from transformer_lib.layers import Encoder, EncoderLayer, LayerNorm, PositionwiseFeedForward, count_parameters
from transformer_lib.masks import padding_mask

torch.manual_seed(0)
torch.set_printoptions(precision=4, sci_mode=False)

# %% [markdown]
# ## 1. Residual connections: a shortcut for the gradient
#
# A deep network is a long chain of functions, and backpropagation multiplies their Jacobians, one per layer.
# If each layer shrinks the gradient by a factor of 0.5, thirty layers shrink it by $0.5^{30}$, about one
# billionth (printed below): the first layers receive essentially no learning signal. This is the **vanishing
# gradient** problem.
#
# It did not stop networks from growing, but it made depth expensive. By 2014 careful initialisation, ReLUs and
# a few tricks had taken image classifiers to about twenty layers: VGG-19 (Simonyan & Zisserman, 2014), and
# GoogLeNet's 22 layers (Szegedy et al., 2014), which added auxiliary classifiers half-way up to inject extra
# gradient. Batch normalisation (Ioffe & Szegedy, 2015) and highway networks (Srivastava et al., 2015), whose
# gated shortcuts let the signal skip layers, pushed further. Yet simply adding more plain layers made even the
# *training* error worse. Residual networks (He et al., "Deep Residual Learning for Image Recognition", CVPR 2016,
# first posted in 2015) fixed that with the simplest possible shortcut, and made networks of 152 layers (on
# ImageNet) and over a thousand (on CIFAR-10) trainable. The Transformer puts the same shortcut around every
# sub-layer. Instead of a replacement for its input, a layer learns a *correction* to it:
#
# $$y = x + F(x).$$
#
# Differentiate: $\dfrac{\partial y}{\partial x} = I + \dfrac{\partial F}{\partial x}$. Whatever $F$ does, the
# identity $I$ passes the gradient from $y$ back to $x$ untouched. Through a stack of such layers there is
# always one path, the chain of shortcuts, along which the gradient is not multiplied by anything at all. (As long
# as nothing else sits on that path: in the Transformer's original arrangement, post-norm, a LayerNorm sits on it
# after every sub-layer and does scale the gradient; section 5 measures by how much.)
#
# **Predict** before running: we build 30 layers, each $F(x) = \tanh(xW + b)$ with PyTorch's default
# initialisation, once as a plain chain $x \leftarrow F(x)$ and once with shortcuts $x \leftarrow x + F(x)$. We
# take the gradient of a fixed linear read-out of the last layer's output. How many times smaller than the
# gradient of layer 30 will the gradient of layer 1 be, in each case: about 1, a thousand, or ten million times?

# %%
def per_layer_gradients(n_layers: int, residual: bool, gain: float | None = None, d: int = 64,
                        batch: int = 32) -> list[float]:
    """Norm of dLoss/dW for each layer of a stack of tanh(x W + b) layers.

    gain None: nn.Linear's default initialisation; a number: Glorot's (uniform) with that gain, biases 0.
    """
    torch.manual_seed(1)
    layers = nn.ModuleList(nn.Linear(d, d) for _ in range(n_layers))
    if gain is not None:
        for layer in layers:
            nn.init.xavier_uniform_(layer.weight, gain=gain)  # variance gain^2 / d for a d x d matrix
            nn.init.zeros_(layer.bias)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(batch, d, generator=g)
    readout = torch.randn(d, generator=g)  # the loss is a fixed linear function of the output
    for layer in layers:
        x = x + torch.tanh(layer(x)) if residual else torch.tanh(layer(x))  # [batch, d]
    loss = (x @ readout).mean()
    loss.backward()
    return [layer.weight.grad.norm().item() for layer in layers]


print(f"0.5 ** 30 = {0.5 ** 30:.1e}")
plain = per_layer_gradients(30, residual=False)
shortcut = per_layer_gradients(30, residual=True)
for name, grads in [("plain chain   ", plain), ("with residuals", shortcut)]:
    print(f"{name}: |grad| layer 1 = {grads[0]:.2e}, layer 30 = {grads[-1]:.2e}, "
          f"layer 30 / layer 1 = {grads[-1] / grads[0]:.1e}")

# %%
fig, ax = plt.subplots(figsize=(7, 3.2))
ax.semilogy(range(1, 31), plain, "o-", label="x <- F(x)  (plain)")
ax.semilogy(range(1, 31), shortcut, "s-", label="x <- x + F(x)  (residual)")
ax.set_xlabel("layer (1 = closest to the input)")
ax.set_ylabel("gradient norm of the layer's W")
ax.set_title("30 tanh layers: gradient reaching each layer")
ax.legend()
fig.tight_layout()
plt.show()

# %% [markdown]
# Without shortcuts, the gradient loses a roughly constant factor per layer: a straight line on the log scale,
# ending seven orders of magnitude lower at layer 1 (layer 30's gradient is $1.3 \times 10^{7}$ times larger). An
# optimiser cannot do anything useful with that. With shortcuts, every layer receives a gradient of the same
# order (layer 1's is even about twice layer 30's, since it collects the gradient of every path above it).
#
# Where does the factor $10^{7}$ come from? Mostly from the initialisation. `nn.Linear` draws its weights from
# $U(-1/\sqrt{d}, 1/\sqrt{d})$, of variance $1/(3d)$, so multiplying by $W$ scales a random vector by about
# $\sqrt{1/3} \approx 0.577$. Between layer 30 and layer 1 the gradient crosses 29 layers, and $0.577^{29}$ alone
# is a factor of $8.3 \times 10^{6}$. That this is close to the $1.3 \times 10^{7}$ measured is partly a coincidence
# (the next cell's first lines). A layer's weight gradient is built from two things, the gradient arriving at the
# layer and the layer's input. The first falls by $3.1 \times 10^{7}$ from layer 30 to layer 1, more than
# $0.577^{29}$, since the slope of tanh, below 1, shrinks it at every layer too. The second works the other way:
# it is larger at layer 1 (norm 7.96) than at layer 30 (0.59), since the forward pass crosses the same small
# weights. The measured $1.3 \times 10^{7}$ comes out of both, and of how the rows of the batch line up, not out of
# $0.577^{29}$ alone. A deep tanh network would not be initialised that way: Glorot & Bengio (2010) scale the weights
# so that a vector keeps its size, and for tanh PyTorch's `nn.init.calculate_gain` gives the extra gain $5/3$.
# **Predict**: with that initialisation, and the same initialisation for the residual chain, how far apart are
# layer 1's and layer 30's gradients? And with a gain that is too large?

# %%
print(f"sqrt(1/3) = {3 ** -0.5:.3f};  1 / {3 ** -0.5:.3f} ** 29 = 3 ** 14.5 = {3 ** 14.5 / 1e6:.1f} million")


def gradient_factors(n_layers: int = 30, d: int = 64, batch: int = 32):
    """The plain chain of per_layer_gradients (same seeds, default initialisation), keeping the two things each
    layer's dLoss/dW is built from: the gradient arriving at its pre-activation x W + b, and its input x."""
    torch.manual_seed(1)
    layers = [nn.Linear(d, d) for _ in range(n_layers)]
    g = torch.Generator().manual_seed(2)
    x, readout = torch.randn(batch, d, generator=g), torch.randn(d, generator=g)
    inputs, pre_activations = [], []
    for layer in layers:
        inputs.append(x)  # [batch, d]
        pre_activations.append(layer(x))  # [batch, d]
        pre_activations[-1].retain_grad()
        x = torch.tanh(pre_activations[-1])
    (x @ readout).mean().backward()
    arriving = [z.grad.norm().item() for z in pre_activations]
    input_norms = [h.norm(dim=-1).mean().item() for h in inputs]  # mean over the batch
    return arriving, input_norms


arriving, input_norms = gradient_factors()
print(f"gradient arriving at the layer, layer 30 / layer 1: {arriving[-1] / arriving[0] / 1e7:.1f} x 10^7")
print(f"norm of the layer's input: layer 1 {input_norms[0]:.2f}, layer 30 {input_norms[-1]:.2f}")
print()
tanh_gain = nn.init.calculate_gain("tanh")  # 5/3
print(f"{'initialisation':<25} | {'plain: layer 30 / layer 1':>25} | {'residual: layer 30 / layer 1':>28}")
for name, gain in [("nn.Linear's default", None), ("Glorot, gain 1", 1.0), ("Glorot, gain 5/3 (tanh)", tanh_gain),
                   ("Glorot, gain 2.5", 2.5)]:
    plain_g, residual_g = per_layer_gradients(30, False, gain), per_layer_gradients(30, True, gain)
    print(f"{name:<25} | {plain_g[-1] / plain_g[0]:>25.2g} | {residual_g[-1] / residual_g[0]:>28.2g}")

# %% [markdown]
# With the initialisation meant for tanh, the plain chain's gradient does not vanish at all over 30 layers: layer
# 1 gets about 23 times layer 30's (a ratio of 0.043), much like the residual chain with the same initialisation
# (0.052). So the $10^{7}$ above is the default initialisation's doing, not something every 30-layer chain
# suffers. What the shortcut buys is independence from that choice: across these four initialisations the plain
# chain's ratio spans ten orders of magnitude, from a vanishing gradient (top row) to an exploding one (bottom
# row), the residual chain's less than two. A shortcut keeps a path whose gain does not depend on the initialisation.
#
# He et al. make the same point from the other side: their plain networks, with a careful initialisation and
# BatchNorm, had gradients of healthy size, and deeper ones still trained to a *higher* training error. They
# argue that this degradation is "unlikely to be caused by vanishing gradients" (section 4.1) but is an
# optimisation difficulty, which the residual form eases: a layer that should change nothing only has to learn
# $F = 0$, not the identity. That, and the gradient path, is the point of "Add".
#
# Residual connections have a second, quieter effect: at initialisation, when $F$ is small and random,
# $x + F(x) \approx x$, so a deep stack starts out close to the identity and the input's information reaches
# the top intact. Each layer only has to learn what to *add* to the representation it is given.
#
# There is a price. Adding keeps adding: with nothing to rein it in, the size of $x$ drifts up (or down)
# with depth. That is the job of the "Norm".

# %% [markdown]
# ## 2. LayerNorm, exactly
#
# **Layer normalisation** (Ba, Kiros & Hinton, "Layer Normalization", 2016) takes one vector $x \in \mathbb{R}^{d}$,
# the $d$ features of one token at one position, and rescales it to mean 0 and variance 1, then lets the model
# choose a scale and a shift per feature:
#
# $$\mu = \frac{1}{d}\sum_{i=1}^{d} x_i, \qquad \sigma^2 = \frac{1}{d}\sum_{i=1}^{d} (x_i - \mu)^2, \qquad
# \mathrm{LayerNorm}(x)_i = \gamma_i\, \frac{x_i - \mu}{\sqrt{\sigma^2 + \epsilon}} + \beta_i .$$
#
# Three details matter, and each is a classic bug:
#
# * the statistics are over the **features of one vector** (the last dimension), never over the batch or the
#   positions;
# * the variance divides by $d$, not $d - 1$ (the "biased" variance; `torch.var` divides by $d - 1$ by default);
# * $\epsilon$ (PyTorch's default: $10^{-5}$) sits **inside** the square root. It only matters when a vector is
#   nearly constant, which is exactly when it must keep the division finite.
#
# $\gamma$ (initialised to ones) and $\beta$ (zeros) are learned: one scale and one shift per feature, shared by every
# token, so the model chooses each feature's size and offset after the normalisation. They do not undo it: each
# token's own mean and scale are gone, and parameters shared by all tokens cannot give them back. (BatchNorm's
# statistics are per feature, so its $\gamma$ and $\beta$ *can* undo its normalisation, $\gamma = \sigma$ and
# $\beta = \mu$, the argument of Ioffe & Szegedy, 2015, section 3; LayerNorm's statistics are per token.)

# %% [markdown]
# ### Exercise 1 — `layer_norm`
# > **Difficulty** ●●○ · **Importance** ●●● · about 15 minutes
#
# Write `layer_norm(x, gamma, beta, eps=1e-5)`.
#
# * `x`: `[..., d]`, any number of leading dimensions (batch, positions, ...).
# * `gamma`, `beta`: `[d]`.
# * returns `[..., d]`: each vector `x[..., :]` normalised with its own mean and variance, then scaled by
#   `gamma` and shifted by `beta`.
#
# Worked example: `x = [1., 2., 3., 4.]` has mean 2.5 and (biased) variance 1.25; with `gamma` all ones and
# `beta` all zeros the output is about `[-1.3416, -0.4472, 0.4472, 1.3416]`. A constant vector such as
# `[2., 2., 2.]` has variance 0: the output is `beta`, not NaN.
#
# <details><summary>Hint 1 — the idea</summary>Each vector is normalised with its own statistics: reduce over the
# last dimension only, and keep that dimension as a size-1 axis, so that the mean and the variance, of shape
# <code>[..., 1]</code>, broadcast back against <code>x</code> of shape <code>[..., d]</code>. Everything else is
# the formula above, term by term.</details>
# <details><summary>Hint 2 — the plan</summary>Four quantities, in order. The mean, <code>[..., 1]</code>. The
# biased variance, <code>[..., 1]</code>: the mean of the squared deviations from that mean (it divides by
# <code>d</code>, not by <code>d - 1</code>). The normalised vectors, <code>[..., d]</code>: the deviations divided by
# the square root of the variance plus <code>eps</code> (<code>eps</code> inside the root). Last, the scale by
# <code>gamma</code> and the shift by <code>beta</code>, both <code>[d]</code>, which broadcast over the leading
# dimensions.</details>
# <details><summary>Hint 3 — the key step</summary>Work one row by hand: <code>[1., 2., 3., 6.]</code> has mean 3,
# squared deviations 4, 1, 0 and 9, and a biased variance of 14 / 4 (divide by <code>d</code> = 4, not by 3). Does
# torch.var give that by default? Read its <code>correction</code> argument, or take the mean of the squares yourself;
# and keep the reduced axis (the <code>keepdim</code> argument of torch.mean).</details>

# %% nbgrader={"grade": false, "grade_id": "layer_norm", "locked": false, "schema_version": 3, "solution": true, "task": false}
def layer_norm(x: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """Normalise each vector along the last dimension, then scale by gamma and shift by beta.

    x: [..., d]; gamma, beta: [d]. Returns [..., d].
    """
    ### BEGIN SOLUTION
    mean = x.mean(dim=-1, keepdim=True)  # [..., 1]
    var = ((x - mean) ** 2).mean(dim=-1, keepdim=True)  # [..., 1], divided by d
    x_hat = (x - mean) / torch.sqrt(var + eps)  # [..., d], mean 0, variance ~1
    return gamma * x_hat + beta
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "layer_norm_test", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false} tags=["raises-exception"]
check_layer_norm(layer_norm)
### BEGIN HIDDEN TESTS
check_layer_norm(layer_norm, hidden=True)
### END HIDDEN TESTS

# %%
layer_norm_impl = yours_or_reference(layer_norm, check_layer_norm)

# %% [markdown]
# The worked example, and `layer_norm_impl` (your function if it passed, the library's otherwise) against PyTorch's
# `nn.LayerNorm` with the same random $\gamma$ and $\beta$:

# %%
example = torch.tensor([1.0, 2.0, 3.0, 4.0])
print(f"mean {example.mean().item()}, biased variance {example.var(unbiased=False).item()}")
print(layer_norm_impl(example, torch.ones(4), torch.zeros(4)))
print(layer_norm_impl(torch.tensor([2.0, 2.0, 2.0]), torch.ones(3), torch.zeros(3)))

x = torch.randn(2, 5, 16) * 3 + 1  # [batch, seq, d]
torch_norm = nn.LayerNorm(16)
with torch.no_grad():
    torch_norm.weight.normal_()
    torch_norm.bias.normal_()
    ours = layer_norm_impl(x, torch_norm.weight, torch_norm.bias)
    gap = (ours - torch_norm(x)).abs().max().item()
claim(gap < 1e-5, "layer_norm_impl and nn.LayerNorm agree to 1e-5 (they differ by float rounding at most)",
      measured=f"max |ours - nn.LayerNorm| = {gap:.1e}")

# %% [markdown]
# A variant you will meet in tutorial code. The LayerNorm of the Annotated Transformer (Rush, "The Annotated
# Transformer", 2018), copied into many tutorials, divides by `x.std(-1) + eps` with `eps = 1e-6`: the
# *unbiased* standard deviation, and $\epsilon$ *outside* the root. That is a different function from
# `nn.LayerNorm`, noticeably so for small $d$ (the factor between the two standard deviations is
# $\sqrt{d/(d-1)}$), and for nearly constant vectors (where the position of $\epsilon$ decides):

# %%
def std_plus_eps_layer_norm(x, eps=1e-6):  # the tutorial variant, gamma = 1, beta = 0
    return (x - x.mean(-1, keepdim=True)) / (x.std(-1, keepdim=True) + eps)


for d in [4, 64, 512]:
    v = torch.randn(1000, d)
    gap = (std_plus_eps_layer_norm(v) - layer_norm_impl(v, torch.ones(d), torch.zeros(d))).abs().max()
    print(f"d = {d:3d}: max difference {gap:.4f}   sqrt(d/(d-1)) = {math.sqrt(d / (d - 1)):.4f}")
flat = torch.tensor([[1.0, 1.001, 0.999, 1.0]])  # a nearly constant vector
print("nearly constant vector, std + eps:    ", std_plus_eps_layer_norm(flat))
print("nearly constant vector, nn.LayerNorm: ", layer_norm_impl(flat, torch.ones(4), torch.zeros(4)))

# %% [markdown]
# Both are normalisations and both train; but if you load weights trained with one into the other, the outputs
# change. This course, like PyTorch and the original TensorFlow code, uses the biased variance with
# $\epsilon$ inside the root.

# %% [markdown]
# ## 3. Why LayerNorm and not BatchNorm?
#
# Vision networks normalise with **BatchNorm** (Ioffe & Szegedy, 2015): for each feature, the mean and variance
# are taken over the *batch* (and, for sequences, over all positions too). LayerNorm takes them the other way:
# over the features of one token. The picture shows which values each pools into one mean and one variance, for
# a batch of three sentences padded to five positions:

# %%
draw_norm_axes()
plt.show()

# %% [markdown]
# Prince (*Understanding Deep Learning*, section 12.4) puts the difference in one line: LayerNorm is like
# BatchNorm, but it normalises over the $D$ dimensions of each token embedding instead of over the batch.
# Transformers use LayerNorm for several reasons. The one this section measures: through BatchNorm's shared
# statistics, a sentence's output depends on the other sentences of its batch and on the padding their
# lengths force. There are others: at inference the batch may be one sentence, or, when generating, one token,
# so BatchNorm must switch to running averages collected in training and computes a different function at test
# time; and Shen et al. (2020, "PowerNorm: Rethinking Batch Normalization in Transformers") found that in NLP
# the batch statistics fluctuate strongly during training. To see the interference we need a BatchNorm for
# padded batches, which is the next exercise.

# %% [markdown]
# ### Exercise 2 — `batch_norm`
# > **Difficulty** ●●○ · **Importance** ●●○ · about 20 minutes
#
# Write `batch_norm(x, mask=None, eps=1e-5)`, BatchNorm without its learned scale and shift (what
# `nn.BatchNorm1d(d, affine=False)` computes in training mode):
#
# * `x`: `[batch, seq, d]`.
# * `mask`: `None` (every position is a real token) or a boolean `[batch, seq]`, `True` for a real token,
#   `False` for padding.
# * returns `[batch, seq, d]`: every feature normalised with **one** mean and **one** biased variance, taken over
#   all the real tokens of all the sentences; every position, padding included, is normalised with those
#   statistics (padding only stays out of the statistics).
#
# Worked example: one feature (`d = 1`), `x = [[[1.], [3.]], [[5.], [0.]]]`, `mask = [[True, True], [True, False]]`.
# The real tokens are 1, 3 and 5: mean 3, variance 8/3, so the output is about
# `[[[-1.2247], [0.]], [[1.2247], [-1.8371]]]` (the padding's 0 becomes $-3/\sqrt{8/3}$).
#
# <details><summary>Hint 1 — the idea</summary>A mask is easiest as weights: 1.0 for a real token, 0.0 for
# padding. A masked mean is then a weighted sum divided by the sum of the weights, and the variance is the masked
# mean of the squared deviations from it. Without a mask, every weight is 1. Unlike LayerNorm, the sums run over
# the batch and the positions, separately for every feature.</details>
# <details><summary>Hint 2 — the plan</summary>The weights, <code>[batch, seq, 1]</code>: the mask with a trailing
# axis, in the dtype of <code>x</code>, so that they broadcast over the <code>d</code> features (a mask of
# <code>None</code> means every token is real). Their total, one number: the count of real tokens. The mean and
# the variance, <code>[1, 1, d]</code>: weighted sums over the first two dimensions, kept as size-1 axes, divided
# by that count. Then the normalisation of LayerNorm, without <code>gamma</code> and <code>beta</code>.</details>
# <details><summary>Hint 3 — the key step</summary>A masked mean on a toy: the values 2, 4 and 9 with the weights 1, 1
# and 0 give a weighted sum of 6 over a weight total of 2, so 3: the padded 9 never counts. To sum over the batch and
# the positions at once, a reduction takes a tuple of dimensions; the page to read: torch.sum.</details>

# %% nbgrader={"grade": false, "grade_id": "batch_norm", "locked": false, "schema_version": 3, "solution": true, "task": false}
def batch_norm(x: torch.Tensor, mask: torch.Tensor | None = None, eps: float = 1e-5) -> torch.Tensor:
    """x: [batch, seq, d]; mask: None or bool [batch, seq] (True = a real token).

    One mean and one biased variance per feature, over the real tokens of every sentence. Returns [batch, seq, d].
    """
    ### BEGIN SOLUTION
    if mask is None:
        mask = torch.ones(x.shape[:2], dtype=torch.bool)
    w = mask[..., None].to(x.dtype)  # [batch, seq, 1]: 1 for a real token, 0 for padding
    count = w.sum()  # real tokens in the whole batch
    mean = (x * w).sum(dim=(0, 1), keepdim=True) / count  # [1, 1, d]
    var = (((x - mean) ** 2) * w).sum(dim=(0, 1), keepdim=True) / count  # [1, 1, d]
    return (x - mean) / torch.sqrt(var + eps)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "batch_norm_test", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false} tags=["raises-exception"]
check_batch_norm(batch_norm)
### BEGIN HIDDEN TESTS
check_batch_norm(batch_norm, hidden=True)
### END HIDDEN TESTS

# %%
batch_norm_impl = yours_or_reference(batch_norm, check_batch_norm)

# %% [markdown]
# The worked example:

# %%
print(batch_norm_impl(torch.tensor([[[1.0], [3.0]], [[5.0], [0.0]]]), torch.tensor([[True, True], [True, False]])))

# %% [markdown]
# Now the interference. We take three "sentences" of 4, 7 and 2 tokens with 8 features each (random vectors,
# with a different scale per sentence, exaggerated on purpose: B's features are 3 times as wide and shifted by 2).
# To put them in one tensor, shorter sentences are **padded** with zero vectors up to the longest length. We then
# look at sentence A (4 tokens) in four situations:
#
# * alone, in a batch of one;
# * alone, but padded to length 10 (as if the batch's longest sentence were 10 tokens long);
# * in a batch with the two other sentences;
# * in a batch with two sentences of the same lengths drawn at A's own scale, a fairer case.
#
# **Predict**: in which of the situations does sentence A's output change, for BatchNorm? For BatchNorm
# with the padding masked out of its statistics? For LayerNorm?

# %%
d = 8
g = torch.Generator().manual_seed(5)
sentence_a = torch.randn(4, d, generator=g)                 # [4 tokens, d]
sentence_b = torch.randn(7, d, generator=g) * 3.0 + 2.0     # [7 tokens, d], larger values
sentence_c = torch.randn(2, d, generator=g) * 0.5 - 1.0     # [2 tokens, d]
sentence_b_alike = torch.randn(7, d, generator=g)           # [7 tokens, d], the scale of sentence A
sentence_c_alike = torch.randn(2, d, generator=g)           # [2 tokens, d]


def pad_batch(sentences: list[torch.Tensor], length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack sentences into [batch, length, d], zero vectors at the missing positions; and the
    [batch, length] mask of the real tokens."""
    batch = torch.zeros(len(sentences), length, d)
    real = torch.zeros(len(sentences), length, dtype=torch.bool)
    for i, s in enumerate(sentences):
        batch[i, : len(s)] = s
        real[i, : len(s)] = True
    return batch, real


ones, zeros = torch.ones(d), torch.zeros(d)
check_batch, _ = pad_batch([sentence_a, sentence_b, sentence_c], 7)
torch_bn = nn.BatchNorm1d(d, affine=False).train()  # BatchNorm1d wants [batch, features, seq]
gap = (batch_norm_impl(check_batch) - torch_bn(check_batch.transpose(1, 2)).transpose(1, 2)).abs().max().item()
claim(gap < 1e-5, "batch_norm_impl and nn.BatchNorm1d (training mode) agree to 1e-5", measured=f"{gap:.1e}")
print()

situations = {
    "alone": pad_batch([sentence_a], 4),
    "alone, padded to 10": pad_batch([sentence_a], 10),
    "with sentences B and C": pad_batch([sentence_a, sentence_b, sentence_c], 7),
    "with B and C of A's scale": pad_batch([sentence_a, sentence_b_alike, sentence_c_alike], 7),
}
norms = {
    "BatchNorm": lambda x, real: batch_norm_impl(x),
    "BatchNorm, mask": lambda x, real: batch_norm_impl(x, real),
    "LayerNorm": lambda x, real: layer_norm_impl(x, ones, zeros),
}
alone = {name: f(*situations["alone"])[0, :4] for name, f in norms.items()}  # sentence A's 4 real tokens
print(f"{'max change of sentence A':<26}" + "".join(f"{name:>18}" for name in norms))
for situation, (batch, real) in situations.items():
    changes = [(f(batch, real)[0, :4] - alone[name]).abs().max().item() for name, f in norms.items()]
    print(f"{situation:<26}" + "".join(f"{c:>18.2f}" for c in changes))

# %% [markdown]
# LayerNorm's column is zero in every row: each token is normalised with its own statistics, so nothing else in
# the tensor can reach it. Plain BatchNorm's output for the *same four tokens* changes in each of the three other
# situations (by up to 1.44, 1.91 and 1.82): the padding zeros drag every feature's mean towards 0, and the other
# sentences bring their own scales. The reference, "alone", is itself BatchNorm over A's four tokens only, the
# noisiest estimate of all (four values per feature): no row holds the "right" statistics, and what the table
# measures is how much A's output depends on the batch it is in. During training the same sentence would be normalised differently from one batch to the
# next, depending on its neighbours and on how much padding the longest of them forced.
#
# Masking the padding out of BatchNorm's statistics fixes the second row but not the third (by up to 2.16): the
# statistics still mix sentences. With neighbours of A's own scale (last row) the changes are hardly smaller, 1.82
# unmasked and 1.49 masked: the exaggerated scales are not what creates the effect. Each batch gives its own noisy
# estimates of a feature's mean and variance (from A's 4 tokens alone, from 13 real tokens with B and C), and A's
# four tokens are normalised with whatever this batch's estimates happen to be. LayerNorm avoids all of it: the same computation at training and at test time, for batches of any size, one
# sentence at a time if need be.

# %% [markdown]
# ## 4. The position-wise feed-forward network
#
# After attention has let the positions exchange information, each position goes through the same small
# two-layer network on its own: attention mixes information across the words, the feed-forward network
# transforms each word's vector (Vaswani et al., section 3.3):
#
# $$\mathrm{FFN}(x) = \max(0,\; x W_1 + b_1)\, W_2 + b_2,$$
#
# with $W_1 \in \mathbb{R}^{d_{model} \times d_{ff}}$ and $W_2 \in \mathbb{R}^{d_{ff} \times d_{model}}$. The paper uses
# $d_{model} = 512$ and $d_{ff} = 2048$: expand by a factor of 4, apply a ReLU, project back. The ReLU is what
# makes the FFN more than one big matrix: without it, the two products would collapse into a single linear map.
# It is the FFN's only non-linearity, but not the layer's: the softmax inside attention is non-linear, and so is
# LayerNorm, which divides each vector by a standard deviation computed from that same vector.

# %% [markdown]
# ### Exercise 3 — `feed_forward`
# > **Difficulty** ●○○ · **Importance** ●●● · about 5 minutes
#
# Write `feed_forward(x, w1, b1, w2, b2)`.
#
# * `x`: `[..., d_model]`.
# * `w1`: `[d_model, d_ff]`, `b1`: `[d_ff]`, `w2`: `[d_ff, d_model]`, `b2`: `[d_model]` (matrices multiply from
#   the right, as $x W^Q$ in chapter 02).
# * returns `[..., d_model]`.
#
# Worked example: with `d_model = 1`, `d_ff = 2`, `w1 = [[1., -1.]]`, `b1 = [0., 0.]`, `w2 = [[2.], [3.]]`,
# `b2 = [1.]`, the input `x = [[-2.]]` gives hidden values `[-2., 2.]`, then `[0., 2.]` after the ReLU, and
# the output `[[7.]]` ($0 \cdot 2 + 2 \cdot 3 + 1$).
#
# <details><summary>Hint 1 — the idea</summary>Two matrix products, two biases and one ReLU, in the order of the
# formula. Python's matrix-product operator multiplies the last dimension of <code>x</code> with the first of a
# matrix, whatever the leading dimensions are.</details>
# <details><summary>Hint 2 — the plan</summary>First the hidden layer, <code>[..., d_ff]</code>: the input times
# <code>w1</code>, plus <code>b1</code>, through the ReLU. Then project it back to <code>[..., d_model]</code> with
# <code>w2</code> and <code>b2</code>, and apply nothing after the second bias.</details>
# <details><summary>Hint 3 — the key step</summary>Shapes on a toy: a <code>[5, 2, 4]</code> input times a <code>[4,
# 8]</code> matrix is <code>[5, 2, 8]</code>, and a bias of shape <code>[8]</code> broadcasts over it. The page to read:
# torch.relu. Where does it go: after the first bias, or after the second?</details>

# %% nbgrader={"grade": false, "grade_id": "feed_forward", "locked": false, "schema_version": 3, "solution": true, "task": false}
def feed_forward(x: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor,
                 w2: torch.Tensor, b2: torch.Tensor) -> torch.Tensor:
    """FFN(x) = max(0, x w1 + b1) w2 + b2, on every position.

    x: [..., d_model]; w1: [d_model, d_ff]; b1: [d_ff]; w2: [d_ff, d_model]; b2: [d_model].
    Returns [..., d_model].
    """
    ### BEGIN SOLUTION
    hidden = torch.relu(x @ w1 + b1)  # [..., d_ff]
    return hidden @ w2 + b2  # [..., d_model]
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "feed_forward_test", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false} tags=["raises-exception"]
check_feed_forward(feed_forward)
### BEGIN HIDDEN TESTS
check_feed_forward(feed_forward, hidden=True)
### END HIDDEN TESTS

# %%
feed_forward_impl = yours_or_reference(feed_forward, check_feed_forward)

# %% [markdown]
# "Position-wise" means two things, both visible in the code: every position goes through the network
# **independently**, and all positions share **the same weights**. We run `feed_forward_impl` with the weights of
# the library's `PositionwiseFeedForward` module (its `nn.Linear` layers store $W^\top$, hence the `.t()`), and
# change the vector at one position only: only that position's output moves.

# %%
ffn = PositionwiseFeedForward(d_model=16, d_ff=64)  # the library's module: two nn.Linear layers
weights = (ffn.linear1.weight.t(), ffn.linear1.bias, ffn.linear2.weight.t(), ffn.linear2.bias)
x = torch.randn(1, 6, 16)  # [batch, seq, d_model]
x_changed = x.clone()
x_changed[0, 2] = torch.randn(16)  # a new vector at position 2 only
with torch.no_grad():
    change = (feed_forward_impl(x_changed, *weights) - feed_forward_impl(x, *weights)).abs().amax(dim=-1)[0]  # [seq]
    print("largest output change at each position:", change)
    gap = (feed_forward_impl(x, *weights) - ffn(x)).abs().max().item()
claim(gap < 1e-5, "feed_forward_impl and the module agree to 1e-5", measured=f"{gap:.1e}")

# %% [markdown]
# The same weights at every position, each position on its own: that is exactly a **convolution with kernel
# size 1** over the sequence, with $d_{model}$ input channels and $d_{ff}$ output channels (the paper says so in
# section 3.3). Copy the weights into two `nn.Conv1d(kernel_size=1)` layers and compare:

# %%
conv1 = nn.Conv1d(16, 64, kernel_size=1)
conv2 = nn.Conv1d(64, 16, kernel_size=1)
with torch.no_grad():
    conv1.weight.copy_(ffn.linear1.weight[:, :, None])  # [d_ff, d_model, kernel 1]
    conv1.bias.copy_(ffn.linear1.bias)
    conv2.weight.copy_(ffn.linear2.weight[:, :, None])  # [d_model, d_ff, kernel 1]
    conv2.bias.copy_(ffn.linear2.bias)
    as_conv = conv2(torch.relu(conv1(x.transpose(1, 2)))).transpose(1, 2)  # Conv1d wants [batch, channels, seq]
    gap = (feed_forward_impl(x, *weights) - as_conv).abs().max().item()
claim(gap < 1e-5, "the FFN and the two 1x1 convolutions agree to 1e-5",
      measured=f"max |FFN - 1x1 convolution| = {gap:.1e}")

# %% [markdown]
# **Predict**: in a layer of the paper's base model ($d_{model} = 512$, $d_{ff} = 2048$, 8 heads), which part holds
# more parameters, the multi-head attention or the FFN? By how much?
#
# Attention has four $d_{model} \times d_{model}$ matrices ($W^Q, W^K, W^V, W^O$) with biases, the FFN two
# $d_{model} \times d_{ff}$ matrices with biases, and each of the two LayerNorms a $\gamma$ and a $\beta$:

# %%
with torch.device("meta"):  # shapes only, no memory: we just count
    base_layer = EncoderLayer(d_model=512, n_heads=8, d_ff=2048)
parts = {
    "multi-head attention": count_parameters(base_layer.self_attn),
    "feed-forward network": count_parameters(base_layer.feed_forward),
    "two LayerNorms": count_parameters(base_layer.norm1) + count_parameters(base_layer.norm2),
}
total = count_parameters(base_layer)
for name, n in parts.items():
    print(f"{name:<22} {n:>10,}  ({n / total:6.1%})")
print(f"{'one encoder layer':<22} {total:>10,}")

# %% [markdown]
# Two thirds of each layer is the FFN: $2 \cdot 512 \cdot 2048 + 2048 + 512$ parameters against
# $4 \cdot (512^2 + 512)$ for attention. Attention decides *which* information flows between positions; most of
# the layer's capacity for *transforming* that information sits in the FFN. (Geva et al., 2021, read the FFN as a
# key–value memory: each of the $d_{ff}$ hidden units has a key, its column of $W_1$, matched against the input,
# and a value, its row of $W_2$, added to the output in proportion to the match.)

# %% [markdown]
# ## 5. Add & Norm: post-norm or pre-norm?
#
# A residual connection and a LayerNorm go around every sub-layer. There are two ways to combine them.
#
# **Post-norm**, the paper's choice (and the form Prince's *Understanding Deep Learning* writes in section 12.4):
# add, then normalise,
#
# $$x \leftarrow \mathrm{LayerNorm}\big(x + \mathrm{Sublayer}(x)\big).$$
#
# **Pre-norm**, used by GPT-2 and most models since: normalise the sub-layer's *input*, and leave the sum alone,
#
# $$x \leftarrow x + \mathrm{Sublayer}\big(\mathrm{LayerNorm}(x)\big).$$

# %%
draw_post_vs_pre_norm()
plt.show()

# %% [markdown]
# Both forms are everywhere, and tutorial code does not always say which it uses. The Annotated Transformer's
# `SublayerConnection` computes `x + dropout(sublayer(norm(x)))`, which is **pre-norm**, although the figure it
# illustrates (the paper's) shows Add & Norm *after* each sub-layer; its authors made the switch for simplicity.
# You should be able to tell the two apart on sight.
#
# In pre-norm the running sum $x$ (the **residual stream**) is never normalised inside the stack, so a pre-norm
# stack ends with one extra LayerNorm on its output.

# %% [markdown]
# ### Exercise 4 — `add_and_norm`
# > **Difficulty** ●●○ · **Importance** ●●● · about 10 minutes
#
# Write `add_and_norm(x, sublayer, gamma, beta, norm_first=False, eps=1e-5)`.
#
# * `x`: `[..., d_model]`.
# * `sublayer`: a function taking and returning `[..., d_model]` tensors (in the encoder: the attention or the FFN).
# * `gamma`, `beta`: `[d_model]`, the parameters of the LayerNorm.
# * `norm_first=False`: post-norm, `LayerNorm(x + sublayer(x))`; `norm_first=True`: pre-norm,
#   `x + sublayer(LayerNorm(x))`.
# * returns `[..., d_model]`.
#
# For the LayerNorm, call `layer_norm_impl` (your exercise 1 if it passed, the library's otherwise).
#
# Worked example: with `sublayer = lambda y: 2 * y`, `gamma` all ones, `beta` all zeros and `x = [1., 2., 3., 4.]`,
# post-norm gives `layer_norm(3 * x)`, about `[-1.3416, -0.4472, 0.4472, 1.3416]`, and pre-norm gives
# `x + 2 * layer_norm(x)`, about `[-1.6833, 1.1056, 3.8944, 6.6833]`.
#
# <details><summary>Hint 1 — the idea</summary>In pre-norm the sub-layer sees the normalised input, but the
# residual adds the <em>raw</em> <code>x</code>. In post-norm the sub-layer sees the raw <code>x</code>, and the
# sum is normalised.</details>
# <details><summary>Hint 2 — the plan</summary>Two branches on <code>norm_first</code>, one return each. Post-norm:
# the sub-layer reads the raw input, and the input plus the sub-layer's output goes through
# <code>layer_norm_impl</code> with <code>gamma</code>, <code>beta</code> and <code>eps</code>. Pre-norm:
# <code>layer_norm_impl</code> of the input goes into the sub-layer, and the raw input is added to what comes out.
# Every tensor stays <code>[..., d_model]</code>.</details>
# <details><summary>Hint 3 — the key step</summary>The question that unlocks it: what is the very last operation of each
# arrangement? In post-norm it is the norm, so the output is normalised; in pre-norm it is the addition, so a raw path
# from the input to the output stays that no norm touches. Check on the toy the cell below prints, a sub-layer that
# doubles its input.</details>

# %% nbgrader={"grade": false, "grade_id": "add_and_norm", "locked": false, "schema_version": 3, "solution": true, "task": false}
def add_and_norm(x: torch.Tensor, sublayer, gamma: torch.Tensor, beta: torch.Tensor,
                 norm_first: bool = False, eps: float = 1e-5) -> torch.Tensor:
    """A sub-layer inside a residual connection with a LayerNorm: post-norm or pre-norm.

    x: [..., d_model]; sublayer: [..., d_model] -> [..., d_model]; gamma, beta: [d_model].
    Returns [..., d_model].
    """
    ### BEGIN SOLUTION
    if norm_first:
        return x + sublayer(layer_norm_impl(x, gamma, beta, eps))  # pre-norm: the sum stays un-normalised
    return layer_norm_impl(x + sublayer(x), gamma, beta, eps)  # post-norm: normalise the sum
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "add_and_norm_test", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false} tags=["raises-exception"]
check_add_and_norm(add_and_norm)
### BEGIN HIDDEN TESTS
check_add_and_norm(add_and_norm, hidden=True)
### END HIDDEN TESTS

# %%
add_and_norm_impl = yours_or_reference(add_and_norm, check_add_and_norm)

# %% [markdown]
# The worked example:

# %%
x4 = torch.tensor([1.0, 2.0, 3.0, 4.0])
print("post-norm:", add_and_norm_impl(x4, lambda y: 2 * y, torch.ones(4), torch.zeros(4), norm_first=False))
print("pre-norm: ", add_and_norm_impl(x4, lambda y: 2 * y, torch.ones(4), torch.zeros(4), norm_first=True))

# %% [markdown]
# ### What the choice does to the gradients
#
# The paper trained its post-norm model with a **learning-rate warm-up**: the learning rate grows linearly over
# the first 4000 steps before it decays (chapter 07 implements that schedule). Without warm-up, post-norm
# Transformers often diverge early in training. Xiong et al. (2020, "On Layer Normalization in the Transformer
# Architecture") trained pre-norm Transformers without any warm-up, and traced the difference to the gradients at
# initialisation. Let us measure them.
#
# We build 12 encoder layers (the library's `EncoderLayer`, $d_{model} = 32$, 4 heads, $d_{ff} = 128$, Glorot
# initialisation) in both forms, feed a random batch, take a mean-squared error against random targets, and
# record for every layer the gradient norm of its FFN's second matrix $W_2$, and the size of the residual
# stream after the layer. Three random initialisations, averaged.
#
# A second run answers *where* each layer's gradient comes from. A layer's output reaches the loss along two
# kinds of path: its **direct path**, along the shortcuts only (and through the LayerNorms that sit on them: every
# one above the layer in post-norm, only the final one in pre-norm), and the paths through the sub-layers above
# it, which read the stream it wrote to. With
# `direct_only=True`, every attention and FFN receives a *detached* copy of its input, so no gradient flows back
# through them: each layer's $W_2$ then gets only its direct path's share.

# %%
def _detach_inputs(module, args):
    """A forward pre-hook: the module reads its inputs, but no gradient flows back through them."""
    return tuple(a.detach() if isinstance(a, torch.Tensor) else a for a in args)


def stack_gradients(n_layers: int, norm_first: bool, seed: int, d: int = 32, heads: int = 4,
                    direct_only: bool = False):
    """Per-layer |dLoss/dW2| of the FFN, and the mean norm of the residual stream after each layer."""
    torch.manual_seed(seed)
    layers = nn.ModuleList(EncoderLayer(d, heads, 4 * d, norm_first=norm_first) for _ in range(n_layers))
    for p in layers.parameters():
        if p.dim() > 1:
            nn.init.xavier_uniform_(p)  # the initialisation of the reference implementations
    if direct_only:
        for layer in layers:
            layer.self_attn.register_forward_pre_hook(_detach_inputs)
            layer.feed_forward.register_forward_pre_hook(_detach_inputs)
    final_norm = LayerNorm(d) if norm_first else nn.Identity()  # pre-norm stacks end with a LayerNorm
    g = torch.Generator().manual_seed(100 + seed)
    x = torch.randn(4, 12, d, generator=g)  # [batch, seq, d_model]
    target = torch.randn(4, 12, d, generator=g)
    stream = []
    for layer in layers:
        x = layer(x)
        stream.append(x.norm(dim=-1).mean().item())
    loss = ((final_norm(x) - target) ** 2).mean()
    loss.backward()
    return [layer.feed_forward.linear2.weight.grad.norm().item() for layer in layers], stream


def averaged(n_layers: int, norm_first: bool, seeds=(0, 1, 2), direct_only: bool = False, **sizes):
    runs = [stack_gradients(n_layers, norm_first, s, direct_only=direct_only, **sizes) for s in seeds]
    grads = torch.tensor([r[0] for r in runs]).mean(dim=0)  # [n_layers]
    stream = torch.tensor([r[1] for r in runs]).mean(dim=0)  # [n_layers]
    return grads, stream


post_grads, post_stream = averaged(12, norm_first=False)
pre_grads, pre_stream = averaged(12, norm_first=True)
post_direct, _ = averaged(12, norm_first=False, direct_only=True)
pre_direct, _ = averaged(12, norm_first=True, direct_only=True)
print("layer:                       " + " ".join(f"{i:>6d}" for i in range(1, 13)))
print("post-norm |grad W2|:         " + " ".join(f"{v:6.3f}" for v in post_grads))
print("  direct path only:          " + " ".join(f"{v:6.3f}" for v in post_direct))
print("pre-norm  |grad W2|:         " + " ".join(f"{v:6.3f}" for v in pre_grads))
print("  direct path only:          " + " ".join(f"{v:6.3f}" for v in pre_direct))
print("post-norm |x| after layer:   " + " ".join(f"{v:6.1f}" for v in post_stream))
print("pre-norm  |x| after layer:   " + " ".join(f"{v:6.1f}" for v in pre_stream))

# %% [markdown]
# How does the top layer's gradient depend on the depth of the stack? Repeat for stacks of 2 to 32 layers, and
# keep, for pre-norm, the size of the stream that enters the final LayerNorm:

# %%
depths = [2, 4, 8, 16, 32]
top_post, top_pre, final_stream = [], [], []
for n in depths:
    top_post.append(averaged(n, norm_first=False, seeds=(0, 1))[0][-1].item())
    grads, stream = averaged(n, norm_first=True, seeds=(0, 1))
    top_pre.append(grads[-1].item())
    final_stream.append(stream[-1].item())
print("layers in the stack:            " + " ".join(f"{n:>6d}" for n in depths))
print("post-norm, top |grad W2|:       " + " ".join(f"{v:6.3f}" for v in top_post))
print("pre-norm,  top |grad W2|:       " + " ".join(f"{v:6.3f}" for v in top_pre))
print("pre-norm,  |x| into final norm: " + " ".join(f"{v:6.1f}" for v in final_stream))
print("pre-norm,  top |grad| x |x|:    " + " ".join(f"{g * s:6.2f}" for g, s in zip(top_pre, final_stream)))

# %%
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.6))
ax1.plot(range(1, 13), post_grads, "o-", color="C0", label="post-norm")
ax1.plot(range(1, 13), pre_grads, "s-", color="C1", label="pre-norm")
ax1.plot(range(1, 13), pre_direct, "s--", color="C1", alpha=0.6, label="pre-norm, direct path only")
ax1.set_xlabel("layer (1 = bottom)")
ax1.set_ylabel("|dLoss/dW2| at initialisation")
ax1.set_title("12-layer stack")
ax1.set_ylim(bottom=0)
ax1.legend(fontsize=8)
product = top_pre[0] * final_stream[0]  # scale the final norm's 1/|x| to the first point
ax2.loglog(depths, top_post, "o-", color="C0", label="post-norm")
ax2.loglog(depths, top_pre, "s-", color="C1", label="pre-norm")
ax2.loglog(depths, [product / s for s in final_stream], "k:", label="c / |x into the final norm|")
ax2.set_xticks(depths, [str(n) for n in depths])
ax2.set_yticks([0.05, 0.1, 0.2, 0.3], ["0.05", "0.1", "0.2", "0.3"])
ax2.minorticks_off()
ax2.set_xlabel("number of layers L")
ax2.set_ylabel("top layer's |dLoss/dW2|")
ax2.set_title("Gradient of the top layer vs depth")
ax2.legend(fontsize=8)
fig.tight_layout()
plt.show()

# %% [markdown]
# What the numbers say:
#
# * **Post-norm** normalises the stream after every sub-layer, so its size stays fixed: each LayerNorm output has
#   norm $\sqrt{d_{model}} = \sqrt{32} \approx 5.7$. Every layer gets a gradient of about the same size, and, in
#   the right panel, **the top layer's gradient does not shrink as the stack gets deeper**. Its direct paths are
#   another story: a layer's output passes through every LayerNorm above it, and each one scales it down again, so
#   the lower layers' gradient arrives almost entirely through the sub-layers above them (layer 1's direct share
#   is 0.003 of 0.268).
# * **Pre-norm** lets the stream grow, since each layer adds its output to it (from 6.7 after layer 1 to
#   18.2 after layer 12), and then divides the sum by its standard deviation once, in the final LayerNorm.
#   Every layer's output enters that same sum, so **every layer's direct path is scaled alike** by the final
#   LayerNorm: the direct-path gradients are all about the same (0.082 to 0.091, flat in the
#   left panel). What differs between layers is the rest: a lower layer's output is also read by every sub-layer
#   above it, so it collects gradient along more paths. Layer 12 has no layer above it and gets its direct share
#   only (0.091); layer 1 collects 0.276, about three times its direct share.
# * The deeper the pre-norm stack, the larger the stream that reaches the final LayerNorm (from 8.4 with 2
#   layers to 32.8 with 32), and the more the final LayerNorm shrinks every direct path. The top layer, which
#   has only its direct path, loses gradient in the same proportion: the product of its gradient and that
#   stream size stays between
#   1.62 and 1.71 (last printed row), and the dotted line in the right panel, computed from the
#   measured stream sizes alone, follows the pre-norm curve. The stream grows about like $\sqrt{L}$ (from 8.4 to
#   32.8 while $L$ grows sixteenfold), so the top layer's gradient falls about like $1/\sqrt{L}$.
#
# **Compare with the published figure.** Xiong et al. (2020, Theorem 1) bound the gradient of the last layer's FFN
# at initialisation: independent of the depth in post-norm, shrinking like $1/\sqrt{L}$ in pre-norm. The right
# panel agrees. Their Figure 3, measured on a 6-layer translation Transformer at initialisation, also shows a profile
# across the layers, and there this notebook disagrees: in their figure post-norm's gradient grows with the layer
# index, toward the output, and pre-norm's stays flat; in the left panel post-norm's is flat and pre-norm's
# *falls* toward the output. The profiles of their figure are those of our **direct paths** (post-norm's grows
# from 0.003 to 0.221, pre-norm's stays between 0.082 and 0.091); in our setting the paths through the sub-layers
# above add enough to change the picture. Is it our small width? The next cell repeats the measurement at their
# size, 6 layers of $d_{model} = 512$ with 8 heads.

# %%
wide_post, _ = averaged(6, norm_first=False, d=512, heads=8)
wide_pre, _ = averaged(6, norm_first=True, d=512, heads=8)
print("6 layers of width 512, layer: " + " ".join(f"{i:>6d}" for i in range(1, 7)))
print("post-norm |grad W2|:          " + " ".join(f"{v:6.3f}" for v in wide_post))
print("pre-norm  |grad W2|:          " + " ".join(f"{v:6.3f}" for v in wide_pre))

# %% [markdown]
# The shapes stay: post-norm flat (0.213 to 0.251), pre-norm falling from 0.251 at layer 1 to 0.113 at layer 6.
# So this notebook does not reproduce their Figure 3, and it cannot say which remaining difference explains it:
# their model embeds real sentences, has a decoder, and is scored by a cross-entropy, where ours reads random
# vectors and is scored by a mean-squared error. Read the left panel as what happens in this setting, not as a
# general law.
#
# **Why the warm-up?** Xiong et al.'s answer: the gradients near the output of a post-norm stack are large at
# initialisation, so the first steps at the full learning rate move its top layers a lot and training can blow up;
# a warm-up keeps the first steps small. Their account is one of several, and it has a weak point: Transformers are
# trained with Adam, which divides each parameter's gradient by a running estimate of that gradient's own size,
# so its steps hardly depend on the gradient's scale. Its first step moves each parameter by the learning rate
# times $|g| / (|g| + \epsilon)$, with $\epsilon = 10^{-8}$ by default: by the learning rate itself, whatever the
# gradient's scale, unless the gradient is tiny (next cell). Liu et al. (2020, "Understanding the Difficulty of Training
# Transformers") argue that the gradients' scale is not the main cause: balancing the gradients alone does not
# make post-norm train stably. They point instead to post-norm's heavy dependence on its residual branches, which
# amplifies small changes of the parameters into large changes of the output. Another account (Liu et al., 2020,
# "On the Variance of the Adaptive Learning Rate and Beyond") blames Adam itself: in the first steps its estimate
# of each gradient's size rests on too few gradients. In practice pre-norm stacks of dozens of layers train where
# post-norm ones need care, one reason why GPT-2, GPT-3 and most large models since are pre-norm. They still use a
# warm-up (GPT-3: Brown et al., 2020, appendix B; LLaMA: Touvron et al., 2023, section 2.3), and at the largest
# scales they are not trouble-free either: PaLM's loss spiked again and again during training (Chowdhery et al.,
# 2022, section 5.1), and ViT-22B normalises its queries and keys because attention scores grown too large made
# its training diverge (Dehghani et al., 2023). Pre-norm has its price too: Liu et al. ("Understanding the Difficulty")
# report that post-norm, when it does train stably, often reaches slightly better results, and at the paper's
# depth of six layers, post-norm with a warm-up works well.

# %%
for scale in (1.0, 1000.0):
    w = torch.zeros(4, requires_grad=True)
    adam = torch.optim.Adam([w], lr=0.001)
    w.grad = scale * torch.tensor([0.3, -0.02, 2.0, -5.0])  # the same gradient, or a thousand times larger
    adam.step()
    print(f"gradient x {scale:>6g}: Adam's first step {w.detach()}")

# %% [markdown]
# ## 6. The encoder layer, assembled
#
# An encoder layer is two sub-layers, each wrapped in Add & Norm (Vaswani et al., section 3.1; Prince,
# section 12.4, in the same post-norm form):
#
# $$x \leftarrow \mathrm{LayerNorm}_1\big(x + \mathrm{MultiHeadSelfAttention}(x)\big), \qquad
# x \leftarrow \mathrm{LayerNorm}_2\big(x + \mathrm{FFN}(x)\big).$$
#
# Attention first: it is the only place where positions exchange information. The FFN then processes each
# position, now informed by its context. In pre-norm the same two sub-layers appear in the same order, with
# $x \leftarrow x + \mathrm{Sublayer}(\mathrm{LayerNorm}(x))$. In training, the paper also applies dropout to each
# sub-layer's output before it is added to $x$.

# %% [markdown]
# ### Exercise 5 — `encoder_layer_forward`
# > **Difficulty** ●●○ · **Importance** ●●● · about 20 minutes
#
# Write `encoder_layer_forward(x, mask, layer)`, the forward pass of one encoder layer, from the parts of the
# library's `EncoderLayer`:
#
# * `x`: `[batch, seq, d_model]`; returns `[batch, seq, d_model]`.
# * `mask`: `None`, or a boolean padding mask that broadcasts to the attention scores (`True` = may attend), as
#   `padding_mask(tokens, pad_id)` makes it: `[batch, 1, 1, seq]`.
# * `layer`: an `EncoderLayer`. Its parts:
#   * `layer.self_attn(query, key, value, mask)`: chapter 03's `MultiHeadAttention` (self-attention: the same
#     tensor three times);
#   * `layer.feed_forward(y)`: the position-wise FFN of exercise 3, as a module;
#   * `layer.norm1`, `layer.norm2`: the two `LayerNorm` modules, around the attention and around the FFN. Call
#     one as `layer.norm1(y)`, or use its `.gamma`, `.beta` and `.eps` with `add_and_norm_impl`;
#   * `layer.dropout1`, `layer.dropout2`: `nn.Dropout` modules, applied to each sub-layer's output before it is
#     added to `x`. They drop in training mode and do nothing in eval mode, as the checker runs them;
#   * `layer.norm_first`: `False` for post-norm (the paper), `True` for pre-norm.
#
# Do not call `layer(x, mask)` itself: that runs the library's own forward pass (the checker refuses it).
#
# Worked example: a freshly built `EncoderLayer(32, 4, 128)` has $\gamma = 1$ and $\beta = 0$ in both norms, so in
# post-norm every output vector has mean 0 and norm $\sqrt{32} \approx 5.657$.
#
# <details><summary>Hint 1 — the idea</summary>Two residual sub-layers in a row: the attention, then the FFN. Write
# each as a small function of one tensor, <code>[batch, seq, d_model]</code> in and out, with its dropout applied to
# its output. Exercise 4 already wraps such a function in Add & Norm, post-norm or pre-norm.</details>
# <details><summary>Hint 2 — the plan</summary>Two sub-layers, each a function of one tensor, <code>[batch, seq,
# d_model]</code> in and out: the attention (the layer's self-attention, with that tensor as query, key and value and
# the mask, then the first dropout) and the FFN (the layer's feed-forward network, then the second dropout). Then two
# residual steps, the attention's around the first norm and the FFN's around the second, in the arrangement the layer's
# <code>norm_first</code> chooses; the second step reads what the first wrote.</details>
# <details><summary>Hint 3 — the key step</summary>The question that unlocks it: exercise 4 takes a sub-layer that is a
# function of one tensor, but the attention also needs the mask. How does a nested <code>def</code> or a
# <code>lambda</code> carry the mask in from the enclosing function? And in pre-norm, which tensor does the second step
# add its output to?</details>

# %% nbgrader={"grade": false, "grade_id": "encoder_layer_forward", "locked": false, "schema_version": 3, "solution": true, "task": false}
def encoder_layer_forward(x: torch.Tensor, mask: torch.Tensor | None, layer: EncoderLayer) -> torch.Tensor:
    """Self-attention, then the FFN, each inside Add & Norm (post-norm or pre-norm, as layer.norm_first says).

    x: [batch, seq, d_model]; mask: None or bool, broadcastable to the scores. Returns [batch, seq, d_model].
    """
    ### BEGIN SOLUTION
    def attention(y):
        return layer.dropout1(layer.self_attn(y, y, y, mask))  # [batch, seq, d_model]

    def ffn(y):
        return layer.dropout2(layer.feed_forward(y))  # [batch, seq, d_model]

    if layer.norm_first:
        x = x + attention(layer.norm1(x))
        return x + ffn(layer.norm2(x))
    x = layer.norm1(x + attention(x))
    return layer.norm2(x + ffn(x))
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "encoder_layer_forward_test", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false} tags=["raises-exception"]
check_encoder_layer_forward(encoder_layer_forward)
### BEGIN HIDDEN TESTS
check_encoder_layer_forward(encoder_layer_forward, hidden=True)
### END HIDDEN TESTS

# %%
encoder_layer_forward_impl = yours_or_reference(encoder_layer_forward, check_encoder_layer_forward)

# %% [markdown]
# Is this the layer PyTorch ships? Copy the weights of an `EncoderLayer` into `nn.TransformerEncoderLayer` and
# compare its output with `encoder_layer_forward_impl`'s, in both forms, with a padding mask. PyTorch keeps
# $W^Q, W^K, W^V$ stacked in one `in_proj_weight`, and its padding mask marks the pads with `True`, the opposite of
# this course's convention.

# %%
def to_torch_layer(ours: EncoderLayer, norm_first: bool) -> nn.TransformerEncoderLayer:
    d_model, n_heads = ours.self_attn.d_model, ours.self_attn.n_heads
    theirs = nn.TransformerEncoderLayer(d_model, n_heads, ours.feed_forward.linear1.out_features, dropout=0.0,
                                        batch_first=True, norm_first=norm_first)
    attn = ours.self_attn
    with torch.no_grad():
        theirs.self_attn.in_proj_weight.copy_(torch.cat([attn.w_q.weight, attn.w_k.weight, attn.w_v.weight]))
        theirs.self_attn.in_proj_bias.copy_(torch.cat([attn.w_q.bias, attn.w_k.bias, attn.w_v.bias]))
        theirs.self_attn.out_proj.load_state_dict(attn.w_o.state_dict())
        theirs.linear1.load_state_dict(ours.feed_forward.linear1.state_dict())
        theirs.linear2.load_state_dict(ours.feed_forward.linear2.state_dict())
        for theirs_norm, our_norm in [(theirs.norm1, ours.norm1), (theirs.norm2, ours.norm2)]:
            theirs_norm.weight.copy_(our_norm.gamma)
            theirs_norm.bias.copy_(our_norm.beta)
    return theirs.train()  # training mode with dropout 0 keeps PyTorch on its plain (not fused) path


tokens = torch.tensor([[5, 9, 3, 7, 2, 8], [4, 6, 1, 0, 0, 0]])  # two sentences, 0 = padding
mask = padding_mask(tokens, 0)  # [batch, 1, 1, seq], True = may attend
x = torch.randn(2, 6, 32)
with torch.no_grad():
    fresh = encoder_layer_forward_impl(x, mask, EncoderLayer(32, 4, 128))
    print(f"fresh post-norm layer: output norms {fresh.norm(dim=-1).min():.3f} to {fresh.norm(dim=-1).max():.3f}")
    for norm_first in [False, True]:
        ours = EncoderLayer(32, 4, 128, norm_first=norm_first)
        ours.norm1.gamma.uniform_(0.5, 1.5)  # not all ones, so that a misplaced norm would show
        ours.norm2.beta.normal_()
        theirs = to_torch_layer(ours, norm_first)
        ours_out = encoder_layer_forward_impl(x, mask, ours)
        theirs_out = theirs(x, src_key_padding_mask=tokens == 0)  # True = padding
        gap = (ours_out - theirs_out).abs().max().item()
        claim(gap < 1e-5, f"norm_first={norm_first}: encoder_layer_forward_impl and nn.TransformerEncoderLayer "
              "agree to 1e-5", measured=f"{gap:.1e}")

# %% [markdown]
# ## 7. Stacking layers: the encoder
#
# The encoder is $N$ such layers in a row, the output of one the input of the next: same computation, separate
# parameters. The library's `Encoder(layer, n_layers, norm_first=False)` holds `n_layers` deep copies of a layer in
# `encoder.layers`, as PyTorch's `nn.TransformerEncoder` does: at the start every copy holds the *same values*, each
# in its own tensors, so that training changes each layer separately (the full model of chapter 07
# re-initialises them, so that they also start apart). In `encoder.norm` it holds the final LayerNorm of a pre-norm stack
# (`nn.Identity()` in a post-norm one, whose layers already end with a norm). The shape never changes:
# `[batch, seq, d_model]` in, `[batch, seq, d_model]` out, at every layer. That is what makes stacking possible.

# %% [markdown]
# ### Exercise 6 — `encoder_forward`
# > **Difficulty** ●○○ · **Importance** ●●○ · about 5 minutes
#
# Write `encoder_forward(x, mask, encoder, layer_forward)`:
#
# * `x`: `[batch, seq, d_model]`; `mask`: as in exercise 5, the same for every layer; returns
#   `[batch, seq, d_model]`.
# * `encoder`: an `Encoder`, with `encoder.layers` (a list of `EncoderLayer`s, bottom first) and `encoder.norm`.
# * `layer_forward`: a function `(x, mask, layer) -> x` that runs one layer, such as your
#   `encoder_layer_forward`. Run every layer through it (not with `layer(x, mask)`), so that the stack runs on
#   the code you pass in.
#
# Worked example: with a single layer, the result is `encoder.norm(layer_forward(x, mask, encoder.layers[0]))`.
#
# <details><summary>Hint 1 — the idea</summary>Each layer reads what the layer below wrote. The final norm comes
# once, after the last layer, whatever kind of stack it is (in post-norm it is the identity).</details>
# <details><summary>Hint 2 — the plan</summary>One pass over the stack's layers, bottom first: each replaces
# <code>x</code> with what your layer function makes of it, the mask and that layer (always <code>[batch, seq,
# d_model]</code>). After the pass, the stack's final norm, once.</details>
# <details><summary>Hint 3 — the key step</summary>The question that unlocks it: which name must the loop rebind at
# every layer so that the next layer reads it, and is the final norm inside the loop or after it? In a post-norm stack
# that norm is the identity, so calling it costs nothing.</details>

# %% nbgrader={"grade": false, "grade_id": "encoder_forward", "locked": false, "schema_version": 3, "solution": true, "task": false}
def encoder_forward(x: torch.Tensor, mask: torch.Tensor | None, encoder: Encoder, layer_forward) -> torch.Tensor:
    """Run x through every layer of the encoder with layer_forward(x, mask, layer), then the final norm.

    x: [batch, seq, d_model]. Returns [batch, seq, d_model].
    """
    ### BEGIN SOLUTION
    for layer in encoder.layers:
        x = layer_forward(x, mask, layer)  # [batch, seq, d_model]
    return encoder.norm(x)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "encoder_forward_test", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false} tags=["raises-exception"]
check_encoder_forward(encoder_forward)
### BEGIN HIDDEN TESTS
check_encoder_forward(encoder_forward, hidden=True)
### END HIDDEN TESTS

# %%
encoder_forward_impl = yours_or_reference(encoder_forward, check_encoder_forward)

# %% [markdown]
# Now the whole chapter at work: a post-norm stack of six layers, run by `encoder_forward_impl` with
# `encoder_layer_forward_impl` for each layer (and inside it, where you wrote them that way, your `add_and_norm`
# and your `layer_norm`). We follow the shapes and the size of the vectors layer by layer, then compare the
# result with the library's `Encoder.forward`.

# %%
small_encoder = Encoder(EncoderLayer(d_model=32, n_heads=4, d_ff=128), n_layers=6)
h = x
print(f"input            {list(h.shape)}")
with torch.no_grad():
    for i, layer in enumerate(small_encoder.layers, start=1):
        h = encoder_layer_forward_impl(h, mask, layer)
        print(f"after layer {i}    {list(h.shape)}   mean |h| per position {h.norm(dim=-1).mean():.3f}")
    stacked = encoder_forward_impl(x, mask, small_encoder, encoder_layer_forward_impl)
    print("encoder_forward_impl gives the same:", torch.allclose(h, stacked))
    print("the library's Encoder.forward gives the same:", torch.allclose(stacked, small_encoder(x, mask), atol=1e-6))
same_storage = small_encoder.layers[0].feed_forward.linear1.weight.data_ptr() == \
    small_encoder.layers[1].feed_forward.linear1.weight.data_ptr()
print("layers 1 and 2 share their weight tensor:", same_storage)
print("layers 1 and 2 start from equal values:  ", torch.equal(small_encoder.layers[0].feed_forward.linear1.weight,
                                                                small_encoder.layers[1].feed_forward.linear1.weight))

# %% [markdown]
# Every layer of this post-norm stack ends in a LayerNorm with $\gamma = 1, \beta = 0$, so every position
# leaves every layer with norm $\sqrt{32} \approx 5.657$. In a pre-norm stack the same walk would show the stream
# growing, as in section 5, until the final `encoder.norm` brings it back.
#
# Finally, the size of the real thing. The paper's base encoder has $N = 6$ layers with $d_{model} = 512$, 8 heads and
# $d_{ff} = 2048$. Built on PyTorch's `meta` device, nothing is allocated; we only count:

# %%
with torch.device("meta"):
    base_encoder = Encoder(EncoderLayer(d_model=512, n_heads=8, d_ff=2048), n_layers=6)
per_layer = count_parameters(base_encoder.layers[0])
print(f"one layer:              {per_layer:>12,}")
print(f"the base encoder (N=6): {count_parameters(base_encoder):>12,}")
print(f"check: 6 x (4 (512^2 + 512) + 2 (512 * 2048) + 2048 + 512 + 4 * 512) = "
      f"{6 * (4 * (512**2 + 512) + 2 * 512 * 2048 + 2048 + 512 + 4 * 512):,}")
print(f"about {count_parameters(base_encoder) / 1e6:.1f} million")

# %% [markdown]
# About 18.9 million parameters, before any embedding: the decoder (chapter 06) has a third sub-layer per layer, and
# the embedding matrices come on top (chapter 07 assembles the whole model).

# %% [markdown]
# ## Summary
#
# * A **residual connection** computes $x + F(x)$. Its Jacobian $I + \partial F/\partial x$ gives the gradient a
#   path through the stack on which nothing multiplies it, as long as nothing else sits on that path (in post-norm a
#   LayerNorm does, section 5). In a 30-layer tanh chain with `nn.Linear`'s default initialisation the first
#   layer's gradient was about $10^{-7}$ times the last layer's, and of the same order with shortcuts; that loss was
#   mostly the initialisation's. Across the four initialisations tried, the plain chain's ratio of the two spanned
#   ten orders of magnitude, the residual chain's less than two. Residual networks (He et al., 2016) made stacks of a hundred layers and more trainable.
# * **LayerNorm** (Ba et al., 2016) normalises each token's feature vector by itself: mean and *biased* variance over
#   the last dimension, $\epsilon$ inside the square root, then $\gamma \hat{x} + \beta$. The Annotated
#   Transformer's `x.std() + eps` is a slightly different function.
# * **BatchNorm**'s statistics mix the tokens of a batch: the same sentence got a different output when padded or
#   batched with others, even with neighbours of its own scale; masking the padding out removed the first effect,
#   not the second. LayerNorm's output did not change at all.
# * The **position-wise FFN**, $\max(0, xW_1 + b_1)W_2 + b_2$ with $d_{ff} = 4 d_{model}$, treats each position
#   on its own with shared weights (a $1 \times 1$ convolution) and holds two thirds of an encoder layer's
#   parameters. Its ReLU is one of the layer's non-linearities, with attention's softmax and the LayerNorms.
# * **Post-norm** $\mathrm{LN}(x + F(x))$ (the paper) keeps the stream normalised, and its top layer's gradient
#   does not shrink with depth; **pre-norm** $x + F(\mathrm{LN}(x))$ lets the stream grow and normalises it once,
#   at the end, so its top layer's gradient falls about like $1/\sqrt{L}$, as Xiong et al.'s (2020) bound says. Their
#   per-layer profile is not reproduced here (only our direct paths have its shape). Why post-norm needs a
#   warm-up is still argued: large gradients (Xiong et al.), though Adam's step hardly depends on their scale;
#   the amplified dependence on the residual branches (Liu et al., 2020).
# * An **encoder layer** is self-attention then FFN, each inside Add & Norm; it matches
#   `nn.TransformerEncoderLayer`. The **encoder** chains $N$ of them (plus a final LayerNorm in pre-norm); the
#   paper's base encoder (6 layers) has 18,914,304 parameters.
#
# ## What's next
#
# Chapter 06 builds the **decoder** side: the causal mask that stops a position from looking at the future,
# padding masks, and cross-attention, the third sub-layer through which the decoder reads the encoder's output.

# %% [markdown]
# ## Where you stand
#
# Which of this chapter's exercises pass (the line for an exercise you have not checked yet says so):

# %%
exercise_summary(check_layer_norm, check_batch_norm, check_feed_forward, check_add_and_norm,
                 check_encoder_layer_forward, check_encoder_forward)

# %% [markdown]
# ## Glossary · 术语表
#
# | English | 中文 | Meaning |
# |---|---|---|
# | residual connection | 残差连接 | the shortcut $y = x + F(x)$ around a sub-layer |
# | vanishing gradient | 梯度消失 | gradients shrinking layer after layer on their way back to the input |
# | layer normalisation (LayerNorm) | 层归一化 | normalise each token's feature vector by its own mean and variance |
# | batch normalisation (BatchNorm) | 批归一化 | normalise each feature with statistics over the batch (and positions) |
# | biased variance | 有偏方差 | the variance divided by $d$ rather than $d - 1$ |
# | gain and bias ($\gamma$, $\beta$) | 缩放因子与平移因子 | LayerNorm's learned per-feature scale and shift |
# | padding | 填充 | filler tokens that bring the sentences of a batch to one length |
# | padding mask | 填充掩码 | a boolean tensor saying which positions are real tokens (`True`) and which are padding |
# | position-wise feed-forward network | 逐位置前馈网络 (FFN) | the same two-layer MLP applied to every position separately |
# | inner dimension $d_{ff}$ | 中间层维度 | the FFN's hidden size, 2048 = 4 × 512 in the paper |
# | 1×1 convolution | 1×1 卷积 | a convolution with kernel size 1: the same linear map at every position |
# | Add & Norm | 残差与归一化 | the residual connection plus LayerNorm around each sub-layer |
# | post-norm | 后置归一化 (Post-LN) | $\mathrm{LN}(x + F(x))$: the paper's arrangement |
# | pre-norm | 前置归一化 (Pre-LN) | $x + F(\mathrm{LN}(x))$: GPT-2's and most later models' arrangement |
# | residual stream | 残差流 | the running sum $x$ that every sub-layer reads from and adds to |
# | learning-rate warm-up | 学习率预热 | starting training with a small learning rate that grows over the first steps |
# | encoder layer | 编码器层 | self-attention then FFN, each inside Add & Norm; stacked $N$ times |
# | dropout | 随机失活 (dropout) | zeroing random activations in training only; a no-op in eval mode |
