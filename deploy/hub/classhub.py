"""A class's JupyterHub on one server, and the instructor's steps of a term through nbgrader's exchange.

    sudo make hub ROSTER=roster.csv    # python deploy/hub/classhub.py serve --roster roster.csv
    sudo make hub-release              # every chapter, both editions, into the exchange
    sudo make collect                  # the exchange's submissions into autograder/submitted/
    sudo make grade                    # as for one learner: sandboxed, only new or changed submissions
    sudo make hub-feedback             # the feedback pages back into the exchange

What it guarantees:

* Each person on the roster has a Unix account of their own (created if missing, home 0700), and
  their server runs as that account: a student cannot read another's files.
* The exchange has nbgrader's own layout and permissions: students write into `inbound/` but cannot
  list it, and each submission's folder carries an unguessable suffix; feedback pages are named by
  a hash of a secret that only the submitting student's copy holds.
* The course's own folders that hold answers or others' work (`solutions/`, `autograder/`, `tests/`,
  `.git`) are closed to students (group `course-instructors`, no access for others).
* `collect` takes a submission only when the Unix owner of its folder is the student it names (a
  student cannot submit in another's name) and it holds the chapter's own notebook; anything else
  is set aside (outside `inbound/`, for the instructor to read) with one line saying why.
* `feedback` releases a page only when it was graded from the submission now collected.

The English edition is the nbgrader course `transformer-course` (released from `chapters/`), the
Chinese one `transformer-course-zh` (from `chapters/zh/`); a student sees only their roster
language's course.
"""

from __future__ import annotations

import argparse
import grp
import hashlib
import json
import os
import pwd
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(HERE))
from roster import Person, RosterError, read_roster  # noqa: E402

EDITIONS = {"en": ("transformer-course", "chapters"), "zh": ("transformer-course-zh", os.path.join("chapters", "zh"))}
PROXY_VERSION = "5.3.0"
# Folders of the course a student must not read: the solutions and hidden tests, others' submissions
# and feedback, the grader's kits, the history that holds all of them.
CLOSED = ["solutions", "autograder", "tests", ".git"]


class ClassError(RuntimeError):
    """A one-line message for the instructor; nothing was changed when it is raised."""


# -- where things are ---------------------------------------------------------------------------


def state_dir() -> Path:
    return Path(os.environ.get("HUB_STATE") or HERE / "state").resolve()


def exchange_dir() -> Path:
    return Path(os.environ.get("COURSE_EXCHANGE") or "/srv/nbgrader/exchange")


def instructor_group() -> str:
    return os.environ.get("HUB_INSTRUCTOR_GROUP") or "course-instructors"


def chapters() -> list[str]:
    return sorted(p.name for p in (ROOT / "chapters").iterdir() if (p / f"{p.name}.ipynb").is_file())


def class_file() -> Path:
    return state_dir() / "class.json"


def load_class() -> dict:
    try:
        return json.loads(class_file().read_text())
    except FileNotFoundError:
        raise ClassError(f"no class here yet: start the hub first with `sudo make hub ROSTER=roster.csv` "
                         f"(it writes {class_file()})") from None


# -- accounts --------------------------------------------------------------------------------------


def _run(*cmd: str) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise ClassError(f"{' '.join(cmd)} failed: {(proc.stderr or proc.stdout).strip()[:300]}")


