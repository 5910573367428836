"""transformer_lib.decoding: greedy, beam and sampled decoding, with and without the KV cache.

The models are small, seeded and untrained (eval mode, no dropout): decoding must be right
for any weights, so random ones are as good a test as trained ones, and much faster.
"""

import itertools
import math

import pytest
import torch

from transformer_lib.attention import KVCache
from transformer_lib.decoding import (
    beam_search,
    gnmt_length_penalty,
    greedy_decode,
    reorder_cache,
    sample_decode,
    sample_next_token,
    sequence_log_prob,
    top_k_filter,
)
from transformer_lib.layers import EncoderDecoder, LayerCache, TransformerConfig
from transformer_lib.masks import causal_mask, padding_mask

PAD, BOS = 0, 1
VOCAB = 13
SEEDS = [0, 1, 2]


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    # These tensors are tiny: a second thread only adds synchronisation, and on a busy
    # machine (CI runs two jobs on two cores) OpenMP's waiting threads make every small op
    # tens of times slower.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def make_model(seed: int) -> EncoderDecoder:
    torch.manual_seed(seed)
    config = TransformerConfig(src_vocab=VOCAB, tgt_vocab=VOCAB, d_model=32, n_heads=4, d_ff=64,
                               n_layers=2, dropout=0.0, max_len=64)
    return EncoderDecoder(config).eval()


def make_source(seed: int):
    """Three source sentences of different lengths (padded with PAD) and their padding mask."""
    g = torch.Generator().manual_seed(100 + seed)
    src = torch.randint(3, VOCAB, (3, 7), generator=g)  # [3, 7]
    src[1, 5:] = PAD
    src[2, 3:] = PAD
    return src, padding_mask(src, PAD)  # [3, 7], [3, 1, 1, 7]


def first_eos(row: torch.Tensor, eos: int) -> int | None:
    hits = (row == eos).nonzero()
    return hits[0].item() if len(hits) else None


# ---------------------------------------------------------------------------------------
# The cache changes the cost, never the tokens
# ---------------------------------------------------------------------------------------

def test_cached_and_uncached_greedy_give_identical_tokens():
    # The eos id only decides where a sequence stops, so trying several ids makes sequences
    # finish at different steps (and some never), which exercises the eos padding.
    lengths = set()
    for seed, eos in itertools.product(SEEDS, [3, 6, 9, 12]):
        model = make_model(seed)
        src, src_mask = make_source(seed)
        cached = greedy_decode(model, src, src_mask, 12, BOS, eos, use_cache=True)
        uncached = greedy_decode(model, src, src_mask, 12, BOS, eos, use_cache=False)
        assert torch.equal(cached, uncached), f"seed {seed}, eos {eos}:\n{cached}\n{uncached}"
        assert cached.dtype == torch.long and (cached[:, 0] == BOS).all()
        for row in cached:
            end = first_eos(row[1:], eos)
            lengths.add(end)
            if end is not None:
                # Everything after a sequence's eos is eos padding.
                assert (row[1 + end :] == eos).all()
    assert None in lengths and len(lengths - {None}) >= 2, "the test should see unfinished and finished rows"


def test_greedy_stops_when_every_sequence_has_finished():
    model, (src, src_mask) = make_model(0), make_source(0)
    free = greedy_decode(model, src, src_mask, 12, BOS, eos_id=-1)  # an id the model can never produce
    assert free.shape == (3, 13)  # no eos: exactly max_len new tokens
    for eos in free[:, 1:].unique().tolist():
        ends = [first_eos(row[1:], eos) for row in free]
        out = greedy_decode(model, src, src_mask, 12, BOS, eos)
        assert out.shape == (3, 13 if None in ends else 2 + max(ends))
        for row, free_row, end in zip(out, free, ends):
            stop = out.shape[1] if end is None else 2 + end
            assert torch.equal(row[:stop], free_row[:stop])  # the same tokens up to eos ...
            assert (row[stop:] == eos).all()  # ... then eos padding


