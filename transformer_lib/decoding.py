"""Decoding: turning an encoder-decoder's next-token distributions into output sequences.

Greedy search, beam search with the GNMT length penalty (Wu et al., 2016, "Google's Neural
Machine Translation System", section 7) and sampling with temperature and top-k (Fan et al.,
2018, "Hierarchical Neural Story Generation"), all with a key/value cache.

Every function works with any model that offers this interface (EncoderDecoder does):

    model.encode(src, src_mask) -> memory                                    [batch, src, d_model]
    model.decode(memory, src_mask, tgt, tgt_mask=None, cache=None) -> hidden  [batch, tgt, d_model]
    model.generator(hidden) -> log-probabilities                            [batch, tgt, vocab]
    model.new_cache() -> an empty cache (for EncoderDecoder: one LayerCache per decoder layer)

The source is encoded once; only the decoder runs at every step. With a cache, each step
feeds just the newest token: the decoder's self-attention appends that token's key and value
to the ones it kept, and cross-attention computes the memory's keys and values at the first
step and reuses them. Without a cache, each step re-decodes the whole prefix under a causal
mask, which gives the same numbers at a cost that grows with the prefix.

Call model.eval() before decoding: with dropout switched on every step would be random.
Outputs start with bos_id; a sequence that has produced eos_id is padded with eos_id until
the longest one in the batch is finished, so everything after the first eos can be dropped.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable

import torch

from .attention import KVCache
from .masks import causal_mask


# ---------------------------------------------------------------------------------------
# Choosing the next token
# ---------------------------------------------------------------------------------------

def _positive_int(value, name: str) -> int:
    try:
        n = None if isinstance(value, bool) else operator.index(value)
    except TypeError:
        n = None
    if n is None or n < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return n


def top_k_filter(logits: torch.Tensor, k: int | None) -> torch.Tensor:
    """Keep the k largest logits of each row and set all the others to -inf.

    logits: [..., vocab]. Returns a new tensor of the same shape with exactly k finite
    entries per row (fewer only if the input already had -inf among its top k); ties at
    the k-th value are broken by position, so the count is exact. k=None or k >= vocab
    returns `logits` unchanged.
    """
    if not isinstance(logits, torch.Tensor):
        raise TypeError(f"top_k_filter expects a torch.Tensor of logits [..., vocab], got {type(logits).__name__}")
    if k is None:
        return logits
    k = _positive_int(k, "top_k")
    if logits.dim() == 0:
        raise ValueError("top_k_filter needs logits with a vocabulary dimension [..., vocab], got a scalar")
    if k >= logits.shape[-1]:
        return logits
    values, index = logits.topk(k, dim=-1)  # [..., k]
    # Scatter the survivors into a sea of -inf: a threshold (logits < k-th value) would
    # keep every entry tied with the k-th one and leave more than k candidates.
    filtered = torch.full_like(logits, float("-inf"))
    return filtered.scatter(-1, index, values)  # [..., vocab]


def sample_next_token(
    logits: torch.Tensor,
    temperature: float = 1.0,
    top_k: int | None = None,
    generator: torch.Generator | None = None,
    filter_fn=None,
) -> torch.Tensor:
    """Draw one token per row from softmax(logits / temperature), optionally among the top k only.

    logits: [batch, vocab] (log-probabilities work too: softmax of a log-softmax gives the
    same probabilities back). Returns a LongTensor [batch].

    temperature > 1 flattens the distribution, < 1 sharpens it; as temperature -> 0 the
    distribution collapses onto the largest logit, so the limit is argmax (greedy decoding).
    temperature = 0 itself would divide by zero: use greedy_decode for that.
    Pass a seeded torch.Generator to make the draws reproducible.
    filter_fn(logits, k) replaces this module's top_k_filter (chapter 07 passes the learner's);
    it is called only when 1 <= top_k < vocab, the range its exercise asks for.
    """
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2:
        shape = list(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
        raise ValueError(f"sample_next_token expects logits of shape [batch, vocab], got {shape}")
    if not logits.is_floating_point():
        raise TypeError(f"sample_next_token expects floating-point logits, got dtype {logits.dtype}")
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not temperature > 0:
        raise ValueError(
            f"temperature must be a number > 0, got {temperature!r}; the limit temperature -> 0 "
            f"is argmax, so for temperature 0 use greedy decoding (greedy_decode) instead"
        )
    if math.isinf(temperature):
        raise ValueError("temperature must be finite (an infinite temperature would be the uniform distribution)")
    scaled = logits / temperature  # [batch, vocab]
    if top_k is not None:
        k = _positive_int(top_k, "top_k")
        if filter_fn is not None and k < logits.shape[-1]:
            scaled = filter_fn(scaled, k)  # [batch, vocab]
        else:
            scaled = top_k_filter(scaled, k)  # [batch, vocab]
    # softmax in float32 at least: float16 probabilities lose the small ones.
    probs = torch.softmax(scaled.float(), dim=-1)  # [batch, vocab]
    return torch.multinomial(probs, num_samples=1, generator=generator).squeeze(-1)  # [batch]


# ---------------------------------------------------------------------------------------
# The decoding loop shared by greedy and sampled decoding
# ---------------------------------------------------------------------------------------

def _check_decode_args(model, src, max_len):
    for name in ("encode", "decode", "generator"):
        if not hasattr(model, name):
            raise TypeError(f"the model must provide .{name}(...): see the interface in transformer_lib.decoding")
    if not isinstance(src, torch.Tensor) or src.dim() < 1:
        raise ValueError("src must be a tensor of source tokens with a batch dimension first, e.g. [batch, src]")
    max_len = _positive_int(max_len, "max_len")
    # The last token fed to the decoder sits at position max_len - 1 (bos is position 0).
    table = getattr(getattr(model, "config", None), "max_len", None)
    if isinstance(table, int) and max_len > table:
        raise ValueError(
            f"max_len={max_len} new tokens need {max_len} decoder positions, but the model's "
            f"positional table has only max_len={table}"
        )
    return max_len


def _next_log_probs(model, memory, src_mask, tokens, cache):
    """Log-probabilities of the token after `tokens` [batch, t]: [batch, vocab]."""
    if cache is not None:
        # Only the newest token is new to the decoder: everything before it is in the cache.
        hidden = model.decode(memory, src_mask, tokens[:, -1:], tgt_mask=None, cache=cache)  # [batch, 1, d_model]
    else:
        mask = causal_mask(tokens.shape[1], device=tokens.device)  # [t, t]
        hidden = model.decode(memory, src_mask, tokens, tgt_mask=mask)  # [batch, t, d_model]
    # Only the last position predicts a new token; the generator runs on it alone.
    return model.generator(hidden[:, -1])  # [batch, vocab]


@torch.no_grad()
def _decode(model, src, src_mask, max_len, bos_id, eos_id, choose: Callable, use_cache: bool):
    max_len = _check_decode_args(model, src, max_len)
    memory = model.encode(src, src_mask)  # [batch, src, d_model], computed once for all steps
    batch = memory.shape[0]
    cache = model.new_cache() if use_cache else None
    tokens = torch.full((batch, 1), bos_id, dtype=torch.long, device=memory.device)  # [batch, 1]
    finished = torch.zeros(batch, dtype=torch.bool, device=memory.device)  # [batch]
    for _ in range(max_len):
        log_probs = _next_log_probs(model, memory, src_mask, tokens, cache)  # [batch, vocab]
        next_token = choose(log_probs)  # [batch]
        # A finished sequence keeps "producing" eos, so the batch stays one rectangle.
        next_token = next_token.masked_fill(finished, eos_id)
        tokens = torch.cat([tokens, next_token[:, None]], dim=1)  # [batch, t + 1]
        finished |= next_token == eos_id
        if finished.all():
            break
    return tokens


def greedy_decode(model, src, src_mask, max_len, bos_id, eos_id, use_cache=True) -> torch.Tensor:
    """At every step take the single most probable next token.

    src: source tokens [batch, src]; src_mask: the encoder's mask (e.g. padding_mask(src, pad),
    [batch, 1, 1, src]) or None. Starts every sequence with bos_id and stops when every
    sequence has produced eos_id, or after max_len new tokens.

    Returns a LongTensor [batch, 1 + steps] (steps <= max_len) that starts with bos_id;
    sequences that finished early are padded with eos_id.

    use_cache=True feeds one token per step and keeps keys/values in model.new_cache();
    use_cache=False re-decodes the whole prefix with a causal mask. Both give the same tokens.
    """
    return _decode(model, src, src_mask, max_len, bos_id, eos_id,
                   choose=lambda log_probs: log_probs.argmax(dim=-1), use_cache=use_cache)


def sample_decode(model, src, src_mask, max_len, bos_id, eos_id, temperature=1.0, top_k=None,
                  generator=None, use_cache=True) -> torch.Tensor:
    """Like greedy_decode, but each next token is drawn with sample_next_token.

    temperature > 0 (its limit 0 is greedy decoding); top_k restricts the draw to the k most
    probable tokens (top_k=1 is greedy decoding); a seeded torch.Generator makes it repeatable.
    Returns a LongTensor [batch, 1 + steps], padded with eos_id after a sequence's eos.
    """
    # Check the sampling settings before encoding anything.
    sample_next_token(torch.zeros(1, 1), temperature, top_k)
    return _decode(model, src, src_mask, max_len, bos_id, eos_id,
                   choose=lambda log_probs: sample_next_token(log_probs, temperature, top_k, generator),
                   use_cache=use_cache)


# ---------------------------------------------------------------------------------------
# Beam search
# ---------------------------------------------------------------------------------------

def _kv_caches(cache):
    """Every KVCache inside a cache structure (lists, tuples, dicts, dataclasses such as LayerCache)."""
    if isinstance(cache, KVCache):
        yield cache
    elif isinstance(cache, (list, tuple)):
        for item in cache:
            yield from _kv_caches(item)
    elif isinstance(cache, dict):
        for item in cache.values():
            yield from _kv_caches(item)
    elif hasattr(cache, "__dict__"):
        for item in vars(cache).values():
            yield from _kv_caches(item)


def reorder_cache(cache, index: torch.Tensor, include_static: bool = False):
    """Make row i of every cached key/value tensor a copy of row index[i] (in place).

    After a beam-search step, beam i continues the hypothesis that sat in row index[i], so
    its self-attention keys and values must follow it. Static (cross-attention) caches hold
    the encoder memory's keys and values, identical for every beam of one source sentence,
    so they are left alone unless include_static=True (needed only if `index` mixes rows of
    different source sentences). Returns the cache, for convenience.
    """
    for kv in _kv_caches(cache):
        if kv.k is None or (kv.static and not include_static):
            continue
        kv.k = kv.k.index_select(0, index)  # [batch * beam, heads, seq, d_k]
        kv.v = kv.v.index_select(0, index)
    return cache


def gnmt_length_penalty(length, alpha: float):
    """lp(Y) = ((5 + |Y|) / 6) ** alpha (Wu et al., 2016): a hypothesis is ranked by log P(Y) / lp(Y).

    length: an int (returns a float) or a tensor of lengths (returns a tensor).

    Every token adds a negative log-probability, so raw sums favour short outputs; dividing by
    lp(Y) undoes part of that. alpha = 0 ranks by the raw sum; alpha = 1 is close to a per-token mean.
    """
    return ((5.0 + length) / 6.0) ** alpha


def _repeat_rows(t, batch: int, times: int):
    """Repeat each batch row `times` times ([b0, b0, b1, b1, ...]); a tensor without a batch dim passes."""
    if t is None or t.dim() == 0 or t.shape[0] != batch:
        return t  # None, or a mask that broadcasts over the batch
    return t.repeat_interleave(times, dim=0)


@torch.no_grad()
def beam_search(model, src, src_mask, max_len, bos_id, eos_id, beam_size=4, length_penalty=0.6) -> torch.Tensor:
    """Keep the beam_size most probable partial outputs at every step; return the best one.

    Every step extends each of a sentence's beam_size hypotheses by every token of the
    vocabulary and keeps the beam_size best of all beam_size * vocab candidates, ranked by the
    sum of their log-probabilities. A hypothesis that has written eos_id is finished: it stays
    in the beam, and its only continuation is eos_id again, at no cost (log-probability 0), so it
    keeps its score and competes with the live ones. The keys and values cached by the decoder's
    self-attention follow their hypotheses when the beam is reordered. The search stops when
    every hypothesis of every sentence is finished, or after max_len steps. Then the best
    hypothesis of each sentence is the one with the largest log P(Y) / lp(|Y|), with the GNMT
    length penalty lp = ((5 + |Y|) / 6) ** length_penalty (Wu et al., 2016), |Y| counting the
    generated tokens up to and including eos; length_penalty = 0 ranks by log P(Y) itself.
    This is the search described in Dive into Deep Learning (Zhang et al.), section 10.8.

    beam_size=1 gives exactly greedy_decode's output. Returns a LongTensor [batch, 1 + steps]
    starting with bos_id, each row padded with eos_id after its eos, as long as its longest row.
    """
    max_len = _check_decode_args(model, src, max_len)
    beam = _positive_int(beam_size, "beam_size")
    if (isinstance(length_penalty, bool) or not isinstance(length_penalty, (int, float))
            or not math.isfinite(length_penalty)):
        raise ValueError(f"length_penalty must be a finite number (GNMT uses 0.6 to 1.0), got {length_penalty!r}")

    memory = model.encode(src, src_mask)  # [batch, src, d_model], computed once
    batch, device = memory.shape[0], memory.device
    # Every beam reads the same source: repeat memory and mask, row b * beam + j for beam j.
    memory = _repeat_rows(memory, batch, beam)  # [batch * beam, src, d_model]
    src_mask = _repeat_rows(src_mask, batch, beam)
    cache = model.new_cache()
    tokens = torch.full((batch * beam, 1), bos_id, dtype=torch.long, device=device)  # [batch * beam, 1]
    # At the start every beam holds the same prefix, <bos>: only beam 0 may grow, or the first
    # step would fill the beam with copies of one hypothesis.
    scores = torch.full((batch, beam), float("-inf"), device=device)  # [batch, beam]: sum of log P
    scores[:, 0] = 0.0
    finished = torch.zeros(batch, beam, dtype=torch.bool, device=device)  # [batch, beam]
    lengths = torch.zeros(batch, beam, dtype=torch.long, device=device)  # generated tokens, eos included
    offsets = torch.arange(batch, device=device)[:, None] * beam  # [batch, 1]: each sentence's first row

    for _ in range(max_len):
        hidden = model.decode(memory, src_mask, tokens[:, -1:], cache=cache)  # [batch * beam, 1, d_model]
        log_probs = model.generator(hidden[:, -1])  # [batch * beam, vocab]
        vocab = log_probs.shape[-1]
        # A finished hypothesis has one continuation, eos, and it costs nothing.
        done = finished.view(-1, 1)  # [batch * beam, 1]
        is_eos = torch.arange(vocab, device=device) == eos_id  # [vocab]
        log_probs = torch.where(done, torch.where(is_eos, 0.0, float("-inf")).to(log_probs.dtype), log_probs)
        candidates = scores[:, :, None] + log_probs.view(batch, beam, vocab)  # [batch, beam, vocab]
        # The best of all beam * vocab candidates of a sentence, not the best of each beam.
        scores, index = candidates.view(batch, beam * vocab).topk(beam, dim=-1)  # [batch, beam]
        parent, token = index // vocab, index % vocab  # [batch, beam] each
        rows = (offsets + parent).view(-1)  # [batch * beam]: the row each new hypothesis continues
        tokens = torch.cat([tokens[rows], token.view(-1, 1)], dim=1)  # [batch * beam, t + 1]
        reorder_cache(cache, rows)  # the keys and values follow their hypotheses
        was_finished = finished.gather(1, parent)  # [batch, beam]
        lengths = lengths.gather(1, parent) + (~was_finished).long()
        finished = was_finished | (token == eos_id)
        if finished.all():
            break

    best = (scores / gnmt_length_penalty(lengths, length_penalty)).argmax(dim=-1)  # [batch]
    out_len = 1 + int(lengths.gather(1, best[:, None]).max())
    return tokens[(offsets[:, 0] + best), :out_len]  # [batch, 1 + steps]


# ---------------------------------------------------------------------------------------
# Scoring a finished output
# ---------------------------------------------------------------------------------------

@torch.no_grad()
def sequence_log_prob(model, src, src_mask, tokens, eos_id) -> torch.Tensor:
    """log P(tokens[:, 1:] | src) summed up to and including each row's first eos: [batch].

    tokens: [batch, L] as returned by the decoders (bos first, eos padding after the end).
    This is the quantity beam search maximises (with length_penalty = 0).
    """
    if tokens.dim() != 2 or tokens.shape[1] < 2:
        raise ValueError(f"tokens must be [batch, L] with bos first and L >= 2, got shape {list(tokens.shape)}")
    memory = model.encode(src, src_mask)  # [batch, src, d_model]
    # Teacher forcing: the prefix up to position t predicts token t + 1, all in one pass.
    prefix, target = tokens[:, :-1], tokens[:, 1:]  # [batch, L - 1] each
    hidden = model.decode(memory, src_mask, prefix, tgt_mask=causal_mask(prefix.shape[1], device=prefix.device))
    log_probs = model.generator(hidden).gather(-1, target[..., None]).squeeze(-1)  # [batch, L - 1]
    # Count a token if no eos came strictly before it (the first eos itself counts).
    is_eos = (target == eos_id).long()
    before = is_eos.cumsum(dim=1) - is_eos  # eos tokens strictly before each position
    return (log_probs * (before == 0)).sum(dim=1)  # [batch]
