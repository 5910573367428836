"""The course's JupyterHub configuration on Kubernetes (Zero to JupyterHub, KubeSpawner).

This text is the only Python configuration of the hub. `helm upgrade ... --set-file
hub.extraFiles.course-config.stringData=deploy/kubernetes/course_config.py` puts it in the hub pod,
and values.yaml's `hub.extraConfig.course` runs it inside the chart's jupyterhub_config.py, where
`c` (the hub's traitlets config) and `get_config` (the chart's: it reads values.yaml by key) exist.
tests/test_deploy_kubernetes.py runs it the same way and asserts what it sets.

Who gets what, decided per user when their server starts (from the roster, else the hub's groups):

* `instructors`: Formgrader on the course directory (/srv/course, a PVC), the course's own
  nbgrader configuration (autograder/nbgrader_config.py), the exchange, more CPU and memory.
* everyone else (the `students` group): the learner's lab of their edition (.lab or .lab-zh: no
  Formgrader, no Create Assignment), plus nbgrader's Assignments tab on their edition's course in
  the exchange: `transformer-course` (English, released from chapters/) or `transformer-course-zh`
  (Chinese, from chapters/zh/, for members of the group `lang-zh`).

Groups come from a roster CSV (login,name,role,language) mounted at ROSTER, or, with LTI 1.3,
from each launch: the LMS's Instructor role, and a locale starting with "zh" (or a custom
parameter course_lang=zh), at every login. The roster is read by the one-server hub's own reader,
deploy/hub/roster.py (a spreadsheet's BOM, valid logins, no login twice, known roles and languages,
one line naming what is wrong), mounted beside this file at ROSTER_READER. With a roster, a
person's role and edition are the roster's even when the hub's groups lost them (a user deleted on
the Admin page to reset a password comes back in no group until the hub restarts).

Each user's server runs as a uid of their own, a hash of their login (uid_of_login): the same on
every start, whatever happens to the hub's database, and computable without the hub, so the
instructor's collect (collect.py, which imports this file) knows whose uid owns each submission in
the exchange. Two logins that would share a uid stop the hub (roster) or that user's server (LTI).

Imported as a module (collect.py), only the definitions run; the hub's settings at the end need the
chart's `c` and `get_config`. Run as a script, it prints each roster login's uid (Python alone):

    python3 deploy/kubernetes/course_config.py roster.csv
"""

import hashlib
import importlib.util
import os
import sys

# Where the image keeps the course (its .venv included) and where pods mount the shared volumes.
COURSE = "/opt/course"
EXCHANGE = "/srv/nbgrader/exchange"
COURSE_DIR = "/srv/course"
COURSE_IDS = {"en": "transformer-course", "zh": "transformer-course-zh"}
LAB_CONFIG = {"en": COURSE + "/.lab", "zh": COURSE + "/.lab-zh"}
START_PAGE = {"en": COURSE + "/chapters/README.md", "zh": COURSE + "/chapters/zh/README.md"}
STUDENT_CONFIG = COURSE + "/deploy/kubernetes/jupyter/student"
INSTRUCTOR_CONFIG = COURSE + "/deploy/kubernetes/jupyter/instructor"
ROSTER = "/usr/local/etc/jupyterhub/course/roster.csv"
# deploy/hub/roster.py in the hub pod (hub.extraFiles.course-roster-reader); elsewhere the checkout's own.
ROSTER_READER = "/usr/local/etc/jupyterhub/course/roster.py"
USERS_GID = 100  # the image's `users` group; the home volume is group-writable for it (fsGroup)
# Users' uids lie in [UID_BASE, UID_BASE + UID_SPAN): above jovyan (1000) and the grader's sandbox
# uids (autograder/isolation.py: 1000000 to 1004095), below 2^31, Kubernetes' largest runAsUser.
# A span this wide makes two logins sharing a uid rare (about 1 in 2000 for 1000 people), and
# checked. Changing either number changes every user's uid: their files in the exchange and home
# then belong to nobody current.
UID_BASE = 2_000_000
UID_SPAN = 1 << 30


# -- who is who -----------------------------------------------------------------------


# The roster the hub read at start ({login: (role, language)}; empty with LTI or without a roster).
ROSTER_PEOPLE = {}


def group_names(user):
    return {getattr(g, "name", g) for g in (getattr(user, "groups", None) or [])}


def role_of(user):
    if user.name in ROSTER_PEOPLE:
        return ROSTER_PEOPLE[user.name][0]
    return "instructor" if "instructors" in group_names(user) else "student"


