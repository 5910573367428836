"""The training chapters pass nbval with two threads per kernel instead of one (tests/other_cpus.py)."""

import pytest

from other_cpus import TRAINING_CHAPTERS, run_nbval

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("chapter", TRAINING_CHAPTERS)
def test_nbval_passes(chapter):
    run_nbval(chapter, OMP_NUM_THREADS="2")