def test_cached_step_log_probs_equal_the_full_prefix_ones():
    for seed in SEEDS:
        model = make_model(seed)
        src, src_mask = make_source(seed)
        tokens = greedy_decode(model, src, src_mask, 10, BOS, eos_id=-1)  # [3, 11]
        with torch.no_grad():
            full = model(src, tokens, src_mask, causal_mask(tokens.shape[1]))  # [3, 11, vocab]
            memory = model.encode(src, src_mask)
            cache = model.new_cache()
            for t in range(tokens.shape[1]):
                step = model.generator(model.decode(memory, src_mask, tokens[:, t : t + 1], cache=cache))  # [3, 1, vocab]
                torch.testing.assert_close(step[:, 0], full[:, t], rtol=1e-5, atol=1e-5)
        assert cache[0].self_attn.length == tokens.shape[1]
        assert cache[0].cross_attn.length == src.shape[1]


class _CallCounter:
    def __init__(self, module):
        self.inputs = []
        module.register_forward_hook(lambda mod, args, out: self.inputs.append(args[0].shape))


def test_encoder_runs_once_and_cross_attention_keys_are_computed_once():
    model, (src, src_mask) = make_model(0), make_source(0)
    encode_calls = []
    original_encode = model.encode
    model.encode = lambda *a, **k: encode_calls.append(1) or original_encode(*a, **k)
    layer = model.decoder.layers[0]
    cross_k, self_k = _CallCounter(layer.cross_attn.w_k), _CallCounter(layer.self_attn.w_k)

    greedy_decode(model, src, src_mask, 8, BOS, eos_id=-1, use_cache=True)
    assert len(encode_calls) == 1
    assert len(cross_k.inputs) == 1  # the memory's keys, at the first step only
    assert len(self_k.inputs) == 8 and all(shape[1] == 1 for shape in self_k.inputs)  # one new token per step

    encode_calls.clear(); cross_k.inputs.clear(); self_k.inputs.clear()
    greedy_decode(model, src, src_mask, 8, BOS, eos_id=-1, use_cache=False)
    assert len(encode_calls) == 1  # still once: only the decoder is re-run
    assert len(cross_k.inputs) == 8
    assert [shape[1] for shape in self_k.inputs] == list(range(1, 9))  # the whole prefix, every step


# ---------------------------------------------------------------------------------------
# A model whose answer is known: the interface is all the decoders rely on
# ---------------------------------------------------------------------------------------

class CountingModel:
    """Next token = previous token + stride (mod vocab), with stride = the first source token.

    Not a Transformer at all: it has just encode / decode / generator / new_cache.
    """

    vocab = 10

    def encode(self, src, src_mask=None):
        return src[:, :1, None].float()  # [batch, 1, 1]: the stride

    def decode(self, memory, src_mask, tgt, tgt_mask=None, cache=None):
        return ((tgt + memory[:, :1, 0].long()) % self.vocab).float()[..., None]  # [batch, tgt, 1]

    def generator(self, hidden):
        logits = 10.0 * torch.nn.functional.one_hot(hidden[..., 0].long(), self.vocab).float()
        return torch.log_softmax(logits, dim=-1)  # [..., vocab]

    def new_cache(self):
        return [LayerCache()]


@pytest.mark.parametrize("decode", [
    lambda *a: greedy_decode(*a),
    lambda *a: greedy_decode(*a, use_cache=False),
    lambda *a: beam_search(*a, beam_size=3),
    lambda *a: sample_decode(*a, top_k=1),
])
def test_decoders_on_a_model_with_a_known_answer(decode):
    src = torch.tensor([[1, 0], [2, 0], [3, 0]])
    out = decode(CountingModel(), src, None, 8, 0, 6)  # bos 0, eos 6
    expected = torch.tensor([
        [0, 1, 2, 3, 4, 5, 6],  # stride 1: reaches eos at step 6
        [0, 2, 4, 6, 6, 6, 6],  # stride 2: finished at step 3, then padded with eos
        [0, 3, 6, 6, 6, 6, 6],
    ])
    assert torch.equal(out, expected), out


def test_without_eos_exactly_max_len_tokens_are_generated():
    src = torch.tensor([[3, 0]])  # stride 3: 0, 3, 6, 9, 2, 5 -- eos 5 would come at step 5
    out = greedy_decode(CountingModel(), src, None, 4, 0, 5)
    assert torch.equal(out, torch.tensor([[0, 3, 6, 9, 2]]))


