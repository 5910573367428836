"""The isolation layer and the pieces the independent check is built from, one guarantee at a time.

Run as root on a machine with bubblewrap (CI), every guarantee must hold. Where the machine lacks
a feature (no bubblewrap, no namespaces), the test of each guarantee the fallback cannot give is
skipped and says why, instead of passing silently."""

import json
import os
import subprocess
import sys

import nbformat
import pytest
import torch

from course_files import ROOT, course_cli, released, solution

sys.path.insert(0, str(ROOT / "autograder"))
import hiding  # noqa: E402
import isolation  # noqa: E402
import sanitize  # noqa: E402

from transformer_lib.checks import get_checker  # noqa: E402
from transformer_lib.checks.core import validate_outputs  # noqa: E402

GUARANTEES = ["not root", "mount fails", "read-only root", "private /dev/shm", "no network", "secrets hidden",
              "own PID namespace", "no other environment", "children die"]


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    """One probe run inside a sandbox made as the grader makes them, with a library copy bound in."""
    iso = isolation.detect()
    tmp = tmp_path_factory.mktemp("secrets")
    gradebook = tmp / "gradebook.db"
    gradebook.write_text("the gradebook")
    os.chmod(gradebook, 0o644)
    secrets = [str(ROOT / "solutions"), str(ROOT / "solutions" / "02_self_attention" / "02_self_attention.ipynb"),
               str(gradebook), str(ROOT / "autograder"), str(ROOT / ".git")]
    copy = hiding.build_copy(tmp / "libraries", [])
    spec = isolation.SandboxSpec(read_only=[(str(copy / "transformer_lib"), str(hiding.library_root()))]
                                 if iso.mode == "bubblewrap" else [])
    os.environ["COURSE_PROBE_SECRET"] = "visible only to the grader"
    try:
        with isolation.job_uid() as uid:
            spec.uid = uid
            result = isolation.verify(spec, secrets, iso)
    finally:
        del os.environ["COURSE_PROBE_SECRET"]
    return iso, result


@pytest.mark.parametrize("guarantee", GUARANTEES)
def test_sandbox_guarantee(probe, guarantee):
    iso, result = probe
    held, detail = result[guarantee]
    if not held and iso.is_fallback:
        pytest.skip(f"not checked: {iso.mode} isolation ({iso.reason}) cannot give '{guarantee}' here ({detail})")
    if guarantee == "not root" and not held and os.geteuid() != 0:
        pytest.skip("not checked: not running as root, and the user namespace maps this user to itself")
    assert held, f"{guarantee}: {detail} ({iso.describe()})"


def test_the_isolation_used_is_named_and_fallbacks_are_loud():
    assert isolation.detect().describe().startswith("isolation: ")
    fallback = isolation.Isolation("rlimits", "bwrap is not installed")
    assert "WARNING" in fallback.describe() and "bubblewrap" in fallback.describe()


def test_the_probe_can_fail():
    """Run without the sandbox, the same probe sees the secrets and the host's processes: the
    guarantees above are measured, not assumed."""
    import tempfile

    with tempfile.TemporaryDirectory(dir="/tmp") as folder:
        os.chmod(folder, 0o755)
        secret = os.path.join(folder, "gradebook.db")
        with open(secret, "w") as f:
            f.write("x")
        os.chmod(secret, 0o644)
        result = isolation.verify(isolation.SandboxSpec(), [secret], isolation.Isolation("rlimits", "no sandbox"),
                                  confine=lambda argv: argv)
    assert not result["secrets hidden"][0]
    assert not result["own PID namespace"][0]


