"""Chapter 06's pictures: a mask drawn as a labelled grid, and the three attentions of an
encoder-decoder Transformer (Vaswani et al., 2017, section 3.2.3), each with the sequence
that asks (queries, the rows), the sequence that answers (keys and values, the columns)
and its mask grid.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import torch
from matplotlib.colors import ListedColormap

from .draw import COLOURS, box, canvas, grid

MASK_COLOURS = ListedColormap(["#eeeeee", "#2f6fad"])  # False: light grey, True: blue


def draw_mask(ax, mask, queries, keys, title):
    """Draw a boolean mask [L_q, L_k] on `ax`: one row per query, one column per key,
    True (may attend) in blue, False (hidden) in grey."""
    mask = torch.as_tensor(mask).detach().cpu().bool()  # [L_q, L_k]
    ax.imshow(mask, cmap=MASK_COLOURS, vmin=0, vmax=1)
    for i in range(mask.shape[0]):
        for j in range(mask.shape[1]):
            ok = bool(mask[i, j])
            ax.text(j, i, "True" if ok else "False", ha="center", va="center", fontsize=6,
                    color="white" if ok else "#888888")
    ax.set_xticks(range(len(keys)), keys, rotation=45, ha="right", fontsize=8)
    ax.set_yticks(range(len(queries)), queries, fontsize=8)
    ax.set_xlabel("key (attended to)", fontsize=8)
    ax.set_ylabel("query (attending)", fontsize=8)
    ax.set_title(title, fontsize=9)


def _default_masks(src, tgt, pad):
    real_src = torch.tensor([w != pad for w in src])  # [S]
    real_tgt = torch.tensor([w != pad for w in tgt])  # [T]
    t = len(tgt)
    enc = real_src[None, :].expand(len(src), len(src))  # [S, S]: padded source keys hidden
    dec = torch.ones(t, t, dtype=torch.bool).tril() & real_tgt[None, :]  # [T, T]: causal AND padding
    cross = real_src[None, :].expand(t, len(src))  # [T, S]: padded source keys hidden
    return enc, dec, cross


def _panel(ax, x0, y0, title, queries, q_from, keys, kv_from, mask, mask_text, cell=0.55):
    """One attention: query tokens down the left, key/value tokens along the top, the mask between."""
    n_q, n_k = len(queries), len(keys)
    label_w, key_h = 1.35, 1.25
    gx, gy = x0 + label_w + 0.1, y0  # the grid's lower-left corner
    grid(ax, gx, gy, [[bool(v) for v in row] for row in mask.tolist()], cell=cell,
         colour_on="key", colour_off="masked")
    for i, word in enumerate(queries):  # rows: the queries
        box(ax, x0, gy + (n_q - 1 - i) * cell + 0.04, label_w, cell - 0.08, word, colour="query",
            fontsize=8, rounded=False)
    for j, word in enumerate(keys):  # columns: the keys and values
        box(ax, gx + j * cell + 0.04, gy + n_q * cell + 0.1, cell - 0.08, key_h, word, colour="value",
            fontsize=8, rounded=False, rotation=90)
    top = gy + n_q * cell + 0.1 + key_h
    ax.text(gx + n_k * cell / 2, top + 0.15, f"keys, values from\n{kv_from}", ha="center", va="bottom",
            fontsize=8.5, color="#3b6e2f")
    ax.text(x0 + label_w / 2, top + 0.15, f"queries\nfrom\n{q_from}", ha="center", va="bottom", fontsize=8.5,
            color="#a0561b")
    ax.text(x0 + (label_w + 0.1 + n_k * cell) / 2, top + 1.25, title, ha="center", va="bottom", fontsize=10.5,
            weight="bold")
    ax.text(x0 + (label_w + 0.1 + n_k * cell) / 2, gy - 0.2, mask_text, ha="center", va="top", fontsize=8.5)


def draw_three_attentions(src=("tu", "es", "<pad>", "<pad>"), tgt=("<bos>", "you", "are", "<pad>", "<pad>"),
                          pad="<pad>", enc_mask=None, dec_mask=None, cross_mask=None):
    """The three attentions of an encoder-decoder Transformer side by side. Rows are queries,
    columns keys (and values); a green cell may attend, a dark one is hidden.

    src, tgt: the source and target tokens; the masks ([S, S], [T, T], [T, S], True = may
    attend) default to the ones the tokens call for (padding, and causal for the decoder).
    Returns the figure."""
    src, tgt = list(src), list(tgt)
    defaults = _default_masks(src, tgt, pad)
    enc_mask = defaults[0] if enc_mask is None else torch.as_tensor(enc_mask).bool()
    dec_mask = defaults[1] if dec_mask is None else torch.as_tensor(dec_mask).bool()
    cross_mask = defaults[2] if cross_mask is None else torch.as_tensor(cross_mask).bool()

    cell, gap = 0.55, 0.9
    widths = [1.45 + len(keys) * cell for keys in (src, tgt, src)]
    height = max(len(src), len(tgt)) * cell + 4.3
    width = sum(widths) + 2 * gap + 0.4
    fig, ax = canvas(width, height, size=(width * 0.82, height * 0.82))
    y0 = 1.3
    x = 0.2
    panels = [
        ("1. encoder self-attention", src, "the source", src, "the source", enc_mask,
         "source padding mask\n[B, 1, 1, S]: grid [S, S]"),
        ("2. masked decoder self-attention", tgt, "the target", tgt, "the target", dec_mask,
         "causal AND target padding\n[B, 1, T, T]: grid [T, T]"),
        ("3. cross-attention", tgt, "the decoder", src, "the encoder's memory", cross_mask,
         "source padding mask\n[B, 1, 1, S]: grid [T, S]"),
    ]
    n_rows = max(len(src), len(tgt))
    for (title, queries, q_from, keys, kv_from, mask, text), w in zip(panels, widths):
        # Align the grids' tops, so the three panels read as one row.
        _panel(ax, x, y0 + (n_rows - len(queries)) * cell, title, queries, q_from, keys, kv_from, mask, text, cell)
        x += w + gap
    box(ax, 0.2, 0.1, 0.35, 0.3, colour="key", rounded=False)
    ax.text(0.65, 0.25, "may attend (True)", va="center", fontsize=8.5)
    box(ax, 2.8, 0.1, 0.35, 0.3, colour="masked", rounded=False)
    ax.text(3.25, 0.25, "hidden (False)", va="center", fontsize=8.5)
    ax.text(5.6, 0.25, "rows: queries (who asks)    columns: keys and values (who answers)", va="center",
            fontsize=8.5, color="#444444")
    return fig


if __name__ == "__main__":  # python -m transformer_lib.diagrams.ch06 writes a preview
    draw_three_attentions().savefig("/tmp/ch06_three_attentions.png", dpi=110, bbox_inches="tight")
    plt.close("all")
