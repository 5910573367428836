"""environment.yml (conda users) must mirror pyproject.toml (pip users) exactly.

pyproject.toml is the single source of truth for every pin. Its [project].dependencies are the
learner's install (`make lab`); the extras `grade` and `test` add what grading and the test
suite need. environment.yml asks conda for Python and pip only, and installs the learner's
dependencies through pip with the same pinned requirement strings, plus the library itself (`-e .`).
"""

import re
import sys
import tomllib
from pathlib import Path

import pytest
import yaml  # PyYAML: a direct dependency of the pinned jupytext and nbgrader
from packaging.requirements import Requirement  # a dependency of the pinned pytest
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = ROOT / "pyproject.toml"
ENVIRONMENT = ROOT / "environment.yml"
LOCAL_INSTALL = "-e ."


def load_pyproject(path: Path = PYPROJECT) -> dict:
    with path.open("rb") as f:
        return tomllib.load(f)


def load_environment(path: Path = ENVIRONMENT) -> tuple[list[str], list[str]]:
    """(conda-level dependencies, pip-section dependencies) of an environment.yml."""
    env = yaml.safe_load(path.read_text())
    conda, pip = [], []
    for dep in env.get("dependencies") or []:
        if isinstance(dep, dict):
            assert set(dep) == {"pip"}, f"{path.name}: unexpected nested section {sorted(dep)}"
            pip.extend(str(d) for d in dep["pip"] or [])
        else:
            conda.append(str(dep))
    return conda, pip


def _by_name(requirements: list[str], where: str) -> dict[str, str]:
    named = {}
    for text in requirements:
        name = canonicalize_name(Requirement(text).name)
        assert name not in named, f"{where} lists {name} twice: {named[name]!r} and {text!r}"
        named[name] = text
    return named


def dependency_differences(pyproject_deps: list[str], environment_pip: list[str]) -> list[str]:
    """One line per dependency that is missing on one side or pinned differently."""
    ours = _by_name(pyproject_deps, "pyproject.toml")
    theirs = _by_name([d for d in environment_pip if d != LOCAL_INSTALL], "environment.yml")
    problems = []
    for name in sorted(ours.keys() | theirs.keys()):
        if name not in theirs:
            problems.append(f"{name}: in pyproject.toml as {ours[name]!r}, missing from environment.yml's pip section")
        elif name not in ours:
            problems.append(f"{name}: in environment.yml as {theirs[name]!r}, missing from pyproject.toml")
        elif Requirement(ours[name]) != Requirement(theirs[name]):
            problems.append(f"{name}: pyproject.toml has {ours[name]!r}, environment.yml has {theirs[name]!r}")
    return problems


def _conda_package(spec: str) -> str:
    return re.split(r"[=<>!~ ]", spec, maxsplit=1)[0].split("::")[-1]


# ---------------------------------------------------------------- the real files


def test_pip_section_mirrors_pyproject_dependencies():
    _, pip = load_environment()
    problems = dependency_differences(load_pyproject()["project"]["dependencies"], pip)
    assert not problems, "environment.yml and pyproject.toml disagree:\n  " + "\n  ".join(problems)


def _all_requirements() -> list[str]:
    project = load_pyproject()["project"]
    extras = project.get("optional-dependencies", {})
    return project["dependencies"] + [d for group in extras.values() for d in group]


def test_every_dependency_is_pinned_exactly():
    unpinned = [
        d for d in _all_requirements()
        if canonicalize_name(Requirement(d).name) != "transformer-lib"  # an extra naming another extra
        and not any(s.operator in ("==", "===") for s in Requirement(d).specifier)
    ]
    assert not unpinned, f"pyproject.toml dependencies without an exact == pin: {unpinned}"


def test_each_package_is_pinned_once_across_the_extras():
    _by_name([d for d in _all_requirements() if canonicalize_name(Requirement(d).name) != "transformer-lib"],
             "pyproject.toml (dependencies and extras)")


def test_the_learners_install_holds_no_grader_or_test_tool():
    core = {canonicalize_name(Requirement(d).name) for d in load_pyproject()["project"]["dependencies"]}
    for tool in ["pytest", "pytest-xdist", "playwright", "transformers", "dask", "distributed", "nbval", "jupytext"]:
        assert tool not in core, f"{tool} is in the learner's install (make lab); it belongs in an extra"


def test_the_test_extra_includes_the_graders_and_the_hub():
    extras = load_pyproject()["project"]["optional-dependencies"]
    assert "transformer_lib[grade,hub]" in extras["test"], \
        "make test grades submissions and runs a class hub: the test extra needs [grade,hub]"
    assert "transformer_lib[grade]" in extras["hub"], "make hub's instructors grade: the hub extra needs [grade]"


