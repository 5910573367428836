"""Chapter 01's conceptual diagrams: the Transformer's two stacks and the cross-attention
between them, the three model families, and the RNN's chain next to attention's all-pairs.

Each function draws one picture on a fresh canvas and returns the figure; the notebook
calls it and shows it. The wiring follows Vaswani et al., "Attention Is All You Need"
(NeurIPS 2017), figure 1, simplified: residual connections and normalisation are left
out here (chapter 05 adds them).
"""

from __future__ import annotations

from .draw import arrow, box, canvas

# Encoder and decoder stacks get the colours the rest of the course uses for them.
ENCODER, DECODER = "input", "ffn"


def draw_encoder_decoder(source: str = "she is eating a green apple", target: str = "elle mange une"):
    """The original Transformer: an encoder stack reads the source, a decoder stack writes the
    target one word at a time, and every decoder layer reads the encoder's output through
    cross-attention."""
    fig, ax = canvas(12, 8.4, size=(9.6, 6.7), title="The Transformer: encoder, decoder, and the attention between them")

    # -- encoder (left) ---------------------------------------------------------------
    ax.add_patch(_frame(0.6, 2.3, 4.8, 3.6))
    ax.text(0.75, 5.65, "Encoder layer  × N", fontsize=9, weight="bold", va="center")
    enc_in = box(ax, 1.0, 1.0, 4.0, 0.8, "word vectors + positions", "neutral", fontsize=9)
    enc_att = box(ax, 1.0, 2.7, 4.0, 0.9, "self-attention\n(every word sees every word)", "attention", fontsize=9)
    enc_ffn = box(ax, 1.0, 4.1, 4.0, 0.9, "feed-forward network\n(each position alone)", "ffn", fontsize=9)
    arrow(ax, (enc_in[0], 1.8), (enc_att[0], 2.7))
    arrow(ax, (enc_att[0], 3.6), (enc_ffn[0], 4.1))
    ax.text(3.0, 0.55, f"source: “{source}”", ha="center", va="center", fontsize=9)
    arrow(ax, (3.0, 0.75), (3.0, 1.0))
    enc_out = box(ax, 1.0, 6.4, 4.0, 0.8, "one vector per source word", "input", fontsize=9)
    arrow(ax, (enc_ffn[0], 5.0), (enc_out[0], 6.4))

    # -- decoder (right) ----------------------------------------------------------------
    ax.add_patch(_frame(6.6, 2.3, 4.8, 4.3))
    ax.text(6.75, 6.35, "Decoder layer  × N", fontsize=9, weight="bold", va="center")
    dec_in = box(ax, 7.0, 1.0, 4.0, 0.8, "word vectors + positions", "neutral", fontsize=9)
    dec_self = box(ax, 7.0, 2.6, 4.0, 0.9, "masked self-attention\n(itself and earlier words)", "attention", fontsize=9)
    dec_cross = box(ax, 7.0, 3.9, 4.0, 0.9, "cross-attention: queries from here,\nkeys and values from the encoder", "key",
                    fontsize=8.5)
    dec_ffn = box(ax, 7.0, 5.2, 4.0, 0.9, "feed-forward network", "ffn", fontsize=9)
    arrow(ax, (dec_in[0], 1.8), (dec_self[0], 2.6))
    arrow(ax, (dec_self[0], 3.5), (dec_cross[0], 3.9))
    arrow(ax, (dec_cross[0], 4.8), (dec_ffn[0], 5.2))
    ax.text(9.0, 0.55, f"target so far: “{target}”", ha="center", va="center", fontsize=9)
    arrow(ax, (9.0, 0.75), (9.0, 1.0))
    head = box(ax, 7.0, 6.9, 4.0, 0.7, "linear + softmax", "output", fontsize=9)
    arrow(ax, (dec_ffn[0], 6.1), (head[0], 6.9))
    ax.text(9.0, 8.0, "probabilities of the next word", ha="center", va="center", fontsize=9)
    arrow(ax, (9.0, 7.6), (9.0, 7.8))

    # -- the link: the encoder's output feeds every decoder layer's cross-attention -----
    arrow(ax, (5.0, 6.8), (7.0, 4.35), colour="#2a7a2a", curve=-0.25)
    ax.text(5.5, 5.3, "to every\ndecoder\nlayer", ha="left", va="center", fontsize=8, color="#2a7a2a")
    return fig


