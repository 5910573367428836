"""Small images that ship with an installed dependency: scikit-learn's 8x8 handwritten digits.

`sklearn.datasets.load_digits` reads a file inside the scikit-learn package (1,797 images of
8 x 8 pixels, 17 grey levels 0..16, ten classes; the UCI "optical recognition of handwritten
digits" test set). Nothing is downloaded. `digits_split()` is the one fixed, seeded,
class-stratified train/test split every chapter and test uses; `digits_split(validation_size=n)`
carves a validation set out of its training images, the same way, leaving the test set as it is.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

import torch

N_LEVELS = 17  # pixel values are the integers 0..16


@dataclass
class DigitsSplit:
    """Images as float [N, 1, 8, 8] in [0, 1] (pixel / 16), labels as int64 [N].

    The validation set is empty unless digits_split was asked for one: it is for choosing
    settings (a learning rate), so that the test set is looked at once, at the end."""

    train_images: torch.Tensor
    train_labels: torch.Tensor
    test_images: torch.Tensor
    test_labels: torch.Tensor
    val_images: torch.Tensor = field(default_factory=lambda: torch.zeros(0, 1, 8, 8))
    val_labels: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.int64))

    def subset(self, n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """n training images and their labels, the first n of a seeded permutation (n = all: every image)."""
        total = self.train_images.shape[0]
        if not 1 <= n <= total:
            raise ValueError(f"a subset of the training set needs 1 <= n <= {total}, got {n}")
        order = torch.randperm(total, generator=torch.Generator().manual_seed(seed))[:n]
        return self.train_images[order], self.train_labels[order]

    @staticmethod
    def levels(images: torch.Tensor) -> torch.Tensor:
        """The original integer grey levels 0..16 of images scaled by digits_split."""
        return (images * (N_LEVELS - 1)).round().long()


@lru_cache(maxsize=None)
def _load(test_size: int, seed: int, validation_size: int):
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x_train, x_test, y_train, y_test = train_test_split(
        digits.images, digits.target, test_size=test_size, random_state=seed, stratify=digits.target)
    x_val, y_val = x_train[:0], y_train[:0]
    if validation_size:  # from the training images only: the test set is the same with or without it
        x_train, x_val, y_train, y_val = train_test_split(
            x_train, y_train, test_size=validation_size, random_state=seed, stratify=y_train)
    as_images = lambda a: torch.tensor(a, dtype=torch.float32).reshape(-1, 1, 8, 8) / (N_LEVELS - 1)  # noqa: E731
    return (as_images(x_train), torch.tensor(y_train), as_images(x_test), torch.tensor(y_test),
            as_images(x_val), torch.tensor(y_val, dtype=torch.int64))


def digits_split(test_size: int = 450, seed: int = 0, validation_size: int = 0) -> DigitsSplit:
    """scikit-learn's 1,797 digits, split once: 1,347 training and 450 test images by default,
    each class in the same proportion in both (stratified), the same split on every machine.

    validation_size > 0 moves that many of the training images (stratified again) into a
    validation set; the test images do not change."""
    if not 10 <= test_size <= 1787:
        raise ValueError(f"test_size must leave at least 10 images on each side, got {test_size}")
    if not 0 <= validation_size <= 1787 - test_size - 10 or 0 < validation_size < 10:
        raise ValueError(f"validation_size must be 0, or at least 10 and leave at least 10 training images, "
                         f"got {validation_size}")
    return DigitsSplit(*(t.clone() for t in _load(test_size, seed, validation_size)))


__all__ = ["DigitsSplit", "digits_split", "N_LEVELS"]
