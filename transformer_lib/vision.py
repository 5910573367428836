"""Transformers for images: the Vision Transformer (ViT) and the Swin Transformer.

ViT (Dosovitskiy et al., "An Image is Worth 16x16 Words", ICLR 2021) cuts an image into
p x p patches, flattens each into one token, prepends a learned [CLS] token, adds learned
positions, runs a pre-norm Transformer encoder and classifies from [CLS]'s final state.

Swin (Liu et al., "Swin Transformer: Hierarchical Vision Transformer using Shifted Windows",
ICCV 2021) attends only inside M x M windows, shifts the windows by M/2 every other block
(a cyclic roll plus a mask keeps the wrapped-around pieces apart), adds a learned bias per
relative offset inside a window, and halves the resolution between stages by merging 2 x 2
neighbours (a feature pyramid, like a CNN's); it classifies from the average of the last
stage's tokens.

Read top to bottom: patchify, the ViT's forward pass (vit_forward) and its module; the Swin
functions (window_partition, window_reverse, cyclic_shift, shifted_window_mask,
relative_position_index_2d, merge_patches, swin_window_attention: the attention half of a block),
its block, stage and model; converters from Hugging Face's ViT and Swin weights (their
conventions, which these functions follow: patch-merging order (0,0),(1,0),(0,1),(1,1),
a roll by -M/2, relative index (dy + M-1)(2M-1) + dx + M-1 with query minus key); a small
CNN with a training loop; and the chapter's comparison protocol on scikit-learn's 8x8 digits
(train_run: one seeded run scored on a validation set; choose_learning_rates: one rate per
model from a grid, chosen on validation).

Attention, LayerNorm, the feed-forward network and the encoder stack are the library's
(attention.MultiHeadAttention with its `bias=`, layers.LayerNorm / PositionwiseFeedForward /
EncoderLayer / Encoder): nothing here has a second copy of them.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from .attention import MultiHeadAttention
from .layers import Encoder, EncoderLayer, LayerNorm, PositionwiseFeedForward


def _int(name: str, value, minimum: int) -> int:
    try:
        if isinstance(value, bool):
            raise TypeError
        value = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int, got {type(value).__name__}") from None
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def _tensor(name: str, x, dims: int, layout: str) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor {layout}, got {type(x).__name__}")
    if x.dim() != dims:
        raise ValueError(f"{name} must be {layout}, got shape {list(x.shape)}")


# ---------------------------------------------------------------------------------------
# Patches: an image becomes a sequence of tokens
# ---------------------------------------------------------------------------------------

def patchify(images: torch.Tensor, patch: int) -> torch.Tensor:
    """Cut images into non-overlapping patch x patch squares and flatten each into one token.

    images: [B, C, H, W] with H and W multiples of `patch`. Returns [B, N, C * patch * patch],
    N = (H / patch) * (W / patch): patches in reading order (left to right, then top to bottom),
    each flattened channel first, then row, then column, the layout of a Conv2d weight
    [D, C, p, p]. So a Linear(C*p*p, D) on these tokens computes exactly what a Conv2d with
    kernel_size = stride = p computes: ViT's "patch embedding".
    """
    _tensor("images", images, 4, "[batch, channels, height, width]")
    p = _int("patch", patch, 1)
    b, c, h, w = images.shape
    if h % p or w % p:
        raise ValueError(f"the image size {h}x{w} is not a multiple of the patch size {p}: "
                         f"crop or pad the images first")
    x = images.reshape(b, c, h // p, p, w // p, p)  # [B, C, rows, p, cols, p]
    # Grid position first (rows, cols), then what is inside one patch (C, p, p).
    x = x.permute(0, 2, 4, 1, 3, 5)  # [B, rows, cols, C, p, p]
    return x.reshape(b, (h // p) * (w // p), c * p * p)  # [B, N, C*p*p]


def unpatchify(tokens: torch.Tensor, patch: int, channels: int, height: int, width: int) -> torch.Tensor:
    """The inverse of patchify: [B, N, C*p*p] -> [B, C, H, W]."""
    _tensor("tokens", tokens, 3, "[batch, patches, channels * patch * patch]")
    p = patch
    b = tokens.shape[0]
    if tokens.shape[1:] != ((height // p) * (width // p), channels * p * p):
        raise ValueError(f"tokens of shape {list(tokens.shape)} do not tile a {channels}x{height}x{width} image "
                         f"with {p}x{p} patches")
    x = tokens.reshape(b, height // p, width // p, channels, p, p)  # [B, rows, cols, C, p, p]
    return x.permute(0, 3, 1, 4, 2, 5).reshape(b, channels, height, width)


def conv_to_linear(conv: nn.Conv2d) -> nn.Linear:
    """The Linear layer that computes on patchify's tokens what a stride-p patch Conv2d computes:
    its [D, C, p, p] kernel flattened to [D, C*p*p] (patchify flattens each patch in that order)."""
    if conv.kernel_size != conv.stride or conv.padding not in ((0, 0), "valid") or conv.groups != 1:
        raise ValueError("only a patch embedding (kernel_size == stride, no padding, groups=1) is a Linear on patches")
    linear = nn.Linear(conv.in_channels * conv.kernel_size[0] * conv.kernel_size[1], conv.out_channels,
                       bias=conv.bias is not None)
    with torch.no_grad():
        linear.weight.copy_(conv.weight.reshape(conv.out_channels, -1))
        if conv.bias is not None:
            linear.bias.copy_(conv.bias)
    return linear


def _init_vision_weights(module: nn.Module) -> None:
    """ViT's and Swin's initialisation: truncated N(0, 0.02) for every Linear, zero biases."""
    if isinstance(module, nn.Linear):
        nn.init.trunc_normal_(module.weight, std=0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)


# ---------------------------------------------------------------------------------------
# ViT
# ---------------------------------------------------------------------------------------

@dataclass
class ViTConfig:
    """Sizes of a Vision Transformer; the defaults are ViT-B/16 on 224 x 224 ImageNet images."""

    image_size: int = 224
    patch_size: int = 16
    in_channels: int = 3
    n_classes: int = 1000  # 0: no head, forward returns [CLS]'s final state
    d_model: int = 768
    n_heads: int = 12
    n_layers: int = 12
    d_ff: int = 3072
    dropout: float = 0.0
    layer_norm_eps: float = 1e-6  # the original (JAX) ViT's

    @property
    def n_patches(self) -> int:
        if self.image_size % self.patch_size:
            raise ValueError(f"image_size {self.image_size} is not a multiple of patch_size {self.patch_size}")
        return (self.image_size // self.patch_size) ** 2


def vit_forward(images: torch.Tensor, model: "ViT") -> torch.Tensor:
    """ViT's forward pass, written out on the parts of `model`: images [B, C, H, W] -> logits [B, n_classes].

    The images are cut with `model.patchify` and embedded (`model.patch_embed`, [B, N, d_model]);
    the learned [CLS] token is put in front ([B, 1 + N, d_model]) and only then the learned positions
    are added, one row of `model.pos_embed` per token, [CLS]'s included; then the pre-norm encoder
    layers, the final LayerNorm, and the head on [CLS]'s final state alone. With n_classes = 0 the
    head is the identity and the result is [CLS]'s final state [B, d_model].
    """
    c = model.config
    tokens = model.patch_embed(model.patchify(images, c.patch_size))  # [B, N, d_model]
    cls = model.cls_token.expand(images.shape[0], -1, -1)  # [B, 1, d_model]
    x = model.dropout(torch.cat([cls, tokens], dim=1) + model.pos_embed)  # [B, 1 + N, d_model]
    # The stack: every pre-norm layer, then the final LayerNorm (the last residual sum is otherwise
    # never normalised); layers.encoder_forward, through the Encoder module.
    x = model.encoder(x)  # [B, 1 + N, d_model]
    return model.head(x[:, 0])  # [B, n_classes], from [CLS] alone


class ViT(nn.Module):
    """Patches -> linear embedding -> [CLS] + patches, plus learned positions -> pre-norm encoder
    (GELU FFN, final LayerNorm) -> a linear head on [CLS].

    forward(images [B, C, H, W]) -> logits [B, n_classes]. The model holds the two functions it runs
    as attributes: `patchify` (patchify's signature) and `forward_pass` (vit_forward's: it receives the
    images and the model, and computes the whole pass from the model's parts). The chapter builds it
    on the learner's functions where they pass.
    """

    def __init__(self, config: ViTConfig, patchify: Callable = patchify, forward_pass: Callable = vit_forward):
        super().__init__()
        c = self.config = config
        self.patchify = patchify
        self.forward_pass = forward_pass
        self.patch_embed = nn.Linear(c.in_channels * c.patch_size ** 2, c.d_model)
        # [CLS] carries no pixel: through attention its final state summarises the image.
        self.cls_token = nn.Parameter(torch.zeros(1, 1, c.d_model))
        # One learned vector per position, [CLS] included (1-D, even though the image is 2-D).
        self.pos_embed = nn.Parameter(torch.zeros(1, c.n_patches + 1, c.d_model))
        self.dropout = nn.Dropout(c.dropout)
        layer = EncoderLayer(c.d_model, c.n_heads, c.d_ff, c.dropout, norm_first=True, activation="gelu")
        self.encoder = Encoder(layer, c.n_layers, norm_first=True)
        for m in self.encoder.modules():
            if isinstance(m, LayerNorm):
                m.eps = c.layer_norm_eps
        self.head = nn.Linear(c.d_model, c.n_classes) if c.n_classes > 0 else nn.Identity()
        self.apply(_init_vision_weights)
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        nn.init.trunc_normal_(self.cls_token, std=0.02)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        c = self.config
        _tensor("images", images, 4, "[batch, channels, height, width]")
        if images.shape[1:] != (c.in_channels, c.image_size, c.image_size):
            raise ValueError(f"this ViT takes images [batch, {c.in_channels}, {c.image_size}, {c.image_size}], "
                             f"got {list(images.shape)}")
        return self.forward_pass(images, self)  # [B, n_classes]


# ---------------------------------------------------------------------------------------
# Swin: windows, shifted windows, relative positions, patch merging
# ---------------------------------------------------------------------------------------

def _check_windows(height: int, width: int, window: int) -> None:
    if height % window or width % window:
        raise ValueError(f"a {height}x{width} map does not split into {window}x{window} windows: "
                         f"height and width must be multiples of the window size")


def window_partition(x: torch.Tensor, window: int) -> torch.Tensor:
    """Cut a feature map into non-overlapping window x window squares, each a sequence of tokens.

    x: [B, H, W, C], H and W multiples of `window`. Returns [B * nW, window * window, C],
    nW = (H / window) * (W / window): image by image, windows in reading order, and inside a
    window the tokens in reading order. Attention then runs on each window separately.
    """
    _tensor("x", x, 4, "[batch, height, width, channels]")
    m = _int("window", window, 1)
    b, h, w, c = x.shape
    _check_windows(h, w, m)
    x = x.reshape(b, h // m, m, w // m, m, c)  # [B, rows, M, cols, M, C]
    x = x.permute(0, 1, 3, 2, 4, 5)  # [B, rows, cols, M, M, C]: the two window indices first
    return x.reshape(-1, m * m, c)  # [B*nW, M*M, C]


def window_reverse(windows: torch.Tensor, window: int, height: int, width: int) -> torch.Tensor:
    """The inverse of window_partition: [B * nW, window * window, C] -> [B, H, W, C]."""
    _tensor("windows", windows, 3, "[batch * windows, window * window, channels]")
    m = _int("window", window, 1)
    h, w = _int("height", height, 1), _int("width", width, 1)
    _check_windows(h, w, m)
    n_windows = (h // m) * (w // m)
    if windows.shape[1] != m * m or windows.shape[0] % n_windows:
        raise ValueError(f"windows of shape {list(windows.shape)} do not tile {height}x{width} maps with "
                         f"{window}x{window} windows ({n_windows} windows of {m * m} tokens per image)")
    c = windows.shape[-1]
    x = windows.reshape(-1, h // m, w // m, m, m, c)  # [B, rows, cols, M, M, C]
    x = x.permute(0, 1, 3, 2, 4, 5)  # [B, rows, M, cols, M, C]
    return x.reshape(-1, h, w, c)  # [B, H, W, C]


def cyclic_shift(x: torch.Tensor, shift: int) -> torch.Tensor:
    """Roll a feature map [B, H, W, C] up and left by `shift` (down and right for a negative shift).

    Row `shift` becomes row 0 and the first `shift` rows wrap around to the bottom (likewise
    for columns). Windows cut from the rolled map are the regular windows displaced by `shift`,
    while their number stays (H/M)(W/M). cyclic_shift(y, -shift) rolls back.
    """
    _tensor("x", x, 4, "[batch, height, width, channels]")
    return torch.roll(x, shifts=(-shift, -shift), dims=(1, 2))  # [B, H, W, C]


def _bands(n: int, window: int, shift: int, device=None) -> torch.Tensor:
    """Which stretch of the rolled axis each index came from: 0 for [0, n - window) (whole windows),
    1 for [n - window, n - shift), 2 for [n - shift, n) (the strip that wrapped around)."""
    idx = torch.arange(n, device=device)
    return (idx >= n - window).long() + (idx >= n - shift).long()  # [n]


def shifted_window_mask(height: int, width: int, window: int, shift: int) -> torch.Tensor:
    """The attention mask of shifted windows: True where two tokens of one window may attend.

    After cyclic_shift(x, shift), the windows of the last row and column hold pieces of the map
    that are not neighbours: the strip that wrapped around from the other side. Label each
    position with the piece it belongs to (3 bands per axis, 9 labels); two tokens of a window
    may attend when they carry the same label. Returns bool [nW, window^2, window^2], windows
    in window_partition's order; every entry is True when shift == 0.
    """
    h, w = _int("height", height, 1), _int("width", width, 1)
    m = _int("window", window, 1)
    s = _int("shift", shift, 0)
    _check_windows(h, w, m)
    if s >= m:
        raise ValueError(f"the shift ({shift}) must be smaller than the window ({window}); Swin uses window // 2")
    label = _bands(h, m, s)[:, None] * 3 + _bands(w, m, s)[None, :]  # [H, W]: 9 labels, one per piece
    windows = window_partition(label[None, :, :, None], m)[..., 0]  # [nW, M*M]
    return windows[:, :, None] == windows[:, None, :]  # [nW, M*M, M*M]


def relative_position_index_2d(window: int) -> torch.Tensor:
    """For tokens i (query) and j (key) of one window, the row of the bias table for their offset.

    With (y, x) the row and column of a token inside the window (reading order),
    dy = y_i - y_j and dx = x_i - x_j lie in [-(M-1), M-1]; shifted by M - 1 they lie in
    [0, 2M-2], and index = (dy + M - 1) * (2M - 1) + (dx + M - 1) numbers the (2M-1)^2 offsets.
    Returns int64 [M*M, M*M]. Two pairs get the same index exactly when they have the same
    offset: the bias depends on where the key is relative to the query, not on where both are.
    """
    m = _int("window", window, 1)
    rows, cols = torch.meshgrid(torch.arange(m), torch.arange(m), indexing="ij")  # [M, M] each
    coords = torch.stack([rows.flatten(), cols.flatten()])  # [2, M*M]: (y, x) of each token
    offsets = coords[:, :, None] - coords[:, None, :]  # [2, M*M, M*M]: query minus key
    offsets = offsets + (m - 1)  # from [-(M-1), M-1] to [0, 2M-2]: table rows start at 0
    return offsets[0] * (2 * m - 1) + offsets[1]  # [M*M, M*M]


def merge_patches(x: torch.Tensor) -> torch.Tensor:
    """Concatenate each 2 x 2 block of neighbours into one token: [B, H, W, C] -> [B, H/2, W/2, 4C].

    The order is Swin's (and its published checkpoints'): x0 = (row 0, col 0), x1 = (1, 0),
    x2 = (0, 1), x3 = (1, 1) of each block, so channels 0..C-1 come from the top-left token,
    C..2C-1 from the one below it, and so on.
    """
    _tensor("x", x, 4, "[batch, height, width, channels]")
    h, w = x.shape[1], x.shape[2]
    if h % 2 or w % 2:
        raise ValueError(f"patch merging needs an even height and width, got {h}x{w}")
    x0 = x[:, 0::2, 0::2]  # [B, H/2, W/2, C]: top-left of each block
    x1 = x[:, 1::2, 0::2]  # bottom-left
    x2 = x[:, 0::2, 1::2]  # top-right
    x3 = x[:, 1::2, 1::2]  # bottom-right
    return torch.cat([x0, x1, x2, x3], dim=-1)  # [B, H/2, W/2, 4C]


def swin_window_attention(x: torch.Tensor, block: "SwinBlock", shift: int) -> torch.Tensor:
    """The attention half of a Swin block on a (normalised) map x [B, H, W, C] -> [B, H, W, C].

    Roll the map up and left by `shift` (nothing to do for shift 0), cut it into block.window x
    block.window windows, attend inside each window with the block's attention, adding each head's
    relative position bias (block.bias_table looked up at relative_position_index_2d) and, for a
    shifted map, the shifted-window mask, then put the windows back and roll the map back. The
    window functions are the block's (`block.parts`), so a Swin built on other functions runs them.
    """
    b, h, w, c = x.shape
    m, parts = block.window, block.parts
    if shift:
        x = cyclic_shift(x, shift)  # [B, H, W, C]: rolled up and left
    windows = parts.window_partition(x, m)  # [B*nW, M*M, C]
    # Index and mask are computed, not learned: cheap next to the attention, so built at each call.
    index = parts.relative_position_index_2d(m).to(block.bias_table.device)  # [M*M, M*M]
    bias = block.bias_table[index].permute(2, 0, 1)  # [M*M, M*M, heads] -> [heads, M*M, M*M]
    mask = None
    if shift:
        # window_partition puts the batch outermost: the nW masks repeat image after image.
        mask = parts.shifted_window_mask(h, w, m, shift).to(x.device).repeat(b, 1, 1)  # [B*nW, M*M, M*M]
    out = block.attn(windows, windows, windows, mask=mask, bias=bias)  # [B*nW, M*M, C]
    x = parts.window_reverse(out, m, h, w)  # [B, H, W, C]
    return cyclic_shift(x, -shift) if shift else x


@dataclass
class SwinParts:
    """The functions a Swin runs on; the chapter swaps in the learner's where they pass."""

    patchify: Callable = patchify
    window_partition: Callable = window_partition
    window_reverse: Callable = window_reverse
    shifted_window_mask: Callable = shifted_window_mask
    relative_position_index_2d: Callable = relative_position_index_2d
    merge_patches: Callable = merge_patches
    window_attention: Callable = swin_window_attention


