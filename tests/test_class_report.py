"""The class report (autograder/class_report.py): after `make grade`, what the class got wrong, per
chapter and exercise, by the checkers' catalogue names. A class of nine on chapter 02 with planted
mistakes, graded once: two students per catalogued mistake of scaled_attention (no sqrt(d_k) scale,
one of them on the Chinese edition; the mask's meaning flipped), one with two mistakes in two
exercises (softmax over dim 0, scores without the scale), two blank (the release as is), one whose
answer loops forever (the time limit), one correct. mistakes.csv holds exactly those counts; the
page opens in Chromium, offline, and shows the same numbers; no hidden test line reaches it; a
regrade after a fix no longer counts the student who fixed it, and COURSE_LANG=zh gives the page in
Chinese."""

import csv
import importlib.util
import shutil
import sys

import nbformat
import pytest

from course_files import ROOT, course_cli, hidden_lines, scratch_course

pytestmark = pytest.mark.slow

CHAPTER = "02_self_attention"
CELL_TIMEOUT = 15
NO_SCALE = "no sqrt(d_k) scale on the scores"
MASK_FLIPPED = "mask meaning inverted: the positions marked True were hidden"
SOFTMAX_DIM0 = "softmax taken over the first dimension (dim=0) instead of the last"
SCORES_UNSCALED = "no sqrt(d_k) scale (plain q @ k^T)"

BODIES = {
    "no_scale": """d_k = q.shape[-1]
scores = q @ k.transpose(-2, -1)
if mask is not None:
    scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
weights = torch.softmax(scores, dim=-1)
return weights @ v, weights""",
    "mask_flipped": """d_k = q.shape[-1]
scores = q @ k.transpose(-2, -1) / math.sqrt(d_k)
if mask is not None:
    scores = scores.masked_fill(mask, torch.finfo(scores.dtype).min)
weights = torch.softmax(scores, dim=-1)
return weights @ v, weights""",
    "softmax_dim0": """shifted = x - x.amax(dim=0, keepdim=True)
e = shifted.exp()
return e / e.sum(dim=0, keepdim=True)""",
    "scores_unscaled": "return q @ k.transpose(-2, -1)",
    "endless": "while True:\n    pass",
}
# student -> (edition, {answer grade id: body}); None: the release as is (blank)
CLASS = {
    "ana": ("en", {"scaled_attention": "no_scale"}),
    "ben": ("zh", {"scaled_attention": "no_scale"}),
    "dan": ("en", {"scaled_attention": "mask_flipped"}),
    "eve": ("en", {"scaled_attention": "mask_flipped"}),
    "fay": ("en", {"softmax": "softmax_dim0", "attention_scores": "scores_unscaled"}),
    "gus": ("en", None),
    "hal": ("zh", None),
    "ivy": ("en", {"self_attention_layer": "endless"}),
    "jon": ("en", {}),
}
EVERYONE_ELSE = "ana ben dan eve fay ivy jon".split()