def test_wall_clock_kill_takes_every_process_of_the_sandbox_with_it():
    iso = isolation.detect()
    if iso.mode != "bubblewrap":
        pytest.skip(f"not checked: {iso.mode} isolation has no PID namespace to take the children with it")
    with isolation.job_uid() as uid:
        spec = isolation.SandboxSpec(uid=uid)
        code = "import subprocess, time\nfor _ in range(20):\n    subprocess.Popen(['sleep', '3600'], start_new_session=True)\ntime.sleep(3600)"
        proc = subprocess.Popen(isolation.wrap(spec, [isolation.python_executable(), "-c", code]), cwd="/",
                                start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        import time

        deadline = time.monotonic() + 60
        while len(isolation.processes_of_uid(uid)) < 21 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert len(isolation.processes_of_uid(uid)) >= 21
        isolation.kill_group(proc)
        time.sleep(0.5)
        assert isolation.processes_of_uid(uid) == []


def test_limits_apply_inside(tmp_path):
    iso = isolation.detect()
    limits = isolation.Limits(memory=2 * 2**30, file_size=2**20, processes=64)
    with isolation.job_uid() as uid:
        spec = isolation.SandboxSpec(uid=uid, limits=limits)
        code = ("import resource, json\nprint(json.dumps([resource.getrlimit(r)[0] for r in "
                "(resource.RLIMIT_AS, resource.RLIMIT_FSIZE, resource.RLIMIT_NPROC, resource.RLIMIT_CORE)]))")
        out = subprocess.run(isolation.wrap(spec, [isolation.python_executable(), "-I", "-c", code], iso),
                             cwd=isolation.host_cwd(spec, iso) or str(tmp_path), capture_output=True, text=True,
                             timeout=120)
    assert json.loads(out.stdout) == [2 * 2**30, 2**20, 64, 0], out.stderr


def test_folders_bound_from_under_the_hosts_tmp_stay_visible(tmp_path):
    """A fresh clone under /tmp (its .venv, its transformer_lib) is bound into a sandbox whose own
    /tmp is private: the binds must land on top of that private /tmp, not under it."""
    iso = isolation.detect()
    if iso.mode != "bubblewrap":
        pytest.skip(f"only bubblewrap binds folders ({iso.mode} isolation here)")
    assert str(tmp_path).startswith("/tmp/"), tmp_path
    (tmp_path / "course").mkdir()
    (tmp_path / "course" / "seen.txt").write_text("seen")
    (tmp_path / "secret.txt").write_text("secret")
    with isolation.job_uid() as uid:
        spec = isolation.SandboxSpec(uid=uid, read_only=[(str(tmp_path / "course"), str(tmp_path / "course"))])
        code = (f"import os\nprint(open({str(tmp_path / 'course' / 'seen.txt')!r}).read(), "
                f"os.path.exists({str(tmp_path / 'secret.txt')!r}))")
        out = subprocess.run(isolation.wrap(spec, [isolation.python_executable(), "-I", "-c", code], iso),
                             cwd=isolation.host_cwd(spec, iso), capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["seen", "False"], out.stderr


# -- the library without the references being graded -----------------------------------------------


def test_a_copy_hides_the_reference_and_keeps_the_rest(tmp_path):
    refs, problems = hiding.references_of(get_checker("softmax"))
    assert problems == [] and [h.dotted for h in refs] == ["transformer_lib.attention.softmax"]
    copy = hiding.build_copy(tmp_path, refs)
    source = (copy / "transformer_lib" / "attention.py").read_text()
    original = (hiding.library_root() / "attention.py").read_text()
    body = original[original.index("def softmax("):].split("\ndef ")[0]
    assert body not in source, "the reference's code is not in the copy"
    code = ("import sys, torch; sys.path.insert(0, sys.argv[1]); import transformer_lib.attention as a\n"
            "x = torch.randn(2, 3)\nprint(a.attention_scores(x, x).shape)\n"
            "try:\n    a.softmax(x)\nexcept Exception as e:\n    print(type(e).__name__)")
    out = subprocess.run([sys.executable, "-c", code, str(copy)], capture_output=True, text=True, timeout=300)
    assert out.stdout.split("\n")[:2] == ["torch.Size([2, 2])", "ReferenceHiddenError"], out.stderr


def test_copies_are_cached_by_content(tmp_path):
    refs, _ = hiding.references_of(get_checker("softmax"))
    first = hiding.build_copies(tmp_path, [refs, []])
    assert hiding.build_copies(tmp_path, [refs, []]) == first
    assert first[0] != first[1]


# -- reading the outputs back -------------------------------------------------------------------------


class Evil(torch.Tensor):
    pass


class Count(int):
    pass


@pytest.mark.parametrize("outputs, problem", [
    ([torch.ones(2), {"__type__": "error", "__error__": "ValueError: x"}], None),
    ([(torch.ones(2), 1.5), [True, None, "text"]], None),
    ([torch.ones(2).as_subclass(Evil), torch.ones(1)], "case 1: an object of type"),
    ([Count(3), torch.ones(1)], "case 1: an object of type"),
    ([torch.ones(2)], "expected outputs for 2 cases, got 1"),
    ((torch.ones(1), torch.ones(1)), "expected a list"),
    ([torch.ones(2, dtype=torch.float32).to_sparse(), torch.ones(1)], "layout"),
    ([{1: torch.ones(1)}, torch.ones(1)], "dict key"),
    ([object(), torch.ones(1)], "an object of type builtins.object"),
])
def test_outputs_are_validated(outputs, problem):
    found = validate_outputs(outputs, 2)
    if problem is None:
        assert found is None
    else:
        assert found is not None and problem in found, found


def test_outputs_over_the_element_budget_are_rejected():
    assert "elements" in validate_outputs([torch.zeros(1000), torch.zeros(1000)], 2, max_elements=1500)


# -- rebuilding a submission on the release --------------------------------------------------------------


@pytest.fixture(scope="module")
def kit(tmp_path_factory):
    from course_files import scratch_course

    course = scratch_course(tmp_path_factory.mktemp("kit"), ["02_self_attention"])
    return course_cli.build_kit(course, "02_self_attention")


def _sanitized(kit, nb):
    raw = nbformat.writes(nb).encode() if not isinstance(nb, bytes) else nb
    return sanitize.sanitize(raw, kit.templates, kit.notebook_metadata, set(kit.release_code))


def test_an_untouched_release_and_the_solutions_need_no_note(kit):
    assert _sanitized(kit, released("02_self_attention")).notes == []
    assert _sanitized(kit, solution("02_self_attention")).notes == []


def test_tampered_metadata_ids_and_tests_become_notes(kit):
    nb = released("02_self_attention")
    answer = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "softmax")
    answer.metadata["nbgrader"]["schema_version"] = 99
    duplicate = nbformat.from_dict(json.loads(json.dumps(answer)))
    duplicate["id"] = "copied-answer"
    nb.cells.insert(nb.cells.index(answer) + 1, duplicate)
    test = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "project_qkv_test")
    test.source = "pass"
    nb.cells = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") != "self_attention_test"]
    clean = _sanitized(kit, nb)
    text = " | ".join(clean.notes)
    assert "schema_version 99" in text and "repeats the nbgrader id 'softmax'" in text
    assert clean.edited_tests == ["project_qkv_test"] and clean.deleted_tests == ["self_attention_test"]
    restored = [c for c in clean.notebook["cells"] if c["metadata"].get("nbgrader", {}).get("grade_id") == "project_qkv_test"]
    assert restored[0]["source"] == "check_project_qkv(project_qkv)"
    ids = [c["metadata"].get("nbgrader", {}).get("grade_id") for c in clean.notebook["cells"]]
    assert ids.count("softmax") == 1


