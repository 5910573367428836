"""A class whose answers are hidden (`make hub ANSWERS=hidden`, autograder/hiding.py build_student_library).

* its library holds no source and no bytecode of a graded reference: a student cannot read `softmax`'s
  from their kernel (import, inspect) or their shell (the files), and calling it says in one line which
  exercise it is, in English or Chinese;
* a blank chapter runs through with it (Run All: no execute reply is an error), each cell that needs an
  answer not yet passed saying so in one line, in the notebook's language;
* `make lab`'s library, the installed one, keeps every reference (and building the class's copy does not
  touch it).

One chapter (02) is hidden in the copy these tests build (a few seconds; the whole course's takes about
a minute, for `make hub`); which references a class hides is checked for every chapter without building.
"""

import ast
import json
import marshal
import os
import re
import subprocess
import sys
import types

import pytest

from course_files import ROOT, is_test_cell, released
import hiding  # noqa: E402  (autograder/, on the path through course_files)

CHAPTER = "02_self_attention"


def _student_env(site) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("COURSE_LANG", "JPY_SESSION_NAME")}
    return dict(env, PYTHONPATH=str(site), MPLBACKEND="Agg", OMP_NUM_THREADS="1")


@pytest.fixture(scope="module")
def student_site(tmp_path_factory):
    """A student server's site-packages holding the class's transformer_lib, with chapter 02's answers hidden."""
    before = hiding.library_digest()
    site = tmp_path_factory.mktemp("servers-site")
    package = hiding.build_student_library(site, chapters=[CHAPTER])
    assert package == site / "transformer_lib"
    assert hiding.library_digest() == before, "building the class's library changed the course's own"
    return site


def test_every_graded_reference_is_hidden_with_its_exercise_number():
    from transformer_lib.checks import REGISTRY

    exercises = hiding.graded_exercises()
    every = {h for checker in REGISTRY.values() for h in hiding.references_of(checker)[0]}
    assert set(exercises) == every
    headings = {}  # chapter -> {the learner's name: its number}, from the release's "Exercise N — `name`"
    for chapter in {e.chapter for e in exercises.values()}:
        text = "".join(c.source for c in released(chapter).cells if c.cell_type == "markdown")
        headings[chapter] = {name: int(n) for n, name in re.findall(r"Exercise (\d+) — `([^`]+)`", text)}
    for hidden, exercise in exercises.items():
        assert headings[exercise.chapter].get(exercise.function) == exercise.number, (hidden, exercise)


# Run in the student's kernel after the chapter: what importing `softmax` gives, and what calling it says.
_READ_SOFTMAX = """
import inspect, json, sys
import transformer_lib
from transformer_lib.attention import softmax as reference_softmax
from transformer_lib.checks.core import AnswerHidden
from transformer_lib.language import set_language
said = []
for language in ("en", "zh"):
    set_language(language)
    try:
        reference_softmax(torch.tensor([1.0, 2.0]))
    except AnswerHidden as exc:
        said.append(str(exc))
set_language(None)
modules = [m.__file__ for name, m in sys.modules.items() if name.split(".")[0] == "transformer_lib"]
print(json.dumps({"source": inspect.getsource(reference_softmax), "said": said, "modules": modules}))
"""

# One kernel of a student's server (nbclient, in a process of its own, the class's library on its path):
# Run All of the English chapter, then of the Chinese one (its language found from the notebook's
# metadata, as JupyterLab's kernel finds it), then the cell above. Each cell's execute reply and outputs.
_KERNEL = """
import json, os, sys
import nbformat
from nbclient import NotebookClient
english, chinese, out = sys.argv[1:4]
replies, cells = {}, {}
nb = nbformat.read(english, as_version=4)
client = NotebookClient(nb, timeout=120, kernel_name="python3", allow_errors=False, resources={"metadata": {"path": out}},
                        on_cell_executed=lambda cell, cell_index, execute_reply:
                            replies.__setitem__(id(cell), execute_reply["content"]["status"]))
with client.setup_kernel():
    for language, path in (("en", english), ("zh", chinese)):
        notebook = nbformat.read(path, as_version=4)
        switch = nbformat.v4.new_code_cell(f"import os; os.environ['JPY_SESSION_NAME'] = {path!r}")
        client.execute_cell(switch, 0)
        for index, cell in enumerate(notebook.cells):
            if cell.cell_type == "code":
                client.execute_cell(cell, index)
        cells[language] = [{"index": i, "replied": replies.get(id(c)), "outputs": c.outputs}
                           for i, c in enumerate(notebook.cells) if c.cell_type == "code"]
    probe = nbformat.v4.new_code_cell(sys.stdin.read())
    client.execute_cell(probe, 0)
print(json.dumps({"cells": cells, "softmax": json.loads(probe.outputs[-1]["text"])}))
"""