def ensure_accounts(people: list[Person], created_file: Path) -> list[str]:
    """Unix accounts for the roster (those already there are kept), homes 0700, the instructors'
    group. Returns the logins this call created; every login the course created is kept in
    `created_file`, so that `remove-accounts` removes those and no other."""
    group = instructor_group()
    try:
        grp.getgrnam(group)
    except KeyError:
        _run("groupadd", "--system", group)
    created = json.loads(created_file.read_text()) if created_file.exists() else []
    new = []
    for person in people:
        try:
            account = pwd.getpwnam(person.login)
            if account.pw_uid < 1000:
                raise ClassError(f"{person.login} is a system account on this server (uid {account.pw_uid}); "
                                 "give that person another login in the roster")
        except KeyError:
            _run("useradd", "--create-home", "--shell", "/bin/bash", "--user-group",
                 "--comment", person.name.replace(":", " "), person.login)
            new.append(person.login)
        home = Path(pwd.getpwnam(person.login).pw_dir)
        os.chmod(home, 0o700)
        if person.is_instructor:
            _run("usermod", "--append", "--groups", group, person.login)
    created_file.write_text(json.dumps(sorted(set(created) | set(new))))
    return new


def remove_accounts(created_file: Path) -> list[str]:
    """Remove the accounts (and homes) this course created, and the instructors' group."""
    removed = []
    for login in json.loads(created_file.read_text()) if created_file.exists() else []:
        subprocess.run(["pkill", "-KILL", "-u", login], capture_output=True)
        if subprocess.run(["userdel", "--remove", login], capture_output=True).returncode == 0:
            removed.append(login)
    created_file.unlink(missing_ok=True)
    subprocess.run(["groupdel", instructor_group()], capture_output=True)
    return removed


def close_course_folders() -> None:
    gid = grp.getgrnam(instructor_group()).gr_gid
    gradebook = ROOT / "autograder" / "gradebook.db"
    if not gradebook.exists():  # Formgrader opens it read-only: it must exist before the first grading
        from nbgrader.api import Gradebook

        Gradebook(f"sqlite:///{gradebook}", "transformer-course").close()
    os.chown(gradebook, -1, gid)
    os.chmod(gradebook, 0o640)
    for name in CLOSED:
        path = ROOT / name
        if path.exists():
            os.chown(path, -1, gid)
            os.chmod(path, (path.stat().st_mode & 0o770) | 0o050)  # group reads, others nothing


# -- the exchange and each role's Jupyter configuration --------------------------------------------


def ensure_exchange(exchange: Path) -> None:
    # nbgrader's own permissions (its release_assignment sets them too): everyone may create a
    # course's folder's entries; each course's inbound/ is 0733 (write, no listing).
    exchange.mkdir(parents=True, exist_ok=True)
    os.chmod(exchange, 0o777)


def _json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def write_role_configs(configs: Path, exchange: Path) -> None:
    """state/config/{student-en,student-zh,instructor}: JUPYTER_CONFIG_PATH for each kind of server.

    A student's is the learner's lab of `make lab` (.lab or .lab-zh: its start page, its settings,
    the running-cell fix, no instructor tools) with nbgrader's Assignments tab and Validate button
    on, and nbgrader told which course is theirs and where the exchange is. The instructors' is the
    course's nbgrader configuration (Formgrader) with the same exchange."""
    for language, (course_id, _) in EDITIONS.items():
        target = configs / f"student-{language}"
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(ROOT / (".lab" if language == "en" else ".lab-zh"), target)
        server = json.loads((target / "jupyter_server_config.json").read_text())
        server["ServerApp"]["jpserver_extensions"]["nbgrader.server_extensions.assignment_list"] = True
        server["LabApp"]["default_url"] = "/lab/tree/START.md"
        _json(target / "jupyter_server_config.json", server)
        page = json.loads((target / "labconfig" / "page_config.json").read_text())
        for plugin in ("@jupyter/nbgrader:assignment-list", "@jupyter/nbgrader:menu"):
            page["disabledExtensions"].pop(plugin, None)
        _json(target / "labconfig" / "page_config.json", page)
        (target / "nbgrader_config.py").write_text(
            "c = get_config()  # noqa: F821\n"
            f"c.CourseDirectory.course_id = {course_id!r}\n"
            f"c.Exchange.root = {str(exchange)!r}\n")
    target = configs / "instructor"
    target.mkdir(parents=True, exist_ok=True)
    _json(target / "jupyter_server_config.json", {
        "LabApp": {"default_url": "/formgrader"},
        "ServerApp": {"jpserver_extensions": {"nbgrader.server_extensions.formgrader": True,
                                              "nbgrader.server_extensions.course_list": True,
                                              "nbgrader.server_extensions.assignment_list": False}}})
    # Formgrader reads the gradebook and never writes it: grading, releasing and collecting run as
    # root through the Makefile, and the instructors' group may read the course's closed folders
    # but write none of them (a file they could write in autograder/ is code root would run).
    gradebook = ROOT / "autograder" / "gradebook.db"
    (target / "nbgrader_config.py").write_text(
        "c = get_config()  # noqa: F821\n"
        f"load_subconfig({str(ROOT / 'autograder' / 'nbgrader_config.py')!r})  # noqa: F821\n"
        f"c.Exchange.root = {str(exchange)!r}\n"
        f"c.CourseDirectory.db_url = {f'sqlite:///file:{gradebook}?mode=ro&uri=true'!r}\n")
    for path in [configs, *configs.rglob("*")]:
        os.chmod(path, 0o755 if path.is_dir() else 0o644)