class SwinBlock(nn.Module):
    """One Swin block, pre-norm: x + WindowAttention(LN(x)), then x + FFN(LN(x)), on [B, H, W, C].

    The window attention is the function `self.window_attention` (swin_window_attention's signature,
    from `parts`), called with the block itself and its shift: with shift > 0 the map is rolled by
    -shift before the windows are cut, attention inside each window is masked so the wrapped-around
    pieces stay apart, and the result is rolled back. Each head adds a learned bias per relative
    offset (a table of (2M-1)^2 rows) to its scores. A map no larger than the window is one window,
    never shifted (as in the paper's code).
    """

    def __init__(self, dim: int, n_heads: int, resolution: tuple[int, int], window: int, shift: int,
                 mlp_ratio: float = 4.0, dropout: float = 0.0, eps: float = 1e-5, parts: SwinParts | None = None):
        super().__init__()
        self.parts = parts or SwinParts()
        self.window_attention = self.parts.window_attention
        h, w = resolution
        if min(h, w) <= window:  # the whole map fits in one window: nothing to shift
            window, shift = min(h, w), 0
        _check_windows(h, w, window)
        self.resolution, self.window, self.shift, self.n_heads = (h, w), window, shift, n_heads
        self.norm1 = LayerNorm(dim, eps)
        self.attn = MultiHeadAttention(dim, n_heads, dropout)
        self.bias_table = nn.Parameter(torch.zeros((2 * window - 1) ** 2, n_heads))  # [(2M-1)^2, heads]
        self.norm2 = LayerNorm(dim, eps)
        self.ffn = PositionwiseFeedForward(dim, int(mlp_ratio * dim), dropout, activation="gelu")
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[1:3] != self.resolution:
            raise ValueError(f"this block was built for {self.resolution[0]}x{self.resolution[1]} maps, "
                             f"got {list(x.shape)}")
        x = x + self.dropout(self.window_attention(self.norm1(x), self, self.shift))  # [B, H, W, C]
        return x + self.dropout(self.ffn(self.norm2(x)))


