"""The learner's lab, used the way a learner uses it: `make lab`, Debian's chromium, Run All.

For every chapter: open the release in the lab `make lab` starts, press Run All, wait until the
kernel is idle, and look at what the learner sees: every code cell ran, the only errors are the
one-line check messages of the unfilled exercises, no traceback anywhere, no instructor menu or
panel, no news pop-up. Then fill one exercise with a catalogued mistake and see its name, and
fill it correctly and see the tick.

The chapters that do not train are opened in their Chinese edition (the training ones run in Chinese
in tests/test_other_cpus_default.py): every claim line and figure text their kernel draws is recorded
(COURSE_TEXT_LOG) and must hold no English a learner would read (tests/test_zh_notebook_text.py). The
code is the same in both editions, so the English release loses nothing by it.

The lab serves a scratch copy of chapters/, so the committed release is never touched.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import nbformat
import pytest

import notebook_text
from course_files import CHAPTERS, ROOT
from other_cpus import TRAINING_CHAPTERS
from transformer_lib.checks import REGISTRY
from transformer_lib.language import CHINESE, ENGLISH

pytestmark = pytest.mark.slow

CHROMIUM = shutil.which("chromium")
if CHROMIUM is None:
    pytest.skip("Debian's chromium is not installed here (and could not be: `make test` installs it with apt-get "
                "when run as root): the browser test is skipped", allow_module_level=True)
sync_playwright = pytest.importorskip("playwright.sync_api").sync_playwright

TOKEN = "course-browser-test"
RUN_ALL_TIMEOUT = 600  # seconds for one chapter's Run All under the suite's two processes
# Chapters whose training cells show tqdm's widget progress bars for several seconds.
TRAINS_WITH_PROGRESS_BARS = ["07_training_inference", "12_vision_transformers"]

# One exercise per chapter, filled from the keyboard: the answer cell's grade_id, a wrong
# answer that is a catalogued mistake (named by a few words of its name), a right one.
EXERCISES = {
    "01_static_to_contextual": (
        "cosine_similarity", "plain dot product",
        "def cosine_similarity(a, b): return a @ b.transpose(-1, -2)",
        "def cosine_similarity(a, b): return torch.nn.functional.normalize(a, dim=-1) @ "
        "torch.nn.functional.normalize(b, dim=-1).transpose(-1, -2)"),
    "02_self_attention": (
        "softmax", "not stabilised",
        "def softmax(x): return x.exp() / x.exp().sum(dim=-1, keepdim=True)",
        "def softmax(x): return (x - x.amax(dim=-1, keepdim=True)).exp() / "
        "(x - x.amax(dim=-1, keepdim=True)).exp().sum(dim=-1, keepdim=True)"),
    "03_multi_head_attention": (
        "split_heads", "without a transpose",
        "def split_heads(x, n_heads): return x.reshape(x.shape[0], n_heads, x.shape[1], -1)",
        "def split_heads(x, n_heads): return x.reshape(x.shape[0], x.shape[1], n_heads, -1).transpose(1, 2)"),
    "04_positional_encoding": (
        "add_positions", "offset ignored",
        "def add_positions(x, pe, offset=0): return x + pe[: x.shape[-2]]",
        "def add_positions(x, pe, offset=0): return x + pe[offset : offset + x.shape[-2]]"),
    "05_add_norm_ffn": (
        "layer_norm", "unbiased variance",
        "def layer_norm(x, gamma, beta, eps=1e-5): return gamma * (x - x.mean(-1, keepdim=True)) / "
        "(x.var(-1, keepdim=True) + eps).sqrt() + beta",
        "def layer_norm(x, gamma, beta, eps=1e-5): return gamma * (x - x.mean(-1, keepdim=True)) / "
        "(x.var(-1, keepdim=True, unbiased=False) + eps).sqrt() + beta"),
    "06_decoder_masks": (
        "make_causal_mask", "upper triangle",
        "def make_causal_mask(size): return torch.ones(size, size, dtype=torch.bool).triu()",
        "def make_causal_mask(size): return torch.ones(size, size, dtype=torch.bool).tril()"),
    "07_training_inference": (
        "top_k_filter", "smallest",
        "def top_k_filter(logits, k): return logits.masked_fill(logits > logits.topk(k, dim=-1, largest=False)"
        ".values[..., -1:], float('-inf'))",
        "def top_k_filter(logits, k): return logits.masked_fill(logits < logits.topk(k, dim=-1).values[..., -1:], "
        "float('-inf'))"),
    "08_tokenization": ("oov_rate",    "a percentage",
      "def oov_rate(vocab, words): return 100 * sum(w not in vocab for w in words) / len(words)",
      "def oov_rate(vocab, words): return sum(w not in vocab for w in words) / len(words)"),
    "09_bert": ("embedding_sum",    "segment embedding left out",
      "def embedding_sum(ids, segment_ids, token_table, segment_table, position_table): return token_table[ids] + position_table[: ids.shape[-1]]",
      "def embedding_sum(ids, segment_ids, token_table, segment_table, position_table): return token_table[ids] + segment_table[segment_ids] + position_table[: ids.shape[-1]]"),
    "10_gpt": ("gpt_block", "post-norm",
      "def gpt_block(x, block, cache=None):\n"
      "    past = 0 if cache is None else cache.length\n"
      "    mask = causal_mask(past + x.shape[1])[past:]\n"
      "    x = block.ln_1(x + block.dropout(block.self_attn(x, x, x, mask, cache=cache)))\n"
      "    return block.ln_2(x + block.dropout(block.feed_forward(x)))",
      "def gpt_block(x, block, cache=None):\n"
      "    past = 0 if cache is None else cache.length\n"
      "    mask = causal_mask(past + x.shape[1])[past:]\n"
      "    h = block.ln_1(x)\n"
      "    x = x + block.dropout(block.self_attn(h, h, h, mask, cache=cache))\n"
      "    return x + block.dropout(block.feed_forward(block.ln_2(x)))"),
    "11_long_sequences": ("sliding_window_mask",    "inverted",
      "def sliding_window_mask(size, window, causal=False): return ~(((torch.arange(size)[:, None] - torch.arange(size)[None, :]).abs() <= window) & ((torch.arange(size)[:, None] >= torch.arange(size)[None, :]) | (not causal)))",
      "def sliding_window_mask(size, window, causal=False): return ((torch.arange(size)[:, None] - torch.arange(size)[None, :]).abs() <= window) & ((torch.arange(size)[:, None] >= torch.arange(size)[None, :]) | (not causal))"),
    "12_vision_transformers": ("vit_forward", "mean of the patch tokens",
      "def vit_forward(images, model):\n"
      "    tokens = model.patch_embed(model.patchify(images, model.config.patch_size))\n"
      "    cls = model.cls_token.expand(images.shape[0], -1, -1)\n"
      "    return model.head(model.encoder(torch.cat([cls, tokens], 1) + model.pos_embed)[:, 1:].mean(1))",
      "def vit_forward(images, model):\n"
      "    tokens = model.patch_embed(model.patchify(images, model.config.patch_size))\n"
      "    cls = model.cls_token.expand(images.shape[0], -1, -1)\n"
      "    return model.head(model.encoder(torch.cat([cls, tokens], 1) + model.pos_embed)[:, 0])"),
}


# What an unfinished test cell, the summary of an untouched chapter and a passing check begin with.
WORDS = {ENGLISH: {"unfinished": "not implemented yet", "none passing": "Exercises passing: 0 of", "all pass": ": all "},
         CHINESE: {"unfinished": "还没有实现", "none passing": "已通过的练习：0 /", "all pass": "：全部 "}}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """`make lab` as README starts it, on a scratch copy of chapters/, with a fixed token."""
    tmp = tmp_path_factory.mktemp("lab")
    workdir = tmp / "chapters"
    shutil.copytree(ROOT / "chapters", workdir)
    port = _free_port()
    env = dict(os.environ, BROWSER="true", JUPYTER_TOKEN=TOKEN, JUPYTER_RUNTIME_DIR=str(tmp / "runtime"),
               JUPYTERLAB_SETTINGS_DIR=str(tmp / "settings"), JUPYTERLAB_WORKSPACES_DIR=str(tmp / "workspaces"),
               COURSE_TEXT_LOG=str(tmp / "drawn.jsonl"))
    log = open(tmp / "lab.log", "w+")
    proc = subprocess.Popen(["make", "--no-print-directory", "lab", f"LAB_PORT={port}", f"LAB_DIR={workdir}"],
                            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.time() + 180
    while True:
        log.seek(0)
        text = log.read()
        if f"127.0.0.1:{port}/lab" in text:
            break
        if proc.poll() is not None or time.time() > deadline:
            os.killpg(proc.pid, signal.SIGTERM)
            pytest.fail(f"`make lab` did not start:\n{text[-3000:]}")
        time.sleep(0.5)
    yield {"url": f"http://127.0.0.1:{port}", "dir": workdir, "log": tmp / "lab.log", "shots": tmp,
           "runtime": tmp / "runtime", "drawn": tmp / "drawn.jsonl"}
    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(timeout=30)


@pytest.fixture(scope="module")
def browser():
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
            "--disable-component-update", "--disable-sync"])
        yield chromium
        chromium.close()


def _open(browser, url):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(url)
    page.wait_for_selector(".jp-LabShell", timeout=120_000)
    return page


def _assert_no_instructor_tools_or_news(page):
    menus = [t.strip() for t in page.locator(".lm-MenuBar-itemLabel").all_inner_texts()]
    assert not any(m.lower() in {"nbgrader", "formgrader", "assignments", "courses"} for m in menus), menus
    labels = " ".join(page.locator(".lm-TabBar-tab").evaluate_all(
        "tabs => tabs.map(t => (t.getAttribute('title') || '') + ' ' + t.innerText)"))
    for word in ["Formgrader", "Assignment List", "Course List", "Create Assignment"]:
        assert word not in labels, f"the learner's lab shows {word!r}"
    toasts = " ".join(page.locator(".Toastify__toast").all_inner_texts())
    assert "news" not in toasts.lower(), f"a news pop-up appeared: {toasts!r}"


def test_the_lab_opens_on_the_start_page_without_instructor_tools(lab, browser):
    page = _open(browser, f"{lab['url']}/?token={TOKEN}")
    page.wait_for_selector(".jp-RenderedMarkdown >> text=How a chapter works", timeout=60_000)
    time.sleep(3)  # pop-ups, if any, appear a moment after the shell
    _assert_no_instructor_tools_or_news(page)
    links = page.locator(".jp-RenderedMarkdown a").evaluate_all("as => as.map(a => a.getAttribute('href'))")
    for chapter in CHAPTERS:
        assert any(f"{chapter}/{chapter}.ipynb" in (link or "") for link in links), f"the start page does not link {chapter}"
    page.screenshot(path=str(lab["shots"] / "start.png"))
    page.close()


def _kernel_idle(page) -> bool:
    return page.evaluate("""async () => {
        const r = await fetch('/api/sessions', {headers: {Authorization: 'token %s'}});
        const sessions = await r.json();
        return sessions.length > 0 && sessions.every(s => s.kernel.execution_state === 'idle');
    }""" % TOKEN)


# The notebook in the tab on show (a page may keep other tabs, hidden).
NOTEBOOK = ".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook"


def _code_prompts(page) -> list[str]:
    return page.locator(f"{NOTEBOOK} .jp-CodeCell .jp-InputArea-prompt").all_inner_texts()


def _status_bar(page) -> str:
    return " ".join(page.locator(".jp-StatusBar-TextItem").all_inner_texts())


PROGRESS_BAR = f"{NOTEBOOK} .jp-OutputArea .widget-hprogress"
POLL = 0.5  # seconds between two looks at the page while Run All goes on
LOOKS_STOPPED_FOR = 8  # polls (about four seconds) in a row: a flicker between two cells is not a stop


def _wait_until_all_ran(page, n_code_cells: int, timeout: float) -> dict:
    """Wait for Run All to finish; meanwhile, hold the lab to looking busy while it runs: the kernel
    status "Busy" and a `[*]` prompt as long as any cell has not run (seen wrong once: Idle and
    `[ ]` for a minute while a training cell's progress bars moved). Returns what was seen."""
    deadline, idle_polls, stopped_look = time.time() + timeout, 0, 0
    seen = {"busy with a progress bar": 0}
    while time.time() < deadline:
        prompts = _code_prompts(page)
        done = len(prompts) == n_code_cells and all(re.fullmatch(r"\[\d+\]:", p.strip()) for p in prompts)
        if not done:
            status, running = _status_bar(page), any("*" in p for p in _code_prompts(page))
            looks_busy = "Busy" in status and running
            stopped_look = 0 if looks_busy else stopped_look + 1
            assert stopped_look < LOOKS_STOPPED_FOR, (
                f"cells are still to run, but the lab looks stopped: status bar {status!r}, "
                f"{'a' if running else 'no'} [*] prompt; prompts {prompts}")
            if looks_busy and page.locator(PROGRESS_BAR).count():
                seen["busy with a progress bar"] += 1
        idle_polls = idle_polls + 1 if done and _kernel_idle(page) else 0
        if idle_polls >= 3:
            return seen
        time.sleep(POLL)
    pytest.fail(f"Run All did not finish in {timeout} s; prompts: {_code_prompts(page)}")


def _run_menu(page, item: str):
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(f"^{re.escape(item)}$")).first.click()