# -- make hub ---------------------------------------------------------------------------------------


def _others_can_run(path: Path) -> bool:
    """Whether a user with no special rights can execute `path` (every folder above it searchable)."""
    path = path.resolve()
    if not path.stat().st_mode & 0o001:
        return False
    return all(parent.stat().st_mode & 0o001 for parent in path.parents)


def servers_python(state: Path) -> Path:
    """The interpreter the class's servers run: the course venv's own when every user may run it;
    otherwise (a venv made from a Python under /root, as pyenv installs it) a small venv in the
    hub's state made from a system Python of the same version, which imports the course venv's
    packages (a .pth file). Students never need write access to either."""
    venv_python = Path(sys.executable)
    if _others_can_run(venv_python):
        return venv_python
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    system = next((Path(folder) / f"python{version}" for folder in ("/usr/bin", "/usr/local/bin")
                   if (Path(folder) / f"python{version}").exists() and _others_can_run(Path(folder) / f"python{version}")), None)
    if system is None:
        raise ClassError(f"the course venv's Python ({venv_python.resolve()}) cannot be run by other users, and this "
                         f"server has no system python{version}: make the venv with a Python every user can run, "
                         f"e.g. `make venv-hub PYTHON=/usr/bin/python{version}` after removing .venv")
    target = state / "python"
    python = target / "bin" / "python"
    if not python.exists():
        _run(str(system), "-m", "venv", "--without-pip", str(target))
    packages = next(Path(p) for p in sys.path if p.endswith("site-packages") and Path(p).is_dir())
    site = next((target / "lib").glob("python*/site-packages"))
    (site / "course-venv.pth").write_text(f"import site; site.addsitedir({str(packages)!r})\n")
    return python



def proxy_command() -> Path:
    # One install for the course (the hub test's hubs use it too), never committed.
    return HERE / "state" / "proxy" / "node_modules" / ".bin" / "configurable-http-proxy"


def ensure_proxy() -> Path:
    if not shutil.which("node") or not shutil.which("npm"):
        raise ClassError("make hub needs Node.js and npm for JupyterHub's proxy (configurable-http-proxy): "
                         "install them first, e.g. `apt-get install nodejs npm`")
    command = proxy_command()
    if not command.exists():
        _run("npm", "install", "--no-audit", "--no-fund", "--silent", "--prefix", str(command.parents[2]),
             f"configurable-http-proxy@{PROXY_VERSION}")
    return command


