"""Checkers for chapter 12, Transformers for images: patchify (ViT's tokens), vit_forward (a ViT's whole
forward pass, from the parts of the library's ViT), window_partition and window_reverse (Swin's windows),
shifted_window_mask (what keeps the wrapped-around pieces of a rolled map apart),
relative_position_index_2d (the bias table's row for each pair of a window), swin_window_attention (the
attention half of a Swin block: roll, windows, attention with the bias and the mask, reverse, roll back)
and merge_patches (Swin's 2 x 2 patch merging, in its published order).

Each checker compares a learner's answer with transformer_lib.vision on deterministic cases and
knows the wrong answers learners often write: features flattened channels-last, patches or
windows taken column by column, a reshape without the permute that gathers a square, a mask
built for the roll in the other direction or with labels that collide, an index not shifted by
M - 1 or with the wrong stride, neighbours merged in reading order, positions added before [CLS] is
prepended, a head on the mean of the patches, a roll not undone, masks tiled in the wrong order, ...

Most of these exercises only move values around, so the checkers can see *how* a wrong answer
moved them. Properties name the error from that alone, even when two mistakes come together:
the right patches (or windows, or 2 x 2 blocks) in the wrong order; the right values inside each
but in the wrong order; values from different squares mixed into one token. For the mask and the
index, the properties read its structure: a token that may not see itself, an asymmetric mask, a
masked window that never wrapped around, indices outside the table, two offsets sharing a row.

The two exercises that assemble a model (vit_forward, swin_window_attention) run on small models whose
parameters are all random and seeded, built without any reference answer (the grader hides them): the
ViT cuts its patches with PyTorch's unfold, and the model's own forward pass (the block's own window
attention) raises, so an answer cannot hand the work back to it. Their wrong answers are options of one
function (where the positions go, the patch order, the final norm, what the head reads; the rolls, the
mask, the bias, the reverse), so a property recognises each wrong option in any combination with the
others, and two mistakes at once are both named.
"""

from __future__ import annotations

import itertools
from collections import Counter

import torch
import torch.nn.functional as F

from transformer_lib.vision import (SwinBlock, SwinParts, ViT, ViTConfig, merge_patches, patchify,
                                    relative_position_index_2d, shifted_window_mask, swin_window_attention,
                                    vit_forward, window_partition, window_reverse)

from . import properties
from .core import Case, Checker, Mistake, Property, describe_difference, randn, seeded

# ---------------------------------------------------------------------------------------
# Shared: how were the values moved? (for outputs that are rearrangements of the input)
# ---------------------------------------------------------------------------------------


def _groups(t: torch.Tensor, n_items: int, item_size: int) -> list[list[tuple]]:
    """t as a list of groups (patches, windows, merged tokens), each a list of items (tuples)."""
    return [[tuple(item) for item in group] for group in t.reshape(-1, n_items, item_size).tolist()]


def _arrangement(expected, actual, n_items: int, item_size: int) -> dict | None:
    """Compare how `actual` arranges the same values as `expected`, group by group.

    Returns None when there is nothing to compare (not a float tensor of the same size), else:
    same_items: the same multiset of items overall; same_groups: the same groups, each taken
    as a multiset of items, in any order; in_place: group k of `actual` holds group k's items;
    exact: the same groups with their items in the same order, in any order of groups."""
    if not (isinstance(expected, torch.Tensor) and isinstance(actual, torch.Tensor)):
        return None
    if not (expected.is_floating_point() and actual.is_floating_point()) or actual.numel() != expected.numel():
        return None
    if expected.numel() == 0 or expected.numel() % (n_items * item_size):
        return None
    e = _groups(expected.double(), n_items, item_size)
    a = _groups(actual.double(), n_items, item_size)
    canon_e = [tuple(sorted(g)) for g in e]
    canon_a = [tuple(sorted(g)) for g in a]
    return {
        "same_items": Counter(i for g in e for i in g) == Counter(i for g in a for i in g),
        "same_groups": Counter(canon_e) == Counter(canon_a),
        "in_place": canon_e == canon_a,
        "exact": Counter(map(tuple, e)) == Counter(map(tuple, a)),
    }


def _arrangement_properties(layout, groups: str, items: str, fixes: tuple[str, str, str]) -> list[Property]:
    """Three properties from `_arrangement`. layout(case, expected, actual) -> (expected, actual,
    n_items, item_size) or None: what to compare, grouped how."""

    def traits(case, expected, actual):
        spec = layout(case, expected, actual)
        return None if spec is None else _arrangement(*spec)

    def wrong_group_order(case, expected, actual):
        t = traits(case, expected, actual)
        return bool(t) and t["same_groups"] and not t["in_place"]

    def wrong_item_order(case, expected, actual):
        t = traits(case, expected, actual)
        return bool(t) and t["same_groups"] and not t["exact"]

    def mixed(case, expected, actual):
        t = traits(case, expected, actual)
        return bool(t) and t["same_items"] and not t["same_groups"]

    return [
        Property(f"the right {groups} in the wrong order", fixes[0], wrong_group_order),
        Property(f"the right {items} inside each of the {groups}, in the wrong order", fixes[1], wrong_item_order),
        Property(f"{groups} that mix {items} from different squares of the input", fixes[2], mixed),
    ]


def _distinct(g: torch.Generator, *shape, dtype=torch.float32) -> torch.Tensor:
    """Random values, all different, so that where each value went can be told."""
    return randn(g, *shape, dtype=dtype)


# ---------------------------------------------------------------------------------------
# Exercise 1: patchify(images, patch) -> [B, N, C*p*p]
# ---------------------------------------------------------------------------------------


def _patchify_cases() -> list[Case]:
    g = seeded(1201)
    return [
        Case("one grey 4x4 image holding 0..15, 2x2 patches", (torch.arange(16.0).reshape(1, 1, 4, 4), 2)),
        Case("batch of 2 RGB 6x6 images, 3x3 patches", (_distinct(g, 2, 3, 6, 6), 3)),
        Case("batch of 3, 2 channels, 4x8 (not square), 2x2 patches", (_distinct(g, 3, 2, 4, 8), 2)),
        Case("8x8 digit-sized images, 2x2 patches", (_distinct(g, 2, 1, 8, 8), 2), hidden=True),
        Case("patch 1: every pixel a token", (_distinct(g, 2, 3, 3, 2), 1), hidden=True),
        Case("patch as large as the image: one token", (_distinct(g, 2, 2, 4, 4), 4), hidden=True),
        Case("float64, 3 channels, 12x8, 4x4 patches", (_distinct(g, 1, 3, 12, 8, dtype=torch.float64), 4),
             hidden=True),
        Case("patch given by keyword, 2 channels, 6x4", (_distinct(g, 2, 2, 6, 4),), {"patch": 2}, hidden=True),
    ]


