"""Chapter 12's diagrams: the ViT pipeline (patches -> tokens -> [CLS] + positions -> encoder ->
head), Swin's windows and shifted windows with the mask that keeps the wrapped-around pieces
apart, the relative-position index of a window, and patch merging as a feature pyramid.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.colors import ListedColormap
from matplotlib.patches import Rectangle

from .draw import COLOURS, arrow, box, canvas

# The 9 pieces of a rolled map (3 bands per axis), one colour each.
PIECE_COLOURS = ["#dbe9f6", "#f9d9b5", "#cfe8c4", "#e3d3ef", "#fff2b3", "#f6c9c9", "#d5eef0", "#f2e1c9",
                 "#c9d3f6"]
MASK_COLOURS = ListedColormap(["#555555", "#cfe8c4"])  # False: dark (blocked), True: green (may attend)


def _image(ax, x, y, image, size, grid_every=None, cmap="Greys"):
    """Draw a [H, W] image with its lower-left corner at (x, y), `size` wide."""
    image = np.asarray(image, dtype=float)
    h, w = image.shape
    ax.imshow(image, cmap=cmap, extent=(x, x + size, y, y + size * h / w), interpolation="nearest", zorder=1)
    if grid_every:
        cell = size / w
        for k in range(0, w + 1, grid_every):
            ax.plot([x + k * cell] * 2, [y, y + size * h / w], color="#d9822b", linewidth=1.5, zorder=2)
        for k in range(0, h + 1, grid_every):
            ax.plot([x, x + size], [y + k * cell] * 2, color="#d9822b", linewidth=1.5, zorder=2)


def draw_vit_pipeline(image=None, patch: int = 4):
    """ViT from left to right: an image cut into patches, each flattened and linearly embedded into a
    token, [CLS] prepended, a learned position added to every token, the pre-norm encoder, and the
    classification head reading [CLS] alone. `image`: an [H, W] array (default: a gradient)."""
    if image is None:
        image = np.add.outer(np.arange(8), np.arange(8)) % 5
    image = np.asarray(image, dtype=float)
    n = (image.shape[0] // patch) * (image.shape[1] // patch)
    fig, ax = canvas(16.0, 4.7, size=(13.0, 3.8))
    fig.subplots_adjust(left=0.01, right=0.99, bottom=0.01, top=0.99)
    _image(ax, 0.2, 1.5, image, 2.4, grid_every=patch)
    ax.text(1.4, 4.15, "image, cut into\npatch x patch squares", ha="center", va="bottom", fontsize=9)
    # The patches, flattened into a row of tokens.
    x0, y_tok = 3.9, 2.0
    ax.text(x0 + 0.1, 4.15, "flatten each patch (C*p*p values)\nLinear -> one token of d_model", ha="left",
            va="bottom", fontsize=9)
    arrow(ax, (2.7, 2.7), (x0 - 0.1, 2.7))
    xs = []
    for k in range(n + 1):
        x = x0 + k * 0.62
        xs.append(x + 0.26)
        if k == 0:
            box(ax, x, y_tok, 0.52, 1.3, "[CLS]", "weights", fontsize=7, rotation=90)
        else:
            box(ax, x, y_tok, 0.52, 1.3, f"patch {k}", "input", fontsize=7, rotation=90)
        box(ax, x, y_tok - 0.9, 0.52, 0.55, f"p{k}", "key", fontsize=7)
        ax.text(x + 0.26, y_tok - 0.2, "+", ha="center", va="center", fontsize=9)
    ax.text(x0 - 0.1, y_tok - 0.62, "learned\npositions", ha="right", va="center", fontsize=8)
    right = x0 + (n + 1) * 0.62
    ax.text((x0 + right) / 2, y_tok - 1.25, f"{n} patch tokens + [CLS]", ha="center", va="top", fontsize=8,
            color="#555555")
    # The encoder and the head.
    enc_x = right + 0.6
    arrow(ax, (right, 2.65), (enc_x, 2.65))
    box(ax, enc_x, 1.0, 2.6, 3.3, "", "norm")
    ax.text(enc_x + 1.3, 4.0, "encoder, L layers", ha="center", va="center", fontsize=9, fontweight="bold")
    for i, (text, colour) in enumerate([("LayerNorm", "neutral"), ("self-attention\n(every token)", "attention"),
                                        ("+ residual", "neutral"), ("LayerNorm", "neutral"), ("MLP (GELU)", "ffn"),
                                        ("+ residual", "neutral")]):
        box(ax, enc_x + 0.25, 3.4 - i * 0.42, 2.1, 0.36, text.replace("\n", " "), colour, fontsize=7)
    ax.text(enc_x + 1.3, 0.75, "then a final LayerNorm", ha="center", va="top", fontsize=8, color="#555555")
    head_x = enc_x + 3.7
    arrow(ax, (enc_x + 2.6, 2.65), (head_x, 2.65), label="[CLS]'s\nfinal state", fontsize=8)
    box(ax, head_x, 2.25, 1.3, 0.8, "Linear\nhead", "output", fontsize=9)
    arrow(ax, (head_x + 1.3, 2.65), (head_x + 2.0, 2.65))
    ax.text(head_x + 2.05, 2.65, "class\nscores", ha="left", va="center", fontsize=9)
    return fig


def _map_with_windows(ax, x, y, label, window, cell, offset=0, title="", text=None):
    """A [H, W] map of piece labels drawn cell by cell, window boundaries every `window` cells
    starting at `offset` (a shifted partition), optional text in the cells."""
    h, w = label.shape
    for i in range(h):
        for j in range(w):
            ax.add_patch(Rectangle((x + j * cell, y + (h - 1 - i) * cell), cell, cell,
                                   facecolor=PIECE_COLOURS[int(label[i, j]) % 9], edgecolor="#999999", linewidth=0.4))
            if text is not None:
                ax.text(x + (j + 0.5) * cell, y + (h - 1 - i + 0.5) * cell, text[i][j], ha="center", va="center",
                        fontsize=6.5)
    bounds_x = sorted({min(max(k, 0), w) for k in range(offset % window - window, w + window, window)} | {0, w})
    bounds_y = sorted({min(max(k, 0), h) for k in range(offset % window - window, h + window, window)} | {0, h})
    for k in bounds_x:
        ax.plot([x + k * cell] * 2, [y, y + h * cell], color="#c0392b", linewidth=2)
    for k in bounds_y:
        ax.plot([x, x + w * cell], [y + (h - k) * cell] * 2, color="#c0392b", linewidth=2)
    if title:
        ax.text(x + w * cell / 2, y + h * cell + 0.15, title, ha="center", va="bottom", fontsize=9)


def draw_shifted_windows(mask_fn=None, height: int = 8, width: int = 8, window: int = 4, shift: int = 2):
    """Swin's two kinds of blocks on a height x width map of tokens:

    1. regular windows: attention inside each window x window square;
    2. the windows displaced by `shift`: more windows, some of them cut small;
    3. the same after rolling the map by -shift (cyclic_shift): window x window windows again,
       but those of the last row and column hold pieces (colours) that are not neighbours;
    4. the mask of the bottom-right window (from `mask_fn(height, width, window, shift)`, default
       the library's shifted_window_mask): only tokens of the same piece may attend.
    Returns the figure."""
    from transformer_lib.vision import shifted_window_mask

    mask_fn = mask_fn or shifted_window_mask
    h, w, m, s = height, width, window, shift
    # Each token of the original map labelled by its displaced window: boundaries at s, s + M, ...
    part = lambda n: np.where(np.arange(n) < s, 0, 1 + (np.arange(n) - s) // m)  # noqa: E731
    original_label = part(h)[:, None] * (w // m + 1) + part(w)[None, :]  # [H, W]
    rolled_label = np.roll(original_label, shift=(-s, -s), axis=(0, 1))
    names = [[f"{i},{j}" for j in range(w)] for i in range(h)]
    rolled_names = np.roll(np.array(names, dtype=object), shift=(-s, -s), axis=(0, 1)).tolist()

    cell = 0.42
    side = w * cell
    gap = 1.35
    width_all, height_all = 3 * side + 2 * gap + 4.6, h * cell + 1.9
    fig, ax = canvas(width_all, height_all, size=(15.5, 15.5 * height_all / width_all))
    fig.subplots_adjust(left=0.01, right=0.99, bottom=0.01, top=0.99)
    y = 0.9
    plain = np.zeros((h, w), dtype=int)
    _map_with_windows(ax, 0.2, y, plain, m, cell, 0, "1. windows: attention inside each", names)
    _map_with_windows(ax, 0.2 + side + gap, y, original_label, m, cell, -s,
                      f"2. windows shifted by {s}: {(h // m + 1) * (w // m + 1)} windows", names)
    x3 = 0.2 + 2 * (side + gap)
    _map_with_windows(ax, x3, y, rolled_label, m, cell, 0, f"3. map rolled by -{s}: {(h // m) * (w // m)} windows",
                      rolled_names)
    arrow(ax, (0.2 + side + 0.15, y + h * cell / 2), (0.2 + side + gap - 0.15, y + h * cell / 2), label="next block",
          fontsize=8)
    arrow(ax, (0.2 + 2 * side + gap + 0.15, y + h * cell / 2), (x3 - 0.15, y + h * cell / 2),
          label="torch.roll", fontsize=8)
    ax.text(0.2 + side + gap + side / 2, y - 0.2, "colours: the displaced windows", ha="center", va="top",
            fontsize=8, color="#555555")
    ax.text(x3 + side / 2, y - 0.2, "cells show (row, col) on the original map", ha="center", va="top", fontsize=8,
            color="#555555")
    # 4. The bottom-right window's mask.
    mask = torch.as_tensor(mask_fn(h, w, m, s)).bool()[-1].numpy()  # [M*M, M*M]
    x4 = x3 + side + 0.9
    mask_side = 3.4
    ax.imshow(mask, cmap=MASK_COLOURS, vmin=0, vmax=1, extent=(x4, x4 + mask_side, y, y + mask_side),
              interpolation="nearest")
    k = mask.shape[0]
    for t in range(1, k):  # thin lines between the cells: one row per query, one column per key
        ax.plot([x4 + t * mask_side / k] * 2, [y, y + mask_side], color="white", linewidth=0.5)
        ax.plot([x4, x4 + mask_side], [y + t * mask_side / k] * 2, color="white", linewidth=0.5)
    window_label = rolled_label[h - m:, w - m:].flatten()
    for t in range(k):  # a coloured strip naming each token's piece, along both axes
        ax.add_patch(Rectangle((x4 + t * mask_side / k, y + mask_side + 0.05), mask_side / k, 0.18,
                               facecolor=PIECE_COLOURS[window_label[t]], edgecolor="#999999", linewidth=0.3))
        ax.add_patch(Rectangle((x4 - 0.23, y + mask_side - (t + 1) * mask_side / k), 0.18, mask_side / k,
                               facecolor=PIECE_COLOURS[window_label[t]], edgecolor="#999999", linewidth=0.3))
    ax.text(x4 + mask_side / 2, y + mask_side + 0.4, "4. mask of the bottom-right window", ha="center",
            va="bottom", fontsize=9)
    ax.text(x4 + mask_side / 2, y - 0.2, "green: may attend (same piece)\ndark: blocked", ha="center", va="top",
            fontsize=8, color="#555555")
    return fig


def draw_relative_index(index, window: int):
    """The relative-position index of one window as a heatmap with its numbers: rows are
    queries, columns keys, both in reading order; equal numbers = equal offsets."""
    index = torch.as_tensor(index).numpy()
    k = index.shape[0]
    fig, ax = plt.subplots(figsize=(0.42 * k + 1.6, 0.42 * k + 1.0))
    ax.imshow(index, cmap="viridis")
    for i in range(k):
        for j in range(k):
            ax.text(j, i, str(int(index[i, j])), ha="center", va="center", fontsize=7,
                    color="white" if index[i, j] < index.max() * 0.6 else "black")
    ticks = [f"({t // window},{t % window})" for t in range(k)]
    ax.set_xticks(range(k), ticks, rotation=90, fontsize=7)
    ax.set_yticks(range(k), ticks, fontsize=7)
    ax.set_xlabel("key (row, col) in the window", fontsize=8)
    ax.set_ylabel("query (row, col)", fontsize=8)
    ax.set_title(f"row of the bias table, window {window}: {(2 * window - 1) ** 2} offsets", fontsize=9)
    fig.tight_layout()
    return fig


def draw_feature_pyramid(grid: int = 8, dim: int = 32, stages: int = 3):
    """ViT keeps one resolution all the way; Swin halves it and doubles the channels at every
    patch merging (each 2x2 block -> one token: concatenate to 4C, LayerNorm, Linear to 2C)."""
    fig, ax = canvas(14.0, 4.0, size=(12.0, 3.45))
    fig.subplots_adjust(left=0.01, right=0.99, bottom=0.01, top=0.99)
    ax.text(0.2, 3.9, "ViT: one scale", ha="left", va="top", fontsize=10, fontweight="bold")
    ax.text(5.2, 3.9, "Swin: a pyramid, like a CNN's", ha="left", va="top", fontsize=10, fontweight="bold")
    vit_cell = 1.2 / grid
    for layer in range(3):  # ViT: the same grid at every depth
        x = 0.3 + layer * 1.55
        for i in range(grid):
            for j in range(grid):
                ax.add_patch(Rectangle((x + j * vit_cell, 1.5 + i * vit_cell), vit_cell, vit_cell,
                                       facecolor=COLOURS["input"], edgecolor="#777777", linewidth=0.3))
        ax.text(x + 0.6, 1.35, f"layer {layer + 1}\n{grid}x{grid}, C={dim}", ha="center", va="top", fontsize=8)
    x = 5.4
    g, c = grid, dim
    for stage in range(stages):
        cell = 2.4 / grid
        for i in range(g):
            for j in range(g):
                ax.add_patch(Rectangle((x + j * cell, 0.9 + i * cell), cell, cell, facecolor=COLOURS["query"],
                                       edgecolor="#777777", linewidth=0.4))
        ax.text(x + g * cell / 2, 0.75, f"stage {stage + 1}\n{g}x{g}, C={c}", ha="center", va="top", fontsize=8)
        if stage < stages - 1:
            ax.add_patch(Rectangle((x, 0.9 + (g - 2) * cell), 2 * cell, 2 * cell, fill=False, edgecolor="#c0392b",
                                   linewidth=2))
            nx = x + g * cell + 1.35
            arrow(ax, (x + g * cell + 0.1, 2.1), (nx - 0.1, 2.1))
            ax.text((x + g * cell + nx) / 2, 2.25, "merge 2x2\n4C -> LN ->\nLinear -> 2C", ha="center",
                    va="bottom", fontsize=7)
            x = nx
            g, c = g // 2, c * 2
    return fig


__all__ = ["draw_vit_pipeline", "draw_shifted_windows", "draw_relative_index", "draw_feature_pyramid"]
