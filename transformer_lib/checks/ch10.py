"""Checkers for chapter 10, GPT: the next-token loss over whole windows (every position a
training example), the bigram baseline, the conversion to bits per character, the
temperature, nucleus (top-p) filtering, and greedy generation with the key/value cache.

References are the library's (transformer_lib.gpt). Each checker knows the wrong answers
learners often write, and properties name an error from a trait of the output when two
mistakes come together (a loss near zero on logits that copy their own token: the targets
are not shifted; probabilities that do not sum to one; positions computed twice).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from transformer_lib.gpt import (GPT, GPTConfig, bigram_log_probs, bits_per_char, greedy_generate, lm_loss,
                                 next_token_loss, temperature_probs, top_p_filter)

from .core import Case, Checker, Mistake, Property, randn, seeded
from .properties import not_finite_on_large_inputs, rows_do_not_sum_to_one

LN2 = math.log(2.0)


def _close(a: float, b: float, rel: float = 1e-4) -> bool:
    return abs(a - b) <= rel * max(abs(a), abs(b), 1e-12)


# ---------------------------------------------------------------------------------------
# Exercise 1: next_token_loss(logits, tokens) -> mean nats over the predictions with a next token
# ---------------------------------------------------------------------------------------


def _copy_logits(tokens: torch.Tensor, vocab: int, dtype=torch.float32) -> torch.Tensor:
    """Logits that put all their confidence on each position's *own* token."""
    return 20.0 * F.one_hot(tokens, vocab).to(dtype)  # [batch, L, vocab]


def _perfect_logits(tokens: torch.Tensor, vocab: int, dtype=torch.float32) -> torch.Tensor:
    """Logits that predict every next token, and at the last position a token that is
    neither the window's first token nor its last (nothing to predict there)."""
    logits = torch.zeros(*tokens.shape, vocab, dtype=dtype)  # [batch, L, vocab]
    logits[:, :-1] = 20.0 * F.one_hot(tokens[:, 1:], vocab).to(dtype)
    last = (tokens[:, 0] + 1) % vocab  # [batch]
    last = torch.where(last == tokens[:, -1], (last + 1) % vocab, last)
    last = torch.where(last == tokens[:, 0], (last + 1) % vocab, last)
    logits[:, -1] = 20.0 * F.one_hot(last, vocab).to(dtype)
    return logits


def _no_repeats(g, batch: int, length: int, vocab: int) -> torch.Tensor:
    """Token ids in which no token equals the one before it (so "own token" != "next token")."""
    tokens = torch.randint(0, vocab, (batch, length), generator=g)
    for t in range(1, length):
        same = tokens[:, t] == tokens[:, t - 1]
        tokens[same, t] = (tokens[same, t] + 1) % vocab
    return tokens


def _next_token_cases() -> list[Case]:
    g = seeded(1001)
    copy_tokens = _no_repeats(g, 2, 6, 9)
    perfect_tokens = _no_repeats(g, 3, 5, 8)
    hidden_copy = _no_repeats(g, 4, 7, 12)
    return [
        Case("one window of 5 tokens, V = 7", (randn(g, 1, 5, 7, scale=2.0), torch.tensor([[3, 1, 4, 1, 5]]))),
        Case("batch of 3 windows of 8, V = 11", (randn(g, 3, 8, 11, scale=2.0), torch.randint(0, 11, (3, 8), generator=g))),
        Case("logits that copy each position's own token", (_copy_logits(copy_tokens, 9), copy_tokens)),
        Case("perfect logits: they predict every next token", (_perfect_logits(perfect_tokens, 8), perfect_tokens)),
        Case("float64, windows of 2 tokens", (randn(g, 4, 2, 6, dtype=torch.float64, scale=3.0),
                                             torch.randint(0, 6, (4, 2), generator=g)), hidden=True),
        Case("batch of 2 windows of 16, V = 30", (randn(g, 2, 16, 30), torch.randint(0, 30, (2, 16), generator=g)),
             hidden=True),
        Case("copying logits, batch of 4", (_copy_logits(hidden_copy, 12, torch.float64), hidden_copy), hidden=True),
        Case("perfect logits, float64", (_perfect_logits(hidden_copy, 12, torch.float64), hidden_copy), hidden=True),
    ]


def _ntl_reference(logits, tokens):
    return next_token_loss(logits, tokens).to(logits.dtype)


def _ntl_not_shifted(logits, tokens):
    return lm_loss(logits, tokens).to(logits.dtype)


def _ntl_wrong_way(logits, tokens):
    return lm_loss(logits[:, 1:], tokens[:, :-1]).to(logits.dtype)


def _ntl_rolled(logits, tokens):
    return lm_loss(logits, tokens.roll(-1, dims=1)).to(logits.dtype)


def _ntl_bits(logits, tokens):
    return _ntl_reference(logits, tokens) / LN2


def _ntl_summed(logits, tokens):
    targets = tokens[:, 1:]
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="sum")


