"""Chapter 08's pictures: one step of byte-pair encoding on a small word table (Sennrich,
Haddow and Birch, 2016), and the road from text to vectors: tokens, ids, one-hot rows, and
the embedding table they pick rows from (Prince, Understanding Deep Learning, 2023, 12.5).
"""

from __future__ import annotations

from transformer_lib.tokenization import merge_pair, pair_counts, train_bpe

from .draw import COLOURS, arrow, box, canvas

GREY = "#555555"
# Colours for the rows a token picks: one per position, so a token, its one-hot row, its
# table row and its output row share a colour.
ROW_COLOURS = ["#f9d9b5", "#cfe8c4", "#e3d3ef", "#f6c9c9", "#d5eef0", "#fff2b3"]


def _show(symbol: str) -> str:
    return symbol.replace(" ", "␣").replace("\n", "⏎")


def _word_row(ax, x, y, symbols, count, cell_w, cell_h, highlight=None, fontsize=10):
    """One word of the table as a row of symbol cells, then its count. `highlight` is the
    symbol to colour (the pair being merged, or the new symbol)."""
    cx = x
    for symbol in symbols:
        width = cell_w * max(1, len(symbol)) * 0.75 + cell_w * 0.25
        colour = "weights" if highlight is not None and symbol in highlight else "input"
        box(ax, cx, y, width, cell_h, _show(symbol), colour, fontsize=fontsize, rounded=False)
        cx += width + 0.06
    ax.text(cx + 0.15, y + cell_h / 2, f"× {count}", va="center", fontsize=fontsize, color=GREY)


def draw_bpe_merge_step(word_counts: dict | None = None, step: int = 0, n_pairs: int = 6):
    """Merge number `step` (0 = the first) of BPE trained on `word_counts` (default: Sennrich
    et al.'s low x5, lower x2, newest x6, widest x3): the word table before it, the pair counts
    (each word weighted by its count) with the winner marked, and the table after it.
    Returns the figure."""
    word_counts = dict(word_counts or {"low": 5, "lower": 2, "newest": 6, "widest": 3})
    merges = train_bpe(word_counts, step + 1)[0]
    if len(merges) <= step:
        raise ValueError(f"the table has no merge number {step}: only {len(merges)} merges are possible")
    words = {tuple(w): c for w, c in word_counts.items()}
    for pair in merges[:step]:
        words = {merge_pair(w, pair): c for w, c in words.items()}
    best = merges[step]
    counts = pair_counts(words)
    top = sorted(counts.items(), key=lambda item: -item[1])[:n_pairs]
    if best not in dict(top):
        top[-1] = (best, counts[best])
    after = {merge_pair(w, best): c for w, c in words.items()}

    fig, ax = canvas(17.0, 7.4, size=(13.5, 5.9),
                     title=f"One BPE merge (merge {step + 1}): count the pairs, merge the most frequent one everywhere")
    cell_w, cell_h, row_gap = 0.55, 0.55, 0.95
    top_y = 5.5

    ax.text(0.3, top_y + 0.95, "1. the word table (word × count)", fontsize=10.5, weight="bold")
    for r, (word, count) in enumerate(words.items()):
        _word_row(ax, 0.3, top_y - r * row_gap, word, count, cell_w, cell_h)

    # -- the pair counts ----------------------------------------------------------------
    px = 6.9
    ax.text(px, top_y + 0.95, "2. pair counts, weighted", fontsize=10.5, weight="bold")
    for r, (pair, n) in enumerate(top):
        colour = "weights" if pair == best else "neutral"
        label = f"({_show(pair[0])}, {_show(pair[1])})   {n}"
        box(ax, px, top_y - r * 0.72 + 0.1, 2.9, 0.55, label, colour, fontsize=9.5, rounded=False)
    tied = [p for p, n in counts.items() if n == counts[best] and p != best]
    note = f"the most frequent pair wins ({counts[best]})"
    if tied:
        note += f";\na tie with ({_show(tied[0][0])}, {_show(tied[0][1])}) goes to the smaller ids"
    ax.text(px, top_y - len(top) * 0.72 + 0.45, note, fontsize=8.5, va="top", color=GREY)
    arrow(ax, (5.2, top_y - 1.8), (6.7, top_y - 1.8))
    arrow(ax, (10.2, top_y - 1.8), (11.3, top_y - 1.8), label="merge")

    # -- after the merge ----------------------------------------------------------------
    ax.text(11.4, top_y + 0.95, f"3. after merging into {_show(best[0] + best[1])!r}", fontsize=10.5,
            weight="bold")
    for r, (word, count) in enumerate(after.items()):
        _word_row(ax, 11.4, top_y - r * row_gap, word, count, cell_w, cell_h, highlight={best[0] + best[1]})

    ax.text(0.3, 0.2, f"Recorded: merge {step + 1} = ({_show(best[0])}, {_show(best[1])}).  "
            "The next merge counts the pairs of the new table; encoding replays the merges in this order.",
            fontsize=9.5, color=GREY)
    return fig


def _cells(ax, x, y, rows, cols, cell, colours, labels=None, fontsize=8):
    """A rows x cols grid with its top row first; colours[i][j] fills cell (i, j)."""
    for i in range(rows):
        for j in range(cols):
            box(ax, x + j * cell, y + (rows - 1 - i) * cell, cell, cell,
                labels[i][j] if labels else "", colours[i][j], fontsize=fontsize, rounded=False)


