"""Checkers for chapter 10, GPT: the pre-norm GPT block and the model's forward pass (with the
key/value cache), the next-token loss over whole windows (every position a training example),
the bigram baseline, the conversion to bits per character, greedy generation with the cache,
the temperature, nucleus (top-p) filtering, and the sampling loop.

References are the library's (transformer_lib.gpt). Each checker knows the wrong answers
learners often write, and properties name an error from a trait of the output when two
mistakes come together (a loss near zero on logits that copy their own token: the targets
are not shifted; probabilities that do not sum to one; positions computed twice; an earlier
output that moves when a later input changes; draws that ignore the generator).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from transformer_lib.attention import KVCache
from transformer_lib.decoding import top_k_filter
from transformer_lib.gpt import (GPT, Block, GPTConfig, bigram_log_probs, bits_per_char, gpt_block, gpt_forward,
                                 greedy_generate, lm_loss, next_token_loss, sample, temperature_probs, top_p_filter)
from transformer_lib.masks import causal_mask

from .core import Case, Checker, Mistake, Property, randn, seeded
from .properties import not_finite_on_large_inputs, rows_do_not_sum_to_one

LN2 = math.log(2.0)


def _close(a: float, b: float, rel: float = 1e-4) -> bool:
    return abs(a - b) <= rel * max(abs(a), abs(b), 1e-12)


# ---------------------------------------------------------------------------------------
# The tiny models every model-level check runs on
# ---------------------------------------------------------------------------------------
#
# The checks build their models themselves, seeded, so the learner's kernel and the grader build
# exactly the same ones. A check must never need the reference answer of *another* exercise (the
# grader hides every reference of the chapter while it runs a notebook), so the tiny GPTs run
# GPT-1's layout (Radford et al., 2018): post-norm blocks and no final LayerNorm. Both are wrong
# answers to this chapter's gpt_block and gpt_forward (GPT-2's layout is asked), so they give
# nothing away; they are real, causal, cached language models all the same.

TINY_GPT_VOCAB = 13


def _gpt1_block(x, block, cache=None):
    """GPT-1's post-norm block: x = LN1(x + Attn(x)); LN2(x + MLP(x))."""
    past = 0 if cache is None else cache.length
    mask = causal_mask(past + x.shape[1], device=x.device)[past:]  # [seq, past + seq]
    x = block.ln_1(x + block.dropout(block.self_attn(x, x, x, mask, cache=cache)))
    return block.ln_2(x + block.dropout(block.feed_forward(x)))


def _gpt1_forward(tokens, model, cache=None):
    """GPT-1's forward pass: embeddings and positions, the blocks, the tied output layer (no final LayerNorm)."""
    past = 0 if cache is None else cache[0].length
    x = model.positions(model.token_embedding(tokens), offset=past)
    for i, block in enumerate(model.blocks):
        x = block(x, None if cache is None else cache[i])
    return model.lm_head(x)


_CALL_THE_BLOCK = ("gpt_block called block(x), which runs the block function the block was built with, not "
                   "yours: compute the block from its parts (block.ln_1, block.self_attn, block.ln_2, "
                   "block.feed_forward, block.dropout)")
_CALL_THE_MODEL = ("gpt_forward called model(tokens), which runs the forward function the model was built with, "
                   "not yours: compute the logits from the model's parts (model.token_embedding, "
                   "model.positions, model.blocks, model.ln_f, model.lm_head)")
ERROR_MESSAGES = (_CALL_THE_BLOCK, _CALL_THE_MODEL)  # raised in the learner's process: translated at judging


def _refuse_block(x, block, cache=None):
    raise RuntimeError(_CALL_THE_BLOCK)


def _refuse_forward(tokens, model, cache=None):
    raise RuntimeError(_CALL_THE_MODEL)


