"""The published model sizes, built as real model objects.

Build them on PyTorch's `meta` device to count parameters without allocating memory:

    >>> from transformer_lib import configs
    >>> model = configs.transformer_base(device="meta")
    >>> configs.count_parameters(model)
    63119496

Each factory's docstring states the reference count and what it assumes (the vocabulary, or the
image size and the number of classes).
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


# ---------------------------------------------------------------------------------------
# BERT (Devlin et al., 2019) and GPT-2 (Radford et al., 2019)
# ---------------------------------------------------------------------------------------

# BERT's uncased English WordPiece vocabulary, and GPT-2's byte-level BPE vocabulary
# (256 bytes + 50,000 merges + <|endoftext|>).
BERT_VOCAB = 30522
GPT2_VOCAB = 50257


def bert_base(vocab_size: int = BERT_VOCAB, device=None):
    """BERT-base (Devlin et al., 2019, section 3): L=12, H=768, A=12, feed-forward 4H = 3072.

    Reference: 110M parameters. Built here: the encoder with its pooler (Hugging Face's
    BertModel), 30,522 WordPiece tokens, 512 positions, 2 segments: 109,482,240 parameters
    (23.8M in the embeddings, 85.1M in the layers, 0.6M in the pooler). The pre-training
    heads (transformer_lib.bert.BertForPreTraining) are not counted: their output matrix is the
    tied token embedding, so they add only 624,188 (MLM transform and bias, NSP).
    """
    from .bert import Bert, BertConfig

    config = BertConfig(vocab_size=vocab_size, max_len=512, n_segments=2, d_model=768, n_heads=12,
                        n_layers=12, d_ff=3072, dropout=0.1)
    with _on(device):
        return Bert(config)


def bert_large(vocab_size: int = BERT_VOCAB, device=None):
    """BERT-large (Devlin et al., 2019, section 3): L=24, H=1024, A=16, feed-forward 4H = 4096.

    Reference: 340M parameters. Built as bert_base (encoder with pooler, 30,522 WordPiece
    tokens, 512 positions, 2 segments): 335,141,888 parameters, 1.4% under the paper's rounded figure.
    """
    from .bert import Bert, BertConfig

    config = BertConfig(vocab_size=vocab_size, max_len=512, n_segments=2, d_model=1024, n_heads=16,
                        n_layers=24, d_ff=4096, dropout=0.1)
    with _on(device):
        return Bert(config)


def gpt2_small(vocab_size: int = GPT2_VOCAB, device=None):
    """GPT-2 small (Radford et al., 2019): 12 layers, d_model 768, 12 heads, a 1,024-token context.

    Reference: 124M parameters, the size of OpenAI's released checkpoint (named "124M"; the
    paper's Table 2 gives 117M for this model). Built here with 50,257 byte-level BPE tokens,
    1,024 learned positions and the output layer tied to the token embedding: 124,439,808
    parameters (38.6M in the token embedding, 0.8M in the positions, 85.1M in the blocks).
    """
    from .gpt import GPT, GPTConfig

    config = GPTConfig(vocab_size=vocab_size, max_len=1024, d_model=768, n_heads=12, n_layers=12, dropout=0.1)
    with _on(device):
        return GPT(config)


__all__ += ["bert_base", "bert_large", "gpt2_small", "BERT_VOCAB", "GPT2_VOCAB"]


# ---------------------------------------------------------------------------------------
# ViT (Dosovitskiy et al., 2021) and Swin (Liu et al., 2021)
# ---------------------------------------------------------------------------------------

IMAGENET_CLASSES = 1000


def vit_b16(n_classes: int = IMAGENET_CLASSES, image_size: int = 224, device=None):
    """ViT-B/16 (Dosovitskiy et al., 2021, Table 1): 12 layers, d_model 768, 12 heads, MLP 3072,
    16 x 16 patches.

    Reference: 86M parameters. Built here for 224 x 224 RGB images (196 patches + [CLS] = 197
    learned positions) and a 1,000-class ImageNet head on [CLS], without the pre-training's extra
    hidden layer in the head: 86,567,656 parameters (0.6M in the patch embedding, 0.15M in the
    positions and [CLS], 85.1M in the layers, 0.77M in the head), as timm's and Hugging Face's
    ViT-B/16 classifiers.
    """
    from .vision import ViT, ViTConfig

    config = ViTConfig(image_size=image_size, patch_size=16, in_channels=3, n_classes=n_classes, d_model=768,
                       n_heads=12, n_layers=12, d_ff=3072)
    with _on(device):
        return ViT(config)


def swin_t(n_classes: int = IMAGENET_CLASSES, image_size: int = 224, device=None):
    """Swin-T (Liu et al., 2021, section 3.3): C = 96, stages of {2, 2, 6, 2} blocks with {3, 6, 12, 24}
    heads, 4 x 4 patches, 7 x 7 windows, MLP ratio 4.

    Reference: 28M parameters (the paper's Table 1, with 81.3% ImageNet top-1). Built here for
    224 x 224 RGB images (56 x 56 patches, then 28, 14 and 7) and a 1,000-class head on the average
    of the last stage: 28,288,354 parameters, relative-position tables included (a [13^2, heads]
    table per block), as timm's and Hugging Face's Swin-T count them (their relative-index and mask
    buffers are not parameters; this library computes the index and the mask when a block runs).
    """
    from .vision import Swin, SwinConfig

    config = SwinConfig(image_size=image_size, patch_size=4, in_channels=3, n_classes=n_classes, embed_dim=96,
                        depths=(2, 2, 6, 2), n_heads=(3, 6, 12, 24), window=7)
    with _on(device):
        return Swin(config)


__all__ += ["vit_b16", "swin_t", "IMAGENET_CLASSES"]