def test_environment_installs_the_library_itself():
    _, pip = load_environment()
    assert LOCAL_INSTALL in pip, f"environment.yml's pip section must end with {LOCAL_INSTALL!r}, got {pip}"


def test_conda_provides_only_python_and_pip():
    # Anything else from conda (torch above all) would sit beside, or under, the pip pins.
    conda, _ = load_environment()
    packages = sorted(_conda_package(d) for d in conda)
    assert packages == ["pip", "python"], (
        f"environment.yml's conda dependencies should be exactly python and pip, got {conda}; "
        "libraries go in the pip section with pyproject.toml's pins"
    )


def test_python_version_agrees_with_requires_python():
    requires = SpecifierSet(load_pyproject()["project"]["requires-python"])
    conda, _ = load_environment()
    python = [d for d in conda if _conda_package(d) == "python"]
    assert len(python) == 1, f"environment.yml must name python exactly once, got {python}"
    match = re.fullmatch(r"python\s*=?=\s*(\d+)\.(\d+)(?:\.\*)?", python[0])
    assert match, f"environment.yml should pin a Python minor version like 'python=3.11', got {python[0]!r}"
    major, minor = match.groups()
    # conda's python=3.11 means any 3.11.x: the first and a late patch release must both be allowed.
    for patch in (0, 99):
        version = f"{major}.{minor}.{patch}"
        assert requires.contains(version), (
            f"environment.yml asks for {python[0]!r}, but pyproject.toml's requires-python "
            f"{str(requires)!r} does not allow Python {version}"
        )


def test_requires_python_covers_exactly_the_versions_ci_tests():
    requires = SpecifierSet(load_pyproject()["project"]["requires-python"])
    assert [v for v in ("3.10.12", "3.11.0", "3.12.0", "3.13.0", "3.13.9", "3.14.0") if requires.contains(v)] == [
        "3.11.0", "3.12.0", "3.13.0", "3.13.9"]
    ci = (ROOT / ".ci" / "run").read_text()
    assert "3.12" in ci and "3.13" in ci, ".ci/run must test Python 3.12 and 3.13"


def test_running_python_satisfies_requires_python():
    requires = SpecifierSet(load_pyproject()["project"]["requires-python"])
    running = ".".join(map(str, sys.version_info[:3]))
    assert requires.contains(running), f"tests run on Python {running}, outside requires-python {requires}"


# ---------------------------------------------------------------- the checker, fed wrong answers

PINS = ["torch==2.13.0", "numpy==2.4.6", "pytest-xdist==3.8.0"]


def test_checker_accepts_a_faithful_mirror():
    assert dependency_differences(PINS, [*PINS, LOCAL_INSTALL]) == []
    # Spelling that means the same requirement is not a difference.
    assert dependency_differences(PINS, ["Torch == 2.13.0", "numpy==2.4.6", "pytest_xdist==3.8.0"]) == []


@pytest.mark.parametrize(
    "environment_pip, expected",
    [
        (["torch==2.12.0", "numpy==2.4.6", "pytest-xdist==3.8.0"],
         ["torch: pyproject.toml has 'torch==2.13.0', environment.yml has 'torch==2.12.0'"]),
        (["torch", "numpy==2.4.6", "pytest-xdist==3.8.0"],
         ["torch: pyproject.toml has 'torch==2.13.0', environment.yml has 'torch'"]),
        (["torch==2.13.0", "pytest-xdist==3.8.0"],
         ["numpy: in pyproject.toml as 'numpy==2.4.6', missing from environment.yml's pip section"]),
        ([*PINS, "scipy==1.17.0"],
         ["scipy: in environment.yml as 'scipy==1.17.0', missing from pyproject.toml"]),
        (["numpy==2.4.7", "pytest-xdist==3.8.0", "pandas==3.0.0"],
         ["numpy: pyproject.toml has 'numpy==2.4.6', environment.yml has 'numpy==2.4.7'",
          "pandas: in environment.yml as 'pandas==3.0.0', missing from pyproject.toml",
          "torch: in pyproject.toml as 'torch==2.13.0', missing from environment.yml's pip section"]),
    ],
    ids=["changed pin", "unpinned", "missing from yml", "missing from pyproject", "several"],
)
def test_checker_names_each_difference(environment_pip, expected):
    assert dependency_differences(PINS, environment_pip) == expected


def test_checker_reads_a_yaml_file(tmp_path):
    env = tmp_path / "environment.yml"
    env.write_text("dependencies:\n  - python=3.11\n  - pip\n  - pip:\n      - torch==2.12.0\n      - -e .\n")
    conda, pip = load_environment(env)
    assert conda == ["python=3.11", "pip"] and pip == ["torch==2.12.0", "-e ."]
    assert dependency_differences(["torch==2.13.0"], pip) == [
        "torch: pyproject.toml has 'torch==2.13.0', environment.yml has 'torch==2.12.0'"
    ]