def _ntl_no_log_softmax(logits, tokens):
    return -logits[:, :-1].gather(-1, tokens[:, 1:, None]).mean()


def _ntl_softmax_over_positions(logits, tokens):
    log_probs = torch.log_softmax(logits[:, :-1], dim=1)  # over the positions, not the vocabulary
    return -log_probs.gather(-1, tokens[:, 1:, None]).mean()


def _loss_near_zero_on_copies(case, expected, actual):
    return "copy" in case.name and float(expected) > 5.0 and abs(float(actual)) < 0.5


def _loss_high_on_perfect(case, expected, actual):
    return "perfect" in case.name and float(expected) < 1e-3 and abs(float(actual)) > 0.5


def _ratio(expected, actual) -> float | None:
    e, a = float(expected), float(actual)
    return a / e if e > 1e-3 else None


def _loss_in_bits(case, expected, actual):
    if "copy" in case.name or "perfect" in case.name:
        return False
    r = _ratio(expected, actual)
    if r is None:
        return False
    n = r * LN2  # bits: r = 1 / ln 2, possibly times a count (a sum instead of a mean)
    return n > 0.99 and _close(n, round(n), 1e-3)


def _loss_summed(case, expected, actual):
    if "copy" in case.name or "perfect" in case.name:
        return False
    r = _ratio(expected, actual)
    if r is None:
        return False
    batch, length = case.args[1].shape
    counts = {batch * (length - 1), batch, length - 1, batch * length}
    return any(c > 1 and (_close(r, c, 1e-3) or _close(r, c / LN2, 1e-3)) for c in counts)


def _negative_loss(case, expected, actual):
    return float(expected) > 1e-3 and float(actual) < 0


check_next_token_loss = Checker(
    name="next_token_loss",
    reference=_ntl_reference,
    fallback=next_token_loss,
    make_cases=_next_token_cases,
    rtol=1e-4,
    atol=1e-5,
    mistakes=[
        Mistake(
            "targets not shifted: position t is scored on its own token t, which it can see",
            "Position t must predict token t + 1: compare logits[:, :-1] with tokens[:, 1:].",
            _ntl_not_shifted,
        ),
        Mistake(
            "shifted the wrong way: position t is scored on token t - 1",
            "Drop the *last* position's logits and the *first* token: logits[:, :-1] against tokens[:, 1:].",
            _ntl_wrong_way,
        ),
        Mistake(
            "the last position scored too: targets rolled round, so its prediction is compared with the "
            "window's first token",
            "The last position's next token lies past the end of the window: leave its prediction out, "
            "logits[:, :-1] against tokens[:, 1:] (no torch.roll).",
            _ntl_rolled,
        ),
        Mistake(
            "the loss in bits (log base 2) instead of nats",
            "Use the natural logarithm, as F.cross_entropy does: the chapter converts to bits later, once.",
            _ntl_bits,
        ),
        Mistake(
            "summed over the predictions instead of averaged",
            "Take the mean over the batch * (L - 1) predictions, so the loss does not grow with the window.",
            _ntl_summed,
        ),
        Mistake(
            "raw logits used as log-probabilities (no log-softmax)",
            "Turn logits into log-probabilities first, torch.log_softmax(logits, dim=-1), or let "
            "F.cross_entropy do it.",
            _ntl_no_log_softmax,
        ),
        Mistake(
            "log-softmax over the positions (dim=1) instead of the vocabulary",
            "Each position's logits are one distribution over the vocabulary: log_softmax over dim=-1.",
            _ntl_softmax_over_positions,
        ),
    ],
    properties=[
        Property("a loss near zero for logits that copy each position's own token (the targets are not shifted)",
                 "Position t has seen token t; it must be scored on token t + 1: logits[:, :-1] against tokens[:, 1:].",
                 _loss_near_zero_on_copies),
        Property("a loss well above zero for logits that predict every next token perfectly (a prediction "
                 "scored against the wrong token)",
                 "Pair position t with token t + 1 and leave out the last position, whose next token is not "
                 "in the window.",
                 _loss_high_on_perfect),
        Property("a loss in bits (your value times ln 2 is a whole multiple of the reference)",
                 "Stay in nats: natural logarithms, as F.cross_entropy uses.", _loss_in_bits),
        Property("a loss that grows with the number of predictions (a sum, not a mean)",
                 "Average over the batch * (L - 1) predictions.", _loss_summed),
        Property("a negative loss", "The loss is minus the mean log-probability of the right tokens: it is >= 0.",
                 _negative_loss),
    ],
)


# ---------------------------------------------------------------------------------------
# Exercise 2: bigram_log_probs(ids, vocab_size, alpha) -> [V, V] log P(next | previous)
# ---------------------------------------------------------------------------------------