def _cell(page, index: int):
    return page.locator(f"{NOTEBOOK} .jp-Cell").nth(index)


def _type_into(page, index: int, code: str):
    cell = _cell(page, index)
    cell.scroll_into_view_if_needed()
    cell.locator(".cm-content").click()
    page.keyboard.press("Control+A")
    page.keyboard.insert_text(code)


def _run_cell(page, index: int):
    _cell(page, index).locator(".cm-content").click()
    page.keyboard.press("Control+Enter")


def _output_text(page, index: int) -> str:
    return _cell(page, index).locator(".jp-OutputArea").inner_text()


def _wait_for_output(page, index: int, pattern: str, timeout: float = 120) -> str:
    deadline = time.time() + timeout
    while time.time() < deadline:
        text = _output_text(page, index)
        if re.search(pattern, text):
            return text
        time.sleep(0.25)
    pytest.fail(f"cell {index} never showed {pattern!r}; it shows:\n{_output_text(page, index)}")


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_run_all_on_a_fresh_release_goes_through(lab, browser, chapter):
    try:
        _run_all_and_fill_one_exercise(lab, browser, chapter, ENGLISH if chapter in TRAINING_CHAPTERS else CHINESE)
    finally:
        _shut_down_kernels(lab["url"])


def _run_all_and_fill_one_exercise(lab, browser, chapter, language=ENGLISH):
    folder = f"{CHINESE}/{chapter}" if language == CHINESE else chapter
    release = nbformat.read(ROOT / "chapters" / folder / f"{chapter}.ipynb", as_version=4)
    code_cells = [c for c in release.cells if c.cell_type == "code"]
    graded = {i for i, c in enumerate(code_cells) if c.metadata.get("nbgrader", {}).get("grade")
              and not c.metadata.get("nbgrader", {}).get("solution")}
    # A workspace of its own, reset: the lab must not reopen the previous chapter's tab.
    page = _open(browser, f"{lab['url']}/lab/workspaces/{chapter}-{language}/tree/{folder}/{chapter}.ipynb?reset&token={TOKEN}")
    page.wait_for_selector(f"{NOTEBOOK} .jp-Cell", timeout=120_000)
    page.wait_for_function("() => document.querySelector('.jp-Notebook-ExecutionIndicator') !== null", timeout=60_000)
    deadline = time.time() + 120
    while not _kernel_idle(page):
        if time.time() > deadline:
            pytest.fail(f"{chapter}: the kernel was not idle 120 s after the notebook opened: {_status_bar(page)!r}")
        time.sleep(0.5)
    lab["drawn"].write_text("")  # what this chapter's kernel draws, from here on
    _run_menu(page, "Run All Cells")
    seen = _wait_until_all_ran(page, len(code_cells), RUN_ALL_TIMEOUT)
    if language == CHINESE:
        notebook_text.assert_rendered_in_chinese(chapter, lab["drawn"])
    if chapter in TRAINS_WITH_PROGRESS_BARS:  # the training cell was watched running, bars moving
        assert seen["busy with a progress bar"] >= 6, f"{chapter}: never saw a training cell run: {seen}"
    page.screenshot(path=str(lab["shots"] / f"{chapter}-run-all.png"), full_page=False)
    _assert_no_instructor_tools_or_news(page)

    # What the learner sees, cell by cell.
    code_locators = page.locator(f"{NOTEBOOK} .jp-CodeCell")
    assert code_locators.count() == len(code_cells)
    for i in range(len(code_cells)):
        cell = code_locators.nth(i)
        errors = cell.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")
        text = cell.locator(".jp-OutputArea").inner_text()
        assert "Traceback (most recent call last)" not in text and "Cell In[" not in text, (
            f"{chapter}: code cell {i} shows a traceback:\n{text[:1500]}")
        if i in graded:
            continue
        assert "CheckFailed" not in text, f"{chapter}: code cell {i} (not a test cell) shows an error:\n{text[:800]}"
        assert errors.count() == 0 or "Error" not in " ".join(errors.all_inner_texts()), (
            f"{chapter}: code cell {i} shows an error:\n{text[:800]}")
    # Every test cell of an unfilled exercise shows exactly its one-line message.
    for i in graded:
        text = code_locators.nth(i).locator(".jp-OutputArea").inner_text().strip()
        assert text.startswith("CheckFailed:") and WORDS[language]["unfinished"] in text and len(text.splitlines()) == 1, (
            f"{chapter}: test cell {i} shows:\n{text[:800]}")
    # The last code cell is the chapter's summary: nothing passes yet.
    summary = code_locators.nth(len(code_cells) - 1).locator(".jp-OutputArea").inner_text()
    assert WORDS[language]["none passing"] + f" {len(graded)}" in summary, summary
    _test_cells_still_test_the_learner(lab, chapter, [code_cells[i].source for i in sorted(graded)], language)

    # Fill one exercise: a catalogued mistake is named, a right answer gets its tick.
    grade_id, keyword, wrong, right = EXERCISES[chapter]
    checker = REGISTRY[grade_id]
    mistake = next(m for m in checker.mistakes if keyword in m.name)
    cells = release.cells
    answer = next(i for i, c in enumerate(cells) if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)
    test = next(i for i in range(answer + 1, len(cells)) if cells[i].metadata.get("nbgrader", {}).get("grade"))
    _type_into(page, answer, wrong)
    _run_cell(page, answer)
    _run_cell(page, test)
    seen = _wait_for_output(page, test, re.escape(mistake.message(checker.name, language)[:60]))
    assert seen.strip().startswith("CheckFailed:") and len(seen.strip().splitlines()) == 1
    _type_into(page, answer, right)
    _run_cell(page, answer)
    _run_cell(page, test)
    _wait_for_output(page, test, "\u2713 " + re.escape(checker.name + WORDS[language]["all pass"]))
    page.screenshot(path=str(lab["shots"] / f"{chapter}-{language}-filled.png"))
    page.close()