def setup(roster: Path, port: int, ip: str, spawner: str, auth: str, hub_port: int = 8081,
          proxy_api_port: int = 8001) -> dict:
    """Everything `make hub` prepares before JupyterHub starts; returns the class description that
    deploy/hub/jupyterhub_config.py reads."""
    if os.geteuid() != 0:
        raise ClassError("make hub must run as root (sudo make hub ROSTER=...): each student's server runs as "
                         "that student's own Unix account, which only root can start")
    people = read_roster(roster)  # before anything is changed
    proxy = ensure_proxy()
    state = state_dir()
    state.mkdir(parents=True, exist_ok=True)
    os.chmod(state, 0o711)  # the role configs below are read by every user's server; nothing else is
    secret = state / "secrets"
    secret.mkdir(mode=0o700, exist_ok=True)
    exchange = exchange_dir()
    new = ensure_accounts(people, secret / "created-accounts.json")
    close_course_folders()
    ensure_exchange(exchange)
    write_role_configs(state / "config", exchange)
    description = {
        "root": str(ROOT), "venv": str(Path(sys.executable).parent.parent), "python": str(servers_python(state)),
        "exchange": str(exchange),
        "state": str(state), "port": port, "ip": ip, "hub_port": hub_port, "proxy_api_port": proxy_api_port, "spawner": spawner, "auth": auth,
        "proxy": str(proxy), "people": [person.__dict__ for person in people],
    }
    _json(class_file(), description)
    os.chmod(class_file(), 0o600)
    students = sum(not p.is_instructor for p in people)
    print(f"class: {students} students, {len(people) - students} instructors from {roster}"
          f" ({len(new)} Unix accounts created); exchange {exchange}; hub state {state}")
    return description


def serve(args) -> int:
    setup(Path(args.roster), args.port, args.ip, args.spawner, args.auth, args.hub_port, args.proxy_api_port)
    env = dict(os.environ, HUB_STATE=str(state_dir()))
    os.chdir(state_dir() / "secrets")
    hub = Path(sys.executable).parent / "jupyterhub"
    print(f"JupyterHub on http://{args.ip}:{args.port}/ (Ctrl-C stops it; students and instructors set their "
          "password on their first login)", flush=True)
    os.execve(str(hub), [str(hub), "-f", str(HERE / "jupyterhub_config.py")], env)


# -- the term: release, collect, feedback ------------------------------------------------------------

# nbgrader's exchange steps for several chapters of one edition, in one process (its start-up and the
# course configuration cost about 2 s), with the application classes `nbgrader release_assignment`,
# `collect` and `release_feedback` use.
_EXCHANGE_STEP = """
import json, sys
from nbgrader.apps import NbGraderAPI
from nbgrader.apps.nbgraderapp import NbGraderApp

step, settings, chapters = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3:]
app = NbGraderApp.instance()
app.load_config_file()
config = app.config
config.CourseDirectory.course_id = settings["course_id"]
config.CourseDirectory.release_directory = settings["release_directory"]
config.Exchange.root = settings["exchange"]
config.ExchangeReleaseAssignment.force = True
config.CourseDirectory.student_id_exclude = settings.get("exclude", "")
api = NbGraderAPI(config=config)
failed = False
for chapter in chapters:
    if step == "release":
        result = api.release_assignment(chapter)
    elif step == "collect":
        result = api.collect(chapter, update=True)
    else:
        result = api.release_feedback(chapter)
    print(json.dumps({"chapter": chapter, "success": result["success"], "log": result.get("log", ""),
                      "error": result.get("error", "")}), flush=True)
"""


def exchange_step(step: str, language: str, chapter_list: list[str], exchange: Path, exclude: list[str] = ()) -> list[dict]:
    course_id, release_directory = EDITIONS[language]
    settings = {"course_id": course_id, "release_directory": release_directory, "exchange": str(exchange),
                "exclude": ",".join(exclude)}
    env = dict(os.environ, JUPYTER_CONFIG_PATH=str(ROOT / "autograder"),
               PATH=str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""))
    proc = subprocess.run([sys.executable, "-c", _EXCHANGE_STEP, step, json.dumps(settings), *chapter_list],
                          cwd=ROOT, env=env, capture_output=True, text=True)
    results = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or len(results) != len(chapter_list):
        raise ClassError(f"nbgrader {step} ({course_id}) failed: {proc.stderr.strip()[-600:]}")
    for result in results:
        if not result["success"]:
            raise ClassError(f"nbgrader {step} {result['chapter']} ({course_id}) failed: "
                             f"{(result['error'] or result['log']).strip()[-600:]}")
    return results