# ---------------------------------------------------------------------------------------
# Beam search
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("alpha", [0.0, 0.6])
def test_beam_size_one_is_greedy(alpha):
    for seed, eos in itertools.product(SEEDS, [3, 9]):
        model = make_model(seed)
        src, src_mask = make_source(seed)
        greedy = greedy_decode(model, src, src_mask, 12, BOS, eos)
        beam = beam_search(model, src, src_mask, 12, BOS, eos, beam_size=1, length_penalty=alpha)
        assert torch.equal(beam, greedy), f"seed {seed}, eos {eos}:\n{beam}\n{greedy}"


def test_beam_search_finds_at_least_greedys_log_prob():
    # Not a theorem (greedy's prefix can fall out of the beam), but it should hold on these
    # seeded models; with alpha = 0 beam search ranks hypotheses by this very log-probability.
    better = 0
    for seed, eos in itertools.product(SEEDS, [3, 9]):
        model = make_model(seed)
        src, src_mask = make_source(seed)
        greedy = greedy_decode(model, src, src_mask, 12, BOS, eos)
        beam = beam_search(model, src, src_mask, 12, BOS, eos, beam_size=4, length_penalty=0.0)
        assert (beam[:, 0] == BOS).all()
        greedy_lp = sequence_log_prob(model, src, src_mask, greedy, eos)
        beam_lp = sequence_log_prob(model, src, src_mask, beam, eos)
        assert (beam_lp >= greedy_lp - 1e-4).all(), f"seed {seed}, eos {eos}: {beam_lp} < {greedy_lp}"
        better += int((beam_lp > greedy_lp + 1e-3).sum())
    assert better > 0, "beam search never did better than greedy: is the beam really searched?"


@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.0])
def test_a_wide_beam_finds_the_exact_optimum(alpha):
    # With the beam as wide as every 2-token prefix, nothing is pruned in 3 steps: beam search
    # must return the best of all 13^3 continuations, found here by brute force.
    model, eos = make_model(1), 3
    src, src_mask = make_source(1)
    src, src_mask = src[:1], src_mask[:1]
    out = beam_search(model, src, src_mask, 3, BOS, eos, beam_size=VOCAB**2, length_penalty=alpha)

    every = torch.tensor(list(itertools.product(range(VOCAB), repeat=3)))  # [2197, 3]
    every = torch.cat([torch.full((len(every), 1), BOS), every], dim=1)  # [2197, 4]
    log_p = sequence_log_prob(model, src.expand(len(every), -1), src_mask.expand(len(every), -1, -1, -1), every, eos)
    length = torch.tensor([3 if first_eos(row[1:], eos) is None else first_eos(row[1:], eos) + 1 for row in every])
    penalised = log_p / ((5.0 + length) / 6.0) ** alpha
    best = every[penalised.argmax()]
    best_len = length[penalised.argmax()].item()
    assert torch.equal(out[0, : 1 + best_len], best[: 1 + best_len]), (out, best)
    assert (out[0, 1 + best_len :] == eos).all()


def test_beam_search_output_format_and_length_penalty():
    model, (src, src_mask) = make_model(2), make_source(2)
    out = beam_search(model, src, src_mask, 10, BOS, 9, beam_size=3)
    assert out.dtype == torch.long and out.shape[0] == 3 and 2 <= out.shape[1] <= 11
    for row in out:
        end = first_eos(row[1:], 9)
        if end is not None:
            assert (row[1 + end :] == 9).all()
    assert gnmt_length_penalty(1, 0.6) == 1.0
    assert gnmt_length_penalty(7, 0.0) == 1.0
    assert math.isclose(gnmt_length_penalty(7, 1.0), 2.0)


class MarkovModel:
    """P(next | last token) from a table: a model with a known best sequence. Token 0 is <bos>."""

    def __init__(self, probs):
        self.table = torch.tensor(probs, dtype=torch.float64)

    def encode(self, src, src_mask=None):
        return torch.zeros(src.shape[0], 1, 1)

    def decode(self, memory, src_mask, tgt, tgt_mask=None, cache=None):
        return torch.nn.functional.one_hot(tgt, len(self.table)).double()  # [batch, t, V]

    def generator(self, hidden):
        return (hidden @ self.table).log()

    def new_cache(self):
        return [LayerCache()]


