"""deploy/kubernetes, checked as far as it can be without a cluster, a registry or the network.

The hub's configuration (deploy/kubernetes/course_config.py) is run the way the Zero to JupyterHub
chart runs it: values.yaml's hub.config applied to a traitlets Config, then hub.extraConfig executed
with `c` and the chart's `get_config` (a stand-in reading values.yaml). KubeSpawner, with the
Kubernetes client stubbed out, then builds the pod manifests of a student, a Chinese-edition student
and an instructor. The Dask grading cluster's spec is built with dask-kubernetes; the learner's and
instructor's Jupyter configuration is resolved the way jupyter_server and JupyterLab resolve it;
the Dockerfile's install is compared with the README's. The image's build context is computed from
Dockerfile.dockerignore the way Docker computes it (moby's patternmatcher, re-implemented below),
and checked to hold what the image needs and none of the course's answers or state. Each user's uid
is derived from their login and checked through KubeSpawner's pod manifests; the instructor's
collect command (collect.py) is run with the screen and nbgrader stubbed out, and once, as root,
with deploy/hub/exchange.py's real screen; the feedback command (feedback.py) on a course folder of
fake submissions, with nbgrader's own release step. The values files the README shows are loaded as
written, merged as Helm merges them, and held to the chart's documented layout; the NetworkPolicy
guarding the grading scheduler is checked against the labels the Dask operator and KubeSpawner give
the pods. The wrong-configuration test feeds the checks deliberately wrong configurations and
expects each to be caught.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
import types
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")
kubespawner_spawner = pytest.importorskip("kubespawner.spawner")
from traitlets.config import Config  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
K8S = ROOT / "deploy" / "kubernetes"
IMAGE_COURSE = "/opt/course"  # where the image holds the course (Dockerfile's WORKDIR)
EXCHANGE = "/srv/nbgrader/exchange"


def readme_section() -> str:
    """README.md's "Running a class", where an instructor reads the image's install command."""
    text = (ROOT / "README.md").read_text()
    start = text.index("## Running a class")
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else None]


def values() -> dict:
    return yaml.safe_load((K8S / "values.yaml").read_text())


# -- the chart, as far as the course uses it ----------------------------------------------


def chart_get_config(vals: dict):
    """The chart's z2jh.get_config: a dotted key into values.yaml."""
    def get_config(key, default=None):
        node = vals
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node:
                return default
            node = node[part]
        return node
    return get_config


# What `helm upgrade --set-file hub.extraFiles.<key>.stringData=<file>` puts in each mount that
# values.yaml leaves empty (README, step 5; test_the_readmes_helm_command_fills_every_mount checks it).
SET_FILES = {"course-config": K8S / "course_config.py", "course-roster-reader": ROOT / "deploy" / "hub" / "roster.py"}


def hub_config(vals: dict, course_config_text: str | None = None, roster: str | None = None, tmp: Path | None = None) -> Config:
    """What the hub's jupyterhub_config.py leaves in `c` for these values."""
    get_config = chart_get_config(vals)
    c = Config()
    c.JupyterHub.spawner_class = "kubespawner.KubeSpawner"
    su = vals.get("singleuser", {})
    image = su.get("image", {})
    c.KubeSpawner.image = f"{image['name']}:{image['tag']}"
    c.KubeSpawner.cmd = [su["cmd"]] if isinstance(su.get("cmd"), str) else su.get("cmd")
    c.KubeSpawner.fs_gid = su.get("fsGid")
    c.KubeSpawner.cpu_limit = float(su["cpu"]["limit"])
    c.KubeSpawner.mem_limit = su["memory"]["limit"]
    c.KubeSpawner.environment = dict(su.get("extraEnv", {}))
    pull_secrets = list(vals.get("imagePullSecrets") or []) + list(image.get("pullSecrets") or [])
    if pull_secrets:  # the chart gives user pods its chart-wide list and singleuser.image's own
        c.KubeSpawner.image_pull_secrets = pull_secrets
    storage = su.get("storage", {})
    c.KubeSpawner.volumes = [{"name": "volume-{user_server}", "persistentVolumeClaim": {"claimName": "claim-{user_server}"}}]
    c.KubeSpawner.volume_mounts = [{"name": "volume-{user_server}", "mountPath": storage.get("homeMountPath", "/home/jovyan")}]
    c.KubeSpawner.volumes.extend(storage.get("extraVolumes", []))
    c.KubeSpawner.volume_mounts.extend(storage.get("extraVolumeMounts", []))
    for section, settings in (vals.get("hub", {}).get("config") or {}).items():
        c[section].update(settings)  # the chart's own loop: hub.config.<Class>.<trait> is c.<Class>.<trait>

    # hub.extraFiles: each mount holds its stringData, or what README's --set-file gives it. Here the
    # hub pod's mounts are files in a temporary folder, and the paths the hub's code names are changed
    # to them: a path that names no mount stays as it is, and finds nothing.
    pod = Path(tempfile.mkdtemp(prefix="hub-pod-", dir=tmp))
    texts = {}
    for key, spec in vals["hub"].get("extraFiles", {}).items():
        if key == "course-config" and course_config_text is not None:
            text = course_config_text
        elif key == "roster" and roster is not None:
            text = roster
        elif "stringData" in spec:
            text = spec["stringData"]
        else:
            assert key in SET_FILES, f"hub.extraFiles.{key} has no content, and the README's helm command sets none"
            text = SET_FILES[key].read_text()
        texts[spec["mountPath"]] = text
    local = {path: pod / Path(path).name for path in texts}

    def in_pod(text: str) -> str:
        for path, target in local.items():
            text = text.replace(f'"{path}"', f'"{target}"')
        return text

    for path, text in texts.items():
        local[path].write_text(in_pod(text), encoding="utf-8")
    namespace = {"c": c, "get_config": get_config, "__name__": "__config__",
                 "__file__": "/usr/local/etc/jupyterhub/jupyterhub_config.py"}
    for name, text in sorted(vals["hub"].get("extraConfig", {}).items()):
        exec(compile(in_pod(text), f"hub.extraConfig.{name}", "exec"), namespace)
    return c, namespace


def load(vals=None, course_config_text=None, roster=None, tmp=None):
    vals = values() if vals is None else vals
    return hub_config(vals, course_config_text, roster, tmp)


# -- users and their pods -----------------------------------------------------------------


def fake_user(name: str, uid: int, groups: list[str]):
    user = types.SimpleNamespace(name=name, id=uid, url=f"/user/{name}/", escaped_name=name,
                                 groups=[types.SimpleNamespace(name=g) for g in groups])
    user.server = None
    return user


@pytest.fixture
def offline_kubespawner(monkeypatch):
    """KubeSpawner without a Kubernetes API: no kube config is read and no client made."""
    monkeypatch.setattr(kubespawner_spawner, "load_config", lambda **kw: None)
    monkeypatch.setattr(kubespawner_spawner, "shared_client", lambda name: None)
    return kubespawner_spawner.KubeSpawner


def pod_for(KubeSpawner, c: Config, user) -> dict:
    spawner = KubeSpawner(_mock=True, config=c, user=user)
    hook = spawner.pre_spawn_hook
    assert hook is not None, "no pre_spawn_hook: nothing picks the student's or instructor's profile"
    hook(spawner)
    hook(spawner)  # a second start must give the same pod (the spawner object lives on between starts)
    manifest = asyncio.run(spawner.get_pod_manifest())
    from kubernetes_asyncio.client import ApiClient
    pod = ApiClient.__new__(ApiClient).sanitize_for_serialization(manifest)  # no client (it would want an event loop)
    pod["_spawner"] = spawner
    return pod


def container(pod: dict) -> dict:
    return pod["spec"]["containers"][0]


def env_of(pod: dict) -> dict:
    return {e["name"]: e.get("value") for e in container(pod).get("env", [])}


def mounts_of(pod: dict) -> dict:
    return {m["mountPath"]: m["name"] for m in container(pod).get("volumeMounts", [])}


def volumes_of(pod: dict) -> dict:
    return {v["name"]: v for v in pod["spec"].get("volumes", [])}


# -- the checks (the last test feeds them wrong configurations) -------------------------------


def check_exchange(pod: dict, claim: str = "nbgrader-exchange") -> None:
    mounts = mounts_of(pod)
    assert EXCHANGE in mounts, f"the exchange is not mounted at {EXCHANGE}: {sorted(mounts)}"
    volume = volumes_of(pod)[mounts[EXCHANGE]]
    assert volume.get("persistentVolumeClaim", {}).get("claimName") == claim, volume
    assert env_of(pod).get("NBGRADER_EXCHANGE") == EXCHANGE


def check_student(pod: dict, language: str) -> None:
    env = env_of(pod)
    course = {"en": "transformer-course", "zh": "transformer-course-zh"}[language]
    lab = {"en": ".lab", "zh": ".lab-zh"}[language]
    assert env.get("COURSE_LANG") == language, env.get("COURSE_LANG")
    assert env.get("NBGRADER_COURSE_ID") == course, env.get("NBGRADER_COURSE_ID")
    path = env.get("JUPYTER_CONFIG_PATH", "").split(":")
    assert path == [f"{IMAGE_COURSE}/deploy/kubernetes/jupyter/student", f"{IMAGE_COURSE}/{lab}"], path
    assert "/srv/course" not in mounts_of(pod), "a student's server mounts the course directory (solutions, gradebook)"
    assert pod["metadata"]["labels"].get("course-role") == "student"
    check_exchange(pod)


def check_instructor(pod: dict) -> None:
    env = env_of(pod)
    assert env.get("JUPYTER_CONFIG_PATH", "").split(":") == [
        f"{IMAGE_COURSE}/deploy/kubernetes/jupyter/instructor", "/srv/course/autograder"], env.get("JUPYTER_CONFIG_PATH")
    mounts = mounts_of(pod)
    assert "/srv/course" in mounts, "the instructor's server lacks the course directory"
    assert volumes_of(pod)[mounts["/srv/course"]]["persistentVolumeClaim"]["claimName"] == "course-files"
    assert pod["metadata"]["labels"].get("course-role") == "instructor"
    check_exchange(pod)


