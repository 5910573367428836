"""The training chapters pass nbval with PyTorch's plain kernels (no vector extensions) (tests/other_cpus.py)."""

import pytest

from other_cpus import TRAINING_CHAPTERS, run_nbval

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("chapter", TRAINING_CHAPTERS)
def test_nbval_passes(chapter):
    run_nbval(chapter, ATEN_CPU_CAPABILITY="default")