def language_of(user):
    if user.name in ROSTER_PEOPLE:
        return ROSTER_PEOPLE[user.name][1]
    return "zh" if "lang-zh" in group_names(user) else "en"


def roster_reader():
    """deploy/hub/roster.py as a module: the one-server hub's reader and checks, not a second parser."""
    here = globals().get("__file__") or ""
    candidates = [ROSTER_READER]
    if os.path.basename(here) == "course_config.py":  # imported or run from a checkout or the image
        candidates.append(os.path.join(os.path.dirname(os.path.abspath(here)), "..", "hub", "roster.py"))
    for path in candidates:
        if os.path.exists(path):
            spec = importlib.util.spec_from_file_location("course_roster", path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = module  # its dataclass looks its module up there
            spec.loader.exec_module(module)
            return module
    raise RuntimeError(f"no roster reader at {ROSTER_READER}: add `--set-file "
                       "hub.extraFiles.course-roster-reader.stringData=deploy/hub/roster.py` to helm upgrade")


def read_roster(path=ROSTER):
    """{login: (role, language)} from a CSV with columns login,name,role,language, checked as on one
    server (a ValueError of one line names the file, the line and the fix); {} without a roster, or
    with the chart's default one (its header alone), which lets nobody in."""
    if not os.path.exists(path):
        return {}
    with open(path, encoding="utf-8-sig") as f:
        if not any(line.strip() for line in f.read().splitlines()[1:]):
            return {}
    return {p.login: (p.role, p.language) for p in roster_reader().read_roster(path)}


def roster_groups(people):
    groups = {"instructors": [], "students": [], "lang-zh": []}
    for login, (role, language) in sorted(people.items()):
        groups["instructors" if role == "instructor" else "students"].append(login)
        if language == "zh":
            groups["lang-zh"].append(login)
    return {name: {"users": users} for name, users in groups.items()}


# -- uids ----------------------------------------------------------------------------------


def uid_of_login(login):
    """The uid a login's server runs as: a hash (not Python's hash(), which changes per process)."""
    digest = hashlib.sha256(login.encode("utf-8")).digest()
    return UID_BASE + int.from_bytes(digest[:8], "big") % UID_SPAN


def roster_uids(logins):
    """{login: uid} for every login; two logins with one uid could submit in each other's name."""
    uids, owner = {}, {}
    for login in logins:
        uid = uid_of_login(login)
        if uid in owner:
            raise ValueError(f"{owner[uid]} and {login} would run as the same uid {uid}: "
                             "give one of them another login")
        uids[login], owner[uid] = uid, login
    return uids


def _hub_logins(user):
    """Every login in the hub's database (LTI users have no roster to check them against)."""
    db = getattr(user, "db", None)
    if db is None:
        return []
    from jupyterhub import orm

    return [name for (name,) in db.query(orm.User.name)]


# -- per user, when the server starts ----------------------------------------------------


def course_uid(spawner):
    """The user's own uid (KubeSpawner.uid); refuses to start a server whose uid another user has."""
    login = spawner.user.name
    uid = uid_of_login(login)
    for other in _hub_logins(spawner.user):
        if other != login and uid_of_login(other) == uid:
            raise RuntimeError(f"{login} and {other} would run as the same uid {uid}: "
                               "their submissions could not be told apart; rename one of them")
    return uid


def course_pre_spawn_hook(spawner):
    """Set the user's role and edition on the spawner, from what the chart configured (each start alike)."""
    base = getattr(spawner, "_course_base", None)
    if base is None:  # the spawner object lives on between starts: start from the configured values each time
        base = spawner._course_base = {
            "environment": dict(spawner.environment), "extra_labels": dict(spawner.extra_labels),
            "volumes": list(spawner.volumes), "volume_mounts": list(spawner.volume_mounts),
            "notebook_dir": spawner.notebook_dir, "default_url": spawner.default_url,
            "cpu_limit": spawner.cpu_limit, "mem_limit": spawner.mem_limit,
        }
    user = spawner.user
    role, language = role_of(user), language_of(user)
    env = dict(base["environment"])
    env.update({
        "COURSE_LANG": language,
        "COURSE_ROLE": role,
        "NBGRADER_EXCHANGE": EXCHANGE,
        "NBGRADER_COURSE_ID": COURSE_IDS[language],
    })
    labels = dict(base["extra_labels"], **{"course-role": role})
    volumes, mounts = list(base["volumes"]), list(base["volume_mounts"])
    notebook_dir, default_url = base["notebook_dir"], base["default_url"]
    cpu_limit, mem_limit = base["cpu_limit"], base["mem_limit"]
    if role == "instructor":
        # Formgrader on the course directory, with the course's nbgrader configuration (`make formgrader`).
        env["JUPYTER_CONFIG_PATH"] = f"{INSTRUCTOR_CONFIG}:{COURSE_DIR}/autograder"
        notebook_dir, default_url = COURSE_DIR, "/formgrader"
        volumes.append({"name": "course-files", "persistentVolumeClaim": {"claimName": COURSE_CLAIM}})
        mounts.append({"name": "course-files", "mountPath": COURSE_DIR})
        cpu_limit, mem_limit = INSTRUCTOR_CPU, INSTRUCTOR_MEMORY
    else:
        # The learner's lab of their edition, and nbgrader's Assignments tab on that edition's course.
        env["JUPYTER_CONFIG_PATH"] = f"{STUDENT_CONFIG}:{LAB_CONFIG[language]}"
        env["COURSE_START_PAGE"] = START_PAGE[language]
    spawner.environment, spawner.extra_labels = env, labels
    spawner.volumes, spawner.volume_mounts = volumes, mounts
    spawner.notebook_dir, spawner.default_url = notebook_dir, default_url
    spawner.cpu_limit, spawner.mem_limit = cpu_limit, mem_limit


# -- LTI 1.3: groups from each launch ---------------------------------------------------

LTI_ROLES = "https://purl.imsglobal.org/spec/lti/claim/roles"
LTI_PRESENTATION = "https://purl.imsglobal.org/spec/lti/claim/launch_presentation"
LTI_CUSTOM = "https://purl.imsglobal.org/spec/lti/claim/custom"


def lti_groups(authenticator, handler, authentication):
    """Instructor or student from the launch's LTI roles, the edition from its locale (or course_lang)."""
    token = authentication.get("auth_state") or {}
    roles = token.get(LTI_ROLES) or []
    instructor = any(r.endswith("#Instructor") or r.endswith("/Instructor") for r in roles)
    custom = token.get(LTI_CUSTOM) or {}
    locale = str(custom.get("course_lang") or (token.get(LTI_PRESENTATION) or {}).get("locale") or "")
    groups = ["instructors" if instructor else "students"]
    if locale.lower().startswith("zh"):
        groups.append("lang-zh")
    authentication["groups"] = groups
    return authentication


# -- the hub (inside the chart's jupyterhub_config.py only) ---------------------------------

if "c" in globals():
    _course = get_config("custom.course", {}) or {}  # noqa: F821 (the chart's get_config)
    COURSE_CLAIM = _course.get("courseClaim", "course-files")
    INSTRUCTOR_CPU = _course.get("instructorCpu", 4)
    INSTRUCTOR_MEMORY = _course.get("instructorMemory", "8G")

    c.JupyterHub.spawner_class = "kubespawner.KubeSpawner"  # noqa: F821 (the hub's config)
    c.KubeSpawner.uid = course_uid  # noqa: F821
    c.KubeSpawner.gid = USERS_GID  # noqa: F821
    c.KubeSpawner.fs_gid = USERS_GID  # noqa: F821
    c.KubeSpawner.supplemental_gids = [USERS_GID]  # noqa: F821
    c.KubeSpawner.pre_spawn_hook = course_pre_spawn_hook  # noqa: F821

    _authenticator = str(c.JupyterHub.authenticator_class)  # noqa: F821
    if "LTI13Authenticator" in _authenticator:
        c.Authenticator.manage_groups = True  # noqa: F821
        c.Authenticator.post_auth_hook = lti_groups  # noqa: F821
        c.Authenticator.allow_all = True  # noqa: F821 (the LMS decides who may launch the course)
    else:
        _people = read_roster()
        ROSTER_PEOPLE.update(_people)
        if _people:
            roster_uids(_people)  # a shared uid stops the hub here, before anyone logs in
            c.JupyterHub.load_groups = roster_groups(_people)  # noqa: F821
            c.Authenticator.allowed_users = set(_people)  # noqa: F821
            c.Authenticator.admin_users = {p for p, (role, _) in _people.items() if role == "instructor"}  # noqa: F821


if __name__ == "__main__":
    try:  # the hub would refuse the same roster: say why in one line, before helm upgrade
        if not os.path.isfile(sys.argv[1]):
            raise ValueError(f"{sys.argv[1]}: no such roster file")
        _uids = roster_uids(read_roster(sys.argv[1]))
    except ValueError as exc:
        sys.exit(f"course_config.py: {exc}")
    for _login, _uid in _uids.items():
        print(_login, _uid)
