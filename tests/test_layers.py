"""transformer_lib.layers held against PyTorch's own layers, and the properties the chapter relies on.

Trusted implementations: torch.nn.LayerNorm, torch.nn.TransformerEncoderLayer and
torch.nn.TransformerDecoderLayer (with our weights copied in). Properties: LayerNorm does
not look across the batch, the FFN does not look across positions, the decoder does not
look into the future, and a cached step-by-step decode equals the full decode.
"""

import math

import pytest
import torch
import torch.nn as nn

from transformer_lib.layers import (
    DecoderLayer,
    Encoder,
    EncoderDecoder,
    EncoderLayer,
    LayerNorm,
    PositionwiseFeedForward,
    ResidualConnection,
    TokenEmbedding,
    TransformerConfig,
    add_and_norm,
    count_parameters,
    feed_forward,
    layer_norm,
)
from transformer_lib.masks import causal_mask, padding_mask

TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.float64: dict(rtol=1e-10, atol=1e-10)}


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _randomise(module: nn.Module, seed: int) -> nn.Module:
    """Random values in every parameter. LayerNorm's gamma and beta too, so that a missing
    or misplaced norm cannot hide behind gamma = 1, beta = 0."""
    g = _gen(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            noise = torch.randn(p.shape, generator=g, dtype=p.dtype)
            p.copy_(1.0 + 0.3 * noise if name.endswith("gamma") else noise / math.sqrt(p.shape[-1]))
    return module


# -- LayerNorm -------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(5,), (3, 7), (2, 4, 16), (2, 3, 5, 8)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_layer_norm_equals_torch(shape, dtype):
    g = _gen(1)
    x = torch.randn(*shape, generator=g, dtype=dtype) * 3 + 2
    ours = LayerNorm(shape[-1]).to(dtype)
    theirs = nn.LayerNorm(shape[-1]).to(dtype)
    with torch.no_grad():
        ours.gamma.copy_(torch.randn(shape[-1], generator=g, dtype=dtype))
        ours.beta.copy_(torch.randn(shape[-1], generator=g, dtype=dtype))
        theirs.weight.copy_(ours.gamma)
        theirs.bias.copy_(ours.beta)
    torch.testing.assert_close(ours(x), theirs(x), **TOL[dtype])
    torch.testing.assert_close(layer_norm(x, ours.gamma, ours.beta), theirs(x), **TOL[dtype])


def test_layer_norm_biased_variance_and_eps_inside_the_sqrt():
    # Tiny values: var = 1e-6 is smaller than eps = 1e-5, so where eps goes matters a lot.
    x = torch.tensor([[1e-3, -1e-3, 1e-3, -1e-3]], dtype=torch.float64)
    out = layer_norm(x, torch.ones(4, dtype=torch.float64), torch.zeros(4, dtype=torch.float64))
    expected = x / math.sqrt(1e-6 + 1e-5)  # mean 0, biased var = 1e-6
    torch.testing.assert_close(out, expected)
    big_eps = layer_norm(x, torch.ones(4, dtype=torch.float64), torch.zeros(4, dtype=torch.float64), eps=0.5)
    torch.testing.assert_close(big_eps, x / math.sqrt(1e-6 + 0.5))


def test_layer_norm_output_has_zero_mean_unit_variance_per_position():
    x = torch.randn(4, 6, 32, generator=_gen(2)) * 5 - 3
    out = LayerNorm(32)(x)
    torch.testing.assert_close(out.mean(-1), torch.zeros(4, 6), atol=1e-5, rtol=0)
    torch.testing.assert_close(out.var(-1, unbiased=False), torch.ones(4, 6), atol=1e-3, rtol=0)


def test_layer_norm_ignores_batch_composition_and_padding():
    g = _gen(3)
    norm = _randomise(LayerNorm(8), 4)
    sentence = torch.randn(1, 5, 8, generator=g)
    others = torch.randn(3, 9, 8, generator=g) * 4 + 1
    padded = torch.cat([sentence, torch.zeros(1, 4, 8)], dim=1)  # [1, 9, 8]: 4 pad positions
    batch = torch.cat([padded, others], dim=0)  # [4, 9, 8]
    alone = norm(sentence)[0]  # [5, 8]
    torch.testing.assert_close(norm(batch)[0, :5], alone)
    torch.testing.assert_close(norm(batch[[3, 0, 1]])[1, :5], alone)  # another order, another batch


def test_layer_norm_rejects_bad_input():
    with pytest.raises(ValueError, match="gamma and beta must have shape"):
        layer_norm(torch.randn(2, 4), torch.ones(5), torch.zeros(5))
    with pytest.raises(TypeError, match="floating point"):
        layer_norm(torch.arange(4), torch.ones(4), torch.zeros(4))
    with pytest.raises(ValueError, match="gamma and beta must have shape"):
        LayerNorm(8)(torch.randn(2, 3, 4))


# -- the position-wise feed-forward network --------------------------------------------------------


def test_feed_forward_formula_and_module_agree():
    g = _gen(5)
    x = torch.randn(2, 5, 8, generator=g)
    ffn = _randomise(PositionwiseFeedForward(8, 32), 6)
    w1, b1 = ffn.linear1.weight.t(), ffn.linear1.bias
    w2, b2 = ffn.linear2.weight.t(), ffn.linear2.bias
    expected = torch.clamp(x @ w1 + b1, min=0) @ w2 + b2
    torch.testing.assert_close(ffn(x), expected)
    torch.testing.assert_close(feed_forward(x, w1, b1, w2, b2), expected)
    torch.testing.assert_close(feed_forward(x, w1, None, w2, None), torch.relu(x @ w1) @ w2)


def test_feed_forward_acts_on_each_position_independently():
    g = _gen(7)
    ffn = _randomise(PositionwiseFeedForward(8, 32), 8)
    x = torch.randn(3, 6, 8, generator=g)
    changed = x.clone()
    changed[1, 4] = torch.randn(8, generator=g)
    moved = (ffn(changed) - ffn(x)).abs().amax(dim=-1)  # [3, 6]
    assert moved[1, 4] > 1e-3
    moved[1, 4] = 0
    assert moved.max() == 0  # bit for bit: no other position even looks at position (1, 4)


def test_feed_forward_is_a_1x1_convolution():
    g = _gen(9)
    ffn = _randomise(PositionwiseFeedForward(8, 32), 10)
    conv1 = nn.Conv1d(8, 32, kernel_size=1)
    conv2 = nn.Conv1d(32, 8, kernel_size=1)
    with torch.no_grad():
        conv1.weight.copy_(ffn.linear1.weight[:, :, None])
        conv1.bias.copy_(ffn.linear1.bias)
        conv2.weight.copy_(ffn.linear2.weight[:, :, None])
        conv2.bias.copy_(ffn.linear2.bias)
    x = torch.randn(2, 7, 8, generator=g)
    conv_out = conv2(torch.relu(conv1(x.transpose(1, 2)))).transpose(1, 2)  # Conv1d wants [batch, channels, seq]
    torch.testing.assert_close(ffn(x), conv_out)


def test_feed_forward_rejects_bad_input():
    with pytest.raises(ValueError, match="activation must be one of"):
        PositionwiseFeedForward(8, 32, activation="tanh")
    with pytest.raises(ValueError, match="feed_forward needs"):
        feed_forward(torch.randn(2, 8), torch.randn(6, 32), None, torch.randn(32, 8), None)


# -- residual connections --------------------------------------------------------------------------


@pytest.mark.parametrize("norm_first", [False, True])
def test_residual_connection_formulas(norm_first):
    g = _gen(11)
    x = torch.randn(2, 5, 8, generator=g)
    sub = _randomise(nn.Linear(8, 8), 12)
    res = ResidualConnection(8, norm_first=norm_first)
    _randomise(res, 13)
    norm = lambda t: torch.nn.functional.layer_norm(t, (8,), res.norm.gamma, res.norm.beta)  # noqa: E731
    expected = x + sub(norm(x)) if norm_first else norm(x + sub(x))
    torch.testing.assert_close(res(x, sub), expected)
    torch.testing.assert_close(add_and_norm(x, sub, res.norm.gamma, res.norm.beta, norm_first), expected)


def test_residual_dropout_acts_on_the_sublayer_output_only():
    x = torch.randn(4, 8, generator=_gen(14))
    res = ResidualConnection(8, dropout=1.0, norm_first=True).train()  # drops every sub-layer output
    torch.testing.assert_close(res(x, lambda y: y * 100), x)


# -- the encoder and decoder layers against PyTorch's ---------------------------------------------


def _copy_attention(ours, theirs):
    theirs.in_proj_weight.copy_(torch.cat([ours.w_q.weight, ours.w_k.weight, ours.w_v.weight]))
    theirs.in_proj_bias.copy_(torch.cat([ours.w_q.bias, ours.w_k.bias, ours.w_v.bias]))
    theirs.out_proj.weight.copy_(ours.w_o.weight)
    theirs.out_proj.bias.copy_(ours.w_o.bias)


def _copy_common(ours, theirs, norms):
    with torch.no_grad():
        _copy_attention(ours.self_attn, theirs.self_attn)
        theirs.linear1.load_state_dict(ours.feed_forward.linear1.state_dict())
        theirs.linear2.load_state_dict(ours.feed_forward.linear2.state_dict())
        for i, residual in enumerate(norms, start=1):
            getattr(theirs, f"norm{i}").weight.copy_(residual.norm.gamma)
            getattr(theirs, f"norm{i}").bias.copy_(residual.norm.beta)


D, HEADS, D_FF = 16, 4, 40


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("with_padding", [False, True])
def test_encoder_layer_equals_torch(norm_first, with_padding):
    g = _gen(20)
    ours = _randomise(EncoderLayer(D, HEADS, D_FF, dropout=0.0, norm_first=norm_first), 21)
    theirs = nn.TransformerEncoderLayer(D, HEADS, D_FF, dropout=0.0, activation="relu", batch_first=True,
                                        norm_first=norm_first)
    _copy_common(ours, theirs, [ours.residual1, ours.residual2])
    theirs.train()  # train mode (dropout is 0) keeps torch off its fused fast path
    x = torch.randn(3, 6, D, generator=g)
    tokens = torch.tensor([[5, 6, 7, 8, 9, 1], [5, 6, 7, 0, 0, 0], [5, 6, 0, 0, 0, 0]])
    if with_padding:
        ours_out = ours(x, padding_mask(tokens, 0)[:, 0])  # [3, 1, 6]: True = may attend
        theirs_out = theirs(x, src_key_padding_mask=tokens == 0)  # True = pad
    else:
        ours_out, theirs_out = ours(x), theirs(x)
    torch.testing.assert_close(ours_out, theirs_out, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_layer_equals_torch(norm_first):
    g = _gen(22)
    ours = _randomise(DecoderLayer(D, HEADS, D_FF, dropout=0.0, norm_first=norm_first), 23)
    theirs = nn.TransformerDecoderLayer(D, HEADS, D_FF, dropout=0.0, activation="relu", batch_first=True,
                                        norm_first=norm_first)
    _copy_common(ours, theirs, [ours.residual1, ours.residual2, ours.residual3])
    with torch.no_grad():
        _copy_attention(ours.cross_attn, theirs.multihead_attn)
    x, memory = torch.randn(2, 5, D, generator=g), torch.randn(2, 7, D, generator=g)
    src = torch.tensor([[3, 4, 5, 6, 7, 8, 9], [3, 4, 5, 0, 0, 0, 0]])
    ours_out = ours(x, memory, src_mask=padding_mask(src, 0), tgt_mask=causal_mask(5))
    theirs_out = theirs(x, memory, tgt_mask=~causal_mask(5), memory_key_padding_mask=src == 0)  # torch: True = hide
    torch.testing.assert_close(ours_out, theirs_out, rtol=1e-5, atol=1e-5)


# -- stacks ------------------------------------------------------------------------------------------


def test_encoder_stacks_copies_with_independent_weights():
    layer = EncoderLayer(D, HEADS, D_FF)
    encoder = Encoder(layer, 3)
    assert len(encoder.layers) == 3
    pointers = [p.data_ptr() for p in encoder.parameters()]
    assert len(pointers) == len(set(pointers)), "two layers share a parameter tensor"
    assert all(p.data_ptr() not in pointers for p in layer.parameters()), "the stack shares the template's weights"
    with torch.no_grad():
        encoder.layers[0].feed_forward.linear1.weight.add_(1.0)
    assert not torch.equal(encoder.layers[0].feed_forward.linear1.weight, encoder.layers[1].feed_forward.linear1.weight)
    torch.testing.assert_close(encoder.layers[1].feed_forward.linear1.weight, layer.feed_forward.linear1.weight)


@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_equals_torch_encoder(norm_first):
    g = _gen(24)
    ours = Encoder(EncoderLayer(D, HEADS, D_FF, norm_first=norm_first), 3, norm_first=norm_first)
    _randomise(ours, 25)
    template = nn.TransformerEncoderLayer(D, HEADS, D_FF, dropout=0.0, batch_first=True, norm_first=norm_first)
    theirs = nn.TransformerEncoder(template, 3, norm=nn.LayerNorm(D) if norm_first else None,
                                   enable_nested_tensor=False)
    for o, t in zip(ours.layers, theirs.layers):
        _copy_common(o, t, [o.residual1, o.residual2])
    if norm_first:
        with torch.no_grad():
            theirs.norm.weight.copy_(ours.norm.gamma)
            theirs.norm.bias.copy_(ours.norm.beta)
    theirs.train()
    x = torch.randn(2, 6, D, generator=g)
    torch.testing.assert_close(ours(x), theirs(x), rtol=1e-5, atol=1e-5)


def test_stack_rejects_zero_layers():
    with pytest.raises(ValueError, match="number of layers"):
        Encoder(EncoderLayer(D, HEADS, D_FF), 0)


def test_base_encoder_parameter_count():
    with torch.device("meta"):
        encoder = Encoder(EncoderLayer(512, 8, 2048), 6)
    per_layer = 4 * (512 * 512 + 512) + (512 * 2048 + 2048) + (2048 * 512 + 512) + 2 * 2 * 512
    assert per_layer == 3_152_384
    assert count_parameters(encoder) == 6 * per_layer == 18_914_304


# -- the whole model -----------------------------------------------------------------------------------


def _small_model(**overrides):
    torch.manual_seed(0)
    config = TransformerConfig(src_vocab=13, tgt_vocab=11, d_model=16, n_heads=4, d_ff=32, n_layers=2,
                               dropout=0.0, max_len=32, **overrides)
    return EncoderDecoder(config).eval()


def test_encoder_decoder_forward_gives_log_probabilities():
    model = _small_model()
    src, tgt = torch.randint(1, 13, (3, 7)), torch.randint(1, 11, (3, 5))
    out = model(src, tgt, padding_mask(src, 0), causal_mask(5))
    assert out.shape == (3, 5, 11)
    torch.testing.assert_close(out.exp().sum(-1), torch.ones(3, 5))


def test_decoder_is_causal():
    model = _small_model()
    src = torch.randint(1, 13, (2, 6), generator=_gen(30))
    tgt = torch.randint(1, 11, (2, 6), generator=_gen(31))
    later = tgt.clone()
    later[:, 4] = (later[:, 4] + 3) % 11
    with torch.no_grad():
        a = model(src, tgt, None, causal_mask(6))
        b = model(src, later, None, causal_mask(6))
    torch.testing.assert_close(a[:, :4], b[:, :4])  # positions before the change: unchanged
    assert (a[:, 4:] - b[:, 4:]).abs().max() > 1e-4  # from the change on: different


@pytest.mark.parametrize("norm_first", [False, True])
def test_cached_step_by_step_decode_equals_full_decode(norm_first):
    model = _small_model(norm_first=norm_first)
    src = torch.tensor([[4, 5, 6, 7, 8, 0], [9, 10, 11, 0, 0, 0]])
    tgt = torch.randint(1, 11, (2, 6), generator=_gen(32))
    src_mask = padding_mask(src, 0)
    with torch.no_grad():
        memory = model.encode(src, src_mask)
        full = model.generator(model.decode(memory, src_mask, tgt, causal_mask(6)))
        cache = model.new_cache()
        steps = [model.generator(model.decode(memory, src_mask, tgt[:, t : t + 1], None, cache)) for t in range(6)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-5, atol=1e-5)
    assert cache[0].self_attn.length == 6


def test_token_embedding_scales_by_sqrt_d_model():
    emb = TokenEmbedding(10, 16)
    tokens = torch.tensor([[1, 2, 3]])
    torch.testing.assert_close(emb(tokens), emb.embedding.weight[tokens] * 4.0)


@pytest.mark.parametrize("bad,error,message", [
    (torch.tensor([[1.0, 2.0]]), TypeError, "integer token ids"),
    (torch.tensor([[1, 10]]), ValueError, r"token ids must lie in \[0, 10\)"),
    (torch.tensor([[-1, 2]]), ValueError, r"token ids must lie in \[0, 10\)"),
    ([[1, 2]], TypeError, "tensor of integer token ids"),
])
def test_token_embedding_rejects_bad_ids(bad, error, message):
    with pytest.raises(error, match=message):
        TokenEmbedding(10, 16)(bad)


def test_share_embeddings_ties_the_three_matrices():
    def build(share):
        torch.manual_seed(0)
        return EncoderDecoder(TransformerConfig(src_vocab=11, tgt_vocab=11, d_model=16, n_heads=4, d_ff=32,
                                                n_layers=2, dropout=0.0, share_embeddings=share))

    untied, tied = build(False), build(True)
    w = tied.src_embed.embedding.weight
    assert tied.tgt_embed.embedding.weight is w and tied.generator.proj.weight is w
    with torch.no_grad():
        w[3, 0] += 1.0  # one change shows in all three places
    assert tied.tgt_embed.embedding.weight[3, 0] == tied.generator.proj.weight[3, 0] == w[3, 0]
    assert count_parameters(untied) - count_parameters(tied) == 2 * 11 * 16  # two vocab x d_model matrices fewer
    with pytest.raises(ValueError, match="one vocabulary"):
        EncoderDecoder(TransformerConfig(src_vocab=12, tgt_vocab=11, d_model=16, n_heads=4, d_ff=32, n_layers=1,
                                         share_embeddings=True))


# -- the decoder layer's one copy of its forward pass (chapter 06's exercise) -------------------------


def test_decoder_layer_runs_the_top_level_decoder_layer_forward(monkeypatch):
    from transformer_lib import layers

    calls = []
    original = layers.decoder_layer_forward

    def counting(*args, **kwargs):
        calls.append(len(args) + len(kwargs))
        return original(*args, **kwargs)

    monkeypatch.setattr(layers, "decoder_layer_forward", counting)
    layer = _randomise(DecoderLayer(D, HEADS, D_FF), 31).eval()
    x, memory = torch.randn(2, 4, D), torch.randn(2, 3, D)
    out = layer(x, memory, None, causal_mask(4))
    assert len(calls) == 1
    torch.testing.assert_close(out, original(x, memory, None, causal_mask(4), layer))


@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_stack_runs_a_given_layer_forward(norm_first):
    from transformer_lib.layers import Decoder, decoder_layer_forward

    calls = []

    def learners(x, memory, src_mask, tgt_mask, layer):  # no cache parameter, like the exercise
        calls.append(layer)
        return decoder_layer_forward(x, memory, src_mask, tgt_mask, layer)

    library = _randomise(Decoder(DecoderLayer(D, HEADS, D_FF, norm_first=norm_first), 3, norm_first), 32).eval()
    theirs = Decoder(DecoderLayer(D, HEADS, D_FF, norm_first=norm_first), 3, norm_first, layer_forward=learners)
    theirs.load_state_dict(library.state_dict())
    x, memory = torch.randn(2, 4, D), torch.randn(2, 6, D)
    src = torch.tensor([[3, 4, 5, 6, 7, 8], [3, 4, 0, 0, 0, 0]])
    args = (x, memory, padding_mask(src, 0), causal_mask(4))
    torch.testing.assert_close(theirs.eval()(*args), library(*args))
    assert calls == list(theirs.layers)


def test_decoder_layer_forward_with_a_cache_equals_the_full_pass():
    from transformer_lib.layers import LayerCache, decoder_layer_forward

    layer = _randomise(DecoderLayer(D, HEADS, D_FF), 33).eval()
    x, memory = torch.randn(2, 5, D), torch.randn(2, 3, D)
    full = decoder_layer_forward(x, memory, None, causal_mask(5), layer)
    cache = LayerCache()
    steps = [decoder_layer_forward(x[:, t:t + 1], memory, None, None, layer, cache) for t in range(5)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-5, atol=1e-5)
    assert cache.self_attn.length == 5 and cache.cross_attn.length == 3