def check_uid(pod: dict, expected: int) -> None:
    context = container(pod).get("securityContext") or {}
    assert context.get("runAsUser") == expected, context
    assert context.get("runAsUser") != 1000, "every user runs as jovyan (uid 1000): nbgrader's exchange cannot tell them apart"
    assert context.get("allowPrivilegeEscalation") is False


STUDENT_EN = ("{c}/deploy/kubernetes/jupyter/student", "{c}/.lab")
STUDENT_ZH = ("{c}/deploy/kubernetes/jupyter/student", "{c}/.lab-zh")
INSTRUCTOR = ("{c}/deploy/kubernetes/jupyter/instructor", "/srv/course/autograder")
INSTRUCTOR_ONLY = ("/srv/course/autograder",)  # the wrong configuration for a student (last test)
# The one-server hub's students: classhub.py's write_role_configs writes their configuration, and
# each server reads it, then the servers' venv's own etc/jupyter (deploy/hub/jupyterhub_config.py).
ONE_SERVER_EN = ("{one}/student-en", "{prefix}/etc/jupyter")
ONE_SERVER_ZH = ("{one}/student-zh", "{prefix}/etc/jupyter")


def effective_jupyter_config(config_path: tuple[str, ...]) -> dict:
    """The nbgrader server extensions and JupyterLab plugins a server on this JUPYTER_CONFIG_PATH enables,
    and the nbgrader configuration it reads, resolved by jupyter_server, jupyterlab_server and nbgrader."""
    return _resolved()[config_path]


_RESOLVE = r"""
import json, os, sys
from jupyter_server.serverapp import ServerApp
from jupyter_server.extension.config import ExtensionConfigManager
from jupyterlab_server.config import get_static_page_config
from nbgrader.apps.baseapp import NbGrader
from traitlets.utils.importstring import import_item
out = []
for path in json.loads(sys.argv[1]):
    os.environ["JUPYTER_CONFIG_PATH"] = os.pathsep.join(path)
    app = ServerApp()
    app.load_config_file()
    ext = dict(app.jpserver_extensions)
    for k, v in ExtensionConfigManager(read_config_path=app.config_file_paths).get_jpserver_extensions().items():
        ext.setdefault(k, v)
    nb = NbGrader()
    nb.load_config_file()

    def module_of(name):  # the one-server configuration's classes import from deploy/hub, on its servers' path
        try:
            return import_item(name).__module__
        except ImportError:
            return None

    out.append({
        "server": {k.rsplit(".", 1)[-1]: v for k, v in ext.items() if k.startswith("nbgrader.")},
        "disabled": {k: v for k, v in (get_static_page_config(level="all").get("disabledExtensions") or {}).items() if v},
        "course_id": nb.config.CourseDirectory.get("course_id"),
        "exchange": nb.config.Exchange.get("root"),
        "exchange_classes": {k: (v, module_of(v)) for k, v in nb.config.ExchangeFactory.items()},
    })
print(json.dumps(out))
"""