def _bigram_cases() -> list[Case]:
    g = seeded(1002)
    return [
        Case("the worked example: 6 ids, V = 4", (torch.tensor([0, 1, 1, 2, 0, 1]), 4, 1.0)),
        Case("60 random ids, V = 6, alpha 0.5", (torch.randint(0, 6, (60,), generator=g), 6, 0.5)),
        Case("V = 5, token 4 never appears, alpha 0.1", (torch.randint(0, 4, (40,), generator=g), 5, 0.1)),
        Case("a stream of 500 ids, V = 10, alpha 1", (torch.randint(0, 10, (500,), generator=g), 10, 1.0),
             hidden=True),
        Case("two ids, V = 3", (torch.tensor([2, 0]), 3, 0.25), hidden=True),
        Case("skewed stream, V = 8, alpha 0.01", (torch.randint(0, 8, (200,), generator=g) % 5, 8, 0.01),
             hidden=True),
    ]


def _pair_counts(prev, nxt, vocab_size):
    return torch.bincount(prev * vocab_size + nxt, minlength=vocab_size * vocab_size).view(
        vocab_size, vocab_size).double()  # [V, V]


def _bg_counts(ids, vocab_size):
    return _pair_counts(ids[:-1], ids[1:], vocab_size)


def _bg_no_smoothing(ids, vocab_size, alpha):
    c = _bg_counts(ids, vocab_size)
    return (c / c.sum(dim=1, keepdim=True)).log().float()


def _bg_normalised_over_previous(ids, vocab_size, alpha):
    c = _bg_counts(ids, vocab_size)
    return ((c + alpha) / (c.sum(dim=0, keepdim=True) + alpha * vocab_size)).log().float()


def _bg_pairs_reversed(ids, vocab_size, alpha):
    c = _pair_counts(ids[1:], ids[:-1], vocab_size)  # [next, previous]
    return ((c + alpha) / (c.sum(dim=1, keepdim=True) + alpha * vocab_size)).log().float()


def _bg_alpha_once(ids, vocab_size, alpha):
    c = _bg_counts(ids, vocab_size)
    return ((c + alpha) / (c.sum(dim=1, keepdim=True) + alpha)).log().float()


def _bg_log2(ids, vocab_size, alpha):
    return bigram_log_probs(ids, vocab_size, alpha) / LN2


def _bg_unigram(ids, vocab_size, alpha):
    counts = torch.bincount(ids, minlength=vocab_size).double()
    row = ((counts + alpha) / (counts.sum() + alpha * vocab_size)).log().float()
    return row.expand(vocab_size, vocab_size).clone()


def _bg_probabilities(ids, vocab_size, alpha):
    return bigram_log_probs(ids, vocab_size, alpha).exp()


def _exp_rows_do_not_sum_to_one(case, expected, actual):
    if not isinstance(actual, torch.Tensor) or actual.shape != expected.shape or not actual.is_floating_point():
        return False
    sums = actual.double().exp().sum(dim=1)
    return bool(((sums - 1).abs() > 1e-3).any())


def _minus_inf_for_unseen_pairs(case, expected, actual):
    return isinstance(actual, torch.Tensor) and bool((torch.isneginf(actual) | actual.isnan()).any())


def _columns_sum_to_one(case, expected, actual):
    if not isinstance(actual, torch.Tensor) or actual.shape != expected.shape or not actual.is_floating_point():
        return False
    p = actual.double().exp()
    return bool(((p.sum(dim=0) - 1).abs() < 1e-4).all()) and bool(((p.sum(dim=1) - 1).abs() > 1e-3).any())


check_bigram_log_probs = Checker(
    name="bigram_log_probs",
    reference=bigram_log_probs,
    make_cases=_bigram_cases,
    rtol=1e-5,
    atol=1e-5,
    mistakes=[
        Mistake(
            "no smoothing: a pair never seen gets probability 0 (log -inf), a token never seen a row of NaN",
            "Add alpha to every count, and alpha * vocab_size to every row total.",
            _bg_no_smoothing,
        ),
        Mistake(
            "normalised over the previous token (columns sum to 1) instead of the next one",
            "Row i is the distribution of what follows token i: divide by the row totals, "
            "counts.sum(dim=1, keepdim=True).",
            _bg_normalised_over_previous,
        ),
        Mistake(
            "pairs counted the wrong way round: counts[next, previous]",
            "Count (ids[:-1], ids[1:]): the first index is the previous token, the second the next one.",
            _bg_pairs_reversed,
        ),
        Mistake(
            "alpha added once to the row total instead of alpha * vocab_size",
            "Every one of the vocab_size cells of a row received alpha: the row total grows by alpha * vocab_size.",
            _bg_alpha_once,
        ),
        Mistake(
            "log base 2 instead of the natural logarithm",
            "Use torch.log (nats), like the model's cross-entropy, so the two losses compare.",
            _bg_log2,
        ),
        Mistake(
            "the previous token ignored: every row is the unigram distribution",
            "Count pairs, not single tokens: counts[i, j] is how often j comes right after i.",
            _bg_unigram,
        ),
        Mistake(
            "probabilities returned instead of log-probabilities",
            "Return the logarithm of the smoothed probabilities (torch.log).",
            _bg_probabilities,
        ),
    ],
    properties=[
        Property("a log-probability of -inf or NaN (a pair or a token never seen gets no probability)",
                 "Smooth: add alpha to every count and alpha * vocab_size to every row total.",
                 _minus_inf_for_unseen_pairs),
        Property("columns that sum to 1 instead of rows (normalised over the previous token)",
                 "Normalise each row i over the next token: divide by counts.sum(dim=1, keepdim=True).",
                 _columns_sum_to_one),
        Property("probabilities (exp of your values) that do not sum to 1 over the next token",
                 "Each row of exp(output) must sum to 1: (counts + alpha) / (row total + alpha * vocab_size), "
                 "then torch.log.", _exp_rows_do_not_sum_to_one),
    ],
)


