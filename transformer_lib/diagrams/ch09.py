"""Chapter 09's picture: BERT's input and its two pre-training heads (Devlin et al., 2019,
figures 1 and 2). A pair [CLS] A [SEP] B [SEP] becomes, per position, the sum of three
embeddings (token, segment, position); the encoder reads it in both directions; the MLM head
predicts the token behind [MASK], the NSP head reads [CLS] and says whether B follows A.
"""

from __future__ import annotations

import matplotlib.pyplot as plt

from .draw import arrow, box, canvas

DEFAULT_TOKENS = ("[CLS]", "she", "ate", "a", "[MASK]", "[SEP]", "it", "was", "ripe", "[SEP]")


def draw_bert_input(tokens=DEFAULT_TOKENS, masked_word="apple"):
    """Bottom to top: the tokens; their token, segment and position embeddings, added; the
    encoder; the final states; the NSP head on [CLS] and the MLM head on [MASK]. Returns the figure."""
    tokens = list(tokens)
    n = len(tokens)
    first_sep = tokens.index("[SEP]")
    segments = ["A" if i <= first_sep else "B" for i in range(n)]
    cell, gap, left = 1.15, 0.12, 2.9  # column width, space between columns, width of the row labels
    width = left + n * (cell + gap) + 0.3
    height = 11.7
    fig, ax = canvas(width, height, size=(width * 0.78, height * 0.78))

    def x_of(i):
        return left + i * (cell + gap)

    def row(y, labels, colours, label, h=0.62, fontsize=8.5):
        ax.text(left - 0.25, y + h / 2, label, ha="right", va="center", fontsize=9)
        for i, (text, colour) in enumerate(zip(labels, colours)):
            box(ax, x_of(i), y, cell, h, text, colour=colour, fontsize=fontsize, rounded=False)

    # The input tokens and the three embedding rows.
    y_tok, y_e1, y_e2, y_e3 = 0.3, 1.45, 2.45, 3.45
    row(y_tok, tokens, ["neutral" if t.startswith("[") else "input" for t in tokens], "input tokens")
    row(y_e1, [f"E({t.strip('[]').lower()})" if t.startswith("[") else f"E({t})" for t in tokens],
        ["input"] * n, "token embedding", fontsize=7.5)
    row(y_e2, [f"E_{s}" for s in segments], ["query" if s == "A" else "key" for s in segments],
        "+ segment embedding")
    row(y_e3, [f"E_{i}" for i in range(n)], ["value"] * n, "+ position embedding")
    for i in range(n):
        arrow(ax, (x_of(i) + cell / 2, y_tok + 0.62), (x_of(i) + cell / 2, y_e1))
    for y in (y_e2, y_e3):
        for i in range(n):
            ax.text(x_of(i) + cell / 2, y - 0.19, "+", ha="center", va="center", fontsize=10, color="#555555")

    # Sum, LayerNorm, the encoder, the final states.
    span = (x_of(0), x_of(n - 1) + cell)
    y_norm, y_enc, y_out = 4.55, 5.75, 7.75
    box(ax, span[0], y_norm, span[1] - span[0], 0.6, "sum of the three, then LayerNorm (no sqrt(d_model) scaling)",
        colour="norm", fontsize=9)
    arrow(ax, ((span[0] + span[1]) / 2, y_e3 + 0.62), ((span[0] + span[1]) / 2, y_norm))
    box(ax, span[0], y_enc, span[1] - span[0], 1.3,
        "BERT encoder: N post-norm layers (self-attention + FFN)\n"
        "no causal mask: every position attends to every other, left and right",
        colour="ffn", fontsize=9.5)
    arrow(ax, ((span[0] + span[1]) / 2, y_norm + 0.6), ((span[0] + span[1]) / 2, y_enc))
    outputs = ["T_cls" if t == "[CLS]" else ("T_sep" if t == "[SEP]" else f"T_{i}") for i, t in enumerate(tokens)]
    row(y_out, outputs, ["output"] * n, "final states")
    for i in range(n):
        arrow(ax, (x_of(i) + cell / 2, y_enc + 1.3), (x_of(i) + cell / 2, y_out))

    # The two heads.
    y_head = 9.2
    cls_x = x_of(0) + cell / 2
    box(ax, x_of(0) - 0.05, y_head, 2.6, 1.5, "NSP head\npooler (dense + tanh)\n+ linear: 2 classes\nIsNext / NotNext",
        colour="weights", fontsize=8.5)
    arrow(ax, (cls_x, y_out + 0.62), (cls_x, y_head))
    if "[MASK]" in tokens:
        m = tokens.index("[MASK]")
        mx = x_of(m) + cell / 2
        box(ax, mx - 1.55, y_head, 3.1, 1.5, f"MLM head\ndense + GELU + LayerNorm\n+ tied token matrix: softmax\n"
            f"over the vocabulary -> '{masked_word}'", colour="weights", fontsize=8.5)
        arrow(ax, (mx, y_out + 0.62), (mx, y_head))
    ax.text(width / 2, height - 0.45, "[CLS] A [SEP] B [SEP]: three embeddings per position, summed; "
            "MLM predicts the hidden word, NSP reads [CLS]", ha="center", va="center", fontsize=10.5, weight="bold")
    # A small legend for the segment colours.
    for k, (label, colour) in enumerate([("segment A (0)", "query"), ("segment B (1)", "key")]):
        y = y_head + 0.95 - 0.65 * k
        box(ax, x_of(n - 4), y, 0.45, 0.35, colour=colour, rounded=False)
        ax.text(x_of(n - 4) + 0.55, y + 0.17, label, va="center", fontsize=8.5)
    return fig


if __name__ == "__main__":  # python -m transformer_lib.diagrams.ch09 writes a preview
    draw_bert_input().savefig("/tmp/ch09_bert_input.png", dpi=110, bbox_inches="tight")
    plt.close("all")
