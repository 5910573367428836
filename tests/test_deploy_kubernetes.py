"""deploy/kubernetes, checked as far as it can be without a cluster, a registry or the network.

The hub's configuration (deploy/kubernetes/course_config.py) is run the way the Zero to JupyterHub
chart runs it: values.yaml's hub.config applied to a traitlets Config, then hub.extraConfig executed
with `c` and the chart's `get_config` (a stand-in reading values.yaml). KubeSpawner, with the
Kubernetes client stubbed out, then builds the pod manifests of a student, a Chinese-edition student
and an instructor. The Dask grading cluster's spec is built with dask-kubernetes; the learner's and
instructor's Jupyter configuration is resolved the way jupyter_server and JupyterLab resolve it;
the Dockerfile's install is compared with the README's. The last test feeds the same checks
deliberately wrong configurations and expects each to be caught.
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
    for pod, user_id in ((ana, 7), (bo, 8), (prof, 9)):
        assert container(pod)["image"] == image
        check_uid(pod, 200000 + user_id)
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
    c_jovyan, _ = load(course_config_text=text.replace("c.KubeSpawner.uid = course_uid", "c.KubeSpawner.uid = 1000"), tmp=tmp_path)
    with pytest.raises(AssertionError):
        check_uid(pod_for(offline_kubespawner, c_jovyan, fake_user("ana", 7, ["students"])), 200007)
    check_uid(good, 200007)

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
