"""nbval on the chapters that train, as another machine would run them.

PyTorch chooses its CPU kernels by the processor (`torch.backends.cpu.get_cpu_capability()`:
AVX512, AVX2 or DEFAULT) and splits work across threads; both change the order of float sums.
`ATEN_CPU_CAPABILITY` forces the kernels of a lesser CPU on this one, and OMP_NUM_THREADS the
thread count, so one machine can play the others. Each pass runs nbval, strict as in
`make test`, on one notebook in a fresh pytest process whose kernel inherits that setting.

A pass may also run the notebook as the Chinese edition runs it (`language="zh"`: the same code, its
claims, figures and check messages in Chinese). nbval then compares every output as strictly, except
the lines the checks print, which read differently in each language (tests/notebook_text.py's
sanitizer); and every claim line and figure text the run draws must hold no English a learner would
read (tests/test_zh_notebook_text.py): the Chinese edition rendered at no extra cost.
"""

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import notebook_text
from course_files import ROOT

# The chapters whose outputs come from float reductions or training (the others print exact
# arithmetic, text and integers). Chapter 11's numbers are timings, already outside comparison.
TRAINING_CHAPTERS = ["02_self_attention", "03_multi_head_attention", "05_add_norm_ffn", "06_decoder_masks", "07_training_inference",
                     "09_bert", "10_gpt", "12_vision_transformers"]


def run_nbval(chapter: str, language: str = "en", **env: str) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        _run_nbval(chapter, language, Path(scratch), **env)


def _run_nbval(chapter: str, language: str, scratch: Path, **env: str) -> None:
    notebook = ROOT / "solutions" / chapter / f"{chapter}.ipynb"
    environment = dict(os.environ, PYTHONHASHSEED="0", OMP_NUM_THREADS="1")
    environment.update(env)
    options = []
    if language == "zh":
        drawn = scratch / "drawn.jsonl"
        environment.update(COURSE_LANG="zh", COURSE_TEXT_LOG=str(drawn))
        environment.pop("JPY_SESSION_NAME", None)
        options = ["--nbval-sanitize-with", str(notebook_text.nbval_sanitizer(scratch / "sanitize.cfg"))]
    if int(environment["OMP_NUM_THREADS"]) > 1:
        # OpenMP's threads spin while they wait for work by default. Under `make test` the other
        # worker holds a core, so a spinning thread waits for a thread that cannot run: chapter 09
        # with two threads took 268 s in a full run, and more than 600 s beside one busy core, against
        # 32 s with passive waiting. The wait policy changes no arithmetic, only how threads idle.
        environment.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    environment.pop("PYTEST_XDIST_WORKER", None)
    # The run's output goes to a file, not into this process's memory: a run gone wrong cannot
    # grow the test worker, and its last lines are what the failure shows.
    with tempfile.TemporaryFile() as log:
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "-q", "--nbval",
             "--nbval-current-env", "--nbval-cell-timeout=300", *options, str(notebook)],
            cwd=ROOT, env=environment, stdout=log, stderr=subprocess.STDOUT, timeout=1200)
        log.seek(max(0, log.seek(0, os.SEEK_END) - 64_000))
        output = log.read().decode(errors="replace")
    if proc.returncode != 0:
        failed = [line for line in output.splitlines() if line.startswith(("FAILED", "ERROR"))]
        raise AssertionError(f"{chapter} with {env}, in {language}: {len(failed)} cells differ or fail\n"
                             + "\n".join(failed) + "\n\n" + output[-6000:])
    if language == "zh":
        notebook_text.assert_rendered_in_chinese(chapter, drawn)