def _wanted(names: list[str]) -> list[str]:
    known = chapters()
    unknown = [name for name in names if name not in known]
    if unknown:
        raise ClassError(f"no chapter {', '.join(unknown)} (the chapters: {', '.join(known)})")
    return names or known


def release(args) -> int:
    hub = load_class()
    wanted = _wanted(args.chapters)
    for language, (course_id, folder) in EDITIONS.items():
        present = [c for c in wanted if (ROOT / folder / c / f"{c}.ipynb").is_file()]
        exchange_step("release", language, present, Path(hub["exchange"]))
        print(f"released to {course_id}: {', '.join(present)}")
    return 0


def _roster(hub: dict) -> dict[str, dict]:
    return {person["login"]: person for person in hub["people"]}


def _grade_ids(notebook: Path) -> set[str]:
    cells = json.loads(notebook.read_text()).get("cells", [])
    return {c.get("metadata", {}).get("nbgrader", {}).get("grade_id") for c in cells} - {None}


def screen_inbound(hub: dict, chapter_list: list[str]) -> tuple[dict, list[str]]:
    """Set aside every inbound entry that is not a student's own submission of that chapter's
    notebook, before nbgrader collect can take it. Returns {language: [chapters with submissions]}
    and one line per entry set aside."""
    people, exchange = _roster(hub), Path(hub["exchange"])
    found, lines = {}, []
    for language, (course_id, folder) in EDITIONS.items():
        inbound = exchange / course_id / "inbound"
        if not inbound.is_dir():
            continue
        aside = exchange / course_id / "set-aside"
        for entry in sorted(inbound.iterdir()):
            parts = entry.name.split("+")
            student, chapter = (parts[0], parts[1]) if len(parts) >= 3 else ("?", "?")
            if chapter not in chapter_list:
                continue
            try:
                owner = pwd.getpwuid(entry.stat().st_uid).pw_name
            except KeyError:
                owner = f"uid {entry.stat().st_uid}"
            notebook = entry / f"{chapter}.ipynb"
            why = None
            if student not in people or people[student]["role"] != "student":
                why = f"{student} is not a student on the roster"
            elif owner != student:
                why = f"it claims to be {student}'s but was written by {owner}"
            elif people[student]["language"] != language:
                why = f"{student} is enrolled in the {people[student]['language']} edition, not {course_id}"
            elif not notebook.is_file():
                others = sorted(p.name for p in entry.glob("*.ipynb"))
                why = f"it holds {', '.join(others) or 'no notebook'}, not {chapter}.ipynb"
            else:
                try:
                    ids = _grade_ids(notebook)
                except (OSError, ValueError):
                    ids = set()
                expected = _grade_ids(ROOT / folder / chapter / f"{chapter}.ipynb")
                if ids and not ids & expected:
                    why = f"its {chapter}.ipynb is another chapter's notebook (none of {chapter}'s exercises in it)"
            if why:
                aside.mkdir(mode=0o700, exist_ok=True)
                shutil.move(str(entry), aside / entry.name)
                lines.append(f"set aside {course_id}/inbound/{entry.name}: {why} (now in {aside})")
            else:
                found.setdefault(language, set()).add(chapter)
    return {language: sorted(names) for language, names in found.items()}, lines