class PatchMerging(nn.Module):
    """Halve the resolution, double the channels: merge 2 x 2 neighbours (4C), LayerNorm, Linear 4C -> 2C."""

    def __init__(self, dim: int, eps: float = 1e-5, parts: SwinParts | None = None):
        super().__init__()
        self.parts = parts or SwinParts()
        self.norm = LayerNorm(4 * dim, eps)
        self.reduction = nn.Linear(4 * dim, 2 * dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.reduction(self.norm(self.parts.merge_patches(x)))  # [B, H/2, W/2, 2C]


class SwinStage(nn.Module):
    """`depth` blocks at one resolution (shift 0, M/2, 0, M/2, ...), then patch merging (except last)."""

    def __init__(self, dim: int, depth: int, n_heads: int, resolution: tuple[int, int], window: int,
                 mlp_ratio: float, dropout: float, eps: float, downsample: bool, parts: SwinParts):
        super().__init__()
        self.blocks = nn.ModuleList(
            SwinBlock(dim, n_heads, resolution, window, 0 if i % 2 == 0 else window // 2, mlp_ratio, dropout, eps,
                      parts)
            for i in range(depth))
        self.merge = PatchMerging(dim, eps, parts) if downsample else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)  # [B, H, W, C]
        return self.merge(x) if self.merge is not None else x


