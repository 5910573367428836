"""Chapter 04's diagrams: where the position vectors enter, the rotation of a (sin, cos) pair,
and how a relative bias is looked up from its table.

Each function draws one picture and returns its figure; the notebook calls it and shows it.
"""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import torch
from matplotlib.patches import Rectangle

from transformer_lib.positional import relative_offsets, sinusoidal_encoding, sinusoidal_frequencies

from .draw import COLOURS, arrow, box, canvas, grid


def _strip(ax, x, y, values, cell=0.32, label=None):
    """A vector drawn as a row of cells coloured by value (red < 0 < blue); returns its top centre."""
    for i, v in enumerate(values):
        face = plt.cm.RdBu(0.5 + 0.5 * max(-1.0, min(1.0, float(v))))
        ax.add_patch(Rectangle((x + i * cell, y), cell, cell, facecolor=face, edgecolor="#555555", linewidth=0.6))
    if label:
        ax.text(x - 0.12, y + cell / 2, label, ha="right", va="center", fontsize=9)
    return (x + len(values) * cell / 2, y + cell)


def draw_positions_added(tokens: tuple[str, ...] = ("the", "dog", "bit", "the", "man"), d_model: int = 6,
                         seed: int = 0):
    """Token embedding + position vector -> their sum -> attention, for each token of a short sentence.

    The same token gets the same embedding wherever it stands ("the" at 0 and at 3); the position
    row differs per position, so the sum (what attention sees) differs too. (English tokens: the
    default matplotlib font has no Chinese glyphs.)"""
    gen = torch.Generator().manual_seed(seed)
    embedding = {c: torch.randn(d_model, generator=gen).clamp(-1.5, 1.5) / 1.5 for c in dict.fromkeys(tokens)}
    pe = sinusoidal_encoding(len(tokens), d_model)  # [len, d]
    cell = 0.32
    width_strip = d_model * cell
    column = width_strip + 1.4
    left = 3.4
    fig, ax = canvas(left + len(tokens) * column + 0.2, 8.4, size=(11, 5.6),
                     title="What attention sees: token embedding + position vector")
    rows = {"token": 7.2, "embed": 5.6, "pos": 4.3, "sum": 2.6, "attn": 0.6}
    ax.text(left - 0.3, rows["token"] + 0.3, "token (position t)", ha="right", va="center", fontsize=9)
    ax.text(left - 0.3, rows["embed"] + cell / 2, "embedding x_t\n(looked up by token)", ha="right", va="center",
            fontsize=9)
    ax.text(left - 0.3, rows["pos"] + cell / 2, "position vector p_t\n(row t of the table)", ha="right",
            va="center", fontsize=9)
    ax.text(left - 0.3, rows["sum"] + cell / 2, "x_t + p_t", ha="right", va="center", fontsize=9)
    for t, char in enumerate(tokens):
        x0 = left + t * column
        centre = x0 + width_strip / 2
        box(ax, centre - 1.0, rows["token"], 2.0, 0.6, f"{char} (t={t})", colour="input", fontsize=9)
        top_e = _strip(ax, x0, rows["embed"], embedding[char].tolist(), cell)
        arrow(ax, (centre, rows["token"]), (top_e[0], top_e[1] + 0.05))
        _strip(ax, x0, rows["pos"], pe[t].tolist(), cell)
        ax.text(centre, rows["pos"] + cell + 0.28, "+", ha="center", va="center", fontsize=16)
        top_s = _strip(ax, x0, rows["sum"], (embedding[char] + pe[t]).clamp(-1, 1).tolist(), cell)
        arrow(ax, (centre, rows["pos"] - 0.05), (top_s[0], top_s[1] + 0.05))
        arrow(ax, (centre, rows["sum"] - 0.05), (centre, rows["attn"] + 0.75))
    box(ax, left - 0.2, rows["attn"], len(tokens) * column - 1.0, 0.75, "multi-head attention (chapter 03)",
        colour="attention", fontsize=10)
    ax.text(left + len(tokens) * column / 2 - 0.5, rows["attn"] - 0.35,
            "the same token at two positions (\"the\" at t=0 and t=3): one embedding, two different sums",
            ha="center", va="center", fontsize=8.5, style="italic")
    return fig