def _grid(images, patch):
    b, c, h, w = images.shape
    return images.reshape(b, c, h // patch, patch, w // patch, patch), b, c, h // patch, w // patch


def _pf_channels_last(images, patch):
    x, b, c, rows, cols = _grid(images, patch)
    return x.permute(0, 2, 4, 3, 5, 1).reshape(b, rows * cols, -1)  # (row, col, channel) inside a patch


def _pf_column_major(images, patch):
    x, b, c, rows, cols = _grid(images, patch)
    return x.permute(0, 4, 2, 1, 3, 5).reshape(b, rows * cols, -1)  # patches column by column


def _pf_no_permute(images, patch):
    b, c, h, w = images.shape
    return images.reshape(b, -1, c * patch * patch)


def _pf_inside_transposed(images, patch):
    x, b, c, rows, cols = _grid(images, patch)
    return x.permute(0, 2, 4, 1, 5, 3).reshape(b, rows * cols, -1)  # (channel, column, row)


def _pf_channel_in_front(images, patch):
    b, c, h, w = images.shape
    x = images.unfold(2, patch, patch).unfold(3, patch, patch)  # [B, C, rows, cols, p, p]
    return x.reshape(b, -1, c * patch * patch)


def _pf_tokens_last(images, patch):
    return patchify(images, patch).transpose(1, 2)  # [B, C*p*p, N]


def _patchify_layout(case, expected, actual):
    if not isinstance(expected, torch.Tensor):
        return None
    return expected, actual, expected.shape[-1], 1  # groups: patches; items: single pixel values


check_patchify = Checker(
    name="patchify",
    reference=patchify,
    make_cases=_patchify_cases,
    mistakes=[
        Mistake(
            "each patch flattened channels last (row, column, channel) instead of channel first",
            "Put the channel before the two in-patch axes: permute to [B, rows, cols, C, p, p] before the "
            "final reshape, the layout of a Conv2d kernel [D, C, p, p].",
            _pf_channels_last,
        ),
        Mistake(
            "patches taken column by column (down the first column, then the next)",
            "Read the patches like text, left to right and then top to bottom: the grid row index goes before the "
            "grid column index, [B, rows, cols, C, p, p].",
            _pf_column_major,
        ),
        Mistake(
            "a plain reshape to [B, N, C*p*p] without a permute: each token is a run of consecutive pixels, "
            "not a square",
            "First reshape to [B, C, H/p, p, W/p, p] so the grid and the in-patch axes are separate, then permute "
            "to [B, H/p, W/p, C, p, p], then reshape to [B, N, C*p*p].",
            _pf_no_permute,
        ),
        Mistake(
            "rows and columns swapped inside each patch (channel, column, row)",
            "Inside a patch keep the row before the column: [..., C, p_row, p_col].",
            _pf_inside_transposed,
        ),
        Mistake(
            "the channel axis left in front of the grid (unfold into [B, C, rows, cols, p, p], then reshape "
            "without moving C)",
            "Move the channel behind the grid indices before reshaping: permute to [B, rows, cols, C, p, p].",
            _pf_channel_in_front,
        ),
        Mistake(
            "tokens and features swapped: [B, C*p*p, N] instead of [B, N, C*p*p]",
            "One row per patch: the sequence axis (N) comes before the features (C*p*p), like [batch, seq, d].",
            _pf_tokens_last,
        ),
    ],
    properties=[
        *_arrangement_properties(
            _patchify_layout, "patches", "pixels",
            ("Order the tokens by the patch's grid position, row by row: [B, rows, cols, ...].",
             "Flatten each patch channel first, then row, then column: [..., C, p, p] before the final reshape.",
             "Each token must hold exactly the C*p*p pixels of one p x p square: reshape to [B, C, H/p, p, W/p, p] "
             "and permute before flattening.")),
        properties.shape_permuted("patchify returns [B, N, C*p*p]: one row per patch, like [batch, seq, d]."),
    ],
)


# ---------------------------------------------------------------------------------------
# Exercise 2: vit_forward(images, model) -> logits [B, n_classes]
# ---------------------------------------------------------------------------------------


def _patchify_by_unfold(images, patch):
    """patchify's layout from PyTorch's own unfold ([B, C*p*p, N], channel first, patches in reading
    order), so that a check's model needs no reference answer while the grader hides them."""
    return F.unfold(images, kernel_size=patch, stride=patch).transpose(1, 2)  # [B, N, C*p*p]


_CALL_THE_VIT = ("vit_forward must compute the pass from the model's parts (patch_embed, cls_token, "
                 "pos_embed, encoder, head): calling model(images) inside it runs the model's own forward "
                 "pass, which this check does not provide")


def _vit_no_shortcut(images, model):
    raise RuntimeError(_CALL_THE_VIT)


def _random_parameters(module: torch.nn.Module, g: torch.Generator, scale: float = 0.5) -> None:
    """Every parameter random (LayerNorms, biases, [CLS], positions, bias tables too), so that a
    part used in the wrong place, or left out, changes the output."""
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(randn(g, *p.shape, dtype=p.dtype, scale=scale))


def _tiny_vit(g, image_size, patch, channels, n_classes, d_model, n_heads, n_layers, dtype=torch.float32):
    with torch.random.fork_rng(devices=[]):  # building draws from the global generator: leave the learner's alone
        model = ViT(ViTConfig(image_size=image_size, patch_size=patch, in_channels=channels, n_classes=n_classes,
                              d_model=d_model, n_heads=n_heads, n_layers=n_layers, d_ff=2 * d_model),
                    patchify=_patchify_by_unfold, forward_pass=_vit_no_shortcut)
    _random_parameters(model, g)
    return model.to(dtype).eval()


def _vit_forward_cases() -> list[Case]:
    g = seeded(1207)
    return [
        Case("2 grey 4x4 images, 2x2 patches (a 2x2 grid), 1 layer, 3 classes",
             (_distinct(g, 2, 1, 4, 4), _tiny_vit(g, 4, 2, 1, 3, 8, 2, 1))),
        Case("3 RGB 6x6 images, 2x2 patches (a 3x3 grid), 2 layers, 5 classes",
             (_distinct(g, 3, 3, 6, 6), _tiny_vit(g, 6, 2, 3, 5, 12, 3, 2))),
        Case("one 8x8 digit-sized image, 2x2 patches, 4 heads, 10 classes",
             (_distinct(g, 1, 1, 8, 8), _tiny_vit(g, 8, 2, 1, 10, 16, 4, 1))),
        Case("2 images of 2 channels, 8x8 with 4x4 patches, 2 layers", (_distinct(g, 2, 2, 8, 8),
             _tiny_vit(g, 8, 4, 2, 4, 8, 2, 2)), hidden=True),
        Case("no head (n_classes=0): [CLS]'s final state", (_distinct(g, 2, 1, 6, 6),
             _tiny_vit(g, 6, 2, 1, 0, 8, 2, 1)), hidden=True),
        Case("float64 model and images, 3x3 patches of 9x9 images", (_distinct(g, 2, 1, 9, 9, dtype=torch.float64),
             _tiny_vit(g, 9, 3, 1, 3, 8, 2, 1, dtype=torch.float64)), hidden=True),
        Case("patch 1: every pixel a token (16 tokens + [CLS])", (_distinct(g, 2, 1, 4, 4),
             _tiny_vit(g, 4, 1, 1, 3, 8, 2, 1)), hidden=True),
        Case("a batch of 5, 3 layers", (_distinct(g, 5, 1, 4, 4), _tiny_vit(g, 4, 2, 1, 3, 8, 2, 3)), hidden=True),
    ]


# Every way vit_forward goes wrong, as options of one function: a catalogue entry is one option, and the
# properties below recognise an option in any combination with the others (two mistakes at once).
VIT_OPTIONS = {
    "positions": ("right", "before_cls", "cls_without", "none"),
    "order": ("rows", "columns"),
    "final_norm": (True, False),
    "pool": ("cls", "mean_patches", "mean_all"),
}


def _vit_variant(images, model, positions="right", order="rows", final_norm=True, pool="cls"):
    c = model.config
    tokens = model.patch_embed(model.patchify(images, c.patch_size))  # [B, N, D]
    b, n, d = tokens.shape
    if order == "columns":  # patches read down the first column of the grid, then the next
        side = c.image_size // c.patch_size
        tokens = tokens.reshape(b, side, side, d).transpose(1, 2).reshape(b, n, d)
    cls = model.cls_token.expand(b, -1, -1)  # [B, 1, D]
    pos = model.pos_embed
    if positions == "right":
        x = torch.cat([cls, tokens], dim=1) + pos
    elif positions == "before_cls":  # patch k gets row k; [CLS] is prepended afterwards, with no position
        x = torch.cat([cls, tokens + pos[:, :n]], dim=1)
    elif positions == "cls_without":  # the patches get their rows 1..N, [CLS] none
        x = torch.cat([cls, tokens + pos[:, 1:]], dim=1)
    else:
        x = torch.cat([cls, tokens], dim=1)
    for layer in model.encoder.layers:
        x = layer(x)
    if final_norm:
        x = model.encoder.norm(x)
    features = {"cls": lambda: x[:, 0], "mean_patches": lambda: x[:, 1:].mean(dim=1),
                "mean_all": lambda: x.mean(dim=1)}[pool]()
    return model.head(features)


def _vit_mistake(**option):
    def wrong(images, model):
        return _vit_variant(images, model, **option)
    return wrong


def _combinations(options: dict):
    names = list(options)
    return [dict(zip(names, values)) for values in itertools.product(*(options[n] for n in names))]


# The variants' outputs for the cases being judged: the properties of one judgement share them (keyed by
# the case object, which the entry holds, so an id is never reused while its entry lives).
_VARIANT_OUTPUTS: dict[int, tuple[Case, dict]] = {}


def _variant_output(case: Case, variant, combo: dict):
    entry = _VARIANT_OUTPUTS.get(id(case))
    if entry is None or entry[0] is not case:
        if len(_VARIANT_OUTPUTS) > 64:
            _VARIANT_OUTPUTS.clear()
        entry = _VARIANT_OUTPUTS[id(case)] = (case, {})
    key = (variant.__name__, tuple(sorted(combo.items())))
    if key not in entry[1]:
        with torch.no_grad():
            entry[1][key] = variant(*case.args, **case.kwargs, **combo)
    return entry[1][key]


def _trait(options: dict, variant, trait: str, rtol: float, atol: float):
    """seen(case, expected, actual): the learner's output is `variant` with `trait` wrong (the other
    options anything), and on this case that option changes the result (setting it right gives
    something else), so it is really there."""
    right = options[trait][0]

    def same(out, actual):
        return out.shape == actual.shape and describe_difference(out, actual, rtol=rtol, atol=atol) is None

    def seen(case, expected, actual):
        if not isinstance(actual, torch.Tensor) or not isinstance(expected, torch.Tensor):
            return False
        for combo in _combinations(options):
            if combo[trait] != right and same(_variant_output(case, variant, combo), actual):
                if not same(_variant_output(case, variant, {**combo, trait: right}), actual):
                    return True
        return False

    return seen


VIT_RTOL, VIT_ATOL = 1e-4, 1e-5

check_vit_forward = Checker(
    name="vit_forward",
    reference=vit_forward,
    make_cases=_vit_forward_cases,
    rtol=VIT_RTOL,
    atol=VIT_ATOL,
    mistakes=[
        Mistake(
            "the positions added to the patch tokens before [CLS] is prepended: patch k gets row k of pos_embed "
            "(patch 0 takes [CLS]'s row), and [CLS] gets none",
            "Prepend [CLS] first ([B, 1 + N, d_model]) and then add model.pos_embed whole: row 0 is [CLS]'s "
            "position, row k + 1 patch k's.",
            _vit_mistake(positions="before_cls"),
        ),
        Mistake(
            "[CLS] left without its position vector (the patches get rows 1..N of pos_embed, row 0 is never used)",
            "[CLS] has a learned position too: add model.pos_embed to the whole sequence after prepending [CLS].",
            _vit_mistake(positions="cls_without"),
        ),
        Mistake(
            "no position vectors added",
            "Add model.pos_embed ([1, 1 + N, d_model]) to the sequence after prepending [CLS]: without it the "
            "encoder cannot tell where a patch was.",
            _vit_mistake(positions="none"),
        ),
        Mistake(
            "the head applied to the mean of the patch tokens instead of [CLS]",
            "ViT classifies from [CLS]'s final state alone: the head reads token 0 of the encoder's output.",
            _vit_mistake(pool="mean_patches"),
        ),
        Mistake(
            "the head applied to the mean of all tokens ([CLS] included) instead of [CLS] alone",
            "ViT classifies from [CLS]'s final state alone: the head reads token 0 of the encoder's output.",
            _vit_mistake(pool="mean_all"),
        ),
        Mistake(
            "no final LayerNorm after the last encoder layer",
            "The layers are pre-norm, so their last residual sum is never normalised: apply model.encoder.norm "
            "after the loop over model.encoder.layers (or call model.encoder, which does both).",
            _vit_mistake(final_norm=False),
        ),
        Mistake(
            "the patches in column order (down the first column of the grid, then the next)",
            "Keep patchify's reading order, row by row: position vector k + 1 belongs to the patch patchify puts "
            "at k.",
            _vit_mistake(order="columns"),
        ),
    ],
    properties=[
        Property("position vectors added to the wrong tokens, or not at all",
                 "Prepend [CLS] first, then add model.pos_embed to the whole [B, 1 + N, d_model] sequence.",
                 _trait(VIT_OPTIONS, _vit_variant, "positions", VIT_RTOL, VIT_ATOL)),
        Property("patches not in patchify's reading order",
                 "Keep the tokens in the order patchify returns them (row by row of patches).",
                 _trait(VIT_OPTIONS, _vit_variant, "order", VIT_RTOL, VIT_ATOL)),
        Property("no final LayerNorm",
                 "Apply model.encoder.norm after the last layer (model.encoder does it for you).",
                 _trait(VIT_OPTIONS, _vit_variant, "final_norm", VIT_RTOL, VIT_ATOL)),
        Property("a head that does not read [CLS] alone",
                 "Apply model.head to token 0 of the final sequence, [CLS]'s state, not to an average.",
                 _trait(VIT_OPTIONS, _vit_variant, "pool", VIT_RTOL, VIT_ATOL)),
        properties.shape_permuted("vit_forward returns [B, n_classes]: one row of class scores per image."),
    ],
)


# ---------------------------------------------------------------------------------------
# Exercise 3: window_partition(x, window) -> [B*nW, M*M, C]
# ---------------------------------------------------------------------------------------


def _window_partition_cases() -> list[Case]:
    g = seeded(1202)
    return [
        Case("one 4x4 map holding 0..15 (1 channel), window 2", (torch.arange(16.0).reshape(1, 4, 4, 1), 2)),
        Case("batch of 2, 6x6 maps, 3 channels, window 3", (_distinct(g, 2, 6, 6, 3), 3)),
        Case("batch of 2, 4x8 maps (not square), 2 channels, window 2", (_distinct(g, 2, 4, 8, 2), 2)),
        Case("window as large as the map: one window per image", (_distinct(g, 2, 4, 4, 3), 4), hidden=True),
        Case("window 1: every token its own window", (_distinct(g, 1, 3, 2, 2), 1), hidden=True),
        Case("float64, batch of 3, 8x4 maps, window 4", (_distinct(g, 3, 8, 4, 5, dtype=torch.float64), 4),
             hidden=True),
        Case("8x12 maps, window 4", (_distinct(g, 2, 8, 12, 2), 4), hidden=True),
        Case("window by keyword, 6x4 maps", (_distinct(g, 2, 6, 4, 2),), {"window": 2}, hidden=True),
    ]


def _wp_grid(x, m):
    b, h, w, c = x.shape
    return x.reshape(b, h // m, m, w // m, m, c), c


def _wp_column_major(x, window):
    t, c = _wp_grid(x, window)
    return t.permute(0, 3, 1, 2, 4, 5).reshape(-1, window * window, c)  # windows column by column


def _wp_no_permute(x, window):
    return x.reshape(-1, window * window, x.shape[-1])


def _wp_tokens_column_major(x, window):
    t, c = _wp_grid(x, window)
    return t.permute(0, 1, 3, 4, 2, 5).reshape(-1, window * window, c)  # inside a window, column by column


def _wp_batch_inside(x, window):
    t, c = _wp_grid(x, window)
    return t.permute(1, 3, 0, 2, 4, 5).reshape(-1, window * window, c)  # window position outermost


def _wp_square_windows(x, window):
    return window_partition(x, window).reshape(-1, window, window, x.shape[-1])  # [B*nW, M, M, C]


def _window_layout(case, expected, actual):
    if not isinstance(expected, torch.Tensor) or expected.dim() != 3:
        return None
    return expected, actual, expected.shape[1], expected.shape[2]  # groups: windows; items: tokens


check_window_partition = Checker(
    name="window_partition",
    reference=window_partition,
    make_cases=_window_partition_cases,
    mistakes=[
        Mistake(
            "windows taken column by column (down the first column of windows, then the next)",
            "Order the windows like text: the window-row index before the window-column index, "
            "[B, H/M, W/M, M, M, C] before the final reshape.",
            _wp_column_major,
        ),
        Mistake(
            "a plain reshape to [-1, M*M, C] without a permute: each 'window' is a strip of consecutive tokens, "
            "not an M x M square",
            "Reshape to [B, H/M, M, W/M, M, C], permute the two window indices to the front "
            "([B, H/M, W/M, M, M, C]), then reshape to [-1, M*M, C].",
            _wp_no_permute,
        ),
        Mistake(
            "the tokens inside each window taken column by column",
            "Inside a window keep the reading order too: the in-window row before the in-window column, "
            "[..., M_row, M_col, C].",
            _wp_tokens_column_major,
        ),
        Mistake(
            "the batch not outermost: windows grouped by position across the images",
            "Keep the batch axis first ([B, H/M, W/M, M, M, C]), so that all windows of image 0 come first.",
            _wp_batch_inside,
        ),
        Mistake(
            "windows left as [B*nW, M, M, C] (the original Swin code's layout)",
            "Flatten each window's M x M tokens into one sequence: return [B*nW, M*M, C], ready for attention.",
            _wp_square_windows,
        ),
    ],
    properties=[
        *_arrangement_properties(
            _window_layout, "windows", "tokens",
            ("Windows go image by image, then row of windows by row of windows: [B, H/M, W/M, M, M, C].",
             "Inside each window keep the tokens in reading order: [..., M_row, M_col, C].",
             "Each window must be an M x M square of the map: reshape to [B, H/M, M, W/M, M, C] and permute "
             "the window indices to the front before flattening.")),
        properties.shape_permuted("window_partition returns [B * nW, M * M, C]: windows, tokens, channels."),
    ],
)


# ---------------------------------------------------------------------------------------
# Exercise 4: window_reverse(windows, window, height, width) -> [B, H, W, C]
# ---------------------------------------------------------------------------------------


def _window_reverse_cases() -> list[Case]:
    g = seeded(1203)

    def windows(b, h, w, c, m, dtype=torch.float32):
        return _distinct(g, b * (h // m) * (w // m), m * m, c, dtype=dtype)

    return [
        Case("4 windows of 2x2 holding 0..15 -> one 4x4 map", (torch.arange(16.0).reshape(4, 4, 1), 2, 4, 4)),
        Case("batch of 2, 6x6 maps, window 3, 3 channels", (windows(2, 6, 6, 3, 3), 3, 6, 6)),
        Case("batch of 2, 4x8 maps (not square), window 2", (windows(2, 4, 8, 2, 2), 2, 4, 8)),
        Case("one window per image", (windows(2, 4, 4, 3, 4), 4, 4, 4), hidden=True),
        Case("float64, batch of 3, 8x4 maps, window 4", (windows(3, 8, 4, 5, 4, torch.float64), 4, 8, 4),
             hidden=True),
        Case("8x12 maps, window 4", (windows(2, 8, 12, 2, 4), 4, 8, 12), hidden=True),
        Case("window 1", (windows(1, 3, 2, 2, 1), 1, 3, 2), hidden=True),
        Case("height and width by keyword, 6x4 maps", (windows(2, 6, 4, 2, 2), 2), {"height": 6, "width": 4},
             hidden=True),
    ]


def _wr_args(windows, window, height, width):
    c = windows.shape[-1]
    return windows.reshape(-1, height // window, width // window, window, window, c), c


def _wr_column_major(windows, window, height, width):
    c = windows.shape[-1]
    t = windows.reshape(-1, width // window, height // window, window, window, c)  # windows read column-major
    return t.permute(0, 2, 3, 1, 4, 5).reshape(-1, height, width, c)


def _wr_no_permute(windows, window, height, width):
    return windows.reshape(-1, height, width, windows.shape[-1])


def _wr_tokens_transposed(windows, window, height, width):
    t, c = _wr_args(windows, window, height, width)
    return t.permute(0, 1, 4, 2, 3, 5).reshape(-1, height, width, c)  # in-window column used as row


def _wr_height_width_swapped(windows, window, height, width):
    return window_reverse(windows, window, width, height)


def _wr_layout(case, expected, actual):
    windows, window = case.args[0], case.args[1]
    if not isinstance(actual, torch.Tensor) or actual.shape != expected.shape:
        return None
    # Cut the learner's map into windows again and compare them with the windows it was given.
    return windows, window_partition(actual, window), windows.shape[1], windows.shape[2]


check_window_reverse = Checker(
    name="window_reverse",
    reference=window_reverse,
    make_cases=_window_reverse_cases,
    mistakes=[
        Mistake(
            "windows laid out column by column on the map",
            "window_partition orders windows row by row: reshape to [B, H/M, W/M, M, M, C] (window-row index "
            "first), then permute to [B, H/M, M, W/M, M, C].",
            _wr_column_major,
        ),
        Mistake(
            "a plain reshape to [B, H, W, C] without a permute: each window's tokens laid out as a strip",
            "Undo window_partition step by step: reshape to [B, H/M, W/M, M, M, C], permute to "
            "[B, H/M, M, W/M, M, C], then reshape to [B, H, W, C].",
            _wr_no_permute,
        ),
        Mistake(
            "the tokens of each window placed transposed (its columns become rows)",
            "Keep the in-window row next to the window-row index: permute(0, 1, 3, 2, 4, 5) on "
            "[B, H/M, W/M, M, M, C].",
            _wr_tokens_transposed,
        ),
        Mistake(
            "height and width swapped",
            "The map is height rows of width tokens: reshape with H/M windows down and W/M across.",
            _wr_height_width_swapped,
        ),
    ],
    properties=[
        *_arrangement_properties(
            _wr_layout, "windows", "tokens",
            ("Put window k back at its place in reading order: rows of windows first, then windows within a row.",
             "Inside a window the tokens are in reading order: token r*M + c goes to row r, column c.",
             "Each window must land on one M x M square of the map: reshape to [B, H/M, W/M, M, M, C] and "
             "permute to [B, H/M, M, W/M, M, C] before the last reshape.")),
        properties.shape_permuted("window_reverse returns [B, H, W, C], the map before window_partition."),
    ],
)


# ---------------------------------------------------------------------------------------
# Exercise 5: shifted_window_mask(height, width, window, shift) -> bool [nW, M*M, M*M]
# ---------------------------------------------------------------------------------------


def _shifted_window_mask_cases() -> list[Case]:
    return [
        Case("4x4 map, window 2, shift 1", (4, 4, 2, 1)),
        Case("8x8 map, window 4, shift 2", (8, 8, 4, 2)),
        Case("6x9 map (not square), window 3, shift 1", (6, 9, 3, 1)),
        Case("shift 0: nothing to mask", (8, 8, 4, 0), hidden=True),
        Case("12x8 map, window 4, shift 2", (12, 8, 4, 2), hidden=True),
        Case("14x14 map, window 7, shift 3 (Swin-T's window)", (14, 14, 7, 3), hidden=True),
        Case("one window row: 4x8 map, window 4, shift 2", (4, 8, 4, 2), hidden=True),
        Case("by keyword: 6x6, window 3, shift 1", (), {"height": 6, "width": 6, "window": 3, "shift": 1},
             hidden=True),
    ]


def _labels_to_mask(label: torch.Tensor, window: int, column_major: bool = False) -> torch.Tensor:
    h, w = label.shape
    t = label.reshape(h // window, window, w // window, window)
    t = t.permute(2, 0, 1, 3) if column_major else t.permute(0, 2, 1, 3)  # [nW rows, nW cols, M, M]
    windows = t.reshape(-1, window * window)  # [nW, M*M]
    return windows[:, :, None] == windows[:, None, :]


def _bands(n, window, shift):
    idx = torch.arange(n)
    return (idx >= n - window).long() + (idx >= n - shift).long()


def _swm(height, width, window, shift, combine=lambda r, c: r * 3 + c, bands=_bands, column_major=False):
    label = combine(bands(height, window, shift)[:, None], bands(width, window, shift)[None, :])
    label = label.expand(height, width)
    return _labels_to_mask(label, window, column_major)


def _swm_no_mask(height, width, window, shift):
    n = (height // window) * (width // window)
    return torch.ones(n, window * window, window * window, dtype=torch.bool)


def _swm_inverted(height, width, window, shift):
    return ~shifted_window_mask(height, width, window, shift)


def _swm_other_roll(height, width, window, shift):
    # torch.roll by +shift: the wrapped strip is the first `shift` rows (and columns).
    def bands(n, m, s):
        idx = torch.arange(n)
        return (idx >= s).long() + (idx >= m).long()
    return _swm(height, width, window, shift, bands=bands)


def _swm_column_major(height, width, window, shift):
    return _swm(height, width, window, shift, column_major=True)


def _swm_sum_labels(height, width, window, shift):
    return _swm(height, width, window, shift, combine=lambda r, c: r + c)


def _swm_rows_only(height, width, window, shift):
    return _swm(height, width, window, shift, combine=lambda r, c: r + 0 * c)


def _mask_structure(name: str, fix: str, bad) -> Property:
    def seen(case, expected, actual):
        if not isinstance(actual, torch.Tensor) or actual.dtype != torch.bool or actual.shape != expected.shape:
            return False
        return bool(bad(case, expected, actual))

    return Property(name, fix, seen)


def _interior_windows(case) -> torch.Tensor:
    """True for the windows that lie away from the last row and column of windows: no wrapped piece."""
    kw = dict(zip(("height", "width", "window", "shift"), case.args), **case.kwargs)
    rows, cols = kw["height"] // kw["window"], kw["width"] // kw["window"]
    r, c = torch.meshgrid(torch.arange(rows), torch.arange(cols), indexing="ij")
    return ((r < rows - 1) & (c < cols - 1)).flatten()  # [nW]


check_shifted_window_mask = Checker(
    name="shifted_window_mask",
    reference=shifted_window_mask,
    make_cases=_shifted_window_mask_cases,
    mistakes=[
        Mistake(
            "no mask at all (every entry True): the wrapped-around pieces attend to one another",
            "Label each position of the rolled map by the piece it came from (3 bands per axis: "
            "[0, H-M), [H-M, H-shift), [H-shift, H)), cut the labels into windows, and allow a pair only when "
            "the labels are equal.",
            _swm_no_mask,
        ),
        Mistake(
            "True and False swapped (True where attention must be blocked)",
            "The course's masks say True = may attend: return label_q == label_k, not !=.",
            _swm_inverted,
        ),
        Mistake(
            "the mask of a roll in the other direction (+shift): the wrapped strip put at the start of each axis",
            "The map is rolled by -shift (up and left), so the strip that wrapped around is the last `shift` rows "
            "and columns: bands (i >= H - M) + (i >= H - shift).",
            _swm_other_roll,
        ),
        Mistake(
            "windows taken column by column",
            "Cut the label map into windows exactly as window_partition does (row of windows by row of windows), "
            "so mask k belongs to window k.",
            _swm_column_major,
        ),
        Mistake(
            "labels made by adding the row band and the column band, so different pieces share a label "
            "(row band 1 + column band 2 = row band 2 + column band 1)",
            "Give each (row band, column band) pair its own label: row_band * 3 + column_band.",
            _swm_sum_labels,
        ),
        Mistake(
            "only the rows kept apart: the column bands ignored",
            "The roll wraps both axes around: label = row_band * 3 + column_band.",
            _swm_rows_only,
        ),
    ],
    properties=[
        properties.mask_inverted("The course's convention is True = may attend: two tokens of the same piece "
                                 "get True."),
        properties.not_a_bool_mask(),
        _mask_structure(
            "a token that may not attend to itself",
            "Every token belongs to its own piece: the diagonal of each window's mask is True.",
            lambda case, e, a: not bool(a.diagonal(dim1=-2, dim2=-1).all())),
        _mask_structure(
            "a mask that is not symmetric (i may see j but j may not see i)",
            "'Same piece' is symmetric: compare the labels of query and key with ==.",
            lambda case, e, a: not torch.equal(a, a.transpose(-2, -1))),
        _mask_structure(
            "a window masked although it holds no wrapped-around piece",
            "Only the windows of the last row and the last column of windows mix pieces from opposite sides; "
            "every other window is all True.",
            lambda case, e, a: not bool(a[_interior_windows(case)].all())),
        _mask_structure(
            "tokens from different pieces of the rolled map allowed to attend to one another",
            "Label the 9 pieces (3 bands per axis, row_band * 3 + column_band) and allow only equal labels.",
            lambda case, e, a: bool((a & ~e).any())),
        properties.shape_permuted("Return [nW, M*M, M*M]: one mask per window, queries by keys."),
    ],
)


# ---------------------------------------------------------------------------------------
# Exercise 6: relative_position_index_2d(window) -> int64 [M*M, M*M]
# ---------------------------------------------------------------------------------------


def _relative_position_index_2d_cases() -> list[Case]:
    return [
        Case("window 2", (2,)),
        Case("window 3", (3,)),
        Case("window 7 (Swin-T)", (7,), hidden=True),
        Case("window 1: one token, one offset", (1,), hidden=True),
        Case("window 4", (4,), hidden=True),
        Case("window 5 by keyword", (), {"window": 5}, hidden=True),
    ]


def _offsets(m):
    rows, cols = torch.meshgrid(torch.arange(m), torch.arange(m), indexing="ij")
    coords = torch.stack([rows.flatten(), cols.flatten()])  # [2, M*M]
    return coords[:, :, None] - coords[:, None, :]  # [2, M*M, M*M]: query minus key


def _rpi_not_shifted(window):
    dy, dx = _offsets(window)
    return dy * (2 * window - 1) + dx


def _rpi_stride_m(window):
    dy, dx = _offsets(window) + (window - 1)
    return dy * window + dx


def _rpi_key_minus_query(window):
    return relative_position_index_2d(window).T.contiguous()


def _rpi_axes_swapped(window):
    dy, dx = _offsets(window) + (window - 1)
    return dx * (2 * window - 1) + dy


def _rpi_no_stride(window):
    dy, dx = _offsets(window) + (window - 1)
    return dy + dx


def _int_index(name: str, fix: str, bad) -> Property:
    def seen(case, expected, actual):
        if not isinstance(actual, torch.Tensor) or actual.shape != expected.shape:
            return False
        return bool(bad(case, expected, actual))

    return Property(name, fix, seen)


def _window_of(case) -> int:
    return case.args[0] if case.args else case.kwargs["window"]


def _collisions(case, expected, actual) -> bool:
    if actual.is_floating_point() or actual.dtype == torch.bool:
        return False
    m = _window_of(case)
    dy, dx = _offsets(m)
    offsets = (dy * 1000 + dx).flatten().tolist()
    seen: dict[int, int] = {}
    for index, offset in zip(actual.flatten().tolist(), offsets):
        if seen.setdefault(index, offset) != offset:
            return True
    return False


def _not_a_function_of_offset(case, expected, actual) -> bool:
    m = _window_of(case)
    dy, dx = _offsets(m)
    seen: dict[int, float] = {}
    for offset, index in zip((dy * 1000 + dx).flatten().tolist(), actual.flatten().tolist()):
        if seen.setdefault(offset, index) != index:
            return True
    return False


def _transposed_index(case, expected, actual) -> bool:
    return not torch.equal(expected, expected.T) and torch.equal(actual.to(expected.dtype), expected.T)


check_relative_position_index_2d = Checker(
    name="relative_position_index_2d",
    reference=relative_position_index_2d,
    make_cases=_relative_position_index_2d_cases,
    mistakes=[
        Mistake(
            "offsets not shifted by M - 1: negative indices, which wrap around to the end of the table",
            "Add M - 1 to dy and to dx before combining them, so that both lie in [0, 2M - 2].",
            _rpi_not_shifted,
        ),
        Mistake(
            "the row offset multiplied by M instead of 2M - 1 (the same as the 1-D offset i - j of the flattened "
            "positions, as for text): different offsets share one row of the table",
            "dx + M - 1 takes 2M - 1 values, so the row offset's stride is 2M - 1: "
            "(dy + M - 1) * (2M - 1) + (dx + M - 1).",
            _rpi_stride_m,
        ),
        Mistake(
            "key minus query instead of query minus key (the index transposed)",
            "Subtract the key's coordinates from the query's: coords[:, :, None] - coords[:, None, :], with the "
            "query on the rows.",
            _rpi_key_minus_query,
        ),
        Mistake(
            "the column offset given the large stride: (dx + M - 1) * (2M - 1) + (dy + M - 1)",
            "The row offset dy takes the stride 2M - 1, the column offset dx is added: "
            "(dy + M - 1) * (2M - 1) + (dx + M - 1).",
            _rpi_axes_swapped,
        ),
        Mistake(
            "the two shifted offsets added without a stride, (dy + M - 1) + (dx + M - 1): one step down and "
            "one step right share a row of the table",
            "Number the (dy, dx) pairs like the cells of a (2M - 1) x (2M - 1) grid: "
            "(dy + M - 1) * (2M - 1) + (dx + M - 1).",
            _rpi_no_stride,
        ),
    ],
    properties=[
        _int_index(
            "indices that are not integers",
            "Return an int64 tensor (torch.long): it indexes the rows of the bias table.",
            lambda case, e, a: a.is_floating_point() or a.dtype == torch.bool),
        _int_index(
            "indices outside the table's rows [0, (2M-1)^2)",
            "Shift both offsets by M - 1 so they lie in [0, 2M - 2], then index = dy' * (2M - 1) + dx'.",
            lambda case, e, a: bool(a.min() < 0 or a.max() >= (2 * _window_of(case) - 1) ** 2)),
        _int_index(
            "two different offsets (dy, dx) sharing one row of the table",
            "Every (dy, dx) needs its own row: with dx' in [0, 2M - 2], use the stride 2M - 1 for dy'.",
            _collisions),
        _int_index(
            "one offset (dy, dx) given different rows at different places in the window",
            "The index must depend only on the offset query minus key, computed from (row, column) coordinates.",
            _not_a_function_of_offset),
        _int_index(
            "the reference's index transposed",
            "Query on the rows, key on the columns, and the offset is query minus key.",
            _transposed_index),
    ],
)


# ---------------------------------------------------------------------------------------
# Exercise 7: swin_window_attention(x, block, shift) -> [B, H, W, C]
# ---------------------------------------------------------------------------------------


_CALL_THE_SWIN_BLOCK = ("swin_window_attention must compute the attention itself (roll, windows, block.attn with "
                        "the bias and the mask, reverse, roll back): calling block(x) inside it runs the block's own "
                        "window attention, which this check does not provide")
ERROR_MESSAGES = (_CALL_THE_VIT, _CALL_THE_SWIN_BLOCK)  # raised in the learner's process: translated at judging


def _swin_no_shortcut(x, block, shift):
    raise RuntimeError(_CALL_THE_SWIN_BLOCK)


def _tiny_block(g, dim, n_heads, height, width, window, shift, dtype=torch.float32):
    with torch.random.fork_rng(devices=[]):  # building draws from the global generator: leave the learner's alone
        block = SwinBlock(dim, n_heads, (height, width), window, shift, mlp_ratio=2.0,
                          parts=SwinParts(window_attention=_swin_no_shortcut))
    _random_parameters(block, g)
    return block.to(dtype).eval()


def _swin_window_attention_cases() -> list[Case]:
    g = seeded(1208)

    def case(name, batch, dim, heads, h, w, m, s, hidden=False, dtype=torch.float32):
        block = _tiny_block(g, dim, heads, h, w, m, s, dtype)
        return Case(name, (_distinct(g, batch, h, w, dim, dtype=dtype), block, s), hidden=hidden)

    return [
        case("2 maps 4x4, window 2, shift 1, 2 heads", 2, 4, 2, 4, 4, 2, 1),
        case("the same kind of block unshifted (shift 0): no roll, no mask", 2, 4, 2, 4, 4, 2, 0),
        case("2 maps 4x6 (not square), window 2, shift 1", 2, 6, 2, 4, 6, 2, 1),
        case("one 6x6 map, window 3, shift 1, 3 heads", 1, 6, 3, 6, 6, 3, 1, hidden=True),
        case("3 maps 8x8, window 4, shift 2, 2 heads", 3, 8, 2, 8, 8, 4, 2, hidden=True),
        case("2 maps 6x4 (not square), window 2, shift 1, 4 heads", 2, 8, 4, 6, 4, 2, 1, hidden=True),
        case("float64, 2 maps 4x8, window 2, shift 1", 2, 4, 2, 4, 8, 2, 1, hidden=True, dtype=torch.float64),
        case("unshifted 6x4 map (not square), window 2", 2, 4, 2, 6, 4, 2, 0, hidden=True),
        case("a batch of 4, 4x4, window 2, shift 1, 1 head", 4, 2, 1, 4, 4, 2, 1, hidden=True),
    ]


# Rolls as (before the windows, after them), in units of shift (the right answer is -1, then +1).
SWIN_ROLLS = {"right": (-1, 1), "wrong_direction": (1, -1), "not_back": (-1, 0), "same_direction": (-1, -1),
              "none": (0, 0)}
SWIN_OPTIONS = {
    "roll": tuple(SWIN_ROLLS),
    "mask": ("right", "missing", "window_major"),
    "bias": ("right", "transposed", "reshaped", "none"),
    "reverse": ("right", "swapped"),
}


def _swin_variant(x, block, shift, roll="right", mask="right", bias="right", reverse="right"):
    b, h, w, c = x.shape
    m = block.window
    before, after = (k * shift for k in SWIN_ROLLS[roll])
    x = torch.roll(x, shifts=(before, before), dims=(1, 2))
    windows = window_partition(x, m)  # [B*nW, M*M, C]
    table = block.bias_table[relative_position_index_2d(m)]  # [M*M, M*M, heads]
    lookup = {"right": lambda: table.permute(2, 0, 1), "transposed": lambda: table.permute(2, 1, 0),
              "reshaped": lambda: table.reshape(-1, m * m, m * m), "none": lambda: None}[bias]()
    masks = None
    if shift and mask != "missing":
        per_window = shifted_window_mask(h, w, m, shift)  # [nW, M*M, M*M]
        masks = per_window.repeat(b, 1, 1) if mask == "right" else per_window.repeat_interleave(b, dim=0)
    out = block.attn(windows, windows, windows, mask=masks, bias=lookup)  # [B*nW, M*M, C]
    x = window_reverse(out, m, w, h) if reverse == "swapped" else window_reverse(out, m, h, w)
    return torch.roll(x, shifts=(after, after), dims=(1, 2))


def _swin_mistake(**option):
    def wrong(x, block, shift):
        return _swin_variant(x, block, shift, **option)
    return wrong


SWIN_RTOL, SWIN_ATOL = 1e-4, 1e-5

check_swin_window_attention = Checker(
    name="swin_window_attention",
    reference=swin_window_attention,
    make_cases=_swin_window_attention_cases,
    rtol=SWIN_RTOL,
    atol=SWIN_ATOL,
    mistakes=[
        Mistake(
            "the map rolled the wrong way: by +shift (down and right) before the windows, by -shift after",
            "Roll by -shift on both axes before window_partition (up and left: the mask of shifted_window_mask "
            "assumes that direction), and by +shift after window_reverse.",
            _swin_mistake(roll="wrong_direction"),
        ),
        Mistake(
            "the map not rolled back after window_reverse: every token ends up shift rows and columns away "
            "from its place",
            "After window_reverse, roll by +shift on both axes (torch.roll with shifts=(shift, shift), "
            "dims=(1, 2)) to undo the first roll.",
            _swin_mistake(roll="not_back"),
        ),
        Mistake(
            "the map rolled back in the same direction as the first roll (by -shift twice)",
            "The second roll undoes the first: -shift before the windows, +shift after them.",
            _swin_mistake(roll="same_direction"),
        ),
        Mistake(
            "the shifted-window mask applied to the regular windows: the map was not rolled",
            "The mask describes the windows of the rolled map: roll by -shift before window_partition and by "
            "+shift after window_reverse.",
            _swin_mistake(roll="none"),
        ),
        Mistake(
            "the shift ignored: no roll and no mask, so a shifted block attends inside the regular windows",
            "For shift > 0: roll the map by -shift, attend with the shifted-window mask, and roll back by +shift.",
            _swin_mistake(roll="none", mask="missing"),
        ),
        Mistake(
            "no mask in the shifted block: the pieces that wrapped around attend to one another",
            "When shift > 0, pass shifted_window_mask_impl(H, W, M, shift), repeated for every image of the "
            "batch, as the mask of block.attn.",
            _swin_mistake(mask="missing"),
        ),
        Mistake(
            "the masks tiled window by window (each mask repeated B times in a row, repeat_interleave) instead of "
            "image by image",
            "window_partition puts the batch outermost (all windows of image 0, then of image 1, ...): repeat the "
            "whole stack of nW masks B times, mask.repeat(B, 1, 1).",
            _swin_mistake(mask="window_major"),
        ),
        Mistake(
            "the relative position bias transposed ([heads, key, query])",
            "bias_table[index] is [M*M (queries), M*M (keys), heads]: permute(2, 0, 1) keeps the queries on "
            "the rows.",
            _swin_mistake(bias="transposed"),
        ),
        Mistake(
            "the bias lookup reshaped to [heads, M*M, M*M] instead of permuted: each head's scores get pieces "
            "of every head's biases",
            "bias_table[index] is [M*M, M*M, heads]: move the heads to the front with permute(2, 0, 1); a "
            "reshape keeps the memory order and mixes heads and positions.",
            _swin_mistake(bias="reshaped"),
        ),
        Mistake(
            "no relative position bias",
            "Look block.bias_table up at relative_position_index_2d_impl(M), permute it to [heads, M*M, M*M] and "
            "pass it as block.attn's bias=.",
            _swin_mistake(bias="none"),
        ),
        Mistake(
            "height and width swapped in window_reverse",
            "window_reverse(windows, M, H, W): the height (x.shape[1]) comes before the width (x.shape[2]).",
            _swin_mistake(reverse="swapped"),
        ),
    ],
    properties=[
        Property("a roll that is not -shift before the windows and +shift after them",
                 "Roll up and left by shift before window_partition, and back down and right by shift after "
                 "window_reverse.",
                 _trait(SWIN_OPTIONS, _swin_variant, "roll", SWIN_RTOL, SWIN_ATOL)),
        Property("a shifted-window mask that is missing or tiled in the wrong order",
                 "When shift > 0, mask block.attn with shifted_window_mask_impl(H, W, M, shift) repeated image by "
                 "image, mask.repeat(B, 1, 1).",
                 _trait(SWIN_OPTIONS, _swin_variant, "mask", SWIN_RTOL, SWIN_ATOL)),
        Property("a relative position bias that is missing, transposed or mixed across heads",
                 "Pass bias=block.bias_table[index].permute(2, 0, 1), [heads, M*M, M*M], to block.attn.",
                 _trait(SWIN_OPTIONS, _swin_variant, "bias", SWIN_RTOL, SWIN_ATOL)),
        Property("height and width swapped when the windows are put back",
                 "window_reverse takes the height before the width: the output is [B, H, W, C] like the input.",
                 _trait(SWIN_OPTIONS, _swin_variant, "reverse", SWIN_RTOL, SWIN_ATOL)),
        properties.shape_permuted("swin_window_attention returns [B, H, W, C], the shape of its input."),
    ],
)


# ---------------------------------------------------------------------------------------
# Exercise 8: merge_patches(x) -> [B, H/2, W/2, 4C]
# ---------------------------------------------------------------------------------------


def _merge_patches_cases() -> list[Case]:
    g = seeded(1206)
    return [
        Case("one 4x4 map holding 0..15, 1 channel", (torch.arange(16.0).reshape(1, 4, 4, 1),)),
        Case("batch of 2, 4x6 maps, 3 channels", (_distinct(g, 2, 4, 6, 3),)),
        Case("a single 2x2 block, 2 channels", (_distinct(g, 1, 2, 2, 2),)),
        Case("float64, batch of 3, 8x8, 5 channels", (_distinct(g, 3, 8, 8, 5, dtype=torch.float64),), hidden=True),
        Case("6x4 maps (not square), 2 channels", (_distinct(g, 2, 6, 4, 2),), hidden=True),
        Case("batch of 2, 2x8 maps, 4 channels", (_distinct(g, 2, 2, 8, 4),), hidden=True),
    ]


def _neighbours(x):
    return {(r, c): x[:, r::2, c::2] for r in range(2) for c in range(2)}


def _mp_reading_order(x):
    n = _neighbours(x)
    return torch.cat([n[0, 0], n[0, 1], n[1, 0], n[1, 1]], dim=-1)


def _mp_interleaved(x):
    n = _neighbours(x)
    b, h, w, c = n[0, 0].shape
    return torch.stack([n[0, 0], n[1, 0], n[0, 1], n[1, 1]], dim=-1).reshape(b, h, w, 4 * c)


def _mp_plain_reshape(x):
    b, h, w, c = x.shape
    return x.reshape(b, h // 2, w // 2, 4 * c)


def _mp_pixel_unshuffle(x):
    return F.pixel_unshuffle(x.permute(0, 3, 1, 2), 2).permute(0, 2, 3, 1)  # channels outermost


def _mp_map_transposed(x):
    return merge_patches(x).transpose(1, 2)


def _merge_layout(case, expected, actual):
    if not isinstance(expected, torch.Tensor):
        return None
    return expected, actual, expected.shape[-1], 1  # groups: merged tokens; items: single values


check_merge_patches = Checker(
    name="merge_patches",
    reference=merge_patches,
    make_cases=_merge_patches_cases,
    mistakes=[
        Mistake(
            "the four neighbours concatenated in reading order (0,0), (0,1), (1,0), (1,1)",
            "Swin's order (and its published weights') is x0 = (0,0), x1 = (1,0), x2 = (0,1), x3 = (1,1): the "
            "row offset changes first. torch.cat([x0, x1, x2, x3], dim=-1).",
            _mp_reading_order,
        ),
        Mistake(
            "the neighbours stacked on a new last axis and flattened: channels interleaved (c0 of each "
            "neighbour, then c1 of each, ...)",
            "Concatenate along the channel axis, torch.cat([...], dim=-1), so each neighbour keeps its C channels "
            "together.",
            _mp_interleaved,
        ),
        Mistake(
            "a plain reshape to [B, H/2, W/2, 4C]: consecutive tokens of one row grouped instead of a 2 x 2 block",
            "Take the four neighbours with strided slices, x[:, 0::2, 0::2], x[:, 1::2, 0::2], ..., and "
            "concatenate them.",
            _mp_plain_reshape,
        ),
        Mistake(
            "channels outermost, as F.pixel_unshuffle orders them (c, then row offset, then column offset)",
            "Keep each neighbour's channels together, neighbour by neighbour: [x0 | x1 | x2 | x3] along the "
            "last axis.",
            _mp_pixel_unshuffle,
        ),
        Mistake(
            "the merged map transposed ([B, W/2, H/2, 4C])",
            "x[:, r::2, c::2] keeps rows on axis 1 and columns on axis 2: no transpose is needed.",
            _mp_map_transposed,
        ),
    ],
    properties=[
        *_arrangement_properties(
            _merge_layout, "merged tokens", "values",
            ("Merged token (i, j) comes from the 2 x 2 block at rows 2i, 2i+1 and columns 2j, 2j+1; keep the "
             "map's layout [B, H/2, W/2, 4C].",
             "Concatenate the four neighbours, each with its C channels together, in the order (0,0), (1,0), "
             "(0,1), (1,1).",
             "Each merged token must hold one 2 x 2 block: x[:, 0::2, 0::2], x[:, 1::2, 0::2], x[:, 0::2, 1::2], "
             "x[:, 1::2, 1::2].")),
        properties.shape_permuted("merge_patches returns [B, H/2, W/2, 4C]."),
    ],
)


CHECKERS = [check_patchify, check_vit_forward, check_window_partition, check_window_reverse,
            check_shifted_window_mask, check_relative_position_index_2d, check_swin_window_attention,
            check_merge_patches]
