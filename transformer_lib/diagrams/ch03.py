"""Chapter 03's conceptual diagrams: multi-head attention's data flow, the memory layout of
split heads, and how one mask reaches every head.

The layer is the one of Vaswani et al., "Attention Is All You Need" (NeurIPS 2017), section
3.2.2: MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O, head_i = Attention(Q W_i^Q, K W_i^K,
V W_i^V), computed as implementations do it, with one d_model x d_model matrix per projection
whose output is cut into heads.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import torch
from matplotlib.colors import ListedColormap

from transformer_lib.attention import split_heads

from .draw import COLOURS, arrow, box, canvas, grid

SHAPE_COLOUR = "#555555"  # the grey of the shape labels on the arrows


def _shape(ax, x, y, text, fontsize=8.5, va="bottom"):
    ax.text(x, y, text, ha="center", va=va, fontsize=fontsize, color=SHAPE_COLOUR, family="monospace")


def draw_multi_head_flow(n_heads: int = 3):
    """Project, split, attend per head, merge (concatenate), mix with W^O, with the shape of
    the tensor on every arrow. B = batch, L = sequence length, h = heads, d_k = d_model / h."""
    fig, ax = canvas(24.2, 7.4, size=(15.5, 4.8), title="Multi-head attention: the shapes along the way")
    lanes = {"Q": 5.3, "K": 3.5, "V": 1.7}  # centre heights of the three projections
    mid = lanes["K"]
    top, bottom = lanes["Q"] + 0.45, lanes["V"] - 0.45

    x_in = box(ax, 0.2, mid - 0.6, 1.7, 1.2, "x\n(query, key,\nvalue inputs)", "input", fontsize=9)
    _shape(ax, x_in[0], mid - 0.75, "[B, L, d_model]", va="top")

    # -- three projections, one full-width matrix each -----------------------------------
    for name, y in lanes.items():
        colour = {"Q": "query", "K": "key", "V": "value"}[name]
        w = box(ax, 3.0, y - 0.45, 1.3, 0.9, f"$W^{name}$", colour, fontsize=12)
        arrow(ax, (1.9, x_in[1]), (3.0, w[1]))
    _shape(ax, 3.65, bottom - 0.15, "each d_model × d_model", va="top")

    # -- one split for all three: view + transpose -----------------------------------------
    split_left, split_w = 6.8, 2.2
    box(ax, split_left, bottom, split_w, top - bottom, "split_heads\n\nview\n+\ntranspose(1, 2)", "neutral", fontsize=9)
    for y in lanes.values():
        arrow(ax, (4.3, y), (split_left, y))
        _shape(ax, 5.55, y + 0.08, "[B, L, d_model]", fontsize=7.5)

    # -- h heads side by side, each a small attention -------------------------------------
    gap = 0.25
    height = (top - bottom - gap * (n_heads - 1)) / n_heads
    head_left, head_w = 11.5, 3.2
    for i in range(n_heads):
        y = top - (i + 1) * height - i * gap
        label = f"head {i}" if i < n_heads - 1 else "head h − 1"  # counted from 0, like the code
        box(ax, head_left, y, head_w, height, f"{label}\n" + r"softmax$(Q_i K_i^T / \sqrt{d_k})\, V_i$",
            "attention", fontsize=9)
    arrow(ax, (split_left + split_w, mid), (head_left, mid))
    _shape(ax, 10.25, mid + 0.08, "Q, K, V each", fontsize=8)
    _shape(ax, 10.25, mid - 0.08, "[B, h, L, d_k]", fontsize=7.5, va="top")
    ax.text(head_left + head_w / 2, top + 0.15, "all heads in one batched @", ha="center", va="bottom",
            fontsize=8.5, color=SHAPE_COLOUR)

    # -- merge (= Concat), then W^O --------------------------------------------------------
    merge_left, merge_w = 17.0, 2.2
    box(ax, merge_left, bottom, merge_w, top - bottom, "merge_heads\n\ntranspose(1, 2)\n+\nreshape\n\n= Concat",
        "neutral", fontsize=9)
    arrow(ax, (head_left + head_w, mid), (merge_left, mid))
    _shape(ax, 15.85, mid + 0.08, "[B, h, L, d_k]", fontsize=7.5)
    w_left = 21.1
    box(ax, w_left, mid - 0.45, 1.0, 0.9, "$W^O$", "output", fontsize=12)
    arrow(ax, (merge_left + merge_w, mid), (w_left, mid))
    _shape(ax, 20.15, mid + 0.08, "[B, L, d_model]", fontsize=7.5)
    out = box(ax, 22.8, mid - 0.6, 1.2, 1.2, "output", "output", fontsize=9)
    arrow(ax, (w_left + 1.0, mid), (22.8, mid))
    _shape(ax, out[0], mid - 0.75, "[B, L, d_model]", fontsize=7.5, va="top")

    ax.text(0.2, 0.3, "Head i uses columns i·d_k … (i+1)·d_k − 1 of each projection; "
            "$W^O$ is where the heads' results meet.", fontsize=9.5, color=COLOURS["masked"])
    return fig


def draw_split_layouts(seq: int = 4, d_model: int = 6, n_heads: int = 3):
    """The same [seq, d_model] matrix cut into heads two ways: view + transpose (right) and
    view straight to [heads, seq, d_k] (wrong). Colour = the head that owns the feature,
    label = the position the number came from."""
    d_k = d_model // n_heads
    owner = (torch.arange(d_model) // d_k).expand(seq, d_model).float()  # [seq, d_model]: head of each feature
    where = torch.arange(seq)[:, None].expand(seq, d_model).float()  # [seq, d_model]: position of each entry
    right = [split_heads(t[None], n_heads)[0] for t in (owner, where)]  # each [heads, seq, d_k]
    wrong = [t.reshape(n_heads, seq, d_k) for t in (owner, where)]  # viewed straight to [heads, seq, d_k]

    palette = ["#8dd3c7", "#fdb462", "#bebada", "#fb8072", "#80b1d3", "#b3de69"]
    colours = ListedColormap(palette[:n_heads])
    fig, axes = plt.subplots(2, n_heads + 1, figsize=(2.0 * (n_heads + 1) + 1.5, 4.2),
                             gridspec_kw={"width_ratios": [n_heads] + [1] * n_heads})
    for row, (heads_owner, heads_where), label in ((0, right, "view + transpose"), (1, wrong, "view only")):
        panels = [(owner, where, "Q  [seq, d_model]")] + [
            (heads_owner[i], heads_where[i], f"head {i}") for i in range(n_heads)]
        for ax, (c, p, title) in zip(axes[row], panels):
            ax.imshow(c, cmap=colours, vmin=-0.5, vmax=n_heads - 0.5)
            for r in range(c.shape[0]):
                for col in range(c.shape[1]):
                    ax.text(col, r, f"t{int(p[r, col])}", ha="center", va="center", fontsize=8)
            ax.set_xticks([])
            ax.set_yticks([])
            ax.set_title(title, fontsize=9)
        axes[row][0].set_ylabel(label)
    fig.suptitle("Colour = the head that owns the feature, label = the position it came from", fontsize=10)
    fig.tight_layout()
    return fig


def draw_mask_broadcast():
    """A padding mask [batch, 1, L_k] meets scores [batch, heads, L_q, L_k]: with a heads
    dimension added (unsqueeze(1)) it reaches every head and every query of its own sentence;
    without it, broadcasting lines the batch up with the heads."""
    batch, heads, l_q, l_k = 2, 2, 3, 5
    lengths = [5, 3]  # sentence 1 has two padding keys
    mask = [[j < n for j in range(l_k)] for n in lengths]  # [batch, L_k]: True = real token
    cell = 0.34
    fig, ax = canvas(13.2, 8.2, size=(11.0, 6.8),
                     title="One padding mask [batch, 1, L_k] for scores [batch, heads, L_q, L_k]")

    # -- the mask as given ------------------------------------------------------------------
    ax.text(1.25, 6.35, "padding mask\n[batch=2, 1, L_k=5]", ha="center", va="bottom", fontsize=9)
    for b in range(batch):
        grid(ax, 0.4, 5.4 - b * 0.9, [mask[b]], cell=cell, colour_on="weights", colour_off="masked")
        ax.text(0.3, 5.4 - b * 0.9 + cell / 2, f"sentence {b}", ha="right", va="center", fontsize=8)

    def scores_panel(x0, y0, title, row_for):
        """Grids [batch rows] x [head columns]; row_for(b, h) is the mask row that lands there."""
        ax.text(x0 + (heads - 1) * 1.5 + l_k * cell / 2, y0 + 2.85, title, ha="center", va="bottom", fontsize=9.5)
        for b in range(batch):
            for h in range(heads):
                x, y = x0 + h * 3.0, y0 + (batch - 1 - b) * 1.45
                row = mask[row_for(b, h)]
                grid(ax, x, y, [row] * l_q, cell=cell, colour_on="weights", colour_off="masked")
                ax.text(x + l_k * cell / 2, y - 0.05, f"sentence {b}, head {h}", ha="center", va="top", fontsize=7.5)

    # -- right: unsqueeze(1), the same mask for every head and every query --------------------
    scores_panel(6.0, 4.3, "mask.unsqueeze(1) → [2, 1, 1, 5] broadcasts to [2, 2, 3, 5]: right",
                 lambda b, h: b)
    arrow(ax, (2.3, 5.6), (5.9, 5.6), label="unsqueeze(1)", fontsize=8.5)
    # -- below: no unsqueeze, dims line up from the right and the batch meets the heads -------
    scores_panel(6.0, 0.55, "no unsqueeze: [2, 1, 5] lines up as [heads, L_q, L_k]: wrong",
                 lambda b, h: h)
    arrow(ax, (1.25, 4.35), (5.9, 2.0), label="as it is", fontsize=8.5, curve=0.15, offset=(-0.7, -0.5))

    ax.text(6.0, 7.75, "yellow = may attend, grey = hidden", fontsize=8.5, color=SHAPE_COLOUR)
    ax.text(0.3, 0.9, "Wrong: head 1 of sentence 0\nhides sentence 1's padding\npositions, and sentence 1's\n"
            "head 0 sees its own padding.", fontsize=8.5, va="bottom", color=COLOURS["masked"])
    return fig