# ---------------------------------------------------------------------------------------
# Exercise 3: bits_per_char(loss, n_tokens, n_chars) -> float
# ---------------------------------------------------------------------------------------


def _bpc_cases() -> list[Case]:
    return [
        Case("a character-level model: 1 nat per character", (1.0, 1000, 1000)),
        Case("a subword model: 2.0 nats per token, 50 tokens for 120 characters", (2.0, 50, 120)),
        Case("a BPE model's validation numbers", (3.72, 12089, 25885)),
        Case("a loss as a 0-d tensor", (torch.tensor(2.5), 300, 1000), hidden=True),
        Case("more tokens than characters", (4.2, 1000, 700), hidden=True),
        Case("a character-level loss of 1.9", (1.9, 25884, 25884), hidden=True),
    ]


def _bpc_reference(loss, n_tokens, n_chars):
    return bits_per_char(loss, n_tokens, n_chars)


def _bpc_times_ln2(loss, n_tokens, n_chars):
    return float(loss) * n_tokens / n_chars * LN2


def _bpc_ratio_inverted(loss, n_tokens, n_chars):
    return float(loss) * n_chars / n_tokens / LN2


def _bpc_ratio_ignored(loss, n_tokens, n_chars):
    return float(loss) / LN2


def _bpc_log10(loss, n_tokens, n_chars):
    return float(loss) * n_tokens / n_chars / math.log(10)


def _bpc_nats(loss, n_tokens, n_chars):
    return float(loss) * n_tokens / n_chars


def _bpc_factors(case):
    loss, n_tokens, n_chars = case.args
    ratio = n_tokens / n_chars
    logs = {"bits": 1.0, "times ln 2": LN2 ** 2, "log10": LN2 / math.log(10), "nats": LN2}
    ratios = {"right": 1.0, "inverted": 1 / ratio ** 2, "ignored": 1 / ratio}
    return logs, ratios


def _bpc_seen(which_log=None, which_ratio=None):
    def seen(case, expected, actual):
        if not isinstance(actual, (int, float, torch.Tensor)) or float(expected) < 1e-9:
            return False
        r = float(actual) / float(expected)
        logs, ratios = _bpc_factors(case)
        for log_name, f in logs.items():
            for ratio_name, g in ratios.items():
                if (log_name, ratio_name) == ("bits", "right") or abs(g - 1.0) < 1e-6 and ratio_name != "right":
                    continue
                if (which_log is None or log_name == which_log) and (which_ratio is None or ratio_name == which_ratio):
                    if _close(r, f * g, 1e-4):
                        return True
        return False

    return seen


check_bits_per_char = Checker(
    name="bits_per_char",
    reference=_bpc_reference,
    fallback=bits_per_char,
    make_cases=_bpc_cases,
    rtol=1e-6,
    atol=1e-9,
    mistakes=[
        Mistake("multiplied by ln 2 instead of divided", "bits = nats / ln 2 (one bit is ln 2 = 0.693 nats).",
                _bpc_times_ln2),
        Mistake("the token/character ratio inverted (n_chars / n_tokens)",
                "Total information = loss * n_tokens; spread over n_chars characters: loss * n_tokens / n_chars.",
                _bpc_ratio_inverted),
        Mistake("the tokens per character left out (bits per token, not per character)",
                "Multiply by n_tokens / n_chars: a token of a subword model covers several characters.",
                _bpc_ratio_ignored),
        Mistake("log base 10 (divided by ln 10)", "Bits are base 2: divide by ln 2 = math.log(2).", _bpc_log10),
        Mistake("left in nats (no division by ln 2)", "Divide by math.log(2) to turn nats into bits.", _bpc_nats),
    ],
    properties=[
        Property("a token/character ratio inverted", "Multiply by n_tokens / n_chars, not n_chars / n_tokens.",
                 _bpc_seen(which_ratio="inverted")),
        Property("the tokens per character left out", "Multiply by n_tokens / n_chars.",
                 _bpc_seen(which_ratio="ignored")),
        Property("nats turned into bits the wrong way (times ln 2, base 10, or not at all)",
                 "bits = nats / math.log(2).", _bpc_seen(which_ratio="right")),
    ],
)