@dataclass
class SwinConfig:
    """Sizes of a Swin Transformer; the defaults are Swin-T on 224 x 224 ImageNet images."""

    image_size: int | tuple[int, int] = 224
    patch_size: int = 4
    in_channels: int = 3
    n_classes: int = 1000  # 0: no head, forward returns the pooled features
    embed_dim: int = 96
    depths: Sequence[int] = (2, 2, 6, 2)
    n_heads: Sequence[int] = (3, 6, 12, 24)
    window: int = 7
    mlp_ratio: float = 4.0
    dropout: float = 0.0
    layer_norm_eps: float = 1e-5

    @property
    def grid(self) -> tuple[int, int]:
        h, w = (self.image_size, self.image_size) if isinstance(self.image_size, int) else tuple(self.image_size)
        if h % self.patch_size or w % self.patch_size:
            raise ValueError(f"image size {h}x{w} is not a multiple of patch_size {self.patch_size}")
        return h // self.patch_size, w // self.patch_size


class Swin(nn.Module):
    """Patches (linear embedding + LayerNorm) -> stages of Swin blocks with patch merging between
    them -> LayerNorm -> average over all positions -> linear head. No [CLS] token, no absolute
    positions: the relative bias inside each window is the only position information.

    forward(images [B, C, H, W]) -> logits [B, n_classes]; features(images) -> the last stage's
    map [B, H', W', C'] after the final LayerNorm. `parts` holds the functions it runs on.
    """

    def __init__(self, config: SwinConfig, parts: SwinParts | None = None):
        super().__init__()
        c = self.config = config
        if len(c.depths) != len(c.n_heads):
            raise ValueError(f"one head count per stage: depths {list(c.depths)}, n_heads {list(c.n_heads)}")
        self.parts = parts or SwinParts()
        self.patch_embed = nn.Linear(c.in_channels * c.patch_size ** 2, c.embed_dim)
        self.patch_norm = LayerNorm(c.embed_dim)  # Swin normalises the patch embeddings (eps 1e-5)
        h, w = c.grid
        stages, dim = [], c.embed_dim
        for i, (depth, heads) in enumerate(zip(c.depths, c.n_heads)):
            last = i == len(c.depths) - 1
            if not last and (h % 2 or w % 2):
                raise ValueError(f"stage {i + 1} works on a {h}x{w} map, which patch merging cannot halve")
            stages.append(SwinStage(dim, depth, heads, (h, w), c.window, c.mlp_ratio, c.dropout, c.layer_norm_eps,
                                    downsample=not last, parts=self.parts))
            if not last:
                h, w, dim = h // 2, w // 2, dim * 2
        self.stages = nn.ModuleList(stages)
        self.norm = LayerNorm(dim, c.layer_norm_eps)
        self.n_features = dim
        self.head = nn.Linear(dim, c.n_classes) if c.n_classes > 0 else nn.Identity()
        self.apply(_init_vision_weights)
        for block in self.blocks():
            nn.init.trunc_normal_(block.bias_table, std=0.02)

    def blocks(self) -> list[SwinBlock]:
        return [block for stage in self.stages for block in stage.blocks]

    def features(self, images: torch.Tensor) -> torch.Tensor:
        c = self.config
        _tensor("images", images, 4, "[batch, channels, height, width]")
        h, w = c.grid
        if images.shape[1:] != (c.in_channels, h * c.patch_size, w * c.patch_size):
            raise ValueError(f"this Swin takes images [batch, {c.in_channels}, {h * c.patch_size}, "
                             f"{w * c.patch_size}], got {list(images.shape)}")
        x = self.patch_norm(self.patch_embed(self.parts.patchify(images, c.patch_size)))  # [B, N, D]
        x = x.reshape(images.shape[0], h, w, c.embed_dim)  # [B, H, W, D]: the patches as a map
        for stage in self.stages:
            x = stage(x)  # [B, H', W', C']
        return self.norm(x)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(images).mean(dim=(1, 2)))  # [B, n_classes]