def test_beam_search_keeps_the_hypothesis_greedy_never_sees():
    # <bos> a b <eos>: greedy takes a (0.6) then <eos> (0.5): 0.30; beam search finds b <eos>: 0.4 * 0.9 = 0.36.
    model = MarkovModel([[0, 0.6, 0.4, 0], [0, 0.25, 0.25, 0.5], [0, 0.05, 0.05, 0.9], [0, 0, 0, 1]])
    src = torch.zeros(1, 1, dtype=torch.long)
    assert greedy_decode(model, src, None, 4, 0, 3).tolist() == [[0, 1, 3]]
    assert beam_search(model, src, None, 4, 0, 3, beam_size=2).tolist() == [[0, 2, 3]]


def test_a_finished_hypothesis_keeps_its_score_and_the_length_penalty_can_overrule_it():
    # <eos> at once: 0.5, finished at step 1 and kept in the beam with that score while "a b <eos>"
    # (0.5 * 0.9 * 0.9 = 0.405) grows. By log P the short one wins; divided by the GNMT penalty with
    # alpha = 1 (1 for length 1, 8/6 for length 3), the long one does.
    model = MarkovModel([[0, 0.5, 0, 0.5], [0, 0, 0.9, 0.1], [0, 0, 0.1, 0.9], [0, 0, 0, 1]])
    src = torch.zeros(1, 1, dtype=torch.long)
    assert beam_search(model, src, None, 5, 0, 3, beam_size=2, length_penalty=0.0).tolist() == [[0, 3]]
    assert beam_search(model, src, None, 5, 0, 3, beam_size=2, length_penalty=1.0).tolist() == [[0, 1, 2, 3]]


def test_reorder_cache_moves_self_attention_rows_only():
    k = torch.arange(4.0).view(4, 1, 1, 1).expand(4, 2, 3, 5)  # row i filled with i
    cache = [LayerCache(self_attn=KVCache(k.clone(), k.clone()), cross_attn=KVCache(k.clone(), k.clone(), static=True))]
    index = torch.tensor([2, 2, 0, 1])
    reorder_cache(cache, index)
    assert cache[0].self_attn.k[:, 0, 0, 0].tolist() == [2, 2, 0, 1]
    assert cache[0].self_attn.v[:, 0, 0, 0].tolist() == [2, 2, 0, 1]
    assert cache[0].cross_attn.k[:, 0, 0, 0].tolist() == [0, 1, 2, 3]  # static: shared by the beams
    reorder_cache(cache, index, include_static=True)
    assert cache[0].cross_attn.k[:, 0, 0, 0].tolist() == [2, 2, 0, 1]


# ---------------------------------------------------------------------------------------
# Top-k and sampling
# ---------------------------------------------------------------------------------------

def test_top_k_filter_keeps_exactly_the_k_largest():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 3, 11, generator=g)
    for k in range(1, 11):
        out = top_k_filter(logits, k)
        assert out.shape == logits.shape
        assert (torch.isfinite(out).sum(-1) == k).all()
        kept = torch.isfinite(out)
        assert torch.equal(out[kept], logits[kept])  # survivors keep their values
        # every kept logit is >= every dropped one
        assert (logits.masked_fill(~kept, float("inf")).amin(-1) >= logits.masked_fill(kept, float("-inf")).amax(-1)).all()
    ties = torch.zeros(2, 6)
    assert (torch.isfinite(top_k_filter(ties, 2)).sum(-1) == 2).all()
    assert top_k_filter(logits, None) is logits
    assert top_k_filter(logits, 11) is logits and top_k_filter(logits, 50) is logits


@pytest.mark.parametrize("k", [0, -1, 1.5, True])
def test_top_k_must_be_a_positive_integer(k):
    with pytest.raises(ValueError, match="top_k"):
        top_k_filter(torch.zeros(2, 5), k)
    with pytest.raises(ValueError, match="top_k"):
        sample_next_token(torch.zeros(2, 5), top_k=k)


@pytest.mark.parametrize("temperature", [0, 0.0, -1.0, float("nan")])
def test_temperature_must_be_positive(temperature):
    with pytest.raises(ValueError, match="temperature"):
        sample_next_token(torch.zeros(2, 5), temperature=temperature)
    model, (src, src_mask) = make_model(0), make_source(0)
    with pytest.raises(ValueError, match="temperature"):
        sample_decode(model, src, src_mask, 5, BOS, 2, temperature=temperature)


