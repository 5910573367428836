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
with deploy/hub/exchange.py's real screen. The last test feeds the checks deliberately wrong
configurations and expects each to be caught.
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
    storage = su.get("storage", {})
    c.KubeSpawner.volumes = [{"name": "volume-{user_server}", "persistentVolumeClaim": {"claimName": "claim-{user_server}"}}]
    c.KubeSpawner.volume_mounts = [{"name": "volume-{user_server}", "mountPath": storage.get("homeMountPath", "/home/jovyan")}]
    c.KubeSpawner.volumes.extend(storage.get("extraVolumes", []))
    c.KubeSpawner.volume_mounts.extend(storage.get("extraVolumeMounts", []))
    for section, settings in (vals.get("hub", {}).get("config") or {}).items():
        c[section].update(settings)

    # hub.extraFiles: the files the chart mounts, here read from the repository.
    files = {}
    for key, spec in vals["hub"].get("extraFiles", {}).items():
        if key == "course-config":
            files[spec["mountPath"]] = course_config_text if course_config_text is not None else (K8S / "course_config.py").read_text()
        elif key == "roster":
            files[spec["mountPath"]] = roster if roster is not None else spec.get("stringData", "")
    real_open = open

    def chart_open(path, *args, **kwargs):
        if str(path) in files:
            target = (tmp or Path("/tmp")) / ("mounted-" + Path(path).name)
            target.write_text(files[str(path)])
            return real_open(target, *args, **kwargs)
        return real_open(path, *args, **kwargs)

    course_config_mod = {"c": c, "get_config": get_config, "open": chart_open, "__name__": "__config__"}
    for name, text in sorted(vals["hub"].get("extraConfig", {}).items()):
        exec(compile(text, f"hub.extraConfig.{name}", "exec"), course_config_mod)
    # course_config.py reads the roster with os.path.exists + open: point it at the mounted text.
    return c, course_config_mod


def load(vals=None, course_config_text=None, roster=None, tmp=None):
    vals = values() if vals is None else vals
    roster_path = None
    if roster is not None:
        roster_path = (tmp or Path("/tmp")) / "roster.csv"
        roster_path.write_text(roster)
    text = course_config_text if course_config_text is not None else (K8S / "course_config.py").read_text()
    if roster_path is not None:
        text = text.replace('ROSTER = "/usr/local/etc/jupyterhub/course/roster.csv"', f'ROSTER = "{roster_path}"')
    return hub_config(vals, text, roster, tmp)


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
    out.append({
        "server": {k.rsplit(".", 1)[-1]: v for k, v in ext.items() if k.startswith("nbgrader.")},
        "disabled": {k: v for k, v in (get_static_page_config(level="all").get("disabledExtensions") or {}).items() if v},
        "course_id": nb.config.CourseDirectory.get("course_id"),
        "exchange": nb.config.Exchange.get("root"),
        "exchange_classes": {k: (v, import_item(v).__module__) for k, v in nb.config.ExchangeFactory.items()},
    })
print(json.dumps(out))
"""


@functools.lru_cache(maxsize=1)
def _resolved() -> dict:
    """One process resolves every configuration path the tests ask about (a fresh process: no config cached)."""
    wanted = [STUDENT_EN, STUDENT_ZH, INSTRUCTOR, INSTRUCTOR_ONLY]
    paths = [[in_repo(p.format(c=IMAGE_COURSE)) for p in path] for path in wanted]
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


def check_no_formgrader(resolved: dict) -> None:
    assert resolved["server"].get("formgrader") is False, f"a student's server loads the Formgrader: {resolved['server']}"
    assert resolved["disabled"].get("@jupyter/nbgrader:formgrader"), "the Formgrader's JupyterLab plugin is enabled"
    assert resolved["disabled"].get("@jupyter/nbgrader:create-assignment"), "Create Assignment is enabled"
    assert resolved["server"].get("assignment_list") is True, "students need the Assignments tab's server extension"
    assert not resolved["disabled"].get("@jupyter/nbgrader:assignment-list"), "the Assignments tab is switched off"


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


def _module(name: str):
    spec = importlib.util.spec_from_file_location(name, K8S / f"{name}.py")
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


def test_lti13_settings_are_the_authenticators_traits(tmp_path):
    text = (K8S / "values.yaml").read_text()
    block = text.split("# LTI13 begin\n")[1].split("# LTI13 end")[0]
    uncommented = "\n".join(re.sub(r"^(\s*)# ", r"\1", ln) for ln in block.splitlines())
    lti = yaml.safe_load(uncommented)
    from ltiauthenticator.lti13.auth import LTI13Authenticator
    assert lti["authenticator_class"] == "ltiauthenticator.lti13.auth.LTI13Authenticator"
    traits = LTI13Authenticator.class_trait_names(config=True)
    for key in ("issuer", "client_id", "authorize_url", "jwks_endpoint", "username_key"):
        assert key in lti["LTI13Authenticator"] and key in traits, key
    for key in lti["LTI13Authenticator"]:
        assert key in traits, f"LTI13Authenticator has no setting {key}"
    # With LTI switched on, groups come from each launch.
    vals = values()
    vals["hub"]["config"]["JupyterHub"]["authenticator_class"] = lti["authenticator_class"]
    vals["hub"]["config"]["LTI13Authenticator"] = lti["LTI13Authenticator"]
    c, mod = load(vals, tmp=tmp_path)
    assert c.Authenticator.manage_groups is True
    hook = c.Authenticator.post_auth_hook
    teacher = hook(None, None, {"name": "t", "auth_state": {
        "https://purl.imsglobal.org/spec/lti/claim/roles": ["http://purl.imsglobal.org/vocab/lis/v2/membership#Instructor"]}})
    learner = hook(None, None, {"name": "s", "auth_state": {
        "https://purl.imsglobal.org/spec/lti/claim/roles": ["http://purl.imsglobal.org/vocab/lis/v2/membership#Learner"],
        "https://purl.imsglobal.org/spec/lti/claim/launch_presentation": {"locale": "zh-CN"}}})
    assert teacher["groups"] == ["instructors"] and learner["groups"] == ["students", "lang-zh"]
    # The URLs the README tells the instructor to paste into the LMS are the authenticator's.
    readme = (K8S / "README.md").read_text()
    auth = LTI13Authenticator()
    for url in (auth.login_url("/hub/"), auth.callback_url("/hub/"), auth.config_json_url("/hub/")):
        assert f"https://HUB-ADDRESS{url}" in readme, url


def test_grading_cluster_spec(tmp_path):
    spec_mod = importlib.util.spec_from_file_location("grading_cluster", K8S / "grading_cluster.py")
    grading = importlib.util.module_from_spec(spec_mod)
    spec_mod.loader.exec_module(grading)
    vals = values()
    image = f"{vals['singleuser']['image']['name']}:{vals['singleuser']['image']['tag']}"
    spec = grading.cluster_spec(image, workers=3)
    assert spec["kind"] == "DaskCluster" and spec["spec"]["worker"]["replicas"] == 3
    check_cluster_spec(spec, image)
    policy = grading.network_policy()
    sources = policy["spec"]["ingress"][0]["from"]
    assert {"course-role": "instructor"} in [s.get("podSelector", {}).get("matchLabels") for s in sources]
    # The printed YAML is what `kubectl apply` gets; the README's command uses the same scheduler address.
    assert grading.main(["--image", image]) == 0
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