# ---------------------------------------------------------------------------------------
# Loading Hugging Face's weights
# ---------------------------------------------------------------------------------------

class _StateDict(dict):
    def __init__(self, entries: dict, expected: str):
        super().__init__(entries)
        self.expected = expected

    def __missing__(self, key):
        raise KeyError(f"the state dict has no {key!r}: expected {self.expected}")


def _linear(ours: dict, mine: str, sd: dict, theirs: str, bias: bool = True) -> None:
    ours[f"{mine}.weight"] = sd[f"{theirs}.weight"]
    if bias:
        ours[f"{mine}.bias"] = sd[f"{theirs}.bias"]


def _norm(ours: dict, mine: str, sd: dict, theirs: str) -> None:
    ours[f"{mine}.gamma"], ours[f"{mine}.beta"] = sd[f"{theirs}.weight"], sd[f"{theirs}.bias"]


def _patch_embed(ours: dict, sd: dict, theirs: str) -> None:
    # The Conv2d kernel [D, C, p, p] flattened is the Linear weight on patchify's tokens.
    weight = sd[f"{theirs}.weight"]
    ours["patch_embed.weight"] = weight.reshape(weight.shape[0], -1)
    ours["patch_embed.bias"] = sd[f"{theirs}.bias"]


def vit_config_from_hf(hf_config, n_classes: int | None = None) -> ViTConfig:
    """The ViTConfig of a Hugging Face ViTConfig (n_classes: its num_labels unless given)."""
    if getattr(hf_config, "hidden_act", "gelu") != "gelu" or not getattr(hf_config, "qkv_bias", True):
        raise ValueError("the course's ViT uses the exact GELU and biases in the attention projections")
    size, patch = hf_config.image_size, hf_config.patch_size
    if not isinstance(size, int) or not isinstance(patch, int):
        raise ValueError("the course's ViT takes square images and square patches")
    return ViTConfig(image_size=size, patch_size=patch, in_channels=hf_config.num_channels,
                     n_classes=hf_config.num_labels if n_classes is None else n_classes,
                     d_model=hf_config.hidden_size, n_heads=hf_config.num_attention_heads,
                     n_layers=hf_config.num_hidden_layers, d_ff=hf_config.intermediate_size,
                     dropout=hf_config.hidden_dropout_prob, layer_norm_eps=hf_config.layer_norm_eps)