def draw_model_families():
    """Three ways to use the two stacks: encoder-only (BERT), decoder-only (GPT) and
    encoder-decoder (the original Transformer, T5)."""
    fig, ax = canvas(15, 6.2, size=(10.5, 4.3))
    columns = [
        (0.3, "Encoder-only (BERT)", [("Encoder × N", "self-attention:\nsees the whole input\n+ feed-forward", ENCODER)],
         "a sentence", "a vector per word"),
        (5.3, "Decoder-only (GPT)", [("Decoder × N", "masked self-attention:\nsees only the past\n+ feed-forward", DECODER)],
         "text so far", "next word"),
    ]
    for x, title, stacks, below, above in columns:
        ax.text(x + 2.2, 5.9, title, ha="center", va="center", fontsize=10, weight="bold")
        _stack(ax, x + 0.2, stacks[0], below, above, width=4.0)

    x = 10.3
    ax.text(x + 2.2, 5.9, "Encoder-decoder (Transformer, T5)", ha="center", va="center", fontsize=10, weight="bold")
    _stack(ax, x, ("Encoder × N", "self-\nattention\n+ FFN", ENCODER), "source", None, width=2.0)
    _stack(ax, x + 2.5, ("Decoder × N", "masked self-\n+ cross-\nattention\n+ FFN", DECODER), "target so far",
           "next word", width=2.0)
    arrow(ax, (x + 2.0, 3.2), (x + 2.5, 3.2), colour="#2a7a2a")
    return fig


def draw_rnn_vs_attention(n: int = 6):
    """Left: an RNN's chain, where token 1 reaches the last state only through n - 1 steps
    that run one after the other. Right: self-attention, one step in which every position
    is connected to every other (all n^2 pairs computed at once)."""
    fig, ax = canvas(16, 6.6, size=(10.5, 4.3))
    gap = 1.15
    # -- RNN ---------------------------------------------------------------------------
    ax.text(3.6, 6.2, "RNN: a chain of steps", ha="center", va="center", fontsize=10, weight="bold")
    states = []
    for i in range(n):
        x = 0.4 + i * gap
        token = box(ax, x, 0.7, 0.8, 0.7, f"x{i + 1}", "neutral", fontsize=9)
        state = box(ax, x, 2.6, 0.8, 0.8, f"h{i + 1}", "input", fontsize=9)
        arrow(ax, (token[0], 1.4), (state[0], 2.6), colour="#b03030" if i == 0 else "#333333")
        if states:
            arrow(ax, (states[-1][0] + 0.4, 3.0), (x, 3.0), colour="#b03030")
        states.append(state)
    ax.text(3.6, 4.4, f"x1 reaches h{n} through {n - 1} steps,\nand step t must wait for step t - 1",
            ha="center", va="center", fontsize=9, color="#b03030")

    # -- attention -----------------------------------------------------------------------
    left = 8.8
    ax.text(left + 3.3, 6.2, "Self-attention: all pairs at once", ha="center", va="center", fontsize=10, weight="bold")
    bottoms, tops = [], []
    for i in range(n):
        x = left + i * gap
        bottoms.append(box(ax, x, 0.7, 0.8, 0.7, f"x{i + 1}", "neutral", fontsize=9))
        tops.append(box(ax, x, 3.4, 0.8, 0.8, f"y{i + 1}", "output", fontsize=9))
    for i, (bx, _) in enumerate(bottoms):
        for j, (tx, _) in enumerate(tops):
            highlight = i == 0 and j == n - 1
            arrow(ax, (bx, 1.4), (tx, 3.4), colour="#b03030" if highlight else "#9a9a9a", style="-")
    ax.text(left + 3.3, 4.9, f"x1 reaches y{n} in one step;\nall {n * n} pairs are independent",
            ha="center", va="center", fontsize=9, color="#b03030")
    return fig


def _frame(x, y, w, h):
    """A dashed outline around the boxes of one layer (the part repeated N times)."""
    from matplotlib.patches import FancyBboxPatch

    return FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.02,rounding_size=0.2", facecolor="none",
                          edgecolor="#777777", linestyle="--", linewidth=1)


def _stack(ax, x, spec, below, above, width):
    """One stack of layers with what goes in below and what comes out above."""
    title, body, colour = spec
    box(ax, x, 1.6, width, 3.3, "", colour)
    middle = x + width / 2
    ax.text(middle, 4.55, title, ha="center", va="center", fontsize=9, weight="bold")
    ax.text(middle, 3.0, body, ha="center", va="center", fontsize=8.5, linespacing=1.4)
    ax.text(middle, 0.45, below, ha="center", va="center", fontsize=9)
    arrow(ax, (middle, 0.75), (middle, 1.6))
    if above:
        arrow(ax, (middle, 4.9), (middle, 5.3))
        ax.text(middle, 5.5, above, ha="center", va="center", fontsize=9)