def collect(args) -> int:
    hub = load_class()
    wanted = _wanted(args.chapters)
    found, lines = screen_inbound(hub, wanted)
    for line in lines:
        print(line)
    if not found:
        raise ClassError(f"nothing to collect: no submission of {', '.join(args.chapters) or 'any chapter'} "
                         f"in the exchange ({hub['exchange']})")
    for language, names in found.items():
        for result in exchange_step("collect", language, names, Path(hub["exchange"])):
            for line in result["log"].splitlines():
                if "Collecting submission" in line or "Updating submission" in line:
                    print(line.split("] ", 1)[-1])
    return 0


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def feedback(args) -> int:
    hub = load_class()
    wanted = _wanted(args.chapters)
    people = _roster(hub)
    submitted, pages = ROOT / "autograder" / "submitted", ROOT / "autograder" / "feedback"
    graded = {}
    record = ROOT / "autograder" / "graded.json"
    if record.exists():
        try:
            graded = json.loads(record.read_text())
        except ValueError:
            graded = {}
    ready = {language: {} for language in EDITIONS}
    for login, person in people.items():
        for chapter in wanted:
            folder, page = submitted / login / chapter, pages / login / chapter / f"{chapter}.html"
            if not (folder / "submission_secret.txt").exists():
                continue
            if not page.exists():
                print(f"{login} / {chapter}: not graded yet (run make grade first)")
                continue
            notebook = folder / f"{chapter}.ipynb"
            # autograder/regrade.py's record: what each submission's grade was made from
            entry = graded.get("submissions", {}).get(login, {}).get(chapter) if isinstance(graded, dict) else None
            if entry and notebook.exists() and entry.get("submission") != _digest(notebook):
                print(f"{login} / {chapter}: resubmitted since it was graded (run make grade first)")
                continue
            for name in ("timestamp.txt", "submission_secret.txt"):
                shutil.copyfile(folder / name, page.parent / name)
            ready[person["language"]].setdefault(chapter, []).append(login)
    released = 0
    for language, by_chapter in ready.items():
        everyone_else = [login for login, p in people.items() if p["language"] != language]
        for chapter, logins in sorted(by_chapter.items()):
            exchange_step("feedback", language, [chapter], Path(hub["exchange"]), exclude=everyone_else)
            released += len(logins)
    print(f"feedback released: {released} pages")
    return 0


def remove(args) -> int:
    removed = remove_accounts(state_dir() / "secrets" / "created-accounts.json")
    print(f"removed {len(removed)} accounts the course had created: {', '.join(removed) or 'none'}")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="step", required=True)
    hub = sub.add_parser("serve", help="make hub: accounts, exchange and JupyterHub")
    hub.add_argument("--roster", required=True)
    hub.add_argument("--port", type=int, default=8000)
    hub.add_argument("--ip", default="0.0.0.0")
    hub.add_argument("--hub-port", type=int, default=8081, help="the hub's own API, on 127.0.0.1")
    hub.add_argument("--proxy-api-port", type=int, default=8001, help="the proxy's API, on 127.0.0.1")
    hub.add_argument("--spawner", choices=["local", "systemd"], default="local")
    hub.add_argument("--auth", choices=["firstuse", "lti13"], default="firstuse")
    check = sub.add_parser("check-roster", help="read a roster and say what is wrong with it")
    check.add_argument("roster")
    for name in ("release", "collect", "feedback"):
        sub.add_parser(name).add_argument("chapters", nargs="*")
    sub.add_parser("remove-accounts", help="remove the Unix accounts the course created")
    args = parser.parse_args(argv)
    # nbgrader runs alembic and jupyter by name: this interpreter's own come first.
    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    try:
        if args.step == "check-roster":
            people = read_roster(args.roster)
            print(f"{args.roster}: {len(people)} people, "
                  f"{sum(p.is_instructor for p in people)} instructors, {sum(p.language == 'zh' for p in people)} in Chinese")
            return 0
        return {"serve": serve, "release": release, "collect": collect, "feedback": feedback,
                "remove-accounts": remove}[args.step](args)
    except (ClassError, RosterError) as exc:
        print(f"{Path(sys.argv[0]).name if argv is None else 'classhub'}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
