"""Properties that name an error from the output alone (see core.Property).

A catalogue entry matches one exact wrong answer. These match a *trait* of a wrong output,
so they still name the error when a learner combines two mistakes. Each builder returns a
`Property`; `select` picks the tensor to look at when an exercise returns several
(attention returns `(output, weights)`: `select=lambda out: out[1]` looks at the weights).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from .core import Property

Select = Callable[[Any], Any]


def _identity(output):
    return output


def _float_tensors(expected, actual, select: Select):
    e, a = select(expected), select(actual)
    if not (isinstance(e, torch.Tensor) and isinstance(a, torch.Tensor)):
        return None, None
    if not (e.is_floating_point() and a.is_floating_point()):
        return None, None
    return e.double(), a.double()


def rows_do_not_sum_to_one(dim: int = -1, what: str = "the keys", fix: str | None = None,
                           select: Select = _identity) -> Property:
    """The reference's rows sum to 1 along `dim`; the learner's do not (finite ones included)."""

    def seen(case, expected, actual):
        e, a = _float_tensors(expected, actual, select)
        if e is None or a.shape != e.shape:
            return False
        e_sums, a_sums = e.sum(dim), a.sum(dim)
        rows = e_sums.isfinite() & ((e_sums - 1).abs() < 1e-4) & a_sums.isfinite()
        return bool(rows.any()) and bool(((a_sums[rows] - 1).abs() > 1e-3).any())

    return Property(
        f"weights that do not sum to 1 along {what} (dim={dim})",
        fix or f"Normalise along {what}: every sum and max is over dim={dim}, with keepdim=True.",
        seen,
    )


def not_finite_on_large_inputs(fix: str, select: Select = _identity) -> Property:
    """NaN or inf where the reference is finite: typically exp() of a large score."""

    def seen(case, expected, actual):
        e, a = _float_tensors(expected, actual, select)
        if e is None or a.shape != e.shape:
            return False
        return bool((~a.isfinite() & e.isfinite()).any())

    return Property("NaN or inf on large inputs where the reference stays finite", fix, seen)


def transposed(fix: str, dims: tuple[int, int] = (-2, -1), select: Select = _identity) -> Property:
    """The learner's output equals the reference's with two dimensions swapped."""

    def seen(case, expected, actual):
        e, a = _float_tensors(expected, actual, select)
        if e is None or e.dim() < 2:
            return False
        swapped = e.transpose(*dims)
        if a.shape != swapped.shape or torch.equal(swapped, e):
            return False
        return torch.allclose(a, swapped, rtol=1e-4, atol=1e-5)

    return Property(f"the reference's output with dimensions {dims[0]} and {dims[1]} swapped", fix, seen)


def shape_permuted(fix: str, select: Select = _identity) -> Property:
    """The right sizes in the wrong order: a missing or misplaced transpose/permute."""

    def seen(case, expected, actual):
        e, a = select(expected), select(actual)
        if not (isinstance(e, torch.Tensor) and isinstance(a, torch.Tensor)):
            return False
        return a.shape != e.shape and sorted(a.shape) == sorted(e.shape)

    return Property("a shape with the right sizes in the wrong order", fix, seen)


def mask_inverted(fix: str = "The course's convention is True = may attend, False = hidden.",
                  select: Select = _identity) -> Property:
    """A boolean mask with True and False swapped on some case (alone or with another error)."""

    def seen(case, expected, actual):
        e, a = select(expected), select(actual)
        if not (isinstance(e, torch.Tensor) and isinstance(a, torch.Tensor)):
            return False
        if e.dtype != torch.bool or a.dtype != torch.bool or a.numel() != e.numel():
            return False
        # Entry by entry (a mask in another layout is not "inverted"): most of the True
        # entries and most of the False ones flipped, possibly with a second, smaller error.
        e, a = e.flatten(), a.flatten()
        if e.all() or not e.any():
            return False
        return bool((~a[e]).float().mean() > 0.5 and a[~e].float().mean() > 0.5)

    return Property("a mask with True and False swapped", fix, seen)


def not_a_bool_mask(select: Select = _identity) -> Property:
    """A mask returned as 0/1 or 0/-inf numbers instead of booleans."""

    def seen(case, expected, actual):
        e, a = select(expected), select(actual)
        return (isinstance(e, torch.Tensor) and isinstance(a, torch.Tensor)
                and e.dtype == torch.bool and a.dtype != torch.bool)

    return Property(
        "a mask of numbers instead of booleans",
        "Return a torch.bool tensor (True = may attend); the attention function turns it into -inf itself.",
        seen,
    )


def not_zero_mean_unit_variance(dim: int = -1, fix: str | None = None, select: Select = _identity) -> Property:
    """For a normalisation with unit gain and zero bias: each vector along `dim` should have
    mean 0 and variance 1 (the reference's output does); the learner's does not."""

    def seen(case, expected, actual):
        e, a = _float_tensors(expected, actual, select)
        if e is None or a.shape != e.shape:
            return False
        e_ok = (e.mean(dim).abs() < 1e-3).all() and ((e.var(dim, unbiased=False) - 1).abs() < 0.05).all()
        a_ok = (a.mean(dim).abs() < 1e-3).all() and ((a.var(dim, unbiased=False) - 1).abs() < 0.05).all()
        return bool(e_ok and not a_ok)

    return Property(
        f"vectors along dim={dim} that do not come out with mean 0 and variance 1",
        fix or f"Take the mean and the variance over the features, dim={dim} (keepdim=True), not over the batch.",
        seen,
    )