def _test_cells_still_test_the_learner(lab, chapter: str, sources: list[str], language: str):
    """Every graded test cell again, after the whole chapter ran, in the kernel Run All used: each
    must still fail with its one-line message. Nothing in the chapter may have rebound a learner's
    function to the reference (that would make a test pass on an empty stub). The cells are sent
    through a second client of the same kernel: the learner's tab is left as Run All left it."""
    from jupyter_client import BlockingKernelClient

    headers = {"Authorization": f"token {TOKEN}"}
    with urllib.request.urlopen(urllib.request.Request(f"{lab['url']}/api/sessions", headers=headers), timeout=30) as r:
        sessions = json.loads(r.read())
    assert len(sessions) == 1, f"{chapter}: one kernel expected, found {sessions}"
    client = BlockingKernelClient()
    client.load_connection_file(str(lab["runtime"] / f"kernel-{sessions[0]['kernel']['id']}.json"))
    client.start_channels()
    try:
        client.wait_for_ready(timeout=60)
        for index, source in enumerate(sources):
            errors = []
            client.execute_interactive(source, timeout=120, output_hook=lambda msg: errors.append(msg["content"])
                                       if msg["msg_type"] == "error" else None)
            assert len(errors) == 1 and errors[0]["ename"] == "CheckFailed" and \
                WORDS[language]["unfinished"] in errors[0]["evalue"], (
                    f"{chapter}: graded test cell {index + 1}, run again after the whole chapter, no longer fails "
                    f"on the unfilled stub: {errors}")
    finally:
        client.stop_channels()


def _shut_down_kernels(url: str):
    """Every kernel the chapter started, so the next chapter runs alone."""
    headers = {"Authorization": f"token {TOKEN}"}
    with urllib.request.urlopen(urllib.request.Request(f"{url}/api/sessions", headers=headers), timeout=30) as r:
        sessions = json.loads(r.read())
    for session in sessions:
        request = urllib.request.Request(f"{url}/api/sessions/{session['id']}", headers=headers, method="DELETE")
        urllib.request.urlopen(request, timeout=30).close()