def load_hf_vit_state_dict(model: ViT, hf_state_dict: dict) -> ViT:
    """Copy a Hugging Face ViTForImageClassification (or ViTModel, into a ViT with n_classes=0)
    state dict into `model`, in place. Names change; the only reshape is the patch Conv2d kernel."""
    n_layers = model.config.n_layers
    prefix = "vit." if "vit.embeddings.cls_token" in hf_state_dict else ""
    sd = _StateDict(hf_state_dict, f"a Hugging Face ViT state dict with {n_layers} layers")
    ours = {"cls_token": sd[f"{prefix}embeddings.cls_token"],
            "pos_embed": sd[f"{prefix}embeddings.position_embeddings"]}
    _patch_embed(ours, sd, f"{prefix}embeddings.patch_embeddings.projection")
    names = {"attention.q_proj": "self_attn.w_q", "attention.k_proj": "self_attn.w_k",
             "attention.v_proj": "self_attn.w_v", "attention.o_proj": "self_attn.w_o",
             "mlp.fc1": "feed_forward.linear1", "mlp.fc2": "feed_forward.linear2"}
    for i in range(n_layers):
        theirs, mine = f"{prefix}layers.{i}.", f"encoder.layers.{i}."
        for their_name, my_name in names.items():
            _linear(ours, mine + my_name, sd, theirs + their_name)
        _norm(ours, mine + "residual1.norm", sd, theirs + "layernorm_before")
        _norm(ours, mine + "residual2.norm", sd, theirs + "layernorm_after")
    if f"{prefix}layers.{n_layers}.mlp.fc1.weight" in sd:
        raise ValueError(f"the state dict has more layers than the model's n_layers={n_layers}")
    _norm(ours, "encoder.norm", sd, f"{prefix}layernorm")
    if model.config.n_classes > 0:
        _linear(ours, "head", sd, "classifier")
    model.load_state_dict({k: v.contiguous() for k, v in ours.items()}, strict=True)
    return model


