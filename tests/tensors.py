"""Shared helpers for the tests that compare attention with PyTorch's."""

import torch

# float32 carries ~7 significant digits, float64 ~16; two implementations that sum in
# different orders agree to a few ulps of the dtype, not bit for bit.
TOL = {
    torch.float32: dict(rtol=1e-5, atol=1e-6),
    torch.float64: dict(rtol=1e-12, atol=1e-13),
}


def random_qkv(batch, l_q, l_k, d_k, d_v, dtype, seed=0):
    """Seeded queries [*batch, l_q, d_k], keys [*batch, l_k, d_k] and values [*batch, l_k, d_v]."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(*batch, l_q, d_k, generator=g, dtype=dtype)
    k = torch.randn(*batch, l_k, d_k, generator=g, dtype=dtype)
    v = torch.randn(*batch, l_k, d_v, generator=g, dtype=dtype)
    return q, k, v
