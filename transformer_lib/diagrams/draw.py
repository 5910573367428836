"""The shapes diagrams are made of: a canvas, labelled boxes, arrows, a grid of cells.

Coordinates are in data units on an axis with no ticks, so a diagram is laid out like
graph paper: `box(ax, x, y, w, h, "W^Q")` puts a box with its lower-left corner at (x, y).
"""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Rectangle

# One palette for every chapter, so a query is always the same colour.
COLOURS = {
    "input": "#dbe9f6", "query": "#f9d9b5", "key": "#cfe8c4", "value": "#e3d3ef",
    "weights": "#fff2b3", "output": "#f6c9c9", "norm": "#d5eef0", "ffn": "#f2e1c9",
    "attention": "#f9d9b5", "neutral": "#eeeeee", "masked": "#555555",
}


def canvas(width: float, height: float, size: tuple[float, float] | None = None, title: str | None = None):
    """A blank axis spanning [0, width] x [0, height], equal aspect, no ticks."""
    fig, ax = plt.subplots(figsize=size or (width * 0.9, height * 0.9))
    ax.set_xlim(0, width)
    ax.set_ylim(0, height)
    ax.set_aspect("equal")
    ax.axis("off")
    if title:
        ax.set_title(title)
    return fig, ax


def box(ax, x, y, w, h, label="", colour="neutral", fontsize=10, rounded=True, **text_kw):
    """A filled box with its label centred; returns its centre."""
    face = COLOURS.get(colour, colour)
    style = "round,pad=0.02,rounding_size=0.12" if rounded else "square,pad=0"
    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle=style, facecolor=face, edgecolor="#333333", linewidth=1))
    if label:
        ax.text(x + w / 2, y + h / 2, label, ha="center", va="center", fontsize=fontsize, **text_kw)
    return (x + w / 2, y + h / 2)


def arrow(ax, start, end, label="", colour="#333333", style="-|>", curve=0.0, fontsize=9, offset=(0.0, 0.15)):
    """An arrow from `start` to `end` (points), optionally labelled at its middle."""
    ax.add_patch(FancyArrowPatch(start, end, arrowstyle=style, mutation_scale=12, color=colour, linewidth=1.2,
                                 connectionstyle=f"arc3,rad={curve}", shrinkA=2, shrinkB=2))
    if label:
        mx, my = (start[0] + end[0]) / 2 + offset[0], (start[1] + end[1]) / 2 + offset[1]
        ax.text(mx, my, label, ha="center", va="bottom", fontsize=fontsize, color=colour)


def grid(ax, x, y, values, cell=0.4, colour_on="query", colour_off="neutral", labels=None):
    """A grid of cells (rows of booleans or numbers in [0, 1]) with its top-left row first."""
    rows = len(values)
    for i, row in enumerate(values):
        for j, v in enumerate(row):
            if isinstance(v, bool):
                face = COLOURS.get(colour_on) if v else COLOURS.get(colour_off)
            else:
                face = plt.cm.Blues(float(v))
            ax.add_patch(Rectangle((x + j * cell, y + (rows - 1 - i) * cell), cell, cell,
                                   facecolor=face, edgecolor="#777777", linewidth=0.6))
            if labels is not None:
                ax.text(x + (j + 0.5) * cell, y + (rows - 1 - i + 0.5) * cell, labels[i][j],
                        ha="center", va="center", fontsize=7)
