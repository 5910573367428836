"""Chapter 10's pictures: a decoder-only language model read as one training step (inputs at
the bottom, the causal mask beside the stack, the targets shifted left by one at the top),
and the three families of Transformers side by side (encoder-decoder, encoder-only,
decoder-only), each with the mask its self-attention uses.
"""

from __future__ import annotations

from .draw import COLOURS, arrow, box, canvas, grid


def _causal(n: int) -> list[list[bool]]:
    return [[j <= i for j in range(n)] for i in range(n)]


def _full(n: int) -> list[list[bool]]:
    return [[True] * n for _ in range(n)]


def draw_decoder_only(tokens=("It", "takes", "great", "courage")):
    """One window of text through a GPT: every position predicts the token after it."""
    n = len(tokens)
    fig, ax = canvas(12.0, 6.9, size=(11.0, 6.3))
    step, w = 1.75, 1.45
    xs = [0.4 + i * step for i in range(n)]
    width = xs[-1] + w - xs[0]

    for x, word in zip(xs, tokens):  # inputs
        box(ax, x, 0.3, w, 0.6, word, colour="input", fontsize=10)
    ax.text(xs[0] - 0.1, 0.2, "inputs: one window of text, positions 0 .. L-1", fontsize=8.5, color="#444444",
            va="top")
    emb = box(ax, xs[0], 1.55, width, 0.55, "token embedding + learned position embedding", colour="neutral", fontsize=9.5)
    stack = box(ax, xs[0], 2.55, width, 1.5, "", colour="attention")
    ax.text(stack[0], stack[1] + 0.35, "N x decoder block", ha="center", fontsize=11, weight="bold")
    ax.text(stack[0], stack[1] - 0.25, "x + masked self-attention(LN(x)),  then  x + MLP(LN(x))",
            ha="center", fontsize=9)
    head = box(ax, xs[0], 4.5, width, 0.55, "final LayerNorm -> linear (tied to the embedding) -> softmax",
               colour="output", fontsize=9.5)
    for x in xs:  # one column of data flow per position
        arrow(ax, (x + w / 2, 0.9), (x + w / 2, 1.55))
        arrow(ax, (x + w / 2, 2.1), (x + w / 2, 2.55))
        arrow(ax, (x + w / 2, 4.05), (x + w / 2, 4.5))
        arrow(ax, (x + w / 2, 5.05), (x + w / 2, 5.65))

    targets = list(tokens[1:]) + ["(past the end)"]
    for i, (x, word) in enumerate(zip(xs, targets)):
        last = i == n - 1
        box(ax, x, 5.65, w, 0.6, word, colour="neutral" if last else "key", fontsize=9 if last else 10,
            color="#777777" if last else "black")
    ax.text(xs[0] - 0.1, 6.4, "targets: the inputs shifted left by one (the last prediction has no target)",
            fontsize=8.5, color="#444444", va="bottom")

    # The causal mask the stack's self-attention uses, beside it.
    cell, gx, gy = 0.5, 9.3, 2.3
    grid(ax, gx, gy, _causal(n), cell=cell, colour_on="key", colour_off="masked")
    for i, word in enumerate(tokens):
        ax.text(gx - 0.1, gy + (n - 1 - i + 0.5) * cell, word, ha="right", va="center", fontsize=8)
        ax.text(gx + (i + 0.5) * cell, gy + n * cell + 0.08, word, ha="center", va="bottom", fontsize=8, rotation=60)
    ax.text(gx + n * cell / 2, gy - 0.25, "causal mask: row t sees\ncolumns 0 .. t (green)", ha="center", va="top",
            fontsize=8.5)
    arrow(ax, (xs[-1] + w, stack[1]), (gx - 1.0, stack[1]), colour="#3b6e2f", style="-")
    return fig


def _family(ax, x0, title, example, parts, objective, use):
    """One family: its blocks (name, mask, colour), then what it is trained on and used for."""
    ax.text(x0 + 2.2, 7.0, title, ha="center", fontsize=12, weight="bold")
    ax.text(x0 + 2.2, 6.55, example, ha="center", fontsize=9, color="#444444")
    n = 4
    cell = 0.32
    spots = [x0 + 1.15] if len(parts) == 1 else [x0 - 0.5, x0 + 2.8]
    centres = []
    for (name, mask, colour, note), x in zip(parts, spots):
        box(ax, x, 3.9, 2.1, 1.9, "", colour=colour)
        ax.text(x + 1.05, 5.5, name, ha="center", fontsize=10.5, weight="bold")
        grid(ax, x + 1.05 - n * cell / 2, 4.05, mask, cell=cell, colour_on="key", colour_off="masked")
        ax.text(x + 1.05, 3.7, note, ha="center", va="top", fontsize=8.5)
        centres.append(x)
    if len(parts) == 2:
        arrow(ax, (spots[0] + 2.1, 4.85), (spots[1], 4.85), label="cross-\nattention", fontsize=8, offset=(0, 0.1))
    ax.text(x0 + 2.2, 2.6, "trained on", ha="center", fontsize=9, color="#444444")
    ax.text(x0 + 2.2, 2.15, objective, ha="center", va="top", fontsize=9.5)
    ax.text(x0 + 2.2, 1.15, "used for", ha="center", fontsize=9, color="#444444")
    ax.text(x0 + 2.2, 0.7, use, ha="center", va="top", fontsize=9.5)


def draw_three_families():
    """Encoder-decoder, encoder-only and decoder-only Transformers, each with its masks."""
    fig, ax = canvas(16.6, 7.7, size=(14.0, 6.5))
    n = 4
    _family(ax, 0.9, "encoder-decoder", "the 2017 Transformer, T5",
            [("encoder", _full(n), "input", "sees the whole source"),
             ("decoder", _causal(n), "output", "sees the target's past\n+ the whole source")],
            "next target token,\ngiven the source", "translation, summarising:\ntext in, other text out")
    _family(ax, 6.6, "encoder-only", "BERT (chapter 09)",
            [("encoder", _full(n), "input", "every token sees every token")],
            "masked tokens (MLM):\nfill in the blanks", "understanding: classify,\ntag tokens, find answer spans")
    _family(ax, 11.8, "decoder-only", "GPT-2, GPT-3 (this chapter)",
            [("decoder", _causal(n), "output", "token t sees tokens 0 .. t")],
            "the next token,\nat every position", "generating text; prompting\n(zero-, one-, few-shot)")
    for x in (6.15, 11.35):
        ax.plot([x, x], [0.3, 7.3], color="#bbbbbb", linewidth=1)
    ax.text(16.5, 7.45, "mask grids: row = query, column = key; green: may attend, dark: hidden", ha="right",
            fontsize=8, color="#555555")
    return fig


__all__ = ["draw_decoder_only", "draw_three_families"]
