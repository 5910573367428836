"""Chapter 11's pictures: the interaction matrices of the sparse attention patterns side by
side (Prince, Understanding Deep Learning, 2023, section 12.9, draws them the same way: rows
are queries, columns keys), and the block loop of the online softmax behind FlashAttention
(Milakov & Gimelshein, 2018; Dao et al., 2022).
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import torch

from .draw import arrow, box, canvas, grid


def _pattern_panel(ax, x, y, mask, title, note, cell, marks=()):
    """One interaction matrix: a grid of cells (row i = query, column j = key), a title above,
    a note below; `marks` are positions whose row and column get a coloured tick (global ones)."""
    rows = [[bool(v) for v in row] for row in mask.tolist()]
    n = len(rows)
    grid(ax, x, y, rows, cell=cell, colour_on="#2f6fad", colour_off="neutral")
    ax.text(x + n * cell / 2, y + n * cell + 0.2, title, ha="center", va="bottom", fontsize=10, weight="bold")
    ax.text(x + n * cell / 2, y - 0.15, note, ha="center", va="top", fontsize=8.3, color="#333333")
    for p in marks:  # a small orange tab beside the row and above the column of a global position
        ax.add_patch(plt.Rectangle((x - 0.16, y + (n - 1 - p) * cell), 0.12, cell, color="#e07b00"))
        ax.add_patch(plt.Rectangle((x + p * cell, y + n * cell + 0.03), cell, 0.12, color="#e07b00"))


def draw_interaction_patterns(patterns: dict, marks: dict | None = None, cell: float = 0.22):
    """Interaction matrices side by side, three per row. `patterns` maps a title to a bool mask
    [n, n] (True = query i may attend to key j), in drawing order; `marks` maps a title to the
    positions to flag as global. Each panel says how many of the n^2 pairs are computed.
    Returns the figure."""
    marks = marks or {}
    items = [(title, torch.as_tensor(mask).bool()) for title, mask in patterns.items()]
    n_max = max(m.shape[-1] for _, m in items)
    per_row = 3
    panel_w, panel_h = n_max * cell + 1.5, n_max * cell + 1.5
    n_rows = -(-len(items) // per_row)
    width, height = per_row * panel_w + 0.2, n_rows * panel_h + 1.1
    fig, ax = canvas(width, height, size=(width * 0.95, height * 0.95))
    for index, (title, mask) in enumerate(items):
        r, c = divmod(index, per_row)
        n = mask.shape[-1]
        x = 0.5 + c * panel_w + (n_max - n) * cell / 2
        y = height - 0.4 - (r + 1) * panel_h + 0.7
        pairs = int(mask.sum())
        note = f"{pairs} of {n * n} pairs ({100 * pairs / (n * n):.0f}%)"
        _pattern_panel(ax, x, y, mask, title, note, cell, marks.get(title, ()))
    box(ax, 0.5, 0.08, 0.3, 0.25, colour="#2f6fad", rounded=False)
    ax.text(0.9, 0.2, "query i may attend to key j", va="center", fontsize=8.5)
    box(ax, 4.6, 0.08, 0.3, 0.25, colour="neutral", rounded=False)
    ax.text(5.0, 0.2, "pair never scored", va="center", fontsize=8.5)
    ax.add_patch(plt.Rectangle((7.6, 0.1), 0.12, 0.22, color="#e07b00"))
    ax.text(7.85, 0.2, "global position (row and column)", va="center", fontsize=8.5)
    ax.text(width / 2, height - 0.05, "interaction matrices: row i is a query, column j a key",
            ha="center", va="top", fontsize=11, color="#333333")
    return fig


def draw_online_softmax(n_blocks: int = 4):
    """The online softmax as a loop over key blocks: each block's scores are folded into a
    running state (m, l, acc), which is rescaled whenever the maximum grows; at the end
    out = acc / l. Only one [L_q x B] block of scores exists at any time. Returns the figure."""
    step_w, gap = 2.5, 0.55
    width = 2.3 + n_blocks * (step_w + gap) + 2.0
    height = 7.0
    fig, ax = canvas(width, height, size=(width * 0.82, height * 0.82))
    ax.text(width / 2, height - 0.2, "online softmax: keys in blocks, one running state per query",
            ha="center", va="top", fontsize=11.5, weight="bold")

    state_y, state_h = 0.65, 1.45
    score_y, score_h = 2.75, 1.1
    kv_y = 4.85
    q_centre = box(ax, 0.2, score_y - 0.1, 1.6, score_h + 0.2, "queries Q\n[L_q, d]\n(read by\nevery block)",
                   colour="query", fontsize=8.5)
    start = box(ax, 0.2, state_y, 1.6, state_h, "start:\nm = -inf\nl = 0\nacc = 0", colour="weights", fontsize=8.5)
    prev = (start[0] + 0.8, start[1])
    x = 2.3
    for b in range(n_blocks):
        kv = box(ax, x + 0.25, kv_y, step_w - 0.5, 0.9, f"keys, values\nblock {b + 1}  [B, d]", colour="key",
                 fontsize=8.5)
        scores = box(ax, x, score_y, step_w, score_h, f"scores Q K{b + 1}ᵀ\n[L_q, B]: used, then gone",
                     colour="neutral", fontsize=8.5)
        arrow(ax, (kv[0], kv_y), (scores[0], score_y + score_h))
        state = box(ax, x, state_y, step_w, state_h,
                    "m' = max(m, block max)\nl, acc ×= exp(m − m')\nl += Σ exp(s − m')\nacc += exp(s − m') · V",
                    colour="weights", fontsize=7.8)
        arrow(ax, (scores[0], score_y), (state[0], state_y + state_h))
        arrow(ax, prev, (x, state[1]))
        prev = (x + step_w, state[1])
        x += step_w + gap
    arrow(ax, (q_centre[0] + 0.8, q_centre[1]), (2.3, q_centre[1]))
    end = box(ax, x, state_y, 1.6, state_h, "out = acc / l\n[L_q, d_v]", colour="output", fontsize=9)
    arrow(ax, prev, (x, end[1]))
    ax.text(x + 0.8, score_y + score_h / 2, "never held:\nthe [L_q, L_k]\nscore matrix", ha="center", va="center",
            fontsize=8.5, color="#a03030")
    ax.text(0.2, 0.25, "state per query: m the largest score so far, l the sum of exp(s − m), "
            "acc the sum of exp(s − m) · value (s: a score)", fontsize=8.3, color="#333333", va="center")
    return fig


if __name__ == "__main__":  # python -m transformer_lib.diagrams.ch11 writes previews
    from transformer_lib import sparse

    n = 12
    pats = {
        "dense (encoder)": torch.ones(n, n, dtype=torch.bool),
        "causal (decoder)": torch.ones(n, n, dtype=torch.bool).tril(),
        "sliding window, w = 2": sparse.sliding_window_mask(n, 2),
        "dilated, w = 2, dilation 2": sparse.dilated_mask(n, 2, 2),
        "global positions 0, 6 + window 1": sparse.sliding_window_mask(n, 1) | sparse.global_positions_mask(n, [0, 6]),
        "1 global token + window 1": sparse.global_token_mask(sparse.sliding_window_mask(n - 1, 1), 1),
    }
    draw_interaction_patterns(pats, marks={"global positions 0, 6 + window 1": [0, 6],
                                           "1 global token + window 1": [0]}).savefig(
        "/tmp/ch11_patterns.png", dpi=110, bbox_inches="tight")
    draw_online_softmax().savefig("/tmp/ch11_online.png", dpi=110, bbox_inches="tight")
    plt.close("all")