@pytest.fixture(scope="module")
def student_kernel(student_site, tmp_path_factory):
    out = tmp_path_factory.mktemp("student-home")
    paths = []
    for edition in ("", "zh"):
        target = out / edition / f"{CHAPTER}.ipynb"
        target.parent.mkdir(exist_ok=True)
        target.write_bytes((ROOT / "chapters" / edition / CHAPTER / f"{CHAPTER}.ipynb").read_bytes())
        paths.append(str(target))
    proc = subprocess.run([sys.executable, "-c", _KERNEL, *paths, str(out)], input=_READ_SOFTMAX, cwd=out,
                          env=_student_env(student_site), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


def _code_objects(code):
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _code_objects(const)


def test_a_student_cannot_read_softmax_from_their_kernel_or_their_shell(student_site, student_kernel):
    import inspect

    from transformer_lib.attention import softmax as reference

    # The kernel: what importing it gives, and what calling it says.
    seen = student_kernel["softmax"]
    assert seen["modules"] and all(path.startswith(str(student_site)) for path in seen["modules"]), seen["modules"]
    assert "amax" not in seen["source"] and "exp" not in seen["source"], seen["source"]
    assert seen["said"] == [
        "skipped: this cell needs `softmax` (chapter 2, exercise 3), whose answer this class keeps hidden",
        "已跳过：这个单元格需要 `softmax`（第 2 章，练习 3），本班隐藏了它的答案"]

    # The shell: no file of the copy holds the reference's body or docstring, in source or in bytecode.
    body = inspect.getsource(reference)
    docstring = inspect.getdoc(reference).splitlines()[0]
    statements = [ast.unparse(s) for s in ast.parse(body).body[0].body[1:]]  # after the docstring
    files = [p for p in student_site.rglob("*") if p.is_file()]
    assert any(p.suffix == ".pyc" for p in files)
    for path in files:
        data = path.read_bytes()
        assert docstring.encode() not in data, path
        if path.suffix == ".py":
            text = ast.unparse(ast.parse(data.decode()))  # the same spelling as `statements`
            assert not all(s in text for s in statements), f"{path} holds softmax's body"
        elif path.suffix == ".pyc":
            for code in _code_objects(marshal.loads(data[16:])):
                if code.co_name == "softmax" and code.co_filename.endswith("attention.py"):
                    assert "hidden" in code.co_names and "amax" not in code.co_names, path


WORDS = {
    "en": {"unfinished": "not implemented yet", "handed": "your `softmax` does not pass its check yet, and this class "
           "keeps the answers hidden", "needs": "skipped: this cell needs your `softmax` (exercise 3), which does not "
           "pass its check yet", "made": "which a cell above did not make: it was skipped for `",
           "summary": "Exercises passing: 0 of 6"},
    "zh": {"unfinished": "还没有实现", "handed": "你的 `softmax` 还没有通过检查，而本班隐藏了参考答案",
           "needs": "已跳过：这个单元格需要你的 `softmax`（练习 3），它还没有通过检查",
           "made": "上面的一个单元格没有生成它：那个单元格因 `", "summary": "已通过的练习：0 / 6"},
}


@pytest.mark.parametrize("language", ["en", "zh"])
def test_run_all_goes_through_a_blank_chapter_with_one_line_per_skipped_cell(student_kernel, language):
    cells, words = student_kernel["cells"][language], WORDS[language]
    tests = {i for i, c in enumerate(released(CHAPTER).cells) if is_test_cell(c)}
    assert [c["index"] for c in cells if c["replied"] != "ok"] == [], "an error reply stops JupyterLab's Run All"
    errors = {c["index"]: o["traceback"] for c in cells for o in c["outputs"] if o["output_type"] == "error"}
    printed = "".join(o.get("text", "") for c in cells for o in c["outputs"] if o["output_type"] == "stream")
    assert all(len(lines) == 1 for lines in errors.values()), "a traceback, not one line"
    assert tests <= set(errors) and all(words["unfinished"] in errors[i][0] for i in tests), errors
    skipped = [lines[0] for i, lines in errors.items() if i not in tests]
    assert any(words["needs"] in line for line in skipped), skipped
    assert any(words["made"] in line for line in skipped), skipped  # a later cell's missing variable
    assert words["handed"] in printed and words["summary"] in printed, printed[-500:]  # ran to the end
    if language == "zh":
        assert "skipped" not in " ".join(skipped) and "this class" not in printed


def test_make_labs_library_keeps_every_reference(student_site, capsys):
    import inspect

    import transformer_lib
    from transformer_lib.attention import softmax
    from transformer_lib.checks import get_checker, yours_or_reference
    from transformer_lib.checks.core import _hidden_exercises

    library = ROOT / "transformer_lib"
    assert transformer_lib.__file__ == str(library / "__init__.py")
    assert "x.amax(dim=dim, keepdim=True)" in inspect.getsource(softmax)
    assert _hidden_exercises() == {} and not (library / "_grading_hidden.py").exists()

    def wrong(x):
        return x

    assert yours_or_reference(wrong, get_checker("softmax")) is softmax
    assert capsys.readouterr().out == "your `wrong` does not pass its check yet: using the reference\n"