@functools.lru_cache(maxsize=1)
def _resolved() -> dict:
    """One process resolves every configuration path the tests ask about (a fresh process: no config cached)."""
    wanted = [STUDENT_EN, STUDENT_ZH, INSTRUCTOR, INSTRUCTOR_ONLY, ONE_SERVER_EN, ONE_SERVER_ZH]
    with tempfile.TemporaryDirectory() as one_server:
        # write_role_configs needs no root: it copies .lab, writes JSON and Python, chmods its own files
        classhub_module().write_role_configs(Path(one_server), Path(EXCHANGE))
        paths = [[in_repo(p.format(c=IMAGE_COURSE, one=one_server, prefix=sys.prefix)) for p in path] for path in wanted]
        env = dict(os.environ, NBGRADER_COURSE_ID="transformer-course-zh", NBGRADER_EXCHANGE=EXCHANGE)
        env.pop("COURSE_LANG", None)
        out = subprocess.run([sys.executable, "-c", _RESOLVE, json.dumps(paths)], env=env, capture_output=True,
                             text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    return dict(zip(wanted, json.loads(out.stdout.strip().splitlines()[-1])))


def in_repo(path: str) -> str:
    """A path inside the image or the course directory, as it is in this checkout."""
    for prefix in (IMAGE_COURSE, "/srv/course"):
        if path == prefix or path.startswith(prefix + "/"):
            return str(ROOT) + path[len(prefix):]
    return path


def check_assignments_tab(resolved: dict) -> None:
    """A student opens the Assignments tab from nbgrader's menu (Nbgrader > Assignment List): both
    JupyterLab plugins on (the learner's lab switches both off), and the tab's server extension."""
    assert resolved["server"].get("assignment_list") is True, "students need the Assignments tab's server extension"
    for plugin in ("@jupyter/nbgrader:assignment-list", "@jupyter/nbgrader:menu"):
        assert not resolved["disabled"].get(plugin), f"{plugin} is switched off: students cannot open the Assignments tab"


def check_no_formgrader(resolved: dict) -> None:
    assert resolved["server"].get("formgrader") is False, f"a student's server loads the Formgrader: {resolved['server']}"
    assert resolved["disabled"].get("@jupyter/nbgrader:formgrader"), "the Formgrader's JupyterLab plugin is enabled"
    assert resolved["disabled"].get("@jupyter/nbgrader:create-assignment"), "Create Assignment is enabled"
    check_assignments_tab(resolved)


def readme_install_command(text: str) -> str:
    lines = [ln for ln in text.splitlines() if "# what the image runs" in ln]
    assert len(lines) == 1, "README's Running a class must show the image's install command once, marked '# what the image runs'"
    return lines[0].split("# what the image runs")[0].strip()


def dockerfile_install_command(text: str) -> str:
    runs = [ln[len("RUN "):].strip() for ln in text.splitlines() if ln.startswith("RUN ") and "make venv" in ln]
    assert len(runs) == 1, runs
    return runs[0]


def check_cluster_spec(spec: dict, image: str) -> None:
    worker = spec["spec"]["worker"]["spec"]["containers"][0]
    scheduler = spec["spec"]["scheduler"]["spec"]["containers"][0]
    assert worker["image"] == image and scheduler["image"] == image, (worker["image"], scheduler["image"])
    assert worker["args"][:4] == [f"{IMAGE_COURSE}/.venv/bin/dask", "worker", "--nthreads", "1"], worker["args"]
    assert scheduler["args"][:2] == [f"{IMAGE_COURSE}/.venv/bin/dask", "scheduler"], scheduler["args"]
    assert "8786" in scheduler["args"]
    context = worker.get("securityContext") or {}
    assert "SYS_ADMIN" in context.get("capabilities", {}).get("add", []) and context.get("runAsUser") == 0, \
        "bubblewrap (as root) cannot make its namespaces without CAP_SYS_ADMIN: grading would fall back"
    env = {e["name"]: e["value"] for e in worker.get("env") or []}
    assert env.get("OMP_NUM_THREADS") == "1"


# -- modules of deploy/kubernetes, imported as the collect command imports them ----------------


def _module(name: str, path: Path | None = None):
    spec = importlib.util.spec_from_file_location(name, path or K8S / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@functools.lru_cache(maxsize=1)
def course_config():
    """course_config.py's definitions (outside the hub, its settings section does not run)."""
    return _module("course_config")


def collect_module():
    path = list(sys.path)
    try:
        return _module("collect")
    finally:
        sys.path[:] = path  # collect.py puts deploy/hub first: not for the tests that run after these


def feedback_module():
    path = list(sys.path)
    try:  # not named feedback: autograder's feedback module has that name in this process
        return _module("kubernetes_feedback", K8S / "feedback.py")
    finally:
        sys.path[:] = path


def classhub_module():
    """deploy/hub/classhub.py, the one-server hub (collect.py and feedback.py import it the same way)."""
    return collect_module().classhub


# -- the image's build context, as Docker computes it ---------------------------------------------
# moby/patternmatcher (which BuildKit's fsutil and the legacy builder both use) and BuildKit's
# dockerignore.ReadAll, re-implemented: no Docker daemon or Go here, and no Python package does
# .dockerignore's rules (gitignore's differ: there `*` also matches below the root).


def go_clean(path: str) -> str:
    """Go's filepath.Clean on a slash path."""
    rooted, parts = path.startswith("/"), []
    for part in path.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if parts and parts[-1] != "..":
                parts.pop()
            elif not rooted:
                parts.append("..")
            continue
        parts.append(part)
    cleaned = ("/" if rooted else "") + "/".join(parts)
    return cleaned or ("/" if rooted else ".")


def dockerignore_patterns(text: str) -> list[str]:
    """dockerignore.ReadAll: `#` comments only at a line's very start, blank lines skipped, each pattern
    cleaned and made relative to the context's root, `!` kept in front."""
    patterns = []
    for number, line in enumerate(text.split("\n")):
        if number == 0:
            line = line.removeprefix("\ufeff")
        if line.startswith("#"):
            continue
        pattern = line.strip()
        if not pattern:
            continue
        invert = pattern.startswith("!")
        if invert:
            pattern = pattern[1:].strip()
        if pattern:
            pattern = go_clean(pattern)
            if len(pattern) > 1 and pattern.startswith("/"):
                pattern = pattern[1:]
        patterns.append("!" + pattern if invert else pattern)
    return patterns


class DockerPattern:
    """patternmatcher.Pattern: `*` and `?` stop at `/`, `**` crosses any number of folders."""

    def __init__(self, text: str):
        text = go_clean(text.strip())
        self.exclusion = text.startswith("!")
        self.text = text[1:] if self.exclusion else text
        self.kind, regex, i, n = "exact", "^", 0, len(self.text)
        for step in range(n):
            if i >= n:
                break
            ch, i = self.text[i], i + 1
            if ch == "*":
                if i < n and self.text[i] == "*":
                    i += 1
                    if i < n and self.text[i] == "/":
                        i += 1
                    if i >= n:
                        if self.kind == "exact":
                            self.kind = "prefix"
                        else:
                            regex, self.kind = regex + ".*", "regexp"
                    else:
                        regex, self.kind = regex + "(.*/)?", "regexp"
                    if step == 0:
                        self.kind = "suffix"
                else:
                    regex, self.kind = regex + "[^/]*", "regexp"
            elif ch == "?":
                regex, self.kind = regex + "[^/]", "regexp"
            elif ch in ".+()|{}$":
                regex += "\\" + ch
            elif ch == "\\":
                if i < n:
                    regex, i, self.kind = regex + "\\" + self.text[i], i + 1, "regexp"
                else:
                    regex += "\\\\"
            elif ch in "[]":
                regex, self.kind = regex + ch, "regexp"
            else:
                regex += ch
        self.regex = re.compile(regex + r"\Z") if self.kind == "regexp" else None  # Go's $: the text's end

    def match(self, path: str) -> bool:
        if self.kind == "exact":
            return path == self.text
        if self.kind == "prefix":
            return path.startswith(self.text[:-2])
        if self.kind == "suffix":
            suffix = self.text[2:]
            return path.endswith(suffix) or (suffix.startswith("/") and path == suffix[1:])
        return self.regex.match(path) is not None


class DockerIgnore:
    def __init__(self, patterns: list[str]):
        self.patterns = [DockerPattern(p) for p in patterns if p.strip()]

    def excluded(self, path: str) -> bool:
        """MatchesOrParentMatches: the last pattern that matches the path or a folder above it wins."""
        parent = path.rsplit("/", 1)[0] if "/" in path else "."
        parents = parent.split("/")
        matched = False
        for pattern in self.patterns:
            if pattern.exclusion != matched:
                continue
            match = pattern.match(path)
            if not match and parent != ".":
                match = any(pattern.match("/".join(parents[:i + 1])) for i in range(len(parents)))
            if match:
                matched = not pattern.exclusion
        return matched

    def may_let_back_in_below(self, folder: str) -> bool:
        """Whether Docker walks into an excluded folder: only when an exception's text starts with it
        (the legacy builder always; BuildKit when no exception holds a wildcard, as here)."""
        return any((p.text + "/").startswith(folder + "/") for p in self.patterns if p.exclusion)


def build_context(root: Path, ignore_text: str) -> set[str]:
    """The paths `docker build` sends from `root` (folders end in /); links are sent, never followed."""
    ignore, sent = DockerIgnore(dockerignore_patterns(ignore_text)), set()

    def walk(folder: str) -> None:
        for entry in sorted(os.scandir(root / folder if folder else root), key=lambda e: e.name):
            path = f"{folder}/{entry.name}" if folder else entry.name
            is_dir = entry.is_dir(follow_symlinks=False)
            if ignore.excluded(path):
                if is_dir and ignore.may_let_back_in_below(path):
                    walk(path)
                continue
            sent.add(path + "/" if is_dir else path)
            if is_dir:
                walk(path)

    walk("")
    return sent


def image_ignore_text() -> str:
    return (K8S / "Dockerfile.dockerignore").read_text()


# What must never be in the image: the answers (solutions/ with its hidden tests, tests/), the
# grader (its code, gradebook, submissions, feedback, grades and reports), rosters, the one-server
# hub's state (passwords, cookie secret), the history, venvs, a learner's checkpoints.
FORBIDDEN = [
    "solutions/02_self_attention/02_self_attention.ipynb", "solutions/02_self_attention/02_self_attention.py",
    "tests/test_grading.py", "autograder/course.py", "autograder/nbgrader_config.py", "autograder/gradebook.db",
    "autograder/submitted/ana/02_self_attention/02_self_attention.ipynb", "autograder/autograded/ana/x.ipynb",
    "autograder/feedback/ana/02_self_attention/02_self_attention.html", "autograder/grades.csv",
    "autograder/report.csv", "autograder/graded.json", "autograder/received.json",
    "autograder/.exchange-staging/transformer-course/inbound/x/y.ipynb", "autograder/.release/x",
    "deploy/hub/state/secrets/jupyterhub_cookie_secret", "deploy/hub/state/passwords.csv",
    ".git/config", ".git/objects/ab/cdef", ".venv/bin/python", ".venv-3.12/bin/python", "roster.csv",
    "transformer_lib.egg-info/PKG-INFO", "chapters/02_self_attention/.ipynb_checkpoints/02_self_attention-checkpoint.ipynb",
    "transformer_lib/__pycache__/attention.cpython-311.pyc", "benchmarks/bench_gpt.py", "environment.yml",
]
# What the image runs: the install (pyproject names README.md), the library, both editions' chapters
# and start pages, the learner's lab configuration, the image's own files, and the exchange classes
# the servers' nbgrader configuration imports (deploy/hub/course_exchange.py).
NEEDED = [
    "pyproject.toml", "README.md", "Makefile", "transformer_lib/__init__.py", "transformer_lib/checks/core.py",
    "chapters/README.md", "chapters/zh/README.md", "chapters/02_self_attention/02_self_attention.ipynb",
    ".lab/jupyter_server_config.json", ".lab-zh/jupyter_server_config.json", "deploy/kubernetes/start.sh",
    "deploy/kubernetes/jupyter/student/nbgrader_config.py", "deploy/kubernetes/collect.py",
    "deploy/hub/course_exchange.py", "deploy/hub/exchange.py",
]


# -- the chart's layout, the README's values files ---------------------------------------------

# The chart keys the course's values use, where Zero to JupyterHub's configuration reference puts
# them (z2jh.jupyter.org; the chart's own values.schema.json is not installed here, so its layout is
# written down instead). Below one of these the chart reads whatever it is given (an annotation, a
# volume, a file), except hub.config, which check_chart_layout follows into each class.
CHART_KEYS = {
    "hub.config", "hub.extraFiles", "hub.extraConfig", "hub.db.type", "hub.db.pvc.storage",
    "custom",  # free for the deployment: course_config.py reads it with the chart's get_config
    "imagePullSecrets", "proxy.service.type", "scheduling.userScheduler.enabled",
    "ingress.enabled", "ingress.ingressClassName", "ingress.annotations", "ingress.hosts", "ingress.tls",
    "singleuser.image.name", "singleuser.image.tag", "singleuser.image.pullPolicy", "singleuser.image.pullSecrets",
    "singleuser.cmd", "singleuser.fsGid", "singleuser.cpu.limit", "singleuser.cpu.guarantee",
    "singleuser.memory.limit", "singleuser.memory.guarantee", "singleuser.startTimeout",
    "singleuser.storage.type", "singleuser.storage.capacity", "singleuser.storage.homeMountPath",
    "singleuser.storage.extraVolumes", "singleuser.storage.extraVolumeMounts",
    "singleuser.storage.dynamic.storageClass", "singleuser.networkPolicy.egress",
    "singleuser.cloudMetadata.blockWithIptables", "cull.enabled", "cull.timeout",
}
# hub.config.<Class>.<setting> becomes c.<Class>.<setting> (the chart's jupyterhub_config.py:
# `for app, cfg in get_config("hub.config").items(): c[app].update(cfg)`): the classes this hub configures.
HUB_CLASSES = {
    "JupyterHub": "jupyterhub.app.JupyterHub", "Authenticator": "jupyterhub.auth.Authenticator",
    "FirstUseAuthenticator": "firstuseauthenticator.FirstUseAuthenticator",
    "LTI13Authenticator": "ltiauthenticator.lti13.auth.LTI13Authenticator", "KubeSpawner": "kubespawner.KubeSpawner",
}


def check_chart_layout(vals: dict, where: str) -> None:
    """Every key of `vals` is one the chart reads, where it reads it."""
    from traitlets.utils.importstring import import_item

    def walk(node, path):
        key = ".".join(path)
        if key == "hub.config":
            for section, settings in node.items():
                assert section in HUB_CLASSES, f"{where}: hub.config.{section} is no class this hub configures"
                traits = import_item(HUB_CLASSES[section]).class_trait_names(config=True)
                for name in settings:
                    assert name in traits, (f"{where}: hub.config.{section}.{name} is no setting of {section} "
                                            "(the chart passes hub.config.<Class>.<setting> to that class)")
        elif key not in CHART_KEYS:
            assert isinstance(node, dict) and node, f"{where}: {key} is not where the chart reads anything"
            for name, child in node.items():
                walk(child, path + [name])

    walk(vals, [])


def helm_merge(base: dict, overlay: dict) -> dict:
    """`helm --values a.yaml --values b.yaml`: maps merge key by key, anything else b replaces."""
    merged = copy.deepcopy(base)
    for key, value in overlay.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = helm_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def readme_k8s() -> str:
    return (K8S / "README.md").read_text()


def code_blocks(text: str) -> list[tuple[str, str]]:
    return [(m[1], m[2]) for m in re.finditer(r"^```(\w*)\n(.*?)^```", text, re.M | re.S)]


def readme_values(text: str | None = None) -> dict[str, dict]:
    """The README's values files, as written: each ```yaml block whose first line names the file."""
    found = {}
    for language, body in code_blocks(text or readme_k8s()):
        first = body.split("\n", 1)[0]
        if language == "yaml" and re.match(r"# [\w-]+\.yaml:", first):
            found[first[2:].split(":")[0]] = yaml.safe_load(body)
    return found


def readme_helm_command(text: str) -> list[str]:
    """The README's `helm upgrade --install` command, its lines joined, as words."""
    import shlex

    for _, body in code_blocks(text):
        joined = body.replace("\\\n", " ")
        for line in joined.splitlines():
            if line.startswith("helm upgrade --install"):
                return shlex.split(line.split(" #")[0])
    raise AssertionError("the README shows no helm upgrade --install command")


def helm_options(words: list[str], option: str) -> list[str]:
    return [words[i + 1] for i, word in enumerate(words[:-1]) if word == option]


# -- who may reach the grading scheduler (Kubernetes' rules for a NetworkPolicy's `from`) ----------


def selects(selector: dict, labels: dict) -> bool:
    assert not selector.get("matchExpressions"), "matchExpressions: not followed here"
    return all(labels.get(k) == v for k, v in (selector.get("matchLabels") or {}).items())


def admits(policy: dict, labels: dict, namespace: str, policy_namespace: str = "grading") -> bool:
    """Whether `policy` lets a pod with these labels, in this namespace, open a connection."""
    for rule in policy["spec"].get("ingress") or []:
        if not rule.get("from"):
            return True  # a rule without `from` admits every pod
        for peer in rule["from"]:
            if "ipBlock" in peer:
                return True  # by address: every pod whose address is in the block
            in_namespace = (selects(peer["namespaceSelector"], {"kubernetes.io/metadata.name": namespace})
                            if "namespaceSelector" in peer else namespace == policy_namespace)
            if in_namespace and selects(peer.get("podSelector") or {}, labels):
                return True
    return False


def check_scheduler_policy(policy: dict, grading_pods: list[dict], instructor: dict, student: dict) -> None:
    """The policy covers the scheduler and workers as the operator labels them, and admits the grading
    side (its own pods, an instructor's server) and no student's server or other pod."""
    assert policy["kind"] == "NetworkPolicy" and "Ingress" in policy["spec"].get("policyTypes", []), policy
    for labels in grading_pods:
        assert selects(policy["spec"]["podSelector"], labels), f"the policy does not cover the pod labelled {labels}"
        assert admits(policy, labels, "grading"), "the cluster's own pods must reach each other"
    assert admits(policy, instructor, "jhub"), "an instructor's server cannot reach the scheduler"
    assert not admits(policy, student, "jhub"), "a student's server reaches the grading scheduler"
    for labels, namespace in (({}, "jhub"), ({"app": "other"}, "default"), (student, "grading")):
        assert not admits(policy, labels, namespace), f"a pod labelled {labels} in {namespace} reaches the scheduler"


# -- the tests ------------------------------------------------------------------------------


def test_values_parse_and_mount_the_exchange_and_the_course_config(tmp_path):
    vals = values()
    assert vals["singleuser"]["storage"]["extraVolumeMounts"] == [{"name": "nbgrader-exchange", "mountPath": EXCHANGE}]
    assert vals["singleuser"]["storage"]["extraVolumes"][0]["persistentVolumeClaim"]["claimName"] == "nbgrader-exchange"
    # The one Python configuration is the file extraFiles mounts and extraConfig runs.
    mount = vals["hub"]["extraFiles"]["course-config"]["mountPath"]
    assert f'open("{mount}")' in vals["hub"]["extraConfig"]["course"]
    assert "stringData" not in vals["hub"]["extraFiles"]["course-config"], "course_config.py must not be copied into values.yaml"
    # The PVCs the values name exist in exchange-nfs.yaml, ReadWriteMany.
    docs = {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all((K8S / "exchange-nfs.yaml").read_text())}
    for claim in ("nbgrader-exchange", vals["custom"]["course"]["courseClaim"]):
        assert docs[("PersistentVolumeClaim", claim)]["spec"]["accessModes"] == ["ReadWriteMany"]
        assert docs[("PersistentVolume", claim)]["spec"]["nfs"]["path"]
    c, _ = load(tmp=tmp_path)
    assert c.JupyterHub.spawner_class == "kubespawner.KubeSpawner"
    assert c.JupyterHub.authenticator_class == "firstuseauthenticator.FirstUseAuthenticator"
    assert callable(c.KubeSpawner.pre_spawn_hook) and callable(c.KubeSpawner.uid)
    assert c.KubeSpawner.gid == 100 and c.KubeSpawner.fs_gid == 100


def test_roster_makes_groups_allowed_users_and_admins(tmp_path):
    roster = "login,name,role,language\nana,Ana,student,en\nbo,Bo,student,zh\nprof,Prof,instructor,en\n"
    c, _ = load(roster=roster, tmp=tmp_path)
    groups = c.JupyterHub.load_groups
    assert groups["students"]["users"] == ["ana", "bo"] and groups["instructors"]["users"] == ["prof"]
    assert groups["lang-zh"]["users"] == ["bo"]
    assert c.Authenticator.allowed_users == {"ana", "bo", "prof"} and c.Authenticator.admin_users == {"prof"}
    with pytest.raises(ValueError):
        load(roster="login,name,role,language\nx,X,teacher,en\n", tmp=tmp_path)


def test_pods_of_a_student_a_chinese_student_and_an_instructor(offline_kubespawner, tmp_path):
    c, _ = load(tmp=tmp_path)
    vals = values()
    image = f"{vals['singleuser']['image']['name']}:{vals['singleuser']['image']['tag']}"
    ana = pod_for(offline_kubespawner, c, fake_user("ana", 7, ["students"]))
    bo = pod_for(offline_kubespawner, c, fake_user("bo", 8, ["students", "lang-zh"]))
    prof = pod_for(offline_kubespawner, c, fake_user("prof", 9, ["instructors"]))
    check_student(ana, "en")
    check_student(bo, "zh")
    check_instructor(prof)
    for pod, login in ((ana, "ana"), (bo, "bo"), (prof, "prof")):
        assert container(pod)["image"] == image
        check_uid(pod, course_config().uid_of_login(login))
        assert pod["spec"]["securityContext"]["fsGroup"] == 100
    assert len({container(p)["securityContext"]["runAsUser"] for p in (ana, bo, prof)}) == 3
    assert env_of(bo)["COURSE_START_PAGE"] == f"{IMAGE_COURSE}/chapters/zh/README.md"
    assert (ROOT / "chapters" / "zh" / "README.md").exists() and (ROOT / "chapters" / "README.md").exists()
    assert prof["_spawner"].default_url == "/formgrader" and prof["_spawner"].notebook_dir == "/srv/course"
    assert ana["_spawner"].notebook_dir is None or ana["_spawner"].notebook_dir != "/srv/course"
    assert container(prof)["resources"]["limits"]["cpu"] != container(ana)["resources"]["limits"]["cpu"]


def test_what_the_servers_load_students_never_get_formgrader():
    c_text = (K8S / "course_config.py").read_text()
    for name in ("STUDENT_CONFIG", "INSTRUCTOR_CONFIG"):
        assert re.search(rf'^{name} = COURSE \+ "/deploy/kubernetes/jupyter/', c_text, re.M)
    for path in (STUDENT_EN, STUDENT_ZH):
        resolved = effective_jupyter_config(path)
        check_no_formgrader(resolved)
        assert resolved["course_id"] == "transformer-course-zh" and resolved["exchange"] == EXCHANGE  # from the hub's env
    instructor = effective_jupyter_config(INSTRUCTOR)
    # The exchange's root is root's 0755 (README, step 2): nbgrader's own classes would refuse it.
    for resolved in (effective_jupyter_config(STUDENT_EN), effective_jupyter_config(STUDENT_ZH), instructor):
        classes = resolved["exchange_classes"]
        for step in ("fetch_assignment", "submit", "list", "fetch_feedback", "release_assignment", "collect"):
            assert classes.get(step, (None, None))[1] == "course_exchange", f"{step}: {classes.get(step)}"
    assert instructor["server"].get("formgrader") is True, instructor
    assert instructor["course_id"] == "transformer-course" and instructor["exchange"] == EXCHANGE
    assert not instructor["disabled"].get("@jupyter/nbgrader:formgrader")


def test_students_open_the_assignments_tab_on_both_hubs():
    """Kubernetes and the one-server hub alike: the Assignments tab's plugin, nbgrader's menu that opens
    it, and its server extension (the learner's lab they start from switches all three off)."""
    for path in (STUDENT_EN, STUDENT_ZH, ONE_SERVER_EN, ONE_SERVER_ZH):
        resolved = effective_jupyter_config(path)
        check_no_formgrader(resolved)
        check_assignments_tab(resolved)
    # what was resolved is classhub.py's configuration (it names each edition's course itself)
    assert effective_jupyter_config(ONE_SERVER_EN)["course_id"] == "transformer-course"
    assert effective_jupyter_config(ONE_SERVER_ZH)["course_id"] == "transformer-course-zh"


def test_lti13_settings_are_the_authenticators_traits(tmp_path):
    """The README's lti13.yaml, as written, given after values.yaml: its settings reach the authenticator."""
    lti = readme_values()["lti13.yaml"]
    check_chart_layout(lti, "lti13.yaml")
    config = lti["hub"]["config"]
    assert config["JupyterHub"]["authenticator_class"] == "ltiauthenticator.lti13.auth.LTI13Authenticator"
    settings = config["LTI13Authenticator"]  # beside JupyterHub: z2jh's hub.config.<Class>.<setting>
    for key in ("issuer", "client_id", "authorize_url", "jwks_endpoint", "username_key"):
        assert key in settings, key
    c, mod = load(helm_merge(values(), lti), tmp=tmp_path)
    from ltiauthenticator.lti13.auth import LTI13Authenticator
    auth = LTI13Authenticator(config=c)  # c.LTI13Authenticator, as the chart leaves it
    for key, value in settings.items():
        got = getattr(auth, key)
        assert (sorted(got) == sorted(value)) if isinstance(value, list) else got == value, (key, got, value)
    # With LTI switched on, groups come from each launch.
    assert c.Authenticator.manage_groups is True
    hook = c.Authenticator.post_auth_hook
    teacher = hook(None, None, {"name": "t", "auth_state": {
        "https://purl.imsglobal.org/spec/lti/claim/roles": ["http://purl.imsglobal.org/vocab/lis/v2/membership#Instructor"]}})
    learner = hook(None, None, {"name": "s", "auth_state": {
        "https://purl.imsglobal.org/spec/lti/claim/roles": ["http://purl.imsglobal.org/vocab/lis/v2/membership#Learner"],
        "https://purl.imsglobal.org/spec/lti/claim/launch_presentation": {"locale": "zh-CN"}}})
    assert teacher["groups"] == ["instructors"] and learner["groups"] == ["students", "lang-zh"]
    # The URLs the README tells the instructor to paste into the LMS are the authenticator's.
    readme = readme_k8s()
    auth = LTI13Authenticator()
    for url in (auth.login_url("/hub/"), auth.callback_url("/hub/"), auth.config_json_url("/hub/")):
        assert f"https://HUB-ADDRESS{url}" in readme, url
    assert "--values lti13.yaml" in readme


def test_values_and_the_readmes_values_files_use_the_charts_layout():
    check_chart_layout(values(), "values.yaml")
    blocks = readme_values()
    assert set(blocks) == {"registry.yaml", "https.yaml", "lti13.yaml"}, sorted(blocks)
    merged = values()
    for name, block in blocks.items():
        check_chart_layout(block, name)
        merged = helm_merge(merged, block)
    check_chart_layout(merged, "all of them")


def test_the_readmes_helm_command_fills_every_mount():
    """What values.yaml leaves empty in hub.extraFiles, the README's command (and values.yaml's own
    comment) fills with --set-file, from the files the test mounts; each --values file is on the page."""
    readme = readme_k8s()
    words = readme_helm_command(readme)
    assert words[:4] == ["helm", "upgrade", "--install", "course"] and helm_options(words, "--version") == ["4.3.3"]
    set_files = dict(item.split("=", 1) for item in helm_options(words, "--set-file"))
    empty = {key for key, spec in values()["hub"]["extraFiles"].items() if "stringData" not in spec}
    assert empty == set(SET_FILES), empty
    for key in empty:
        assert set_files.get(f"hub.extraFiles.{key}.stringData") == str(SET_FILES[key].relative_to(ROOT)), key
    assert set_files.get("hub.extraFiles.roster.stringData") == "roster.csv"
    assert helm_options(words, "--values")[0] == "deploy/kubernetes/values.yaml"
    assert set(helm_options(words, "--values")[1:]) <= set(readme_values()), helm_options(words, "--values")
    header = "\n".join(ln[1:].strip() for ln in (K8S / "values.yaml").read_text().splitlines() if ln.startswith("#   "))
    for key in empty:
        assert f"--set-file hub.extraFiles.{key}.stringData={SET_FILES[key].relative_to(ROOT)}" in header, key


def test_https_through_the_clusters_ingress(tmp_path):
    https = readme_values()["https.yaml"]
    ingress = https["ingress"]
    assert ingress["enabled"] is True and ingress["hosts"] == ["HUB-ADDRESS"]  # the host of the LMS's URLs
    assert ingress["tls"], "an ingress without tls serves http only"
    for tls in ingress["tls"]:
        assert set(tls["hosts"]) == set(ingress["hosts"]) and tls["secretName"], tls
    secret = ingress["tls"][0]["secretName"]
    # the certificate: cert-manager's (the annotation), or one you were given, put into that secret
    assert {"cert-manager.io/cluster-issuer", "cert-manager.io/issuer"} & set(ingress.get("annotations") or {})
    assert f"kubectl create secret tls {secret} --namespace jhub" in readme_k8s()
    assert https["proxy"]["service"]["type"] == "ClusterIP", "the hub would also be reachable without HTTPS"
    load(helm_merge(values(), https), tmp=tmp_path)


def test_a_private_registry_reaches_both_namespaces(offline_kubespawner, tmp_path):
    registry = readme_values()["registry.yaml"]
    (name,) = registry["imagePullSecrets"]
    readme = readme_k8s()
    made = re.search(r"for namespace in ([\w ]+); do\n\s+kubectl create secret docker-registry (\S+) --namespace \$namespace",
                     readme)
    assert made and set(made[1].split()) == {"jhub", "grading"} and made[2] == name, "the secret must exist in both namespaces"
    c, _ = load(helm_merge(values(), registry), tmp=tmp_path)
    pod = pod_for(offline_kubespawner, c, fake_user("ana", 7, ["students"]))
    assert pod["spec"]["imagePullSecrets"] == [{"name": name}]
    assert f"--image-pull-secret {name}" in readme
    grading = _module("grading_cluster")
    spec = grading.cluster_spec("img:1", pull_secret=name)
    for part in ("scheduler", "worker"):
        assert spec["spec"][part]["spec"]["imagePullSecrets"] == [{"name": name}], part
    assert "imagePullSecrets" not in grading.cluster_spec("img:1")["spec"]["worker"]["spec"]


def grading_pod_labels(cluster: dict) -> list[dict]:
    """The labels the dask-kubernetes operator gives the scheduler's and a worker's pods (its own code)."""
    from dask_kubernetes.operator.controller.controller import (build_scheduler_deployment_spec,
                                                                 build_worker_deployment_spec)
    name, labels = cluster["metadata"]["name"], cluster["metadata"].get("labels") or {}
    scheduler = build_scheduler_deployment_spec(name, cluster["spec"]["scheduler"]["spec"], {}, labels)
    worker = build_worker_deployment_spec(f"{name}-default", "grading", name, "0123456789",
                                          cluster["spec"]["worker"]["spec"], {}, labels)
    return [scheduler["spec"]["template"]["metadata"]["labels"], worker["spec"]["template"]["metadata"]["labels"]]


def test_grading_cluster_spec(offline_kubespawner, tmp_path, capsys):
    grading = _module("grading_cluster")
    vals = values()
    image = f"{vals['singleuser']['image']['name']}:{vals['singleuser']['image']['tag']}"
    spec = grading.cluster_spec(image, workers=3)
    assert spec["kind"] == "DaskCluster" and spec["spec"]["worker"]["replicas"] == 3
    check_cluster_spec(spec, image)
    # The printed YAML is what `kubectl apply` gets: the cluster and the policy that guards its scheduler,
    # checked against the pods the hub makes for an instructor and a student.
    assert grading.main(["--image", image]) == 0
    printed = {doc["kind"]: doc for doc in yaml.safe_load_all(capsys.readouterr().out)}
    assert set(printed) == {"DaskCluster", "NetworkPolicy"}
    check_cluster_spec(printed["DaskCluster"], image)
    c, _ = load(tmp=tmp_path)
    instructor = pod_for(offline_kubespawner, c, fake_user("prof", 9, ["instructors"]))["metadata"]["labels"]
    student = pod_for(offline_kubespawner, c, fake_user("ana", 7, ["students"]))["metadata"]["labels"]
    check_scheduler_policy(printed["NetworkPolicy"], grading_pod_labels(printed["DaskCluster"]), instructor, student)
    # The README's command uses the same scheduler address.
    readme = (K8S / "README.md").read_text() + readme_section()
    address = f"tcp://{grading.NAME}-scheduler.grading:{grading.SCHEDULER_PORT}"
    assert f"make grade VENV={IMAGE_COURSE}/.venv SCHEDULER={address}" in readme


def test_dockerfile_installs_with_the_readme_command_and_image_names_match():
    dockerfile = (K8S / "Dockerfile").read_text()
    section = readme_section()
    command = dockerfile_install_command(dockerfile)
    assert command == readme_install_command(section)
    assert command == readme_install_command((ROOT / "README.md").read_text())  # and only there in README
    assert command.startswith("make venv-grade ")
    assert re.search(r"^venv-grade:", (ROOT / "Makefile").read_text(), re.M)
    assert '".[hub]"' in command and "jupyterhub==" in (ROOT / "pyproject.toml").read_text()
    assert re.search(r"^FROM python:3\.11-slim$", dockerfile, re.M)
    assert f"WORKDIR {IMAGE_COURSE}" in dockerfile and f"COPY . {IMAGE_COURSE}" in dockerfile
    assert "bubblewrap" in dockerfile  # make grade's sandbox
    assert (K8S / "start.sh").stat().st_mode & 0o111
    vals = values()
    name = vals["singleuser"]["image"]["name"]
    both = (K8S / "README.md").read_text() + section
    assert f"docker build -f deploy/kubernetes/Dockerfile -t {name}:" in both
    assert f"docker push {name}:" in both


def test_the_checks_catch_wrong_configurations(offline_kubespawner, tmp_path):
    """Each check above fails on a configuration that is wrong in the way it looks for."""
    c, _ = load(tmp=tmp_path)
    good = pod_for(offline_kubespawner, c, fake_user("ana", 7, ["students"]))

    # No exchange mount.
    vals = values()
    vals["singleuser"]["storage"]["extraVolumeMounts"] = []
    c_no_exchange, _ = load(vals, tmp=tmp_path)
    with pytest.raises(AssertionError, match="exchange is not mounted"):
        check_exchange(pod_for(offline_kubespawner, c_no_exchange, fake_user("ana", 7, ["students"])))

    # A Chinese student given the English course; a student given the instructor's profile.
    text = (K8S / "course_config.py").read_text()
    c_wrong_lang, _ = load(course_config_text=text.replace('"lang-zh" in group_names', '"lang-xx" in group_names'), tmp=tmp_path)
    with pytest.raises(AssertionError):
        check_student(pod_for(offline_kubespawner, c_wrong_lang, fake_user("bo", 8, ["students", "lang-zh"])), "zh")
    c_all_instructors, _ = load(course_config_text=text.replace(
        'return "instructor" if "instructors" in group_names(user) else "student"', 'return "instructor"'), tmp=tmp_path)
    with pytest.raises(AssertionError):
        check_student(pod_for(offline_kubespawner, c_all_instructors, fake_user("ana", 7, ["students"])), "en")

    # Everyone as jovyan.
    ana_uid = course_config().uid_of_login("ana")
    c_jovyan, _ = load(course_config_text=text.replace("c.KubeSpawner.uid = course_uid", "c.KubeSpawner.uid = 1000"), tmp=tmp_path)
    with pytest.raises(AssertionError):
        check_uid(pod_for(offline_kubespawner, c_jovyan, fake_user("ana", 7, ["students"])), ana_uid)
    check_uid(good, ana_uid)

    # The student's lab with the Formgrader switched on (the instructor's configuration in its place).
    with pytest.raises(AssertionError, match="Formgrader"):
        check_no_formgrader(effective_jupyter_config(INSTRUCTOR_ONLY))

    # The Dockerfile installing something else than the README says.
    with pytest.raises(AssertionError):
        assert dockerfile_install_command("FROM x\nRUN make venv && pip install nbgrader\n") == \
            readme_install_command(readme_section())

    # A grading cluster on the stock Dask image, or without the sandbox's privileges.
    spec_mod = importlib.util.spec_from_file_location("grading_cluster", K8S / "grading_cluster.py")
    grading = importlib.util.module_from_spec(spec_mod)
    spec_mod.loader.exec_module(grading)
    from dask_kubernetes.operator import make_cluster_spec
    with pytest.raises(AssertionError):
        check_cluster_spec(make_cluster_spec(name="x", image="ghcr.io/dask/dask:latest"), "ghcr.io/dask/dask:latest")
    with pytest.raises(AssertionError, match="SYS_ADMIN"):
        check_cluster_spec(grading.cluster_spec("img:1", sandbox_privileges=False), "img:1")
    wrong = copy.deepcopy(grading.cluster_spec("img:1"))
    wrong["spec"]["worker"]["spec"]["containers"][0]["image"] = "other:1"
    with pytest.raises(AssertionError):
        check_cluster_spec(wrong, "img:1")

    # A student's lab without nbgrader's menu (the learner's lab switches it off): no way to the tab.
    no_menu = copy.deepcopy(effective_jupyter_config(STUDENT_EN))
    no_menu["disabled"]["@jupyter/nbgrader:menu"] = True
    with pytest.raises(AssertionError, match="nbgrader:menu"):
        check_assignments_tab(no_menu)

    # The LTI settings inside JupyterHub (where values.yaml's commented block had them), and a chart
    # key where the chart does not read it.
    nested = {"hub": {"config": {"JupyterHub": {"authenticator_class": "x", "LTI13Authenticator": {"issuer": "y"}}}}}
    with pytest.raises(AssertionError, match="LTI13Authenticator is no setting of JupyterHub"):
        check_chart_layout(nested, "nested")
    with pytest.raises(AssertionError, match="singleuser.imagePullSecrets"):
        check_chart_layout({"singleuser": {"imagePullSecrets": ["x"]}}, "misplaced")

    # A scheduler policy that admits every pod of the hub's namespace, or covers the workers only.
    policy = grading.network_policy()
    cluster = grading.cluster_spec("img:1")
    instructor = pod_for(offline_kubespawner, c, fake_user("prof", 9, ["instructors"]))["metadata"]["labels"]
    student = good["metadata"]["labels"]
    check_scheduler_policy(policy, grading_pod_labels(cluster), instructor, student)
    too_open = copy.deepcopy(policy)
    too_open["spec"]["ingress"][0]["from"].append({"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "jhub"}}})
    with pytest.raises(AssertionError, match="student's server reaches"):
        check_scheduler_policy(too_open, grading_pod_labels(cluster), instructor, student)
    workers_only = copy.deepcopy(policy)
    workers_only["spec"]["podSelector"]["matchLabels"]["dask.org/component"] = "worker"
    with pytest.raises(AssertionError, match="does not cover"):
        check_scheduler_policy(workers_only, grading_pod_labels(cluster), instructor, student)


# -- the image holds no answers --------------------------------------------------------------------


def test_the_dockerignore_matcher_follows_dockers_rules(tmp_path):
    """The re-implementation agrees with Docker's documented examples (docs.docker.com, .dockerignore)."""
    def sent(ignore, files):
        for f in files:
            (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / f).write_text("x")
        return {p for p in build_context(tmp_path, ignore) if not p.endswith("/")}

    files = ["README.md", "README-secret.md", "CHANGES.md", "a/b/c.go", "c.go", "docs/x", "docs/keep.md",
             "temp1", "a/temp2", "a/b/temp3", "secret/deep/key", "node/__pycache__/m.pyc"]
    # the docs' own example: the last matching line wins
    assert sent("*.md\n!README*.md\nREADME-secret.md\n", files) >= {"README.md"}
    assert not sent("*.md\n!README*.md\nREADME-secret.md\n", files) & {"README-secret.md", "CHANGES.md"}
    # * stays in one folder; a pattern names paths from the context's root; ** crosses folders
    assert "a/temp2" in sent("temp?\n", files) and "temp1" not in sent("temp?\n", files)
    assert "a/temp2" not in sent("*/temp*\n", files) and "a/b/temp3" in sent("*/temp*\n", files)
    assert not {"a/b/c.go", "c.go"} & sent("**/*.go\n", files)
    assert "node/__pycache__/m.pyc" not in sent("**/__pycache__\n", files)
    # a folder's pattern covers everything below it; an exception lets one file back in
    assert not any(p.startswith("secret/") for p in sent("/secret/\n", files))
    assert sent("docs\n!docs/keep.md\n", files) & {"docs/keep.md", "docs/x"} == {"docs/keep.md"}
    # `#` starts a comment only at the line's start
    assert "temp1" in sent("#temp1\n", files) and "temp1" not in sent("temp1 \n", files)
    assert dockerignore_patterns("/a/../b/\n ! c\n# x\n\n") == ["b", "!c"]


def test_the_image_holds_what_it_needs_and_no_answers(tmp_path):
    """Docker's context from Dockerfile.dockerignore: a tree holding every kind of file that must stay
    out gives exactly the files the image needs; the same holds for this checkout."""
    patterns = dockerignore_patterns(image_ignore_text())
    for pattern in patterns:  # BuildKit walks differently past a wildcard exception: none here
        assert not (pattern.startswith("!") and any(ch in pattern for ch in "*?[\\")), pattern
    for path in FORBIDDEN + NEEDED:
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("x")
    files = {p for p in build_context(tmp_path, image_ignore_text()) if not p.endswith("/")}
    assert files == set(NEEDED), f"sent but forbidden: {sorted(files - set(NEEDED))}; needed but left out: {sorted(set(NEEDED) - files)}"

    # This checkout, untracked files and the hub's state included.
    sent = build_context(ROOT, image_ignore_text())
    top = {p.split("/")[0] for p in sent}
    assert top <= {".lab", ".lab-zh", "Makefile", "README.md", "chapters", "deploy", "pyproject.toml", "transformer_lib"}, top
    assert not [p for p in sent if p.startswith("deploy/hub/state") or "__pycache__" in p or ".ipynb_checkpoints" in p]
    assert not [p for p in NEEDED if p not in sent], [p for p in NEEDED if p not in sent]
    cfg = course_config()
    for path in (cfg.STUDENT_CONFIG, cfg.INSTRUCTOR_CONFIG, *cfg.LAB_CONFIG.values(), *cfg.START_PAGE.values()):
        relative = path[len(IMAGE_COURSE) + 1:]
        assert relative in sent or relative + "/" in sent, f"course_config.py uses {path}, which the image lacks"
    tracked = subprocess.run(["git", "ls-files", "transformer_lib", "chapters", ".lab", ".lab-zh", "deploy/kubernetes"],
                             cwd=ROOT, capture_output=True, text=True)
    if tracked.returncode == 0:
        missing = [p for p in tracked.stdout.split() if p not in sent and (ROOT / p).exists()]
        assert not missing, f"tracked files the image would lack: {missing[:5]}"


def test_the_dockerfile_refuses_a_context_that_ignored_the_list(tmp_path):
    """A builder that does not read Dockerfile.dockerignore copies everything: the Dockerfile's guard
    (run here with sh, in a copy of the context) admits the names the list lets in, and nothing else."""
    lines = (K8S / "Dockerfile").read_text().replace("\\\n", " ").splitlines()
    guard = [ln[len("RUN "):] for ln in lines if ln.startswith("RUN ") and 'case "$name"' in ln]
    assert len(guard) == 1, "the Dockerfile's guard after COPY is missing"

    def context(name: str, *paths: str) -> Path:
        for path in paths:
            (tmp_path / name / path).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / name / path).write_text("x")
        return tmp_path / name

    def guard_passes(folder: Path) -> bool:
        return subprocess.run(["sh", "-c", guard[0]], cwd=folder, capture_output=True).returncode == 0

    assert guard_passes(context("clean", *NEEDED))
    for intruder in ("solutions/02/02.ipynb", ".git/config", "deploy/hub/state/x", "roster.csv"):
        assert not guard_passes(context(intruder.replace("/", "_"), *NEEDED, intruder)), intruder


# -- a uid of each user's own ------------------------------------------------------------------------


def colliding_logins() -> tuple[str, str]:
    """Two logins with one uid (a birthday search: about 50,000 hashes)."""
    uid_of_login, seen = course_config().uid_of_login, {}
    for i in range(1_000_000):
        login = f"s{i}"
        uid = uid_of_login(login)
        if uid in seen:
            return seen[uid], login
        seen[uid] = login
    raise AssertionError("no two logins share a uid in a million: is the span wider than 2^31?")


def test_each_login_has_its_own_uid_in_every_pod_and_after_restarts(offline_kubespawner, tmp_path):
    roster = "login,name,role,language\nana,Ana,student,en\nbo,Bo,student,zh\nprof,Prof,instructor,en\n"
    c1, _ = load(roster=roster, tmp=tmp_path)
    c2, _ = load(roster=roster, tmp=tmp_path)  # the hub restarted, its database new: other user ids
    groups = {"ana": ["students"], "bo": ["students", "lang-zh"], "prof": ["instructors"]}
    uids = {}
    for login in groups:
        before = pod_for(offline_kubespawner, c1, fake_user(login, 7, groups[login]))
        after = pod_for(offline_kubespawner, c2, fake_user(login, 42, groups[login]))
        uids[login] = container(before)["securityContext"]["runAsUser"]
        assert container(after)["securityContext"]["runAsUser"] == uids[login], f"{login}'s uid changed with the restart"
        for pod in (before, after):
            check_uid(pod, uids[login])
            assert container(pod)["securityContext"]["runAsGroup"] == 100
    assert len(set(uids.values())) == 3, uids
    for uid in uids.values():
        assert uid != 1000 and 1004095 < uid < 2**31, uid  # not jovyan, not the grader's sandbox uids
    # The collect command computes the same uids without the hub (course_config.py as a module).
    assert course_config().roster_uids(list(groups)) == uids
    # Pinned: a changed derivation changes every user's uid, and their files become nobody's.
    assert uids["ana"] == 418968010


def test_two_logins_sharing_a_uid_are_refused(offline_kubespawner, tmp_path):
    first, second = colliding_logins()
    roster = f"login,name,role,language\n{first},A,student,en\n{second},B,student,en\nprof,P,instructor,en\n"
    with pytest.raises(ValueError, match=f"{first} and {second} would run as the same uid"):
        load(roster=roster, tmp=tmp_path)
    # With LTI there is no roster: the hub's own users are checked when a server starts.
    c, _ = load(tmp=tmp_path)
    user = fake_user(second, 8, ["students"])
    user.db = types.SimpleNamespace(query=lambda column: [(first,), (second,), ("prof",)])
    with pytest.raises(RuntimeError, match="same uid"):
        pod_for(offline_kubespawner, c, user)
    user.db = types.SimpleNamespace(query=lambda column: [(second,), ("prof",)])
    check_uid(pod_for(offline_kubespawner, c, user), course_config().uid_of_login(second))


# -- the instructor's collect ------------------------------------------------------------------------

ROSTER = "login,name,role,language\nana,Ana,student,en\nbo,Bo,student,zh\nprof,Prof,instructor,en\n"


def test_collect_screens_with_the_hubs_uids_then_collects_with_update(tmp_path, monkeypatch):
    collect = collect_module()
    (tmp_path / "roster.csv").write_text(ROSTER)
    people = collect.read_people(tmp_path / "roster.csv")
    exchange, course = tmp_path / "exchange", tmp_path / "course"
    screened, ran, said = [], [], []

    def screen(exchange_root, course_id, chapters, uid_of, staging, aside, judge=None):
        screened.append(dict(exchange_root=exchange_root, course_id=course_id, chapters=chapters, uid_of=uid_of,
                             staging=staging, aside=aside, judge=judge))
        if course_id == "transformer-course":
            return [types.SimpleNamespace(student="ana", chapter="02_self_attention")], ["set aside x: it claims to be ana's"]
        return [], []

    monkeypatch.setattr(collect.exchange_rules, "collect_safely", screen)
    monkeypatch.setattr(collect, "layout_problems", lambda *a: [])
    received = []  # classhub writes autograder/received.json of the checkout it is in: not here
    monkeypatch.setattr(collect.classhub, "record_received", lambda entries: received.extend(entries) or [])
    uids = course_config().roster_uids(["ana", "bo", "prof"])

    # The dry run says what it would screen and run, and does neither.
    collect.collect(people, ["02_self_attention"], exchange, course, dry_run=True, run=ran.append, say=said.append)
    assert not screened and not ran
    assert all(str(uid) in "\n".join(said) for uid in uids.values())
    assert [ln for ln in said if ln.startswith("would run:") and " collect 02_self_attention --update " in ln]

    said.clear()
    collect.collect(people, ["02_self_attention"], exchange, course,
                    run=lambda argv, **kw: ran.append((argv, kw)), say=said.append)
    staging = course / "autograder" / ".exchange-staging"
    assert [s["course_id"] for s in screened] == ["transformer-course", "transformer-course-zh"]
    for s in screened:
        assert s["uid_of"] == uids and s["exchange_root"] == exchange and s["chapters"] == ["02_self_attention"]
        assert s["staging"] == staging and s["aside"] == exchange / s["course_id"] / "set-aside"
        assert callable(s["judge"])
    assert len(ran) == 1, ran  # only the English course had a submission
    argv, kw = ran[0]
    assert argv[argv.index("collect"):] == ["collect", "02_self_attention", "--update",
                                            "--CourseDirectory.course_id=transformer-course", f"--Exchange.root={staging}"]
    assert kw["cwd"] == course and kw.get("check") is True
    assert [(e.student, e.chapter) for e in received] == [("ana", "02_self_attention")]
    assert said == ["set aside x: it claims to be ana's", "collected 1, set aside 1"]


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give files the students' uids")
def test_collect_takes_a_students_own_submission_and_sets_aside_another_uids(tmp_path, monkeypatch):
    """The real screen (deploy/hub/exchange.py): an entry in ana's name that bo's uid wrote is set aside."""
    collect = collect_module()
    monkeypatch.setattr(collect.classhub, "record_received", lambda entries: [])  # this checkout's autograder/
    (tmp_path / "roster.csv").write_text(ROSTER)
    people = collect.read_people(tmp_path / "roster.csv")
    uids = course_config().roster_uids(["ana", "bo", "prof"])
    exchange, course = tmp_path / "exchange", tmp_path / "course"
    course_ids = [course_id for course_id, _ in collect.classhub.EDITIONS.values()]
    collect.exchange_rules.prepare(exchange, course_ids)  # root's, as the collecting instructor's uid is here
    assert collect.layout_problems(exchange, course_ids, os.getuid()) == []
    inbound = exchange / "transformer-course" / "inbound"
    notebook = (ROOT / "chapters" / "02_self_attention" / "02_self_attention.ipynb").read_bytes()
    for name, writer in (("ana+02_self_attention+2026-01-05 10:00:00.000000 UTC+own", "ana"),
                         ("ana+02_self_attention+2026-01-05 11:00:00.000000 UTC+forged", "bo")):
        (inbound / name).mkdir()
        (inbound / name / "02_self_attention.ipynb").write_bytes(notebook)
        for path in (inbound / name, inbound / name / "02_self_attention.ipynb"):
            os.chown(path, uids[writer], 100)
    ran, said = [], []
    collect.collect(people, ["02_self_attention"], exchange, course, run=lambda argv, **kw: ran.append(argv), say=said.append)
    assert [ln for ln in said if "+forged" in ln and f"written by uid {uids['bo']}" in ln], said
    assert said[-1] == "collected 1, set aside 1"
    staged = list((course / "autograder" / ".exchange-staging" / "transformer-course" / "inbound").iterdir())
    assert [p.name.split("+")[0] for p in staged] == ["ana"]
    assert [p.name for p in (exchange / "transformer-course" / "set-aside").iterdir()] == [
        "ana+02_self_attention+2026-01-05 11:00:00.000000 UTC+forged"]
    assert len(ran) == 1 and "--update" in ran[0]


# -- the roster, as the one-server hub reads it ------------------------------------------------------


def test_the_roster_is_read_as_on_one_server_with_a_bom_and_refusing_a_login_twice(tmp_path):
    """A spreadsheet's "CSV UTF-8" starts with a byte-order mark: the hub and collect.py read it as
    without; a login twice stops both, in one line naming the line (deploy/hub/roster.py's checks)."""
    bom = "\ufeff" + ROSTER
    plain_hub, _ = load(roster=ROSTER, tmp=tmp_path)
    bom_hub, _ = load(roster=bom, tmp=tmp_path)
    for section, name in (("JupyterHub", "load_groups"), ("Authenticator", "allowed_users"), ("Authenticator", "admin_users")):
        assert bom_hub[section].get(name) == plain_hub[section].get(name) and plain_hub[section].get(name), name
    (tmp_path / "plain.csv").write_text(ROSTER, encoding="utf-8")
    (tmp_path / "bom.csv").write_text(bom, encoding="utf-8")
    people = {"ana": ("student", "en"), "bo": ("student", "zh"), "prof": ("instructor", "en")}
    assert course_config().read_roster(str(tmp_path / "bom.csv")) == course_config().read_roster(str(tmp_path / "plain.csv")) == people
    assert collect_module().read_people(tmp_path / "bom.csv") == collect_module().read_people(tmp_path / "plain.csv")

    twice = ROSTER + "ana,Ana Again,student,zh\n"
    with pytest.raises(ValueError) as refused:
        load(roster=twice, tmp=tmp_path)
    message = str(refused.value)
    assert "\n" not in message and "line 5" in message and "'ana' appears twice (first on line 2)" in message, message
    # Before helm upgrade, on the instructor's computer (README, step 5): the same line, and nothing else.
    (tmp_path / "twice.csv").write_text(twice)
    checked = subprocess.run([sys.executable, str(K8S / "course_config.py"), str(tmp_path / "twice.csv")],
                             capture_output=True, text=True, timeout=60)
    assert checked.returncode == 1 and not checked.stdout, checked
    assert checked.stderr.strip().count("\n") == 0 and "'ana' appears twice" in checked.stderr, checked.stderr


def test_a_user_deleted_for_a_password_reset_keeps_role_edition_and_home(offline_kubespawner, tmp_path):
    """Deleting a user on the Admin page resets a FirstUseAuthenticator password. The user comes back
    with another id and in no group (the roster's groups are loaded when the hub starts), and
    KubeSpawner deletes a deleted user's home volume unless told not to."""
    c, _ = load(roster=ROSTER, tmp=tmp_path)
    check_instructor(pod_for(offline_kubespawner, c, fake_user("prof", 90, [])))
    check_student(pod_for(offline_kubespawner, c, fake_user("bo", 91, [])), "zh")
    before = pod_for(offline_kubespawner, c, fake_user("ana", 7, ["students"]))["_spawner"]
    after = pod_for(offline_kubespawner, c, fake_user("ana", 92, []))["_spawner"]
    assert before.pvc_name == after.pvc_name, "the home volume's name must follow the login, not the hub's user id"
    deleted = []

    async def delete_pvc(name, request_timeout):  # the Kubernetes API call KubeSpawner would make
        deleted.append(name)
        return True

    before._make_delete_pvc_request = delete_pvc
    asyncio.run(before.delete_forever())  # what the hub calls when the user is deleted
    assert deleted == [], f"deleting the user deletes their home volume {deleted}"


# -- the image's JupyterHub is the chart's -------------------------------------------------------------

# The JupyterHub each Zero to JupyterHub chart runs in its hub pod, from the chart's changelog
# (docs/source/changelog.md, "4.3.3 - 2026-03-26": "(jupyterhub 5.4.4)"). Nothing installed here says it.
CHART_JUPYTERHUB = {"4.3.3": "5.4.4"}


def test_the_images_jupyterhub_is_the_charts_major_version():
    """A single-user server a major version apart from its hub "could cause failure to authenticate"
    (jupyterhub._version): the image installs the chart's JupyterHub after the README's install line."""
    import tomllib
    from importlib import metadata

    from packaging.requirements import Requirement

    commands = [readme_helm_command(readme_k8s())]
    commands.append(readme_helm_command("```\n" + "\n".join(
        ln[1:].strip() + "\n" for ln in (K8S / "values.yaml").read_text().splitlines() if ln.startswith("#   ")) + "```\n"))
    (chart,) = {v for words in commands for v in helm_options(words, "--version")}
    hub = CHART_JUPYTERHUB[chart]
    runs = [ln[len("RUN "):] for ln in (K8S / "Dockerfile").read_text().splitlines() if ln.startswith("RUN ")]
    install = runs.index(dockerfile_install_command((K8S / "Dockerfile").read_text()))
    pins = [(i, m[1]) for i, run in enumerate(runs) if (m := re.fullmatch(r'\.venv/bin/pip install --quiet "jupyterhub==([\d.]+)"', run))]
    assert [version for _, version in pins] == [hub] and pins[0][0] > install, (pins, hub)
    assert hub in readme_k8s() and chart in readme_k8s()
    # What else the image installs accepts that JupyterHub (transformer_lib[hub] itself asks for the
    # one-server hub's 6.1.1: pip warns, and only jupyterhub-singleuser runs in the image).
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = project["dependencies"] + project["optional-dependencies"]["grade"] + project["optional-dependencies"]["hub"]
    names = {Requirement(r).name for r in wanted} - {"transformer_lib", "jupyterhub"}
    for name in sorted(names):
        for line in metadata.requires(name) or []:
            need = Requirement(line)
            if need.name == "jupyterhub" and not (need.marker and "extra" in str(need.marker)):
                assert need.specifier.contains(hub), f"{name} needs {need}, the image has jupyterhub {hub}"


# -- feedback on Kubernetes ------------------------------------------------------------------------------


def test_feedback_puts_the_secret_beside_each_page_and_releases_per_edition(tmp_path):
    """On a course folder of fake submissions, pages and autograder/graded.json, with nbgrader's own
    release step (the course's exchange class, in this process, on this folder)."""
    import hashlib

    from nbgrader.auth import Authenticator
    from nbgrader.coursedir import CourseDirectory
    from nbgrader.utils import notebook_hash

    feedback = feedback_module()
    classhub = feedback.classhub
    course, exchange, chapter = tmp_path / "course", tmp_path / "exchange", "02_self_attention"
    exchange.mkdir()
    people = [{"login": login, "role": role, "language": language} for login, role, language in (
        ("ana", "student", "en"), ("bo", "student", "zh"), ("cy", "student", "en"), ("dee", "student", "en"),
        ("prof", "instructor", "en"))]
    graded = {}

    def hand_in(login: str, notebook: bytes, graded_from: bytes | None) -> None:
        folder = course / "autograder" / "submitted" / login / chapter
        folder.mkdir(parents=True)
        (folder / f"{chapter}.ipynb").write_bytes(notebook)
        (folder / "timestamp.txt").write_text("2026-03-01 10:00:00.000000 UTC")
        (folder / "submission_secret.txt").write_text(f"secret of {login}")
        if graded_from is not None:  # make grade wrote the page, and recorded what it graded
            page = course / "autograder" / "feedback" / login / chapter / f"{chapter}.html"
            page.parent.mkdir(parents=True)
            page.write_text(f"<p>{login}'s feedback</p>")
            graded[login] = {chapter: {"submission": hashlib.sha256(graded_from).hexdigest()}}

    hand_in("ana", b"ana 1", b"ana 1")
    hand_in("bo", b"bo 1", b"bo 1")
    hand_in("cy", b"cy 2", b"cy 1")  # resubmitted and collected after grading
    hand_in("dee", b"dee 1", None)  # collected, not graded yet
    gone = course / "autograder" / "feedback" / "gone" / chapter  # a student since taken off the roster
    gone.mkdir(parents=True)
    (gone / f"{chapter}.html").write_text("<p>gone</p>")
    (course / "autograder" / "graded.json").write_text(json.dumps({"version": 1, "submissions": graded}))

    def nbgrader_release(step, language, chapters, exchange_root, exclude=()):
        """classhub.exchange_step's release_feedback, on this course folder."""
        assert step == "feedback"
        for name in chapters:
            coursedir = CourseDirectory(root=str(course), feedback_directory=os.path.join("autograder", "feedback"),
                                        course_id=classhub.EDITIONS[language][0], assignment_id=name,
                                        student_id_exclude=",".join(exclude))
            classhub.course_exchange.ExchangeReleaseFeedback(
                coursedir=coursedir, authenticator=Authenticator(), root=str(exchange_root)).start()

    # nbgrader's release alone (README's old `nbgrader release_feedback`) stops at the first page.
    with pytest.raises(FileNotFoundError, match="timestamp.txt"):
        nbgrader_release("feedback", "en", [chapter], exchange, exclude=["bo", "cy", "dee", "gone", "prof"])

    said, released = [], []
    feedback.feedback(people, [chapter], exchange, course, dry_run=True, release=released.append, say=said.append)
    assert not released and not (course / "autograder" / "feedback" / "ana" / chapter / "timestamp.txt").exists()
    assert "would release 02_self_attention to transformer-course in " + str(exchange) + ": ana" in said, said

    said.clear()
    feedback.feedback(people, [chapter], exchange, course, release=nbgrader_release, say=said.append)
    assert said == ["cy / 02_self_attention: resubmitted since it was graded (run make grade first)",
                    "dee / 02_self_attention: not graded yet (run make grade first)",
                    "feedback released: 2 pages"], said
    for login, course_id in (("ana", "transformer-course"), ("bo", "transformer-course-zh")):
        # the name the student's own copy computes when fetching (nbgrader's fetch_feedback)
        name = notebook_hash(secret=f"secret of {login}", notebook_id=chapter) + ".html"
        pages = sorted(p.name for p in (exchange / course_id / "feedback").iterdir())
        assert pages == [name], (course_id, pages)
        assert (exchange / course_id / "feedback" / name).read_text() == f"<p>{login}'s feedback</p>"

    # The README's walk-through returns feedback with it, for both editions.
    teach = [body for _, body in code_blocks(readme_k8s()) if "cd /srv/course" in body]
    assert len(teach) == 1 and f"python deploy/kubernetes/feedback.py {chapter}" in teach[0], teach
    assert "nbgrader release_feedback" not in teach[0], "nbgrader's release alone stops with FileNotFoundError"


# -- the README: what the administrators give, the Chinese edition ------------------------------------


def test_the_readme_asks_the_administrators_for_what_only_they_can_give():
    readme = readme_k8s()
    section = readme[readme.index("## 0. "):readme.index("## 1. ")]
    # what the manifests make that no namespace holds, and what the chart needs of the cluster
    nfs_kinds = {doc["kind"] for doc in yaml.safe_load_all((K8S / "exchange-nfs.yaml").read_text())}
    cluster_wide = (nfs_kinds & {"PersistentVolume"}) | {"DaskCluster", "CustomResourceDefinition", "StorageClass",
                                                         "userScheduler", "NetworkPolicies", "privileged"}
    for needed in sorted(cluster_wide):
        assert needed in section, f"step 0 does not ask for {needed}"
    assert "With one namespace only" in section and "userScheduler: {enabled: false}" in section


def test_the_chinese_readme_has_the_same_commands_and_keeps_to_the_term_list():
    english, chinese = readme_k8s(), (K8S / "README.zh.md").read_text(encoding="utf-8")
    assert code_blocks(chinese) == code_blocks(english), "README.zh.md's code blocks differ from README.md's"
    assert readme_values(chinese) == readme_values(english)
    for url in re.findall(r"`(https://HUB-ADDRESS/[^`]*)`", english):
        assert url in chinese, url
    # tests/test_zh_terms.py reads README.zh.md and chapters/zh/README.md only: its rules, on this one
    zh_terms = _module("zh_terms", ROOT / "tests" / "test_zh_terms.py")
    found = zh_terms.violations(zh_terms.Text("deploy/kubernetes/README.zh.md", "", 1, chinese, "readme"))
    assert not found, "\n".join(map(str, found))
