"""The published model sizes, built as real model objects.

Build them on PyTorch's `meta` device to count parameters without allocating memory:

    >>> from transformer_lib import configs
    >>> model = configs.transformer_base(device="meta")
    >>> configs.count_parameters(model)
    63119496

Each factory's docstring states the reference count and the vocabulary it assumes.
"""

from __future__ import annotations

import contextlib

import torch

from .layers import EncoderDecoder, TransformerConfig, count_parameters

# "sentences were encoded using byte-pair encoding, which has a shared source-target
# vocabulary of about 37000 tokens" (Vaswani et al., 2017, section 5.1).
WMT14_EN_DE_VOCAB = 37000


def _on(device):
    return torch.device(device) if device is not None else contextlib.nullcontext()


def transformer_base(vocab_size: int = WMT14_EN_DE_VOCAB, device=None) -> EncoderDecoder:
    """"Attention Is All You Need", Table 3, base: N=6, d_model=512, d_ff=2048, h=8, P_drop=0.1.

    Reference: 65M parameters. Assumed here: one shared vocabulary of 37,000 tokens and the
    paper's weight sharing (both embeddings and the pre-softmax projection are one matrix,
    section 3.4), post-norm layers, sinusoidal positions (no parameters). That gives
    63,119,496 parameters (44.1M in the layers, 18.9M in the shared embedding, 37,000 in the
    output bias): 2.9% under the paper's rounded figure, which the paper does not break down.
    """
    config = TransformerConfig(vocab_size, vocab_size, d_model=512, n_heads=8, d_ff=2048, n_layers=6,
                               dropout=0.1, share_embeddings=True)
    with _on(device):
        return EncoderDecoder(config)


def transformer_big(vocab_size: int = WMT14_EN_DE_VOCAB, device=None) -> EncoderDecoder:
    """"Attention Is All You Need", Table 3, big: N=6, d_model=1024, d_ff=4096, h=16, P_drop=0.3.

    Reference: 213M parameters. With the same assumptions as transformer_base (37,000 shared
    tokens, tied embeddings and output projection): 214,282,376 parameters, 0.6% over.
    """
    config = TransformerConfig(vocab_size, vocab_size, d_model=1024, n_heads=16, d_ff=4096, n_layers=6,
                               dropout=0.3, share_embeddings=True)
    with _on(device):
        return EncoderDecoder(config)


__all__ = ["transformer_base", "transformer_big", "count_parameters", "WMT14_EN_DE_VOCAB"]