def draw_text_to_vectors(text: str, tokens: list[str], ids: list[int], vocab_size: int = 10, d_model: int = 4):
    """text -> tokens -> ids -> one-hot rows [seq, vocab] @ table [vocab, d_model] = embeddings
    [seq, d_model]. Each token keeps one colour along the way; the table rows nobody picks stay
    white. Returns the figure."""
    if len(tokens) != len(ids) or len(tokens) > len(ROW_COLOURS):
        raise ValueError(f"give as many ids as tokens, at most {len(ROW_COLOURS)}")
    if max(ids) >= vocab_size:
        raise ValueError(f"ids must be below vocab_size={vocab_size}")
    seq, cell = len(tokens), 0.42
    width = 1.3 + 4.0 + 1.0 + cell * vocab_size + 0.9 + 2 * cell * d_model + 1.0 + 0.8 + 1.9 + 0.3
    fig, ax = canvas(width, 7.0, size=(width * 0.74, 5.6), title="From text to vectors: tokens, ids, and rows of the table")

    # -- text, tokens, ids: one lane each, labelled on the left ------------------------------
    left, lane_w = 1.3, 4.0
    text_y, tok_y, id_y = 5.6, 4.2, 2.9
    for y, h, label in [(text_y, 0.7, "text"), (tok_y, 0.7, "tokens"), (id_y, 0.6, "ids")]:
        ax.text(left - 0.15, y + h / 2, label, ha="right", va="center", fontsize=9.5, color=GREY)
    box(ax, left, text_y, lane_w, 0.7, repr(text), "neutral", fontsize=10)
    token_w = lane_w / seq
    for i, (token, token_id) in enumerate(zip(tokens, ids)):
        x = left + i * token_w
        box(ax, x + 0.04, tok_y, token_w - 0.08, 0.7, _show(token), ROW_COLOURS[i], fontsize=9.5, rounded=False)
        box(ax, x + 0.04, id_y, token_w - 0.08, 0.6, str(token_id), ROW_COLOURS[i], fontsize=10, rounded=False)
    mid = left + lane_w / 2
    arrow(ax, (mid, text_y), (mid, tok_y + 0.7))
    ax.text(mid + 0.15, (text_y + tok_y + 0.7) / 2, "tokenizer (BPE)", va="center", fontsize=8.5, color=GREY)
    arrow(ax, (mid, tok_y), (mid, id_y + 0.6))
    ax.text(mid + 0.15, (tok_y + id_y + 0.6) / 2, "vocabulary: token → id", va="center", fontsize=8.5, color=GREY)

    # -- one-hot [seq, vocab] @ table [vocab, d_model] = [seq, d_model] ------------------------
    oh_x, oh_y = left + lane_w + 1.0, 3.3
    oh_colours = [[ROW_COLOURS[i] if j == ids[i] else "white" for j in range(vocab_size)] for i in range(seq)]
    oh_labels = [["1" if j == ids[i] else "0" for j in range(vocab_size)] for i in range(seq)]
    _cells(ax, oh_x, oh_y, seq, vocab_size, cell, oh_colours, oh_labels, fontsize=7)
    ax.text(oh_x + vocab_size * cell / 2, oh_y + seq * cell + 0.2, "one-hot rows\n[seq, vocab]", ha="center",
            fontsize=9, color=GREY)
    arrow(ax, (left + lane_w + 0.05, id_y + 0.3), (oh_x - 0.1, oh_y + seq * cell / 2))

    t_x = oh_x + vocab_size * cell + 0.9
    t_y = 1.0
    row_of = {token_id: i for i, token_id in reversed(list(enumerate(ids)))}
    table_colours = [[ROW_COLOURS[row_of[v]] if v in row_of else "white" for _ in range(d_model)]
                     for v in range(vocab_size)]
    _cells(ax, t_x, t_y, vocab_size, d_model, cell, table_colours)
    for v in range(vocab_size):
        ax.text(t_x - 0.08, t_y + (vocab_size - 1 - v + 0.5) * cell, str(v), ha="right", va="center", fontsize=7,
                color=GREY)
    ax.text(t_x + d_model * cell / 2, t_y + vocab_size * cell + 0.2, "embedding table\n[vocab, d_model]",
            ha="center", fontsize=9, color=GREY)
    ax.text(t_x - 0.5, oh_y + seq * cell / 2, "@", ha="center", va="center", fontsize=16)

    o_x = t_x + d_model * cell + 1.0
    out_colours = [[ROW_COLOURS[i]] * d_model for i in range(seq)]
    _cells(ax, o_x, oh_y, seq, d_model, cell, out_colours)
    ax.text(o_x - 0.5, oh_y + seq * cell / 2, "=", ha="center", va="center", fontsize=16)
    ax.text(o_x + d_model * cell / 2, oh_y + seq * cell + 0.2, "embeddings\n[seq, d_model]", ha="center",
            fontsize=9, color=GREY)

    nx = o_x + d_model * cell + 0.4
    box(ax, nx + 0.4, oh_y - 0.05, 1.9, seq * cell + 0.1, "× √d_model\n+ positions", "norm", fontsize=9.5)
    arrow(ax, (o_x + d_model * cell, oh_y + seq * cell / 2), (nx + 0.4, oh_y + seq * cell / 2))
    ax.text(0.2, 0.35, "Each one-hot row has a single 1, so the product copies one row of the table per token: "
            "a lookup, table[ids].", fontsize=9.5, color=COLOURS["masked"])
    return fig
