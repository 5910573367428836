"""Chapter 02's conceptual diagram: the path of one token through self-attention.

Token i's embedding x_i is projected three ways (W^Q, W^K, W^V) into its query, key and
value. Its query is compared with the key of every token j (a dot product each), the scores
are divided by sqrt(d_k) and turned into weights by a softmax over j, and the weights mix
the values of all tokens into z_i. The equation is eq. 1 of Vaswani et al., "Attention Is
All You Need" (NeurIPS 2017), read one row at a time.
"""

from __future__ import annotations

from .draw import COLOURS, arrow, box, canvas

SHAPE_COLOUR = "#555555"  # the grey of the small shape notes under the boxes


def _row_of_cells(ax, x, y, labels, colour, cell_w=0.62, cell_h=0.75, fontsize=10):
    """A row of small square-ish cells, one per token j; returns (left, right, bottom, top)."""
    for j, label in enumerate(labels):
        box(ax, x + j * cell_w, y, cell_w, cell_h, label, colour, fontsize=fontsize, rounded=False)
    return x, x + len(labels) * cell_w, y, y + cell_h


def _note(ax, x, y, text, fontsize=8.5):
    ax.text(x, y, text, ha="center", va="top", fontsize=fontsize, color=SHAPE_COLOUR)


def draw_qkv_flow():
    """One token's trip through self-attention: x_i -> (W^Q, W^K, W^V) -> q_i, k_i, v_i;
    q_i . k_j for every j -> scores -> / sqrt(d_k) -> softmax -> weights -> sum_j a_ij v_j -> z_i."""
    fig, ax = canvas(16.2, 7.6, size=(13.0, 6.1),
                     title="Self-attention for one token i: query, keys, values, weights")
    top, mid, bottom = 5.6, 3.2, 0.8  # lanes: the query's path, the keys, the values
    h = 0.8

    # -- projections: one embedding, three learned matrices --------------------------------
    x_i = box(ax, 0.2, mid - 0.1, 1.5, 1.0, "$x_i$\ntoken i", "input", fontsize=11)
    _note(ax, x_i[0], mid - 0.2, "[d_model]")
    lanes = {"Q": (top, "query", "$q_i$"), "K": (mid, "key", "$k_i$"), "V": (bottom, "value", "$v_i$")}
    made = {}
    for name, (y, colour, label) in lanes.items():
        w = box(ax, 2.5, y, 1.1, h, f"$W^{name}$", "neutral", fontsize=11)
        arrow(ax, (1.7, x_i[1]), (2.5, w[1]))
        made[name] = box(ax, 4.2, y, 1.0, h, label, colour, fontsize=12)
        arrow(ax, (3.6, w[1]), (4.2, w[1]))
    _note(ax, made["Q"][0], top - 0.1, "[d_k]")
    _note(ax, made["K"][0], mid - 0.1, "[d_k]")
    _note(ax, made["V"][0], bottom - 0.1, "[d_v]")

    # -- every token j has a key and a value, made the same way ----------------------------
    keys = ["$k_1$", "$k_2$", "…", "$k_n$"]
    values = ["$v_1$", "$v_2$", "…", "$v_n$"]
    k_left, k_right, _, k_top = _row_of_cells(ax, 6.3, mid, keys, "key")
    v_left, v_right, _, _ = _row_of_cells(ax, 6.3, bottom, values, "value")
    arrow(ax, (5.2, made["K"][1]), (k_left, made["K"][1]))
    arrow(ax, (5.2, made["V"][1]), (v_left, made["V"][1]))
    _note(ax, (k_left + k_right) / 2, mid - 0.1, "the keys of all n tokens")
    _note(ax, (v_left + v_right) / 2, bottom - 0.1, "the values of all n tokens")

    # -- the query's path: compare with every key, scale, softmax --------------------------
    dot = box(ax, 6.0, top, 3.1, h, "$q_i \\cdot k_j$  for every j", "query", fontsize=11)
    arrow(ax, (5.2, made["Q"][1]), (6.0, dot[1]))
    arrow(ax, ((k_left + k_right) / 2, k_top), ((k_left + k_right) / 2, top))
    s_left, s_right, _, _ = _row_of_cells(ax, 9.8, top, ["$s_{i1}$", "$s_{i2}$", "…", "$s_{in}$"], "neutral")
    arrow(ax, (9.1, dot[1]), (s_left, dot[1]))
    _note(ax, (s_left + s_right) / 2, top - 0.1, "scores")
    scale = box(ax, 12.9, top, 1.25, h, "$\\div\\sqrt{d_k}$", "neutral", fontsize=12)
    arrow(ax, (s_right, scale[1]), (12.9, scale[1]))
    soft = box(ax, 14.75, top, 1.3, h, "softmax\nover j", "weights", fontsize=10)
    arrow(ax, (14.15, soft[1]), (14.75, soft[1]))

    # -- weights: n numbers >= 0 that sum to 1 ----------------------------------------------
    w_left, w_right, _, w_top = _row_of_cells(ax, 13.3, mid, ["$a_{i1}$", "$a_{i2}$", "…", "$a_{in}$"],
                                              "weights")
    arrow(ax, (soft[0], top), (soft[0], w_top))
    _note(ax, (w_left + w_right) / 2, mid - 0.1, "weights: ≥ 0, sum to 1")

    # -- the weighted sum of the values -----------------------------------------------------
    mix = box(ax, 9.9, bottom - 0.1, 2.6, 1.0, "$\\sum_j\\, a_{ij}\\, v_j$", "output", fontsize=13)
    arrow(ax, (v_right, mix[1]), (9.9, mix[1]))
    arrow(ax, ((w_left + w_right) / 2, mid - 0.55), (12.2, bottom + 0.9), curve=-0.15)
    z_i = box(ax, 13.6, bottom - 0.1, 1.5, 1.0, "$z_i$\nnew vector", "output", fontsize=11)
    arrow(ax, (12.5, mix[1]), (13.6, z_i[1]))
    _note(ax, z_i[0], bottom - 0.2, "[d_v]")

    ax.text(0.2, 7.15, "Every token runs this same path at once: stacked as rows, it is "
            "softmax(Q Kᵀ / √d_k) V.", fontsize=10, va="center", color=COLOURS["masked"])
    return fig
