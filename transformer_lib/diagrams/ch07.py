"""Chapter 07's diagram: the whole encoder-decoder, with the path the data takes through it.

The source goes up the left column once; the decoder's input (the target shifted right behind
<bos>) goes up the right column, and every decoder layer's cross-attention reads the encoder's
output, the memory. The generator turns the last decoder layer's vectors into log-probabilities.
"""

from __future__ import annotations

from .draw import arrow, box, canvas


def draw_encoder_decoder(n_layers: str = "N"):
    """The encoder-decoder Transformer as a data-flow diagram; returns the figure."""
    fig, ax = canvas(12.5, 13.0, size=(9.4, 9.75))
    left, right, w = 0.3, 7.0, 4.6  # x of the two columns, and their width
    lx, rx = left + w / 2, right + w / 2  # their centre lines

    # -- the encoder column (left), bottom to top --------------------------------------
    box(ax, left, 0.3, w, 0.8, "source tokens  [batch, S]\n\"3 Mar 2021\"", "input", fontsize=9)
    box(ax, left, 1.7, w, 0.9, "token embedding × sqrt(d_model)\n+ sinusoidal positions", "neutral", fontsize=9)
    ax.add_patch(_frame(left - 0.15, 3.2, w + 0.3, 3.3))
    ax.text(left + w + 0.25, 6.5, f"× {n_layers}", ha="left", va="top", fontsize=11, fontweight="bold")
    box(ax, left + 0.3, 3.5, w - 0.6, 1.0, "self-attention\n(source padding mask)", "attention", fontsize=9)
    box(ax, left + 0.3, 4.9, w - 0.6, 0.9, "feed-forward", "ffn", fontsize=9)
    ax.text(lx, 6.15, "encoder layer (each sublayer: add & norm)", ha="center", fontsize=8, style="italic")
    box(ax, left, 7.1, w, 0.9, "memory  [batch, S, d_model]", "key", fontsize=9)
    ax.text(lx, 8.2, "at inference: computed once per sentence", ha="center", fontsize=8, style="italic")
    for y0, y1 in [(1.1, 1.7), (2.6, 3.5), (4.5, 4.9), (5.8, 7.1)]:
        arrow(ax, (lx, y0), (lx, y1))

    # -- the decoder column (right), bottom to top -------------------------------------
    box(ax, right, 0.3, w, 0.8, "decoder input  [batch, T]\n<bos> + target shifted right", "input", fontsize=9)
    box(ax, right, 1.7, w, 0.9, "token embedding × sqrt(d_model)\n+ sinusoidal positions", "neutral", fontsize=9)
    ax.add_patch(_frame(right - 0.15, 3.2, w + 0.3, 5.0))
    ax.text(right + w + 0.25, 8.2, f"× {n_layers}", ha="left", va="top", fontsize=11, fontweight="bold")
    box(ax, right + 0.3, 3.5, w - 0.6, 1.0, "masked self-attention\n(causal + padding mask)", "query", fontsize=9)
    box(ax, right + 0.3, 5.0, w - 0.6, 1.0, "cross-attention\nqueries here, keys/values: memory", "attention",
        fontsize=9)
    box(ax, right + 0.3, 6.5, w - 0.6, 0.9, "feed-forward", "ffn", fontsize=9)
    ax.text(rx, 7.75, "decoder layer (each sublayer: add & norm)", ha="center", fontsize=8, style="italic")
    box(ax, right, 8.9, w, 0.9, "generator: linear to V, log-softmax", "output", fontsize=9)
    box(ax, right, 10.5, w, 0.9, "log-probabilities  [batch, T, V]\nof the next token at every position",
        "weights", fontsize=9)
    for y0, y1 in [(1.1, 1.7), (2.6, 3.5), (4.5, 5.0), (6.0, 6.5), (7.4, 8.9), (9.8, 10.5)]:
        arrow(ax, (rx, y0), (rx, y1))

    # -- the one link between the columns: memory -> every cross-attention --------------
    arrow(ax, (left + w, 7.55), (right + 0.3, 5.5))
    ax.text(6.35, 6.75, "keys,\nvalues", ha="left", va="center", fontsize=9)
    ax.text(6.0, 11.95, "training: all T positions in one pass (teacher forcing)\n"
            "inference: one new token per step, keys and values of earlier steps in a KV cache",
            ha="center", va="center", fontsize=9)
    ax.text(lx, 12.7, "encoder", ha="center", fontsize=11, fontweight="bold")
    ax.text(rx, 12.7, "decoder", ha="center", fontsize=11, fontweight="bold")
    return fig


def _frame(x, y, w, h):
    """A dashed rectangle around the sublayers that repeat N times."""
    from matplotlib.patches import Rectangle

    return Rectangle((x, y), w, h, fill=False, linestyle="--", edgecolor="#777777", linewidth=1)