# ---------------------------------------------------------------------------------------
# Exercise 4: temperature_probs(logits, temperature) -> softmax(logits / T)
# ---------------------------------------------------------------------------------------


def _temperature_cases() -> list[Case]:
    g = seeded(1004)
    return [
        Case("the worked example, T = 0.5", (torch.tensor([1.0, 2.0, 3.0]), 0.5)),
        Case("batch of 4, V = 6, T = 2", (randn(g, 4, 6, scale=2.0), 2.0)),
        Case("T = 1 is the plain softmax", (randn(g, 2, 5, scale=3.0), 1.0)),
        Case("large logits, T = 0.1", (randn(g, 3, 7, scale=30.0), 0.1)),
        Case("float64, two batch dims, T = 0.7", (randn(g, 2, 3, 9, dtype=torch.float64, scale=2.0), 0.7),
             hidden=True),
        Case("T = 10: nearly uniform", (randn(g, 5, 4, scale=4.0), 10.0), hidden=True),
        Case("huge logits, T = 0.05", (randn(g, 2, 8, scale=100.0), 0.05), hidden=True),
    ]


def _temp_after_softmax(logits, temperature):
    return torch.softmax(logits, dim=-1) / temperature


def _temp_multiplied(logits, temperature):
    return torch.softmax(logits * temperature, dim=-1)


def _temp_power_not_renormalised(logits, temperature):
    return torch.softmax(logits, dim=-1) ** (1.0 / temperature)


def _temp_wrong_dim(logits, temperature):
    return torch.softmax(logits / temperature, dim=0)


def _temp_log_probs(logits, temperature):
    return torch.log_softmax(logits / temperature, dim=-1)


def _temp_ignored(logits, temperature):
    return torch.softmax(logits, dim=-1)


def _entropy(p: torch.Tensor) -> torch.Tensor:
    return torch.special.entr(p.double()).sum(dim=-1)  # [...]


def _wrong_direction(case, expected, actual):
    logits, temperature = case.args
    if temperature == 1.0 or not isinstance(actual, torch.Tensor) or actual.shape != expected.shape:
        return False
    if ((actual.double().sum(-1) - 1).abs() > 1e-3).any() or (actual < 0).any():
        return False
    base = _entropy(torch.softmax(logits.double(), dim=-1))
    got = _entropy(actual)
    # Lower T must sharpen (less entropy than T = 1), higher T must flatten (more).
    wrong = got > base + 1e-6 if temperature < 1.0 else got < base - 1e-6
    return bool(wrong.any())


check_temperature_probs = Checker(
    name="temperature_probs",
    reference=temperature_probs,
    make_cases=_temperature_cases,
    rtol=1e-4,
    atol=1e-6,
    mistakes=[
        Mistake("temperature applied after the softmax (probabilities divided by T: rows no longer sum to 1)",
                "Divide the logits, before the softmax: torch.softmax(logits / temperature, dim=-1).",
                _temp_after_softmax),
        Mistake("logits multiplied by T instead of divided (a low temperature flattens)",
                "Divide: logits / temperature. T < 1 must make the distribution sharper.", _temp_multiplied),
        Mistake("probabilities raised to 1/T without normalising again",
                "softmax(logits / T) is p ** (1/T) renormalised; simpler: torch.softmax(logits / temperature, dim=-1).",
                _temp_power_not_renormalised),
        Mistake("softmax over dim 0 (the batch) instead of the vocabulary",
                "Each row is one distribution over the vocabulary: softmax over dim=-1.", _temp_wrong_dim),
        Mistake("log-probabilities returned (log_softmax)",
                "Return probabilities: torch.softmax, which samplers such as torch.multinomial take.", _temp_log_probs),
        Mistake("the temperature ignored", "Divide the logits by temperature before the softmax.", _temp_ignored),
    ],
    properties=[
        rows_do_not_sum_to_one(dim=-1, what="the vocabulary",
                               fix="Scale the logits first, then one softmax over dim=-1: its rows sum to 1."),
        not_finite_on_large_inputs("Use torch.softmax (or subtract the row's max before exp): logits / T can be "
                                   "huge when T is small."),
        Property("a distribution that moves the wrong way (flatter for T < 1 or sharper for T > 1)",
                 "Divide the logits by T: T < 1 stretches their gaps, so the top token gains.", _wrong_direction),
    ],
)


# ---------------------------------------------------------------------------------------
# Exercise 5: top_p_filter(logits, p) -> logits outside the nucleus set to -inf
# ---------------------------------------------------------------------------------------


def _probs_to_logits(probs) -> torch.Tensor:
    return torch.tensor(probs, dtype=torch.float64).log().float()