def swin_config_from_hf(hf_config, n_classes: int | None = None) -> SwinConfig:
    """The SwinConfig of a Hugging Face SwinConfig (n_classes: its num_labels unless given)."""
    if getattr(hf_config, "hidden_act", "gelu") != "gelu" or not getattr(hf_config, "qkv_bias", True):
        raise ValueError("the course's Swin uses the exact GELU and biases in the attention projections")
    if getattr(hf_config, "use_absolute_embeddings", False):
        raise ValueError("the course's Swin has no absolute position embeddings (Swin-T's default)")
    return SwinConfig(image_size=hf_config.image_size, patch_size=hf_config.patch_size,
                      in_channels=hf_config.num_channels,
                      n_classes=hf_config.num_labels if n_classes is None else n_classes,
                      embed_dim=hf_config.embed_dim, depths=tuple(hf_config.depths),
                      n_heads=tuple(hf_config.num_heads), window=hf_config.window_size,
                      mlp_ratio=hf_config.mlp_ratio, dropout=hf_config.hidden_dropout_prob,
                      layer_norm_eps=hf_config.layer_norm_eps)


def load_hf_swin_state_dict(model: Swin, hf_state_dict: dict) -> Swin:
    """Copy a Hugging Face SwinForImageClassification (or SwinModel, into a Swin with n_classes=0)
    state dict into `model`, in place. The relative-position tables are copied as they are: both
    use the index (dy + M-1)(2M-1) + (dx + M-1) with query minus key."""
    prefix = "swin." if "swin.embeddings.norm.weight" in hf_state_dict else ""
    sd = _StateDict(hf_state_dict, f"a Hugging Face Swin state dict with depths {list(model.config.depths)}")
    ours: dict = {}
    _patch_embed(ours, sd, f"{prefix}embeddings.patch_embeddings.projection")
    _norm(ours, "patch_norm", sd, f"{prefix}embeddings.norm")
    names = {"attention.q_proj": "attn.w_q", "attention.k_proj": "attn.w_k", "attention.v_proj": "attn.w_v",
             "attention.o_proj": "attn.w_o", "mlp.fc1": "ffn.linear1", "mlp.fc2": "ffn.linear2"}
    for s, stage in enumerate(model.stages):
        for b in range(len(stage.blocks)):
            theirs, mine = f"{prefix}encoder.layers.{s}.blocks.{b}.", f"stages.{s}.blocks.{b}."
            for their_name, my_name in names.items():
                _linear(ours, mine + my_name, sd, theirs + their_name)
            ours[mine + "bias_table"] = sd[theirs + "attention.relative_position_bias.relative_position_bias_table"]
            _norm(ours, mine + "norm1", sd, theirs + "layernorm_before")
            _norm(ours, mine + "norm2", sd, theirs + "layernorm_after")
        if stage.merge is not None:
            _norm(ours, f"stages.{s}.merge.norm", sd, f"{prefix}encoder.layers.{s}.downsample.norm")
            _linear(ours, f"stages.{s}.merge.reduction", sd, f"{prefix}encoder.layers.{s}.downsample.reduction",
                    bias=False)
    _norm(ours, "norm", sd, f"{prefix}layernorm")
    if model.config.n_classes > 0:
        _linear(ours, "head", sd, "classifier")
    model.load_state_dict({k: v.contiguous() for k, v in ours.items()}, strict=True)
    return model


# ---------------------------------------------------------------------------------------
# A small CNN, and training on small image sets
# ---------------------------------------------------------------------------------------

class SmallCNN(nn.Module):
    """A small convolutional network for 8 x 8 images: 3x3 convolution (ReLU), 2x2 max-pool,
    3x3 convolution (ReLU), then a linear head on the flattened 4 x 4 map. Locality (3x3
    kernels) and weight sharing (the same kernel everywhere) are built in: the Transformers
    have to learn them from the data."""

    def __init__(self, in_channels: int = 1, n_classes: int = 10, width: int = 16, image_size: int = 8):
        super().__init__()
        if image_size % 2:
            raise ValueError(f"SmallCNN halves the image once: image_size must be even, got {image_size}")
        w, side = width, image_size // 2
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, w, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),  # [B, w, H/2, W/2]
            nn.Conv2d(w, 2 * w, 3, padding=1), nn.ReLU(),  # [B, 2w, H/2, W/2]
        )
        self.head = nn.Linear(2 * w * side * side, n_classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(images).flatten(1))  # [B, n_classes]


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def train_classifier(model: nn.Module, images: torch.Tensor, labels: torch.Tensor, steps: int,
                     batch_size: int = 64, lr: float = 3e-3, weight_decay: float = 0.05, warmup: int = 20,
                     seed: int = 0, progress: bool = False, desc: str = "training") -> list[float]:
    """Train with AdamW and cross-entropy for a fixed number of steps; returns every step's loss.

    Batches are drawn from a fresh seeded permutation each epoch (same seed, same batches), the
    learning rate warms up linearly for `warmup` steps and then decays to 0 along a cosine.
    """
    from tqdm.auto import tqdm

    _int("steps", steps, 1)
    n = images.shape[0]
    if labels.shape != (n,):
        raise ValueError(f"one label per image: images {list(images.shape)}, labels {list(labels.shape)}")
    g = torch.Generator().manual_seed(seed)
    # fused: one kernel for all parameters, noticeably faster for small models on a CPU.
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay, fused=True)

    def rate(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, rate)
    batch_size = min(batch_size, n)
    model.train()
    losses: list[float] = []
    order, at = torch.randperm(n, generator=g), 0
    for _ in tqdm(range(steps), desc=desc, disable=not progress, mininterval=1.0):
        if at + batch_size > n:  # a new epoch: a new order
            order, at = torch.randperm(n, generator=g), 0
        batch = order[at:at + batch_size]
        at += batch_size
        loss = F.cross_entropy(model(images[batch]), labels[batch])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        scheduler.step()
        losses.append(loss.item())
    model.eval()
    return losses


