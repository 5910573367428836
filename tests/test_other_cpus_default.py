"""The training chapters pass nbval with PyTorch's plain kernels (no vector extensions) (tests/other_cpus.py),
run as the Chinese edition runs them: their claims and figures are held to speaking Chinese there
(tests/test_zh_notebook_text.py), and every other output is compared as in English."""

import pytest

from other_cpus import TRAINING_CHAPTERS, run_nbval

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("chapter", TRAINING_CHAPTERS)
def test_nbval_passes(chapter):
    run_nbval(chapter, language="zh", ATEN_CPU_CAPABILITY="default")