def test_sampling_is_reproducible_with_a_seeded_generator():
    logits = torch.randn(5, 13, generator=torch.Generator().manual_seed(0))
    a = sample_next_token(logits, generator=torch.Generator().manual_seed(7))
    b = sample_next_token(logits, generator=torch.Generator().manual_seed(7))
    assert torch.equal(a, b) and a.shape == (5,) and a.dtype == torch.long
    model, (src, src_mask) = make_model(0), make_source(0)
    runs = [sample_decode(model, src, src_mask, 10, BOS, 3, generator=torch.Generator().manual_seed(s), use_cache=c)
            for s, c in [(5, True), (5, True), (5, False), (6, True)]]
    assert torch.equal(runs[0], runs[1])
    assert torch.equal(runs[0], runs[2])  # the cache changes nothing, the draws included
    assert not torch.equal(runs[0], runs[3])


def test_top_k_one_is_greedy():
    logits = torch.randn(8, 13, generator=torch.Generator().manual_seed(1))
    assert torch.equal(sample_next_token(logits, temperature=2.0, top_k=1), logits.argmax(-1))
    for seed in SEEDS:
        model = make_model(seed)
        src, src_mask = make_source(seed)
        sampled = sample_decode(model, src, src_mask, 12, BOS, 9, top_k=1, generator=torch.Generator().manual_seed(0))
        assert torch.equal(sampled, greedy_decode(model, src, src_mask, 12, BOS, 9))


def test_a_low_temperature_approaches_argmax():
    logits = torch.randn(8, 13, generator=torch.Generator().manual_seed(2))
    draws = sample_next_token(logits.repeat(50, 1), temperature=1e-3, generator=torch.Generator().manual_seed(0))
    assert torch.equal(draws, logits.argmax(-1).repeat(50))


@pytest.mark.parametrize("temperature, top_k", [(1.0, None), (0.5, None), (2.0, 4)])
def test_samples_follow_the_softmax(temperature, top_k):
    # One decoding step of the model, drawn 40000 times: the counts must match
    # softmax(top_k(logits / T)) up to sampling noise (a chi-square test).
    model, (src, src_mask) = make_model(0), make_source(0)
    with torch.no_grad():
        log_probs = model(src[:1], torch.tensor([[BOS, 5]]), src_mask[:1], causal_mask(2))[:, -1]  # [1, vocab]
    n = 40_000
    draws = sample_next_token(log_probs.expand(n, -1), temperature, top_k, generator=torch.Generator().manual_seed(3))
    counts = torch.bincount(draws, minlength=VOCAB).double()
    p = torch.softmax(top_k_filter(log_probs[0].double() / temperature, top_k), dim=-1)
    assert (counts[p == 0] == 0).all(), "drew a token outside the top k"
    expected = n * p
    big = expected >= 5  # chi-square needs enough expected counts per cell; lump the rest
    observed_cells = torch.cat([counts[big], counts[~big].sum(0, keepdim=True)])
    expected_cells = torch.cat([expected[big], expected[~big].sum(0, keepdim=True)])
    keep = expected_cells > 0
    chi2 = (((observed_cells - expected_cells) ** 2)[keep] / expected_cells[keep]).sum().item()
    dof = int(keep.sum()) - 1
    # mean dof, sd sqrt(2 dof): 5 sd is far beyond chance, far below a wrong distribution
    assert chi2 < dof + 5 * math.sqrt(2 * dof), f"chi2 = {chi2:.1f} with {dof} degrees of freedom"


# ---------------------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------------------

def test_bad_arguments_are_named():
    model, (src, src_mask) = make_model(0), make_source(0)
    with pytest.raises(ValueError, match="max_len"):
        greedy_decode(model, src, src_mask, 0, BOS, 2)
    with pytest.raises(ValueError, match="positional table"):
        greedy_decode(model, src, src_mask, 65, BOS, 2)
    with pytest.raises(ValueError, match="beam_size"):
        beam_search(model, src, src_mask, 5, BOS, 2, beam_size=0)
    with pytest.raises(ValueError, match=r"\[batch, vocab\]"):
        sample_next_token(torch.zeros(13))
    with pytest.raises(TypeError, match="encode"):
        greedy_decode(object(), src, src_mask, 5, BOS, 2)
