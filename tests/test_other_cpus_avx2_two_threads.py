"""The training chapters pass nbval as a typical laptop runs them: PyTorch's AVX2 kernels (a CPU
without AVX-512) on two threads per kernel (tests/other_cpus.py). Both change the order of float
sums, each in its own way; one pass with both costs half of two passes (each was about 230 s of
a full `make test`), and a claim that holds under the pair is one a learner's machine confirms."""

import pytest

from other_cpus import TRAINING_CHAPTERS, run_nbval

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("chapter", TRAINING_CHAPTERS)
def test_nbval_passes(chapter):
    run_nbval(chapter, ATEN_CPU_CAPABILITY="avx2", OMP_NUM_THREADS="2")