def _top_p_cases() -> list[Case]:
    g = seeded(1005)
    peaked = randn(g, 3, 12, scale=3.0)  # [3, 12]: a few tokens take most of the mass
    return [
        Case("the worked example, p = 0.8", (_probs_to_logits([0.1, 0.5, 0.05, 0.15, 0.2]), 0.8)),
        Case("batch of 4, V = 10, p = 0.9", (randn(g, 4, 10, scale=2.0), 0.9)),
        Case("the top token alone is more than p = 0.3", (_probs_to_logits([0.05, 0.7, 0.25]), 0.3)),
        Case("peaked rows, p = 0.6", (peaked, 0.6)),
        Case("two batch dims, p = 0.75", (randn(g, 2, 3, 8, scale=1.5), 0.75), hidden=True),
        Case("float64, p = 0.95", (randn(g, 5, 20, dtype=torch.float64, scale=2.5), 0.95), hidden=True),
        Case("flat rows, p = 0.5", (randn(g, 2, 16, scale=0.1), 0.5), hidden=True),
        Case("tiny p = 0.01", (randn(g, 3, 6, scale=2.0), 0.01), hidden=True),
    ]


def _sorted_probs(logits):
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    return sorted_logits, order, torch.softmax(sorted_logits.float(), dim=-1)


def _unsort(drop_sorted, order):
    return drop_sorted.scatter(-1, order, drop_sorted)


def _tp_crossing_dropped(logits, p):
    _, order, probs = _sorted_probs(logits)
    drop = probs.cumsum(-1) > p  # the token that crosses p goes too ...
    drop[..., 0] = False  # ... but the top token is always kept
    return logits.masked_fill(_unsort(drop, order), float("-inf"))


def _tp_crossing_dropped_top_too(logits, p):
    _, order, probs = _sorted_probs(logits)
    drop = probs.cumsum(-1) > p  # may drop every token when the top one alone exceeds p
    return logits.masked_fill(_unsort(drop, order), float("-inf"))


def _tp_ascending(logits, p):
    sorted_logits, order = logits.sort(dim=-1)  # least probable first
    probs = torch.softmax(sorted_logits.float(), dim=-1)
    drop = (probs.cumsum(-1) - probs) >= p
    return logits.masked_fill(_unsort(drop, order), float("-inf"))


def _tp_left_sorted(logits, p):
    sorted_logits, _, probs = _sorted_probs(logits)
    return sorted_logits.masked_fill((probs.cumsum(-1) - probs) >= p, float("-inf"))


def _tp_zero_fill(logits, p):
    _, order, probs = _sorted_probs(logits)
    return logits.masked_fill(_unsort((probs.cumsum(-1) - probs) >= p, order), 0.0)


def _tp_no_softmax(logits, p):
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    mass = sorted_logits.cumsum(-1) - sorted_logits  # logits summed as if they were probabilities
    return logits.masked_fill(_unsort(mass >= p, order), float("-inf"))


def _tp_probs_returned(logits, p):
    filtered = top_p_filter(logits, p)
    return torch.softmax(filtered, dim=-1)


def _finite(t):
    return t.isfinite()


def _tensors(expected, actual):
    return (isinstance(actual, torch.Tensor) and isinstance(expected, torch.Tensor)
            and actual.shape == expected.shape and actual.is_floating_point())


def _row_emptied(case, expected, actual):
    return _tensors(expected, actual) and bool((~_finite(actual)).all(dim=-1).any())


def _kept_values_changed(case, expected, actual):
    if not _tensors(expected, actual):
        return False
    logits = case.args[0].to(actual.dtype)
    kept = _finite(actual)
    return bool(kept.any()) and not torch.allclose(actual[kept], logits[kept])


def _not_a_top_set(case, expected, actual):
    if not _tensors(expected, actual):
        return False
    logits = case.args[0].double()
    kept = _finite(actual)
    low_kept = torch.where(kept, logits, torch.inf).amin(dim=-1)  # [...]
    high_dropped = torch.where(~kept, logits, -torch.inf).amax(dim=-1)
    return bool((kept.any(-1) & (high_dropped > low_kept + 1e-9)).any())


def _nucleus_too_small(case, expected, actual):
    if not _tensors(expected, actual):
        return False
    logits, p = case.args
    kept = _finite(actual)
    mass = (torch.softmax(logits.double(), dim=-1) * kept).sum(-1)
    return bool((kept.any(-1) & (mass < p - 1e-6)).any())


def _removed_not_minus_inf(case, expected, actual):
    if not _tensors(expected, actual):
        return False
    removed = torch.isneginf(expected)
    return bool(removed.any()) and bool(torch.isfinite(actual[removed]).all())