@torch.no_grad()
def accuracy(model: nn.Module, images: torch.Tensor, labels: torch.Tensor, batch_size: int = 500) -> float:
    """Fraction of images whose highest logit is the right class (the model in eval mode)."""
    model.eval()
    correct = 0
    for start in range(0, images.shape[0], batch_size):
        logits = model(images[start:start + batch_size])
        correct += (logits.argmax(dim=-1) == labels[start:start + batch_size]).sum().item()
    return correct / images.shape[0]


# ---------------------------------------------------------------------------------------
# A comparison a reviewer can check: learning rates chosen on validation, several seeds
# ---------------------------------------------------------------------------------------

@dataclass
class Run:
    """One trained model of a comparison: its setting, the model, every step's loss, and its
    accuracy on the validation set (the test set is scored later, for the chosen runs only)."""

    name: str
    lr: float
    n_train: int
    seed: int
    model: nn.Module
    losses: list[float]
    val_accuracy: float


def train_run(name: str, build: Callable[[], nn.Module], data, n_train: int, lr: float, seed: int, steps: int,
              batch_size: int = 64, threads: int | None = 1) -> Run:
    """Train build() from scratch on n_train training images of `data` (a DigitsSplit with a
    validation set) and score it on the validation images.

    `seed` fixes everything random in the run: the subset (the first n_train of a seeded
    permutation), the initial weights and the order of the batches. Every model gets the same
    `steps` whatever n_train is, so that data, not compute, is what changes with n_train.

    The run uses `threads` CPU threads (None: PyTorch's setting). One is the default: on models
    this small, splitting each operation between threads costs more in synchronisation than it
    saves (several times slower with two threads on a busy machine), and one thread also gives
    the same sums, hence the same numbers, whatever the number of cores.

    Denormal numbers are flushed to zero during the run. A model that fits its few images
    perfectly (a training loss near 1e-4) drives some gradients and optimiser moments below
    float32's smallest normal number, 1.2e-38, where x86 CPUs compute many times slower: trained
    for 200 steps (seed 0, rate 0.01), chapter 12's small CNN took three times as long on 100
    images as on 1,047. Flushing them changed no printed digit of the chapter's results. The
    setting is the process's; it is turned off again (PyTorch's default) when the run ends.
    """
    if data.val_images.shape[0] == 0:
        raise ValueError("the data have no validation set: use digits_split(validation_size=...)")
    previous = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(_int("threads", threads, 1))
    torch.set_flush_denormal(True)
    try:
        torch.manual_seed(seed)
        model = build()
        images, labels = data.subset(n_train, seed)
        losses = train_classifier(model, images, labels, steps=steps, batch_size=batch_size, lr=lr, seed=seed)
        val_accuracy = accuracy(model, data.val_images, data.val_labels)
    finally:
        torch.set_num_threads(previous)
        torch.set_flush_denormal(False)
    return Run(name, lr, n_train, seed, model, losses, val_accuracy)


def choose_learning_rates(runs: Sequence[Run]) -> dict[str, float]:
    """For each model, the learning rate whose runs have the highest mean validation accuracy
    (the mean over every training-set size and seed it was tried with); a tie goes to the
    smaller rate. One rate per model, used at every size: the test set plays no part."""
    scores: dict[str, dict[float, list[float]]] = {}
    for run in runs:
        scores.setdefault(run.name, {}).setdefault(run.lr, []).append(run.val_accuracy)
    return {name: max(sorted(by_lr), key=lambda lr: sum(by_lr[lr]) / len(by_lr[lr])) for name, by_lr in scores.items()}


__all__ = [
    "patchify", "unpatchify", "conv_to_linear", "ViTConfig", "vit_forward", "ViT",
    "window_partition", "window_reverse", "cyclic_shift", "shifted_window_mask", "relative_position_index_2d",
    "merge_patches", "swin_window_attention", "SwinParts", "SwinBlock", "PatchMerging", "SwinStage", "SwinConfig",
    "Swin",
    "vit_config_from_hf", "load_hf_vit_state_dict", "swin_config_from_hf", "load_hf_swin_state_dict",
    "SmallCNN", "count_parameters", "train_classifier", "accuracy", "Run", "train_run", "choose_learning_rates",
]