@pytest.mark.parametrize("raw", [b'{"cells": [ {"cell_type": "code", ', b"\xff\xfe", b'{"cells": 3, "nbformat": 4}',
                                 b'{"nbformat": 99, "cells": []}'])
def test_unreadable_notebooks_are_reported(kit, raw):
    clean = _sanitized(kit, raw)
    assert clean.notebook is None and "could not be read" in clean.notes[0]


# -- the grading policy's static scans ----------------------------------------------------------------------


def test_reference_imports_are_found_however_they_are_spelled():
    refs = ["transformer_lib.attention.softmax"]
    for code in ["from transformer_lib.attention import softmax as s", "import transformer_lib.attention as a\na.softmax(x)",
                 "from transformer_lib import attention\nattention.softmax", "y = check_softmax.reference(x)"]:
        assert sanitize.uses_reference([code], refs, ["check_softmax"]), code
    assert not sanitize.uses_reference(["from transformer_lib.checks import yours_or_reference"], refs, ["check_softmax"])


def test_forbidden_calls_are_found_and_instructor_lines_are_not_counted():
    forbidden = ["torch.softmax", "torch.nn.functional.softmax", "torch.Tensor.softmax"]
    assert sanitize.uses_forbidden(["import torch.nn.functional as F\ndef f(x):\n    return F.softmax(x, -1)"], forbidden)
    assert sanitize.uses_forbidden(["def f(x):\n    return x.softmax(-1)"], forbidden) == ["torch.Tensor.softmax"]
    assert sanitize.uses_forbidden(["def f(x):\n    e = x.exp()\n    return e / e.sum(-1, keepdim=True)"], forbidden) == []
    line = "weights = torch.softmax(scores, dim=-1)"
    assert sanitize.uses_forbidden([line], forbidden, release_lines={line}) == []


def test_the_policy_reads_each_checkers_declaration_and_scores_a_flag_zero():
    import policy
    from transformer_lib.checks import get_checker

    softmax = policy.forbidden_for(get_checker("check_softmax"))
    assert {"torch.softmax", "torch.nn.functional.softmax", "torch.Tensor.softmax", "aten._softmax"} <= set(softmax)
    assert policy.forbidden_for(get_checker("check_attention_scores")) == ()
    flags = policy.flags_for(["transformer_lib.attention.softmax"], [])
    assert len(flags) == 1 and "reference implementation (transformer_lib.attention.softmax)" in flags[0]
    assert policy.score(2.0, True, []) == 2.0
    assert policy.score(2.0, True, flags) == 0.0  # right outputs, but the reference: 0
    assert policy.score(2.0, False, []) == 0.0


def test_checker_calls_are_read_from_the_test_source():
    calls = course_cli.checker_calls("check_softmax(softmax)\n### BEGIN HIDDEN TESTS\ncheck_softmax(softmax, hidden=True)\n### END HIDDEN TESTS")
    assert [(c.checker, c.function, c.hidden) for c in calls] == [("check_softmax", "softmax", False), ("check_softmax", "softmax", True)]