check_top_p_filter = Checker(
    name="top_p_filter",
    reference=top_p_filter,
    make_cases=_top_p_cases,
    rtol=1e-5,
    atol=1e-6,
    mistakes=[
        Mistake("the token that crosses p dropped (only tokens whose cumulative mass stays within p kept)",
                "Keep the smallest set whose mass reaches p: a token stays if the tokens ranked above it sum to "
                "less than p, (cumsum - probs) < p.", _tp_crossing_dropped),
        Mistake("every token dropped when the top token alone has more than p",
                "Compare the mass *before* each token with p, (cumsum - probs) < p: the top token has 0 before it "
                "and always stays.", _tp_crossing_dropped_top_too),
        Mistake("sorted ascending: the nucleus built from the least probable tokens",
                "Sort the logits in descending order: logits.sort(dim=-1, descending=True).", _tp_ascending),
        Mistake("the result left in sorted order",
                "Put the decision back in vocabulary order (scatter with the sort's indices) before masking "
                "the original logits.", _tp_left_sorted),
        Mistake("removed tokens set to 0 instead of -inf (exp(0) = 1: they can still be drawn)",
                "Fill with float('-inf'), so that the softmax gives them probability exactly 0.", _tp_zero_fill),
        Mistake("the cumulative sum taken over logits instead of probabilities",
                "Turn the sorted logits into probabilities first (torch.softmax), then take cumsum.", _tp_no_softmax),
        Mistake("probabilities returned instead of filtered logits",
                "Return the logits themselves, -inf outside the nucleus: sampling applies the softmax later.",
                _tp_probs_returned),
    ],
    properties=[
        Property("a row with no token left", "The most probable token always stays: it has no mass before it.",
                 _row_emptied),
        Property("kept logits whose values changed",
                 "Return the original logits for the tokens you keep; only the others change, to -inf.",
                 _kept_values_changed),
        Property("a removed token more probable than a kept one (not the top of the distribution)",
                 "The nucleus is a set of *most* probable tokens: sort in descending order.", _not_a_top_set),
        Property("a nucleus whose probability is below p",
                 "Keep tokens until their mass reaches p, the one that crosses it included.", _nucleus_too_small),
        Property("removed tokens that are not -inf",
                 "Set every token outside the nucleus to float('-inf').", _removed_not_minus_inf),
    ],
)


# ---------------------------------------------------------------------------------------
# Exercise 6: greedy_generate(model, prompt, max_new_tokens) with the key/value cache
# ---------------------------------------------------------------------------------------

TINY_GPT_VOCAB = 13


@dataclass(frozen=True)
class TinyGPT:
    """Which tiny GPT a case runs on. The checker builds it (seeded, float64, no dropout,
    weights larger than GPT-2's initialisation so that greedy outputs vary), so the learner's
    kernel and the grader build exactly the same model."""

    seed: int
    layers: int = 2

    def __repr__(self) -> str:
        return f"tiny GPT #{self.seed} ({self.layers} layers)"

    def build(self) -> GPT:
        config = GPTConfig(vocab_size=TINY_GPT_VOCAB, max_len=128, d_model=16, n_heads=2, n_layers=self.layers,
                           dropout=0.0)
        with torch.random.fork_rng(devices=[]):  # building must not move the notebook's random state
            torch.manual_seed(self.seed)
            model = GPT(config)
            with torch.no_grad():
                for p in model.parameters():
                    if p.dim() >= 2:  # embeddings and weight matrices; LayerNorms and biases as built
                        p.normal_(0.0, 0.5)
        return model.double().eval()


class _PositionCounter:
    """Counts, with a hook on the first block, how many positions the model computes in all."""

    def __init__(self, model: GPT):
        self.positions = 0
        self.hook = model.blocks[0].register_forward_pre_hook(self._count)

    def _count(self, module, args):
        self.positions += args[0].shape[1]  # x: [batch, new positions, d_model]


def _invoke_generate(fn, case: Case):
    tiny, prompt, max_new = case.args
    model = tiny.build()
    counter = _PositionCounter(model)
    try:
        tokens = fn(model, prompt, max_new)
    finally:
        counter.hook.remove()
    # Each position of the result needs computing once (the last one need not be): anything
    # beyond prompt + max_new positions was computed again.
    return tokens, {"positions computed twice": max(0, counter.positions - (prompt.shape[1] + max_new))}


def _generate_cases() -> list[Case]:
    cases = []
    for name, seed, layers, batch, prompt_len, max_new, hidden in [
        ("one prompt of 3 tokens, 6 new", 1, 2, 1, 3, 6, False),
        ("batch of 3 prompts of 4, 8 new", 2, 1, 3, 4, 8, False),
        ("prompts of 1 token, 5 new", 3, 2, 2, 1, 5, False),
        ("batch of 4, 10 new", 4, 2, 4, 5, 10, True),
        ("one new token", 5, 1, 2, 6, 1, True),
        ("long prompt, 3 layers", 6, 3, 2, 12, 7, True),
    ]:
        g = seeded(1060 + seed)
        prompt = torch.randint(0, TINY_GPT_VOCAB, (batch, prompt_len), generator=g)
        cases.append(Case(name, (TinyGPT(seed, layers), prompt, max_new), hidden=hidden))
    return cases