def _randomise(module: torch.nn.Module) -> None:
    """Weights far from GPT-2's small initialisation, LayerNorms and biases included, so that
    every part of a block or model visibly changes the output."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            if p.dim() >= 2:  # embeddings and weight matrices
                p.normal_(0.0, 0.5)
            elif name.endswith("gamma"):
                p.normal_(1.0, 0.3)
            else:  # biases and LayerNorm shifts
                p.normal_(0.0, 0.3)


@dataclass(frozen=True)
class TinyGPT:
    """Which tiny GPT (GPT-1's layout, see above) a case runs on; `float32` for sampling, whose
    draws depend on the dtype of the probabilities."""

    seed: int
    layers: int = 2
    float32: bool = False

    def __repr__(self) -> str:
        return f"tiny GPT #{self.seed} ({self.layers} layers{', float32' if self.float32 else ''})"

    def build(self, forward_fn=_gpt1_forward) -> GPT:
        config = GPTConfig(vocab_size=TINY_GPT_VOCAB, max_len=128, d_model=16, n_heads=2, n_layers=self.layers,
                           dropout=0.0)
        with torch.random.fork_rng(devices=[]):  # building must not move the notebook's random state
            torch.manual_seed(self.seed)
            model = GPT(config, block_fn=_gpt1_block, forward_fn=forward_fn)
            _randomise(model)
        return (model.float() if self.float32 else model.double()).eval()


class _Halve(torch.nn.Module):
    """Stands in for a block's dropout in one case, so that the check sees where it is applied."""

    def forward(self, x):
        return 0.5 * x


@dataclass(frozen=True)
class TinyBlock:
    """Which block a gpt_block case runs on (seeded, float64), and the cache it starts with:
    None for no cache, else a KVCache already holding `past` positions of random keys and values."""

    seed: int
    d_model: int = 16
    n_heads: int = 2
    past: int | None = None
    halve_dropout: bool = False

    def __repr__(self) -> str:
        text = f"block #{self.seed}: d_model {self.d_model}, {self.n_heads} heads"
        if self.past is not None:
            text += f", a cache holding {self.past} positions"
        return text + (", block.dropout halving its input" if self.halve_dropout else "")

    def build(self) -> Block:
        config = GPTConfig(vocab_size=TINY_GPT_VOCAB, max_len=64, d_model=self.d_model, n_heads=self.n_heads,
                           n_layers=1, dropout=0.0)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            block = Block(config, block_fn=_refuse_block)
            _randomise(block)
        if self.halve_dropout:
            block.dropout = _Halve()
        return block.double().eval()

    def cache(self, batch: int) -> KVCache | None:
        if self.past is None:
            return None
        g = seeded(self.seed + 500)
        shape = (batch, self.n_heads, self.past, self.d_model // self.n_heads)  # [batch, heads, past, d_k]
        return KVCache(randn(g, *shape, dtype=torch.float64), randn(g, *shape, dtype=torch.float64)) if self.past \
            else KVCache()


# ---------------------------------------------------------------------------------------
# Exercise 1: gpt_block(x, block, cache=None) -> the pre-norm block, causal, with the cache
# ---------------------------------------------------------------------------------------

SEES_FUTURE = "an earlier output moved when only the last position's input changed"
CARRIED = "adding 1 to every feature of x added 1 to every feature of the output"


def _invoke_block(fn, case: Case):
    x, tiny = case.args
    block = tiny.build()
    cache = tiny.cache(x.shape[0])
    if cache is not None:
        out = fn(x, block, cache)
        return {"output": out, "cached keys": cache.k, "cached values": cache.v}
    out = fn(x, block)
    probe = x.clone()
    probe[:, -1] = probe[:, -1].flip(-1)  # change the last position only (not by a shift or a scale, which
    # a LayerNorm would undo): no earlier output may move
    moved = fn(probe, tiny.build())
    # A pre-norm block carries a constant added to every feature straight through its residual
    # path (each LayerNorm ignores it): the output moves by exactly that constant.
    shifted = fn(x + 1.0, tiny.build())
    try:
        sees_future = bool((moved[:, :-1] - out[:, :-1]).abs().max() > 1e-9) if x.shape[1] > 1 else False
        carried = bool(torch.allclose(shifted - out, torch.ones_like(out), rtol=0, atol=1e-6))
    except Exception:  # an output without positions: the comparison of "output" says what is wrong
        sees_future = carried = None
    return {"output": out, SEES_FUTURE: sees_future, CARRIED: carried}


def _block_cases() -> list[Case]:
    g = seeded(1000)
    cases = []
    for name, tiny, batch, seq, hidden in [
        ("one sequence of 5 positions, no cache", TinyBlock(1), 1, 5, False),
        ("a batch of 3 sequences of 7, no cache", TinyBlock(2), 3, 7, False),
        ("3 new positions after 4 cached ones", TinyBlock(3, past=4), 2, 3, False),
        ("1 new position after 6 cached ones", TinyBlock(4, past=6), 2, 1, False),
        ("no cache; block.dropout replaced by a fixed halving, to see where it is applied",
         TinyBlock(5, halve_dropout=True), 2, 4, False),
        ("an empty cache, 4 new positions", TinyBlock(6, past=0), 1, 4, True),
        ("d_model 24, 3 heads, 12 positions, no cache", TinyBlock(7, d_model=24, n_heads=3), 2, 12, True),
        ("2 new positions after 9 cached ones, 4 heads", TinyBlock(8, n_heads=4, past=9), 3, 2, True),
        ("a cache and the halving dropout", TinyBlock(9, past=3, halve_dropout=True), 2, 3, True),
    ]:
        x = randn(g, batch, seq, tiny.d_model, dtype=torch.float64)
        cases.append(Case(name, (x, tiny), hidden=hidden))
    return cases


def _mask_for(x, cache):
    past = 0 if cache is None else cache.length
    return causal_mask(past + x.shape[1], device=x.device)[past:]


def _attend(block, h, mask, cache):
    return block.dropout(block.self_attn(h, h, h, mask, cache=cache))


def _mlp(block, h):
    return block.dropout(block.feed_forward(h))


def _blk_post_norm(x, block, cache=None):
    x = block.ln_1(x + _attend(block, x, _mask_for(x, cache), cache))
    return block.ln_2(x + _mlp(block, x))


def _blk_no_mask(x, block, cache=None):
    x = x + _attend(block, block.ln_1(x), None, cache)
    return x + _mlp(block, block.ln_2(x))


def _blk_residual_from_normalised(x, block, cache=None):
    h = block.ln_1(x)
    x = h + _attend(block, h, _mask_for(x, cache), cache)
    h = block.ln_2(x)
    return h + _mlp(block, h)


def _blk_mlp_first(x, block, cache=None):
    mask = _mask_for(x, cache)
    x = x + _mlp(block, block.ln_2(x))
    return x + _attend(block, block.ln_1(x), mask, cache)


def _blk_one_norm(x, block, cache=None):
    x = x + _attend(block, block.ln_1(x), _mask_for(x, cache), cache)
    return x + _mlp(block, block.ln_1(x))


def _blk_mlp_reads_input(x, block, cache=None):
    attended = _attend(block, block.ln_1(x), _mask_for(x, cache), cache)
    return x + attended + _mlp(block, block.ln_2(x))


def _blk_cache_ignored(x, block, cache=None):
    x = x + _attend(block, block.ln_1(x), _mask_for(x, None), None)
    return x + _mlp(block, block.ln_2(x))


def _blk_mask_first_rows(x, block, cache=None):
    past = 0 if cache is None else cache.length
    mask = causal_mask(past + x.shape[1], device=x.device)[:x.shape[1]]  # the first rows, not the new ones
    x = x + _attend(block, block.ln_1(x), mask, cache)
    return x + _mlp(block, block.ln_2(x))


def _blk_no_dropout(x, block, cache=None):
    h = block.ln_1(x)
    x = x + block.self_attn(h, h, h, _mask_for(x, cache), cache=cache)
    return x + block.feed_forward(block.ln_2(x))


def _blk_dropout_on_sum(x, block, cache=None):
    h = block.ln_1(x)
    x = block.dropout(x + block.self_attn(h, h, h, _mask_for(x, cache), cache=cache))
    return block.dropout(x + block.feed_forward(block.ln_2(x)))


def _dicts(expected, actual):
    return isinstance(expected, dict) and isinstance(actual, dict)


def _block_sees_future(case, expected, actual):
    return _dicts(expected, actual) and expected.get(SEES_FUTURE) is False and actual.get(SEES_FUTURE) is True


def _cache_not_extended(case, expected, actual):
    if not _dicts(expected, actual) or "cached keys" not in expected:
        return False
    keys = actual.get("cached keys")
    return not isinstance(keys, torch.Tensor) or keys.shape != expected["cached keys"].shape


def _shift_not_carried(case, expected, actual):
    return _dicts(expected, actual) and expected.get(CARRIED) is True and actual.get(CARRIED) is False


def _output_normalised(case, expected, actual):
    """Post-norm's trait: every output row is a LayerNorm's output (mean beta, spread gamma)."""
    if not _dicts(expected, actual):
        return False
    e, a = expected.get("output"), actual.get("output")
    if not (isinstance(a, torch.Tensor) and isinstance(e, torch.Tensor) and a.shape == e.shape
            and a.is_floating_point()):
        return False
    block = case.args[1].build()

    def normalised(t, norm):
        z = (t.double() - norm.beta.double()) / norm.gamma.double()
        return bool(((z.mean(-1).abs() < 1e-4) & ((z.var(-1, unbiased=False) - 1).abs() < 1e-2)).all())

    return any(normalised(a, n) and not normalised(e, n) for n in (block.ln_1, block.ln_2))


check_gpt_block = Checker(
    name="gpt_block",
    reference=gpt_block,
    make_cases=_block_cases,
    invoke=_invoke_block,
    rtol=1e-6,
    atol=1e-8,
    mistakes=[
        Mistake("post-norm: the LayerNorm applied to the residual sum, as in GPT-1 and the original Transformer",
                "GPT-2 is pre-norm: normalise the *input* of each sub-block and add the sub-block's output to the "
                "un-normalised x, x + attention(ln_1(x)), then x + MLP(ln_2(x)).", _blk_post_norm),
        Mistake("no causal mask: every position attends to the positions after it too",
                "Pass block.self_attn a causal mask: causal_mask(past + seq), its last seq rows.", _blk_no_mask),
        Mistake("the residual added to the normalised x (h + attention(h) with h = ln_1(x)) instead of to x",
                "Keep the residual stream un-normalised: x + attention(ln_1(x)), where the sum starts from x "
                "itself.", _blk_residual_from_normalised),
        Mistake("the MLP sub-block before the attention sub-block",
                "Attention first (positions exchange information), then the MLP (each position on its own).",
                _blk_mlp_first),
        Mistake("one LayerNorm (ln_1) used for both sub-blocks",
                "Each sub-block has its own LayerNorm: ln_1 before the attention, ln_2 before the MLP.", _blk_one_norm),
        Mistake("the MLP fed from the block's input x instead of the attention sub-block's output",
                "The two sub-blocks run one after the other: update x with the attention's output, then normalise "
                "that new x for the MLP.", _blk_mlp_reads_input),
        Mistake("the cache ignored: the new positions attend only to each other and the cache is left as it was",
                "Pass the cache to the attention, block.self_attn(h, h, h, mask, cache=cache): it appends the new "
                "keys and values and attends over all of them; the mask is then [seq, past + seq].",
                _blk_cache_ignored),
        Mistake("the first rows of the causal mask instead of its last ones: with a cache, the new positions are "
                "past .. past + seq - 1",
                "Build causal_mask(past + seq) and keep its rows past onwards, [past:], one row per new position.",
                _blk_mask_first_rows),
        Mistake("block.dropout left out",
                "GPT-2 drops out each sub-block's output before adding it to x: x + block.dropout(attention ...), "
                "x + block.dropout(MLP ...). It is the identity when dropout is 0, but not in every model.",
                _blk_no_dropout),
        Mistake("block.dropout applied to the sum x + sub-block instead of to the sub-block's output",
                "Drop out only what the sub-block adds: x + block.dropout(sub-block output); the residual path "
                "stays untouched.", _blk_dropout_on_sum),
    ],
    properties=[
        Property(f"{SEES_FUTURE} (the attention is not causal)",
                 "Pass a causal mask to block.self_attn, True where a position may attend: itself and the "
                 "positions before it.", _block_sees_future),
        Property("a cache that does not end up holding the cached and the new positions",
                 "Give the attention the cache, cache=cache: it appends the new keys and values itself. Read "
                 "cache.length before that call, for the mask.", _cache_not_extended),
        Property("a residual path that does not carry x through: adding 1 to every feature of x should add 1 "
                 "to the output, since each LayerNorm ignores it",
                 "Start each sum from x itself, x + sub-block(LayerNorm(x)), and never normalise the sum.",
                 _shift_not_carried),
        Property("outputs that are LayerNorm outputs (the residual sum normalised: post-norm)",
                 "Pre-norm: normalise each sub-block's input, and add its output to the un-normalised x.",
                 _output_normalised),
    ],
)


# ---------------------------------------------------------------------------------------
# Exercise 2: gpt_forward(tokens, model, cache=None) -> logits, with the positions offset
# ---------------------------------------------------------------------------------------

BLOCK_CALLS = "blocks run (through block(x, cache))"


def _invoke_forward(fn, case: Case):
    tokens, tiny, chunks = case.args
    model = tiny.build(forward_fn=_refuse_forward)
    calls = [0]

    def counted(x, block, cache=None):  # the model's block function, counting its calls
        calls[0] += 1
        return _gpt1_block(x, block, cache)

    for block in model.blocks:
        block.block_fn = counted
    out = {"logits": fn(tokens, model)}
    if chunks is not None:
        cache, start, parts = model.new_cache(), 0, []
        for n in chunks:
            parts.append(fn(tokens[:, start:start + n], model, cache))
            start += n
        out["logits, chunk by chunk, with the cache"] = parts
        out["positions in each block's cache"] = [c.length for c in cache]
    out[BLOCK_CALLS] = calls[0]
    return out


def _forward_cases() -> list[Case]:
    g = seeded(1010)
    cases = []
    for name, tiny, batch, seq, chunks, hidden in [
        ("a batch of 2 windows of 6 tokens, no cache", TinyGPT(11), 2, 6, None, False),
        ("7 tokens, then the same 7 fed 4, 1, 2 at a time with a cache", TinyGPT(12), 2, 7, (4, 1, 2), False),
        ("5 tokens, then fed one at a time with a cache, 3 blocks", TinyGPT(13, 3), 1, 5, (1, 1, 1, 1, 1), False),
        ("one block, 9 tokens in chunks of 3 with a cache", TinyGPT(14, 1), 3, 9, (3, 3, 3), True),
        ("one token, no cache", TinyGPT(15), 2, 1, None, True),
        ("12 tokens fed 5 then 7 with a cache", TinyGPT(16), 2, 12, (5, 7), True),
    ]:
        tokens = torch.randint(0, TINY_GPT_VOCAB, (batch, seq), generator=g)
        cases.append(Case(name, (tokens, tiny, chunks), hidden=hidden))
    return cases


def _blocks(model, x, cache, which=lambda i, cache: cache[i]):
    for i, block in enumerate(model.blocks):
        x = block(x, None if cache is None else which(i, cache))
    return x


def _fwd_embed(tokens, model, cache, offset=None):
    past = (0 if cache is None else cache[0].length) if offset is None else offset
    return model.positions(model.token_embedding(tokens), offset=past)


def _fwd_no_offset(tokens, model, cache=None):
    return model.lm_head(model.ln_f(_blocks(model, _fwd_embed(tokens, model, cache, offset=0), cache)))


def _fwd_offset_by_blocks(tokens, model, cache=None):
    x = _fwd_embed(tokens, model, cache, offset=0 if cache is None else len(cache))
    return model.lm_head(model.ln_f(_blocks(model, x, cache)))


def _fwd_no_final_norm(tokens, model, cache=None):
    return model.lm_head(_blocks(model, _fwd_embed(tokens, model, cache), cache))


def _fwd_scaled(tokens, model, cache=None):
    past = 0 if cache is None else cache[0].length
    x = model.positions(model.token_embedding(tokens) * math.sqrt(model.config.d_model), offset=past)
    return model.lm_head(model.ln_f(_blocks(model, x, cache)))


def _fwd_tokens_twice(tokens, model, cache=None):
    embedded = model.token_embedding(tokens)
    x = embedded + _fwd_embed(tokens, model, cache)  # model.positions already returns embeddings + positions
    return model.lm_head(model.ln_f(_blocks(model, x, cache)))


def _fwd_cache_not_passed(tokens, model, cache=None):
    x = _blocks(model, _fwd_embed(tokens, model, cache), None)
    return model.lm_head(model.ln_f(x))


def _fwd_first_cache_everywhere(tokens, model, cache=None):
    x = _blocks(model, _fwd_embed(tokens, model, cache), cache, which=lambda i, cache: cache[0])
    return model.lm_head(model.ln_f(x))


def _fwd_norm_after_every_block(tokens, model, cache=None):
    x = _fwd_embed(tokens, model, cache)
    for i, block in enumerate(model.blocks):
        x = model.ln_f(block(x, None if cache is None else cache[i]))
    return model.lm_head(x)


def _cache_disagrees(case, expected, actual):
    key = "logits, chunk by chunk, with the cache"
    if not _dicts(expected, actual) or key not in expected:
        return False
    try:
        whole, parts = actual["logits"], torch.cat(list(actual[key]), dim=1)
        return whole.shape == parts.shape and not torch.allclose(whole, parts, rtol=1e-5, atol=1e-7)
    except Exception:
        return False


def _cache_lengths_wrong(case, expected, actual):
    key = "positions in each block's cache"
    return _dicts(expected, actual) and key in expected and actual.get(key) != expected[key]


def _blocks_bypassed(case, expected, actual):
    return _dicts(expected, actual) and expected.get(BLOCK_CALLS, 0) > 0 and actual.get(BLOCK_CALLS) == 0


check_gpt_forward = Checker(
    name="gpt_forward",
    reference=gpt_forward,
    make_cases=_forward_cases,
    invoke=_invoke_forward,
    rtol=1e-6,
    atol=1e-8,
    mistakes=[
        Mistake("positions not offset by the cache: the new tokens get positions 0, 1, ... at every call",
                "With a cache, the new tokens come after the cached ones: their first position is "
                "cache[0].length (0 without a cache).", _fwd_no_offset),
        Mistake("positions offset by len(cache), the number of blocks, instead of the number of cached positions",
                "len(cache) counts the blocks; the positions already computed are cache[0].length.",
                _fwd_offset_by_blocks),
        Mistake("no final LayerNorm before the output layer",
                "GPT-2 normalises the residual stream once more after the last block: model.ln_f, then "
                "model.lm_head.", _fwd_no_final_norm),
        Mistake("token embeddings multiplied by sqrt(d_model), as the original Transformer's embedding does",
                "GPT-2 adds its token and position vectors as they are: no sqrt(d_model) scale.", _fwd_scaled),
        Mistake("the token embeddings added twice: model.positions already returns embeddings + positions",
                "model.positions(embeddings, offset) adds the position vectors to what you give it: use its output "
                "as it is.", _fwd_tokens_twice),
        Mistake("the cache not handed to the blocks",
                "Run block i with cache[i], block(x, cache[i]): that is where its keys and values are kept.",
                _fwd_cache_not_passed),
        Mistake("every block given the first block's cache, cache[0]",
                "Each block keeps its own keys and values: block i gets cache[i].", _fwd_first_cache_everywhere),
        Mistake("the final LayerNorm applied after every block",
                "model.ln_f runs once, after the last block (each block normalises its own sub-blocks' inputs).",
                _fwd_norm_after_every_block),
    ],
    properties=[
        Property("logits with the cache that differ from your own logits without it",
                 "With a cache the new tokens sit at positions cache[0].length onwards, and block i gets cache[i]: "
                 "then chunk by chunk gives the same logits as the whole sequence at once.", _cache_disagrees),
        Property("caches that do not hold every position fed so far",
                 "Hand block i its own cache, cache[i], at every call: it appends the new keys and values.",
                 _cache_lengths_wrong),
        Property("blocks that never ran as the model's blocks",
                 "Run each block as block(x, cache): that runs the block function the model was built with "
                 "(in this chapter's GPT, your gpt_block).", _blocks_bypassed),
    ],
)


# ---------------------------------------------------------------------------------------
# Exercise 3: next_token_loss(logits, tokens) -> mean nats over the predictions with a next token
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
# Exercise 4: bigram_log_probs(ids, vocab_size, alpha) -> [V, V] log P(next | previous)
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
# Exercise 5: bits_per_char(loss, n_tokens, n_chars) -> float
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
# Exercise 7: temperature_probs(logits, temperature) -> softmax(logits / T)
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
# Exercise 8: top_p_filter(logits, p) -> logits outside the nucleus set to -inf
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


# ---------------------------------------------------------------------------------------
# Exercise 9: sample(model, prompt, max_new_tokens, temperature, top_k, top_p, generator)
# ---------------------------------------------------------------------------------------

SAME_DRAWS = "the same draws when only the global random state changes"
TWICE = "positions computed twice"


def _invoke_sample(fn, case: Case):
    tiny, prompt, max_new = case.args
    settings = dict(case.kwargs)
    seed = settings.pop("seed")
    runs = []
    for global_seed in (1234, 4321):  # the generator alone must decide the draws
        model = tiny.build()
        counter = _PositionCounter(model)
        try:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(global_seed)
                runs.append((fn(model, prompt, max_new, generator=torch.Generator().manual_seed(seed), **settings),
                             counter.positions))
        finally:
            counter.hook.remove()
    (tokens, positions), (again, _) = runs
    same = bool(torch.equal(tokens, again)) if isinstance(tokens, torch.Tensor) and isinstance(again, torch.Tensor) \
        and tokens.shape == again.shape else False
    return {"tokens": tokens, SAME_DRAWS: same, TWICE: max(0, positions - (prompt.shape[1] + max_new))}


def _sample_cases() -> list[Case]:
    cases = []
    for name, seed, layers, batch, prompt_len, max_new, settings, hidden in [
        ("T = 0.8, top-k 5", 21, 2, 3, 4, 8, dict(temperature=0.8, top_k=5, top_p=None), False),
        ("T = 1.3, top-p 0.7", 22, 2, 2, 3, 10, dict(temperature=1.3, top_k=None, top_p=0.7), False),
        ("T = 0.6, top-k 6 and top-p 0.8", 23, 1, 4, 2, 6, dict(temperature=0.6, top_k=6, top_p=0.8), False),
        ("T = 1, no filter", 24, 2, 2, 5, 8, dict(temperature=1.0, top_k=None, top_p=None), False),
        ("a prompt of 1 token, T = 1.5, top-p 0.9", 25, 2, 1, 1, 12, dict(temperature=1.5, top_k=None, top_p=0.9),
         True),
        ("a batch of 5, T = 0.5, top-k 3", 26, 2, 5, 3, 7, dict(temperature=0.5, top_k=3, top_p=None), True),
        ("T = 2, top-k 8 and top-p 0.6, 3 layers", 27, 3, 2, 4, 9, dict(temperature=2.0, top_k=8, top_p=0.6), True),
        ("one new token, T = 0.9, top-p 0.5", 28, 2, 3, 6, 1, dict(temperature=0.9, top_k=None, top_p=0.5), True),
    ]:
        g = seeded(1090 + seed)
        prompt = torch.randint(0, TINY_GPT_VOCAB, (batch, prompt_len), generator=g)
        cases.append(Case(name, (TinyGPT(seed, layers, float32=True), prompt, max_new),
                          dict(settings, seed=seed), hidden=hidden))
    return cases


def _draw(scores, generator):
    return torch.multinomial(torch.softmax(scores, dim=-1), 1, generator=generator)  # [batch, 1]


def _sampling_loop(choose, cached=True):
    """A sampling loop in which `choose(logits [batch, vocab], generator) -> [batch, 1]` varies."""

    def run(model, prompt, max_new_tokens, temperature=1.0, top_k=None, top_p=None, generator=None):
        cache = model.new_cache() if cached else None
        tokens = new = prompt
        for _ in range(max_new_tokens):
            logits = model(new if cached else tokens, cache)[:, -1]  # [batch, vocab]
            new = choose(logits, temperature, top_k, top_p, generator)
            tokens = torch.cat([tokens, new], dim=1)
        return tokens

    return run


def _filtered(scores, top_k, top_p):
    scores = top_k_filter(scores, top_k)
    return top_p_filter(scores, top_p)


def _right_choice(logits, temperature, top_k, top_p, generator):
    return _draw(_filtered(temperature_probs(logits, temperature).log(), top_k, top_p), generator)


def _smp_temperature_ignored(logits, temperature, top_k, top_p, generator):
    probs = torch.softmax(logits, dim=-1) / temperature  # a constant factor: the draw renormalises it away
    return _draw(_filtered(probs.log(), top_k, top_p), generator)


def _smp_filters_on_probs(logits, temperature, top_k, top_p, generator):
    probs = temperature_probs(logits, temperature)
    return _draw(_filtered(probs, top_k, top_p), generator)  # probabilities treated as logits


def _smp_argmax(logits, temperature, top_k, top_p, generator):
    return _filtered(temperature_probs(logits, temperature).log(), top_k, top_p).argmax(dim=-1, keepdim=True)


def _smp_global_rng(logits, temperature, top_k, top_p, generator):
    return _draw(_filtered(temperature_probs(logits, temperature).log(), top_k, top_p), None)


def _smp_temperature_after_filters(logits, temperature, top_k, top_p, generator):
    return _draw(_filtered(logits, top_k, top_p) / temperature, generator)


def _smp_without_prompt(model, prompt, max_new_tokens, **settings):
    return _sampling_loop(_right_choice)(model, prompt, max_new_tokens, **settings)[:, prompt.shape[1]:]


def _replay(case, tokens):
    """The logits the tiny model gives before each new token of `tokens`: [batch, new, vocab]."""
    tiny, prompt, _ = case.args
    model = tiny.build()
    with torch.no_grad():
        return model(tokens[:, :-1])[:, prompt.shape[1] - 1:]


def _new_tokens(case, actual):
    tokens, prompt = actual.get("tokens"), case.args[1]
    if (not isinstance(tokens, torch.Tensor) or tokens.dim() != 2 or tokens.dtype != torch.long
            or tokens.shape[0] != prompt.shape[0] or tokens.shape[1] <= prompt.shape[1]
            or tokens.min() < 0 or tokens.max() >= TINY_GPT_VOCAB):
        return None
    return tokens


def _outside_filters(case, expected, actual):
    tokens = _new_tokens(case, actual) if _dicts(expected, actual) else None
    if tokens is None or (case.kwargs["top_k"] is None and case.kwargs["top_p"] is None):
        return False
    logits = _replay(case, tokens)  # [batch, new, vocab]
    allowed = _filtered(logits / case.kwargs["temperature"], case.kwargs["top_k"], case.kwargs["top_p"]).isfinite()
    drawn = tokens[:, case.args[1].shape[1]:]
    return not bool(allowed.gather(-1, drawn[..., None]).all())


def _always_argmax(case, expected, actual):
    """Every draw the argmax, at steps where a draw would often have picked another token: the
    filtered distribution's top token under 0.7, at T = 1 and at the case's T alike (a mistake in
    the temperature must not pass for an argmax)."""
    tokens = _new_tokens(case, actual) if _dicts(expected, actual) else None
    if tokens is None or tokens.shape != expected["tokens"].shape:
        return False
    prompt_len = case.args[1].shape[1]
    logits = _replay(case, tokens)  # [batch, new, vocab]
    top_k, top_p = case.kwargs["top_k"], case.kwargs["top_p"]
    top = torch.maximum(*(_filtered(logits / t, top_k, top_p).softmax(-1).amax(-1)
                          for t in (1.0, case.kwargs["temperature"])))
    unsure = top < 0.7  # [batch, new]
    drawn_argmax = logits.argmax(dim=-1) == tokens[:, prompt_len:]
    return int(unsure.sum()) >= 6 and bool(drawn_argmax[unsure].all())


def _global_rng(case, expected, actual):
    return _dicts(expected, actual) and expected.get(SAME_DRAWS) is True and actual.get(SAME_DRAWS) is False


def _sample_computed_twice(case, expected, actual):
    return _dicts(expected, actual) and isinstance(actual.get(TWICE), int) and actual[TWICE] > 0


def _sample_prompt_missing(case, expected, actual):
    tokens, prompt = actual.get("tokens") if isinstance(actual, dict) else None, case.args[1]
    return (isinstance(tokens, torch.Tensor) and tokens.dim() == 2 and tokens.shape[0] == prompt.shape[0]
            and (tokens.shape[1] < prompt.shape[1] or not torch.equal(tokens[:, :prompt.shape[1]], prompt)))


check_sample = Checker(
    name="sample",
    reference=sample,
    make_cases=_sample_cases,
    invoke=_invoke_sample,
    mistakes=[
        Mistake("the temperature applied after the softmax (or not at all): dividing probabilities by T changes "
                "nothing once the draw renormalises them",
                "Divide the logits by T before the softmax: your temperature_probs(logits, temperature) does it.",
                _sampling_loop(_smp_temperature_ignored)),
        Mistake("top-k and top-p applied to probabilities instead of logits (the softmax that follows flattens them)",
                "The filters take logits: filter log-probabilities (the log of temperature_probs), then take the "
                "softmax of what is left.", _sampling_loop(_smp_filters_on_probs)),
        Mistake("the argmax taken instead of a draw",
                "Draw: torch.multinomial(probabilities, 1, generator=generator) gives [batch, 1].",
                _sampling_loop(_smp_argmax)),
        Mistake("draws from the global random generator instead of `generator`",
                "Pass generator=generator to torch.multinomial, so that a seeded generator makes the samples "
                "reproducible.", _sampling_loop(_smp_global_rng)),
        Mistake("the temperature applied after the filters (the nucleus chosen at T = 1)",
                "Temperature first, then top-k, then top-p: the nucleus is the smallest set with mass p *at* the "
                "temperature you sample at.", _sampling_loop(_smp_temperature_after_filters)),
        Mistake("no cache: the whole sequence run again at every step",
                "Make cache = model.new_cache() before the loop; feed the prompt once, then only the newest "
                "token, [batch, 1], with the cache.", _sampling_loop(_right_choice, cached=False)),
        Mistake("the prompt left out of the output",
                "Return the prompt followed by the new tokens: [batch, seq + max_new_tokens].", _smp_without_prompt),
    ],
    properties=[
        Property("draws that change when only the global random state changes (the generator is not used)",
                 "Draw with torch.multinomial(..., generator=generator).", _global_rng),
        Property("a token drawn from outside the top-k or the nucleus",
                 "Filter the logits (or log-probabilities) at the temperature: top_k_filter, then your top_p_filter "
                 "when top_p is given; -inf leaves a token probability 0.", _outside_filters),
        Property("always the most probable token: no draw",
                 "Draw from the filtered distribution with torch.multinomial instead of taking the argmax.",
                 _always_argmax),
        Property("positions computed more than once", "With the cache, run the prompt once and then only the newest "
                 "token at each step.", _sample_computed_twice),
        Property("an output that does not start with the prompt",
                 "Start from the prompt and append each new token.", _sample_prompt_missing),
    ],
)


CHECKERS = [check_gpt_block, check_gpt_forward, check_next_token_loss, check_bigram_log_probs, check_bits_per_char,
            check_greedy_generate, check_temperature_probs, check_top_p_filter, check_sample]
