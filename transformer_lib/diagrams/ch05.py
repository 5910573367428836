"""Chapter 05's diagrams: which values LayerNorm and BatchNorm pool, and where the norm sits
in post-norm and pre-norm sub-layers."""

from __future__ import annotations

from matplotlib.patches import Circle, Rectangle

from .draw import COLOURS, arrow, box, canvas

_CELL = 0.32  # side of one cell of a [seq, features] grid


def _sentence(ax, x, y, seq, d, length, highlight, title):
    """One sentence as a grid: rows are positions (top = first), columns are features.

    `highlight(i, j)` says whether cell (position i, feature j) is pooled into one statistic.
    Padding rows (i >= length) are dark; a pooled padding cell gets a coloured edge."""
    for i in range(seq):
        for j in range(d):
            pooled, padding = highlight(i, j), i >= length
            face = COLOURS["masked"] if padding else (COLOURS["query"] if pooled else COLOURS["neutral"])
            edge, width = ("#d9822b", 2.0) if pooled and padding else ("#777777", 0.6)
            ax.add_patch(Rectangle((x + j * _CELL, y + (seq - 1 - i) * _CELL), _CELL, _CELL, facecolor=face,
                                   edgecolor=edge, linewidth=width, zorder=2 if pooled and padding else 1))
    ax.text(x + d * _CELL / 2, y + seq * _CELL + 0.12, title, ha="center", va="bottom", fontsize=9)


def draw_norm_axes(seq: int = 5, d: int = 6, lengths=(5, 3, 4)):
    """A [batch, seq, features] block drawn as one grid per sentence, twice: the values
    LayerNorm pools into one mean and variance (one token's features), and those BatchNorm
    pools (one feature, across every position of every sentence, padding included)."""
    gap = 0.45
    width_one = d * _CELL
    block = len(lengths) * width_one + (len(lengths) - 1) * gap
    left, middle = 0.6, 1.3
    width = left + 2 * block + middle + 0.2
    height = seq * _CELL + 2.6
    fig, ax = canvas(width, height, size=(width * 0.62, height * 0.62))
    fig.subplots_adjust(left=0.01, right=0.99, bottom=0.01, top=0.99)
    y0 = 1.25
    panels = [
        ("LayerNorm: one token's d features", left, lambda b, i, j: b == 0 and i == 1),
        ("BatchNorm: one feature, every token", left + block + middle, lambda b, i, j: j == 2),
    ]
    for title, x0, rule in panels:
        for b, length in enumerate(lengths):
            _sentence(ax, x0 + b * (width_one + gap), y0, seq, d, length,
                      lambda i, j, b=b: rule(b, i, j), f"sentence {b + 1}")
        ax.text(x0 + block / 2, y0 + seq * _CELL + 0.7, title, ha="center", va="bottom", fontsize=11,
                fontweight="bold")
        # Axis arrows under and beside the first grid.
        arrow(ax, (x0, y0 - 0.25), (x0 + width_one, y0 - 0.25))
        ax.text(x0 + width_one / 2, y0 - 0.35, "features (d)", ha="center", va="top", fontsize=8)
        arrow(ax, (x0 - 0.2, y0 + seq * _CELL), (x0 - 0.2, y0))
        ax.text(x0 - 0.3, y0 + seq * _CELL / 2, "positions", ha="right", va="center", fontsize=8, rotation=90)
        ax.text(x0 + block / 2, y0 - 0.7, "batch: one grid per sentence", ha="center", va="top", fontsize=8,
                color="#555555")
    ax.text(width / 2, 0.05, "orange = pooled into one mean and one variance;  dark = padding "
            "(an orange edge: padding that BatchNorm pools too)", ha="center", va="bottom", fontsize=8,
            color="#555555")
    return fig


def _flow(ax, y, steps, label, residual_from, residual_to):
    """A row of boxes joined by arrows, with the residual shortcut drawn above them."""
    x = 1.7
    ax.text(0.1, y + 0.35, label, ha="left", va="center", fontsize=11, fontweight="bold")
    centres = []
    for text, colour, w in steps:
        if text == "+":
            ax.add_patch(Circle((x + 0.3, y + 0.35), 0.3, facecolor="white", edgecolor="#333333", linewidth=1.2))
            ax.text(x + 0.3, y + 0.35, "+", ha="center", va="center", fontsize=14)
            centres.append((x, x + 0.6))
            x += 0.6
        else:
            box(ax, x, y, w, 0.7, text, colour)
            centres.append((x, x + w))
            x += w
        x += 0.55
    for (_, right), (next_left, _) in zip(centres, centres[1:]):
        arrow(ax, (right, y + 0.35), (next_left, y + 0.35))
    start = (centres[residual_from][0] - 0.27, y + 0.35)
    end = (centres[residual_to][0] + 0.3, y + 0.65)
    ax.plot([start[0], start[0], end[0]], [start[1], y + 1.15, y + 1.15], color="#2b7bb9", linewidth=1.5)
    arrow(ax, (end[0], y + 1.15), end, colour="#2b7bb9")
    ax.text((start[0] + end[0]) / 2, y + 1.2, "residual: x itself", ha="center", va="bottom", fontsize=8,
            color="#2b7bb9")


def draw_post_vs_pre_norm():
    """Post-norm (the paper): x -> sub-layer -> + x -> LayerNorm. Pre-norm (GPT-2 and most later
    models): x -> LayerNorm -> sub-layer -> + x, the sum left un-normalised."""
    fig, ax = canvas(10.2, 4.3, size=(8.2, 3.7))
    fig.subplots_adjust(left=0.01, right=0.99, bottom=0.01, top=0.99)
    post = [("x", "input", 0.6), ("sub-layer", "attention", 1.5), ("+", None, 0), ("LayerNorm", "norm", 1.5),
            ("out", "output", 0.7)]
    pre = [("x", "input", 0.6), ("LayerNorm", "norm", 1.5), ("sub-layer", "attention", 1.5), ("+", None, 0),
           ("out", "output", 0.7)]
    _flow(ax, 2.45, post, "post-norm", 1, 2)
    _flow(ax, 0.25, pre, "pre-norm", 1, 3)
    ax.text(10.1, 2.1, "LayerNorm(x + sub-layer(x))", ha="right", va="center", fontsize=9, family="monospace")
    ax.text(10.1, -0.1, "x + sub-layer(LayerNorm(x))", ha="right", va="center", fontsize=9, family="monospace")
    ax.text(1.7, 2.1, "the sum is normalised: the stream keeps a fixed size", ha="left", va="center", fontsize=8,
            color="#555555")
    ax.text(1.7, -0.1, "the sum is not: the stream grows, one final LayerNorm tops the stack", ha="left",
            va="center", fontsize=8, color="#555555")
    ax.set_ylim(-0.35, 4.3)
    return fig