def _gen_no_cache(model, prompt, max_new_tokens):
    tokens = prompt
    for _ in range(max_new_tokens):
        next_token = model(tokens)[:, -1].argmax(dim=-1)
        tokens = torch.cat([tokens, next_token[:, None]], dim=1)
    return tokens


def _gen_whole_sequence_on_cache(model, prompt, max_new_tokens):
    cache, tokens = model.new_cache(), prompt
    for _ in range(max_new_tokens):
        next_token = model(tokens, cache)[:, -1].argmax(dim=-1)
        tokens = torch.cat([tokens, next_token[:, None]], dim=1)
    return tokens


def _gen_newest_without_cache(model, prompt, max_new_tokens):
    tokens, new = prompt, prompt
    for _ in range(max_new_tokens):
        next_token = model(new)[:, -1].argmax(dim=-1)  # the newest token alone, at position 0
        tokens = torch.cat([tokens, next_token[:, None]], dim=1)
        new = next_token[:, None]
    return tokens


def _gen_first_position(model, prompt, max_new_tokens):
    cache, tokens, new = model.new_cache(), prompt, prompt
    for _ in range(max_new_tokens):
        next_token = model(new, cache)[:, 0].argmax(dim=-1)  # the first position's prediction
        tokens = torch.cat([tokens, next_token[:, None]], dim=1)
        new = next_token[:, None]
    return tokens


def _gen_argmax_positions(model, prompt, max_new_tokens):
    cache, tokens, new = model.new_cache(), prompt, prompt
    for _ in range(max_new_tokens):
        next_token = model(new, cache).argmax(dim=1)[:, -1]  # over the positions, not the vocabulary
        tokens = torch.cat([tokens, next_token[:, None]], dim=1)
        new = next_token[:, None]
    return tokens


def _gen_without_prompt(model, prompt, max_new_tokens):
    return greedy_generate(model, prompt, max_new_tokens)[:, prompt.shape[1]:]


def _gen_one_too_many(model, prompt, max_new_tokens):
    return greedy_generate(model, prompt, max_new_tokens + 1)


def _computed_twice(case, expected, actual):
    return actual[1]["positions computed twice"] > 0


def _prompt_missing(case, expected, actual):
    tokens, prompt = actual[0], case.args[1]
    return (isinstance(tokens, torch.Tensor) and tokens.dim() == 2 and tokens.shape[0] == prompt.shape[0]
            and (tokens.shape[1] < prompt.shape[1] or not torch.equal(tokens[:, :prompt.shape[1]], prompt)))


def _wrong_length(case, expected, actual):
    tokens, prompt, max_new = actual[0], case.args[1], case.args[2]
    return isinstance(tokens, torch.Tensor) and tokens.dim() == 2 and tokens.shape[1] != prompt.shape[1] + max_new


check_greedy_generate = Checker(
    name="greedy_generate",
    reference=greedy_generate,
    make_cases=_generate_cases,
    invoke=_invoke_generate,
    mistakes=[
        Mistake("no cache: the whole sequence run again at every step",
                "Make cache = model.new_cache() before the loop; run the prompt once, then feed only the newest "
                "token: model(new, cache) with new of shape [batch, 1].", _gen_no_cache),
        Mistake("the whole sequence fed on top of the cache (its keys and values are cached again, at wrong "
                "positions)",
                "The cache already holds every earlier token: after the prompt, feed only the newest one.",
                _gen_whole_sequence_on_cache),
        Mistake("the newest token fed without the cache (the model sees it alone, with no context)",
                "Pass the cache at every call, model(new, cache): that is where the earlier tokens' keys and "
                "values are.", _gen_newest_without_cache),
        Mistake("the first position's logits used instead of the last one's",
                "Only the last position has seen the whole sequence: take logits[:, -1].", _gen_first_position),
        Mistake("argmax over the positions (dim=1) instead of the vocabulary",
                "Take the last position's logits [batch, vocab] and argmax over dim=-1.", _gen_argmax_positions),
        Mistake("the prompt left out of the output",
                "Return the prompt followed by the new tokens: [batch, seq + max_new_tokens].", _gen_without_prompt),
        Mistake("one token too many (max_new_tokens + 1)",
                "Loop exactly max_new_tokens times, one new token per step.", _gen_one_too_many),
    ],
    properties=[
        Property("positions computed more than once", "With the cache, run the prompt once and then only the newest "
                 "token at each step.", _computed_twice),
        Property("an output that does not start with the prompt",
                 "Start from the prompt and append each new token: torch.cat([tokens, next_token[:, None]], dim=1).",
                 _prompt_missing),
        Property("an output of the wrong length", "Return [batch, seq + max_new_tokens]: one token per step.",
                 _wrong_length),
    ],
)


CHECKERS = [check_next_token_loss, check_bigram_log_probs, check_bits_per_char, check_temperature_probs,
            check_top_p_filter, check_greedy_generate]