def _builder():
    spec = importlib.util.spec_from_file_location("adversarial_build", ROOT / "autograder" / "adversarial" / "build.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _notebook(edition: str, wrong: dict | None):
    build = _builder()
    release, correct = build._sources()
    if edition == "zh":
        release = nbformat.read(ROOT / "chapters" / "zh" / CHAPTER / f"{CHAPTER}.ipynb", as_version=4)
    if wrong is None:
        return release
    return build.Notebook(release, correct).all_correct(**{gid: BODIES[b] for gid, b in wrong.items()}).nb


def _submit(course, student, nb):
    folder = course.submitted / student / CHAPTER
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    nbformat.write(nb, folder / f"{CHAPTER}.ipynb")


def _grade(course):
    lines = []
    report = course_cli.grade(course, cell_timeout=CELL_TIMEOUT, jobs=2, log=lines.append)
    return report, "\n".join(lines)


def _mistakes(course) -> dict:
    """(exercise, outcome, mistake) -> (count, students), and the rows in order."""
    with open(course.root / "autograder" / "mistakes.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert all(r["chapter"] == CHAPTER for r in rows)
    return {(r["exercise"], r["outcome"], r["mistake"]): (int(r["students"]), r["which_students"]) for r in rows}, rows


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    course = scratch_course(tmp_path_factory.mktemp("class") / "course", [CHAPTER])
    for student, (edition, wrong) in CLASS.items():
        _submit(course, student, _notebook(edition, wrong))
    report, log = _grade(course)
    assert report.graded == {(s, CHAPTER) for s in CLASS}, log
    return course, report, log


def test_the_planted_mistakes_are_counted_exactly(graded):
    course, report, log = graded
    counts, rows = _mistakes(course)
    blank = (2, "gus hal")
    expected = {
        ("scaled_attention", "mistake", NO_SCALE): (2, "ana ben"),  # one English, one Chinese: one name
        ("scaled_attention", "mistake", MASK_FLIPPED): (2, "dan eve"),
        ("scaled_attention", "blank", "(blank)"): blank,
        ("scaled_attention", "passed", "(passed)"): (3, "fay ivy jon"),
        ("softmax", "mistake", SOFTMAX_DIM0): (1, "fay"),
        ("softmax", "blank", "(blank)"): blank,
        ("softmax", "passed", "(passed)"): (6, "ana ben dan eve ivy jon"),
        ("attention_scores", "mistake", SCORES_UNSCALED): (1, "fay"),
        ("attention_scores", "blank", "(blank)"): blank,
        ("attention_scores", "passed", "(passed)"): (6, "ana ben dan eve ivy jon"),
        ("self_attention_layer", "limit", "(time or memory limit)"): (1, "ivy"),
        ("self_attention_layer", "blank", "(blank)"): blank,
        ("self_attention_layer", "passed", "(passed)"): (6, "ana ben dan eve fay jon"),
        ("project_qkv", "blank", "(blank)"): blank,
        ("project_qkv", "passed", "(passed)"): (7, " ".join(EVERYONE_ELSE)),
        ("self_attention", "blank", "(blank)"): blank,
        ("self_attention", "passed", "(passed)"): (7, " ".join(EVERYONE_ELSE)),
    }
    assert counts == expected, (counts, log)
    # the hardest exercise first: scaled_attention, 4 of the 7 who tried it failed; its mistakes first
    assert [r["exercise"] for r in rows[:4]] == ["scaled_attention"] * 4
    assert rows[0]["outcome"] == rows[1]["outcome"] == "mistake"
    assert rows[-1]["exercise"] in ("project_qkv", "self_attention")
    limit = next(r for r in rows if r["outcome"] == "limit")
    assert "time limit" in limit["differs"], limit
    print("\nmistakes.csv, top five rows:\n" + "\n".join(",".join(r.values()) for r in rows[:5]))


def test_the_page_shows_the_same_numbers_offline_and_no_hidden_test(graded):
    course, _, _ = graded
    page = course.root / "autograder" / "class_report.html"
    text = page.read_text()
    for line in hidden_lines(CHAPTER):
        assert line not in text, f"a hidden test line reached the class report: {line!r}"
    assert "case '" not in text and "http://" not in text and "https://" not in text and "<script" not in text
    assert text.count("data:image/png;base64,") == 1  # one chapter, one chart
    assert NO_SCALE in text and "feedback" not in [p.name for p in page.parents]
    # nothing of it in any student's feedback
    for student in CLASS:
        assert "class_report" not in (course.feedback / student / CHAPTER / f"{CHAPTER}.html").read_text()

    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.skip("Debian's chromium is not installed here: the page's numbers were not checked in a browser")
    sync_playwright = pytest.importorskip("playwright.sync_api").sync_playwright
    counts, _ = _mistakes(course)
    outside = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu"])
        try:
            tab = browser.new_page()
            tab.on("request", lambda r: outside.append(r.url) if not r.url.startswith(("file:", "data:")) else None)
            tab.goto(page.as_uri())
            cells = tab.eval_on_selector_all(
                "td.count", "tds => tds.map(td => [td.dataset.exercise, td.dataset.outcome, td.dataset.mistake, "
                            "td.textContent.trim(), td.closest('table').id])")
            loaded = tab.eval_on_selector_all("img", "imgs => imgs.map(i => i.complete && i.naturalWidth > 100)")
        finally:
            browser.close()
    assert not outside, outside
    assert loaded == [True], "the chart did not render from the page itself"
    shown = {}
    for exercise, outcome, mistake, number, table in cells:
        if table == "hardest":  # the summary: one cell per outcome (all the mistakes of an exercise together)
            total = sum(n for (e, o, _), (n, _) in counts.items() if e == exercise and o == outcome)
            assert int(number) == total, (exercise, outcome, number, total)
        elif int(number):
            label = mistake or {"unnamed": "(no catalogued mistake)", "blank": "(blank)", "passed": "(passed)",
                                "limit": "(time or memory limit)"}[outcome]
            shown[(exercise, outcome, label)] = int(number)
    assert shown == {key: n for key, (n, _) in counts.items()}


def test_a_regrade_after_a_fix_updates_the_report_in_the_instructors_language(graded, monkeypatch):
    import json

    course, _, _ = graded
    _submit(course, "ben", _notebook("zh", {}))  # ben fixes his scale
    # jon hands in his correct notebook again, with one change that alters nothing (so it is regraded),
    # while the instructor's shell says COURSE_LANG=zh: that chooses the report's language only, and
    # an English submission is still judged in English (it scored 0 when the variable reached its kernel).
    again = _notebook("en", {})
    again.metadata["resubmitted"] = True
    _submit(course, "jon", again)
    monkeypatch.setenv("COURSE_LANG", "zh")
    report, log = _grade(course)
    monkeypatch.delenv("COURSE_LANG")
    assert report.graded == {("ben", CHAPTER), ("jon", CHAPTER)}, log
    assert report.scores[("jon", CHAPTER)][0] == report.scores[("jon", CHAPTER)][1], log
    counts, _ = _mistakes(course)
    assert counts[("scaled_attention", "mistake", NO_SCALE)] == (1, "ana")
    assert counts[("scaled_attention", "passed", "(passed)")] == (4, "ben fay ivy jon")
    assert counts[("scaled_attention", "mistake", MASK_FLIPPED)] == (2, "dan eve")
    # the page in the instructor's language (COURSE_LANG=zh during that run)
    text = (course.root / "autograder" / "class_report.html").read_text()
    assert '<html lang="zh">' in text and "全班错在哪里" in text
    assert "分数没有除以 sqrt(d_k) 进行缩放" in text  # the catalogue's Chinese name for NO_SCALE
    assert _mistakes(course)[0] == counts  # the CSV keeps the English catalogue names
    # and in English again, from the same record, without grading (what grade() does last)
    record = json.loads((course.root / "autograder" / "graded.json").read_text())
    course_cli._class_report(course, record, print, "en")
    assert '<html lang="en">' in (course.root / "autograder" / "class_report.html").read_text()