def draw_rotation_circle(k: int = 2, d_model: int = 16, pairs: tuple[int, ...] = (0, 1), n_positions: int = 8):
    """Pair i of the sinusoidal encoding as a point on the unit circle, one point per position.

    Moving k positions turns the point by the same angle k * omega_i, wherever it starts: that is
    the rotation M_k of section 4."""
    omega = sinusoidal_frequencies(d_model)  # [d/2]
    fig, axes = plt.subplots(1, len(pairs), figsize=(4.4 * len(pairs), 4.9))
    axes = [axes] if len(pairs) == 1 else list(axes)
    starts = (1, 4)
    colours = ("#d62728", "#1f77b4")
    for ax, i in zip(axes, pairs):
        w = omega[i].item()
        circle = torch.linspace(0, 2 * math.pi, 200)
        ax.plot(circle.sin(), circle.cos(), color="#bbbbbb", linewidth=1)
        for pos in range(n_positions):
            a = pos * w
            ax.plot(math.sin(a), math.cos(a), "o", color="#333333", markersize=4)
            ax.annotate(str(pos), (math.sin(a), math.cos(a)), xytext=(1.17 * math.sin(a), 1.17 * math.cos(a)),
                        ha="center", va="center", fontsize=8)
        for start, colour in zip(starts, colours):
            a0, a1 = start * w, (start + k) * w
            arc = torch.linspace(a0, a1, 50)
            ax.plot(0.78 * arc.sin(), 0.78 * arc.cos(), color=colour, linewidth=2)
            ax.annotate("", xy=(0.78 * math.sin(a1), 0.78 * math.cos(a1)),
                        xytext=(0.78 * arc[-2].sin().item(), 0.78 * arc[-2].cos().item()),
                        arrowprops=dict(arrowstyle="-|>", color=colour, lw=2))
            for a in (a0, a1):
                ax.plot([0, math.sin(a)], [0, math.cos(a)], color=colour, linewidth=0.8, linestyle="--")
        ax.set_title(f"pair {i}: dims {2 * i}, {2 * i + 1}   (omega = {w:.3f})\n"
                     f"{_start_text(starts, k)}: both turn by k * omega = {k * w:.2f} rad", fontsize=9)
        ax.set_xlabel(f"dim {2 * i}: sin(pos * omega)", fontsize=8)
        ax.set_ylabel(f"dim {2 * i + 1}: cos(pos * omega)", fontsize=8)
        ax.set_xlim(-1.35, 1.35)
        ax.set_ylim(-1.35, 1.35)
        ax.set_aspect("equal")
        ax.tick_params(labelsize=7)
    fig.suptitle(f"Moving k = {k} positions: the same rotation from every starting position", fontsize=10)
    fig.tight_layout()
    return fig


def _start_text(starts, k) -> str:
    return " and ".join(f"{s} -> {s + k}" for s in starts)


def draw_relative_bias_lookup(max_distance: int = 2, length: int = 6, values=(0.1, 0.9, 0.3, 0.6, 0.2)):
    """One head's table of 2D + 1 biases, and the [L_q, L_k] bias matrix it fills: entry (i, j)
    is the table entry of the clipped offset j - i, so every diagonal holds one value."""
    table = list(values)
    assert len(table) == 2 * max_distance + 1
    index = relative_offsets(length, length, max_distance)  # [L, L]
    cell = 0.55
    fig, ax = canvas(11.2, 5.6, size=(9.5, 4.8), title="A relative bias: one table per head, looked up by offset")
    # the table
    tx, ty = 0.6, 3.2
    ax.text(tx, ty + 2 * cell + 0.05, "table of one head\n(2D + 1 learned numbers)", fontsize=9, va="bottom")
    grid(ax, tx, ty, [table], cell=cell, labels=[[f"{v:.1f}" for v in table]])
    for m in range(-max_distance, max_distance + 1):
        ax.text(tx + (m + max_distance + 0.5) * cell, ty - 0.2, f"{m:+d}" if m else "0", ha="center", va="top",
                fontsize=8)
    ax.text(tx + len(table) * cell / 2, ty - 0.62, "offset j - i (clipped to ±D)", ha="center", va="top",
            fontsize=8)
    # the bias matrix
    gx, gy = 6.0, 0.6
    labels = [[f"{int(index[i, j]) - max_distance:+d}" if index[i, j] != max_distance else "0"
               for j in range(length)] for i in range(length)]
    grid(ax, gx, gy, [[table[int(index[i, j])] for j in range(length)] for i in range(length)], cell=cell,
         labels=labels)
    for j in range(length):
        ax.text(gx + (j + 0.5) * cell, gy + length * cell + 0.1, str(j), ha="center", va="bottom", fontsize=8)
    for i in range(length):
        ax.text(gx - 0.1, gy + (length - i - 0.5) * cell, str(i), ha="right", va="center", fontsize=8)
    ax.text(gx + length * cell / 2, gy + length * cell + 0.45, "key position j", ha="center", va="bottom",
            fontsize=9)
    ax.text(gx - 0.45, gy + length * cell / 2, "query position i", ha="center", va="center", fontsize=9,
            rotation=90)
    ax.text(gx + length * cell + 0.2, gy + length * cell / 2,
            "bias[i, j] =\ntable[clip(j - i) + D]\n\nadded to\nscore[i, j]\nbefore softmax", ha="left",
            va="center", fontsize=8.5)
    arrow(ax, (tx + len(table) * cell + 0.1, ty + cell / 2), (gx - 0.35, gy + length * cell * 0.9),
          label="gather", curve=0.0)
    ax.add_patch(Rectangle((tx - 0.05, ty - 0.05), len(table) * cell + 0.1, cell + 0.1, fill=False,
                           edgecolor=COLOURS["masked"], linewidth=0.8, linestyle=":"))
    return fig
