"""JupyterHub's configuration for a class on one server; `make hub` starts the hub with it.

It reads the class that deploy/hub/classhub.py prepared (`$HUB_STATE/class.json`: the roster, the
course, the exchange, the port) and sets:

* the hub's state in `$HUB_STATE/secrets` (its SQLite database, cookie secret, proxy token and
  first-use passwords; 0700, never committed);
* the standard proxy, configurable-http-proxy, installed by `make hub` under `$HUB_STATE/proxy`;
* login: FirstUseAuthenticator with the first passwords `make hub` gave (passwords.py: nobody sets
  another's password by logging in first; only the roster's logins are let in), or LTI 1.3 from an
  LMS (`AUTH=lti13`: the settings in `$HUB_STATE/lti13.json`, see README "Running a class");
* groups `instructors` and `students`; instructors are the hub's admins;
* each person's server runs as their own Unix account, under limits of its own (limits.py's
  LimitedSpawner: LocalProcessSpawner with per-user cgroups and rlimits; or SystemdSpawner,
  `SPAWNER=systemd`), on the servers' Python (servers.py): a
  student gets the learner's lab of `make lab` in their roster language with nbgrader's
  Assignments tab, an instructor gets Formgrader on the course folder.
"""

import json
import os
import pwd
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # passwords.py, limits.py

c = get_config()  # noqa: F821 (provided by traitlets when JupyterHub loads this file)

STATE = Path(os.environ["HUB_STATE"])
CLASS = json.loads((STATE / "class.json").read_text())
SECRETS = STATE / "secrets"
ROOT = Path(CLASS["root"])
SERVERS = Path(CLASS["servers_prefix"])  # the servers' venv, which every account can read
PEOPLE = {person["login"]: person for person in CLASS["people"]}
INSTRUCTORS = sorted(login for login, p in PEOPLE.items() if p["role"] == "instructor")
STUDENTS = sorted(login for login, p in PEOPLE.items() if p["role"] == "student")

# -- the hub and its proxy ---------------------------------------------------------------------------
c.JupyterHub.ip = CLASS["ip"]
c.JupyterHub.port = CLASS["port"]
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = CLASS.get("hub_port", 8081)
c.ConfigurableHTTPProxy.command = [CLASS["proxy"]]
c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{CLASS.get('proxy_api_port', 8001)}"
c.ConfigurableHTTPProxy.pid_file = str(SECRETS / "proxy.pid")
c.JupyterHub.db_url = f"sqlite:///{SECRETS / 'jupyterhub.sqlite'}"
c.JupyterHub.cookie_secret_file = str(SECRETS / "jupyterhub_cookie_secret")
c.JupyterHub.pid_file = str(SECRETS / "jupyterhub.pid")
c.JupyterHub.cleanup_servers = True  # a stopped hub stops the class's servers too

# -- who may log in ----------------------------------------------------------------------------------
if CLASS["auth"] == "lti13":
    c.JupyterHub.authenticator_class = "ltiauthenticator.lti13.auth.LTI13Authenticator"
    for name, value in json.loads((STATE / "lti13.json").read_text()).items():
        setattr(c.LTI13Authenticator, name, value)
else:
    c.JupyterHub.authenticator_class = "passwords.RosterAuthenticator"
    c.FirstUseAuthenticator.dbm_path = str(SECRETS / "passwords.dbm")
    c.FirstUseAuthenticator.create_users = False  # only the roster's logins (created below) may log in
    c.FirstUseAuthenticator.min_password_length = 8
c.Authenticator.allowed_users = set(PEOPLE)
c.Authenticator.admin_users = set(INSTRUCTORS)
c.JupyterHub.load_groups = {"instructors": {"users": INSTRUCTORS}, "students": {"users": STUDENTS}}

# -- each person's server --------------------------------------------------------------------------
if CLASS["spawner"] == "systemd":
    c.JupyterHub.spawner_class = "systemdspawner.SystemdSpawner"
    c.SystemdSpawner.dynamic_users = False  # the roster's own Unix accounts
    c.SystemdSpawner.mem_limit = os.environ.get("HUB_MEM_LIMIT", "4G")
    c.SystemdSpawner.cpu_limit = float(os.environ.get("HUB_CPU_LIMIT", "2"))
    c.SystemdSpawner.isolate_tmp = True
    c.SystemdSpawner.disable_user_sudo = True
else:
    # Each server in cgroups of its own (memory, processes, CPU share), rlimits as a floor:
    # limits.py (HUB_MEM_LIMIT, HUB_PIDS_LIMIT, HUB_CPU_SHARE). One student cannot take the class down.
    import limits

    c.JupyterHub.spawner_class = limits.LimitedSpawner
    print(f"per-student limits: {limits.describe()}", flush=True)
c.Spawner.cmd = [CLASS["python"], "-m", "jupyterhub.singleuser"]
c.Spawner.start_timeout = 120
c.Spawner.http_timeout = 120
c.Spawner.environment = {
    "PATH": f"{SERVERS / 'bin'}:/usr/local/bin:/usr/bin:/bin",
    "OMP_NUM_THREADS": os.environ.get("HUB_THREADS_PER_USER", "2"),  # a shared server: two cores a learner
    "PYTHONHASHSEED": "0",
}


def start_page(language: str) -> Path:
    return ROOT / "deploy" / "hub" / ("start.zh.md" if language == "zh" else "start.md")


def give_start_page(account, source: Path) -> None:
    """Put the start page in a student's home unless something is already there. Root writes into a
    folder the student owns: never through a link they made (O_CREAT|O_EXCL fails on any existing
    name, a dangling link included, and chown acts on the open file, not on a path)."""
    try:
        home = os.open(account.pw_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return
    try:
        fd = os.open("START.md", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644, dir_fd=home)
    except OSError:
        return  # something of theirs is there already (a file, a folder, a link)
    finally:
        os.close(home)
    with os.fdopen(fd, "wb") as page:
        os.fchown(fd, account.pw_uid, account.pw_gid)
        page.write(source.read_bytes())


def prepare_server(spawner):
    """Pick the person's kind of server, and give a student's home its start page."""
    person = PEOPLE[spawner.user.name]
    if person["role"] == "instructor":
        config = Path(CLASS["configs"]) / "instructor"
        spawner.notebook_dir = str(ROOT)
        spawner.default_url = "/formgrader"
        spawner.environment["COURSE_LANG"] = person["language"]
    else:
        config = Path(CLASS["configs"]) / f"student-{person['language']}"
        spawner.notebook_dir = "~"
        spawner.default_url = "/lab/tree/START.md"
        spawner.environment["COURSE_LANG"] = person["language"]
        give_start_page(pwd.getpwnam(person["login"]), start_page(person["language"]))
    # The role's configuration first; then the servers' venv's own (which turns JupyterLab and
    # nbgrader's server extensions on).
    spawner.environment["JUPYTER_CONFIG_PATH"] = os.pathsep.join([str(config), str(SERVERS / "etc" / "jupyter")])
    spawner.environment["JUPYTER_PATH"] = str(SERVERS / "share" / "jupyter")
    spawner.environment["JUPYTERLAB_DIR"] = str(SERVERS / "share" / "jupyter" / "lab")


c.Spawner.pre_spawn_hook = prepare_server

# A test hub (tests/test_hub.py) adds its free ports and settings here.
_extra = STATE / "extra_config.py"
if _extra.exists():
    exec(compile(_extra.read_text(), str(_extra), "exec"))
