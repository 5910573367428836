"""A class's JupyterHub on one server, and the instructor's steps of a term through nbgrader's exchange.

    sudo make hub ROSTER=roster.csv    # python deploy/hub/classhub.py serve --roster roster.csv
    sudo make hub-release              # every chapter, both editions, into the exchange
    sudo make collect                  # the exchange's submissions into autograder/submitted/
    sudo make grade                    # as for one learner: sandboxed, only new or changed submissions
    sudo make hub-feedback             # the feedback pages back into the exchange

What it guarantees:

* Each person on the roster has a Unix account of their own, created by the course (home 0700; a
  login that is already someone's account on this server is refused), and their server runs as that
  account, from a Python every account can read (servers.py): a student cannot read another's files.
* Nobody chooses another's password: `make hub` gives each person a first password (passwords.py),
  in a file only root reads, for the instructor to hand out.
* The exchange's root and course folders are root's, made before anyone logs in (exchange.py):
  students write into `inbound/` but cannot list it, rename or remove another's entry, or create,
  rename or remove a course; each submission's folder carries an unguessable suffix; feedback pages
  are named by a hash of a secret that only the submitting student's copy holds.
* The course's own folders that hold answers or others' work (`solutions/`, `autograder/`, `tests/`,
  `.git`, and `transformer_lib/` when the answers are hidden) are closed to students (group
  `course-instructors`, no access for others).
* `collect` reads each submission without following links and copies it before nbgrader does; it
  takes one only when the Unix owner of it and of all it holds is the student it names, it holds no
  link or special file, stays within a count and a size, and holds the chapter's own notebook;
  anything else is set aside (outside `inbound/`, for the instructor to read) with one line saying
  why, and the others are collected. A submission counts at the time the exchange received it
  (`autograder/received.json`), not the time the student's own `timestamp.txt` claims.
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
import course_exchange  # noqa: E402
import exchange as exchange_rules  # noqa: E402
import passwords  # noqa: E402
import schedule as deadlines  # noqa: E402
import servers  # noqa: E402
from roster import Person, RosterError, read_roster  # noqa: E402

EDITIONS = {"en": ("transformer-course", "chapters"), "zh": ("transformer-course-zh", os.path.join("chapters", "zh"))}
PROXY_VERSION = "5.3.0"
# Folders of the course a student must not read: the solutions and hidden tests, others' submissions
# and feedback, the grader's kits, the history that holds all of them.
CLOSED = ["solutions", "autograder", "tests", ".git"]
ANSWERS = ("visible", "hidden")


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


def _created(created_file: Path) -> list[str]:
    return json.loads(created_file.read_text()) if created_file.exists() else []


def check_accounts(people: list[Person], created_file: Path) -> None:
    """Refuse, before anything is made, a roster login that is an account the course did not create:
    on a shared server `wang` may be a member of staff, whose files and mail a student must not get."""
    created = set(_created(created_file))
    for person in people:
        try:
            account = pwd.getpwnam(person.login)
        except KeyError:
            continue
        if person.login not in created:
            raise ClassError(f"{person.login} is already an account on this server (uid {account.pw_uid}) that the "
                             "course did not create: give that person another login in the roster")


def ensure_accounts(people: list[Person], created_file: Path) -> list[str]:
    """Unix accounts for the roster (check_accounts first), homes 0700, the instructors' group.
    Returns the logins this call created; every login the course created is kept in
    `created_file`, so that `remove-accounts` removes those and no other."""
    group = instructor_group()
    try:
        grp.getgrnam(group)
    except KeyError:
        _run("groupadd", "--system", group)
    created = _created(created_file)
    new = []
    for person in people:
        try:
            pwd.getpwnam(person.login)
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
    for login in _created(created_file):
        subprocess.run(["pkill", "-KILL", "-u", login], capture_output=True)
        if subprocess.run(["userdel", "--remove", login], capture_output=True).returncode == 0:
            removed.append(login)
    created_file.unlink(missing_ok=True)
    subprocess.run(["groupdel", instructor_group()], capture_output=True)
    return removed


def close_course_folders(answers: str = "visible") -> None:
    gid = grp.getgrnam(instructor_group()).gr_gid
    gradebook = ROOT / "autograder" / "gradebook.db"
    if not gradebook.exists():  # Formgrader opens it read-only: it must exist before the first grading
        from nbgrader.api import Gradebook

        Gradebook(f"sqlite:///{gradebook}", "transformer-course").close()
    os.chown(gradebook, -1, gid)
    os.chmod(gradebook, 0o640)
    for name in CLOSED + (["transformer_lib"] if answers == "hidden" else []):
        path = ROOT / name
        if path.exists():
            os.chown(path, -1, gid)
            os.chmod(path, (path.stat().st_mode & 0o770) | 0o050)  # group reads, others nothing
    library = ROOT / "transformer_lib"
    if answers == "visible":  # a class that hid them before
        os.chmod(library, library.stat().st_mode | 0o055)


# -- the exchange and each role's Jupyter configuration --------------------------------------------


def course_ids() -> list[str]:
    return [course_id for course_id, _ in EDITIONS.values()]


def _json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def write_role_configs(configs: Path, exchange: Path) -> None:
    """<servers>/config/{student-en,student-zh,instructor}: JUPYTER_CONFIG_PATH for each kind of server.

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
            f"c.Exchange.root = {str(exchange)!r}\n" + course_exchange.config_lines())
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
        f"c.CourseDirectory.db_url = {f'sqlite:///file:{gradebook}?mode=ro&uri=true'!r}\n"
        + course_exchange.config_lines())
    for path in [configs, *configs.rglob("*")]:
        os.chmod(path, 0o755 if path.is_dir() else 0o644)


# -- make hub ---------------------------------------------------------------------------------------


def proxy_command() -> Path:
    # One install for the course (the hub test's hubs use it too), never committed.
    return HERE / "state" / "proxy" / "node_modules" / ".bin" / "configurable-http-proxy"


NODE_MAJOR = 20  # configurable-http-proxy 5.3.0's package.json: "engines": {"node": ">= 20"}


def ensure_proxy() -> Path:
    if not shutil.which("node") or not shutil.which("npm"):
        raise ClassError("make hub needs Node.js and npm for JupyterHub's proxy (configurable-http-proxy): "
                         "install them first, e.g. `apt-get install nodejs npm`")
    # npm installs the proxy on an older Node with a warning its --silent hides, and the hub then fails
    version = subprocess.run(["node", "--version"], capture_output=True, text=True).stdout.strip()
    try:
        major = int(version.lstrip("v").split(".")[0])
    except ValueError:
        major = 0
    if major < NODE_MAJOR:
        raise ClassError(f"JupyterHub's proxy (configurable-http-proxy {PROXY_VERSION}) needs Node.js {NODE_MAJOR} or "
                         f"newer, and `node --version` says {version or 'nothing'}: install Node.js {NODE_MAJOR} (README, "
                         "Running a class: what the server needs)")
    command = proxy_command()
    if not command.exists():
        _run("npm", "install", "--no-audit", "--no-fund", "--silent", "--prefix", str(command.parents[2]),
             f"configurable-http-proxy@{PROXY_VERSION}")
    return command


def _student_library(answers: str, hide: list[str]):
    """What writes transformer_lib into the servers' venv: the whole library, or (hidden answers) the
    grader's copy without the graded exercises' references (of the chapters `hide`, or all)."""
    if answers == "visible":
        return None
    sys.path.insert(0, str(ROOT / "autograder"))
    import hiding

    return lambda site: hiding.build_student_library(site, chapters=hide or None)


def setup(roster: Path, port: int, ip: str, spawner: str, auth: str, hub_port: int = 8081,
          proxy_api_port: int = 8001, answers: str = "visible", hide: list[str] = ()) -> dict:
    """Everything `make hub` prepares before JupyterHub starts; returns the class description that
    deploy/hub/jupyterhub_config.py reads."""
    if os.geteuid() != 0:
        raise ClassError("make hub must run as root (sudo make hub ROSTER=...): each student's server runs as "
                         "that student's own Unix account, which only root can start")
    people = read_roster(roster)  # before anything is changed
    hide = _wanted(list(hide)) if hide else []
    if not servers.others_can_enter(ROOT):
        raise ClassError(f"the course is in {ROOT}, which other accounts cannot enter (the instructors' servers open "
                         "it): clone it where every account can pass, e.g. `git clone ... /srv/transformer-course-src`, "
                         "and run make hub there")
    state = state_dir()
    secret = state / "secrets"
    check_accounts(people, secret / "created-accounts.json")
    proxy = ensure_proxy()
    state.mkdir(parents=True, exist_ok=True)
    os.chmod(state, 0o700)  # the hub's alone: what every server reads is in the servers' folder
    secret.mkdir(mode=0o700, exist_ok=True)
    exchange = exchange_dir()
    try:
        exchange_rules.prepare(exchange, course_ids())
        python = servers.build(Path(sys.executable).parent.parent, ROOT / "transformer_lib",
                               f"hidden:{','.join(hide) or 'all'}" if answers == "hidden" else "visible",
                               _student_library(answers, hide))
    except (exchange_rules.ExchangeError, servers.ServersError) as exc:
        raise ClassError(str(exc)) from None
    new = ensure_accounts(people, secret / "created-accounts.json")
    close_course_folders(answers)
    configs = servers.servers_dir() / "config"
    write_role_configs(configs, exchange)
    given = passwords.issue_first_passwords(secret / "passwords.dbm", secret / "first-passwords.csv",
                                            [(p.login, p.name) for p in people])
    description = {
        "root": str(ROOT), "venv": str(Path(sys.executable).parent.parent), "python": str(python),
        "servers_prefix": str(python.parent.parent), "configs": str(configs), "answers": answers,
        "exchange": str(exchange),
        "state": str(state), "port": port, "ip": ip, "hub_port": hub_port, "proxy_api_port": proxy_api_port, "spawner": spawner, "auth": auth,
        "proxy": str(proxy), "people": [person.__dict__ for person in people],
    }
    _json(class_file(), description)
    os.chmod(class_file(), 0o600)
    students = sum(not p.is_instructor for p in people)
    print(f"class: {students} students, {len(people) - students} instructors from {roster}"
          f" ({len(new)} Unix accounts created); exchange {exchange}; hub state {state}; answers {answers}"
          + (f" ({', '.join(hide) if hide else 'every chapter'})" if answers == "hidden" else ""))
    if given:
        print(f"first passwords for {len(given)} people in {secret / 'first-passwords.csv'} (root only): hand each "
              "person theirs; they change it at /hub/auth/change-password")
    return description


def serve(args) -> int:
    setup(Path(args.roster), args.port, args.ip, args.spawner, args.auth, args.hub_port, args.proxy_api_port,
          args.answers, [c for c in args.hide.split(",") if c])
    env = dict(os.environ, HUB_STATE=str(state_dir()))
    os.chdir(state_dir() / "secrets")
    hub = Path(sys.executable).parent / "jupyterhub"
    print(f"JupyterHub on http://{args.ip}:{args.port}/ (Ctrl-C stops it)", flush=True)
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
for name, value in settings["classes"].items():  # course_exchange.py: a root nobody else may write
    setattr(config.ExchangeFactory, name, value)
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
                "exclude": ",".join(exclude), "classes": course_exchange.CLASSES}
    env = dict(os.environ, JUPYTER_CONFIG_PATH=str(ROOT / "autograder"), PYTHONPATH=str(HERE),
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


def _verified_exchange(hub: dict) -> Path:
    exchange = Path(hub["exchange"])
    try:
        exchange_rules.verify(exchange, course_ids())
    except exchange_rules.ExchangeError as exc:
        raise ClassError(str(exc)) from None
    return exchange


def release(args) -> int:
    hub = load_class()
    wanted = _wanted(args.chapters)
    exchange = _verified_exchange(hub)
    students = {p["login"] for p in hub["people"] if p["role"] == "student"}
    dates = deadlines.load(ROOT, chapters(), students)  # a bad row stops the release before anything changes
    for language, (course_id, folder) in EDITIONS.items():
        present = [c for c in wanted if (ROOT / folder / c / f"{c}.ipynb").is_file()]
        exchange_step("release", language, present, exchange)
        # nbgrader's Assignments tab has no place for a due date: the first cell of the fetched copy says it
        for chapter in present:
            deadlines.stamp_release(exchange / course_id / "outbound" / chapter / f"{chapter}.ipynb",
                                    dates.deadline(chapter), language)
        print(f"released to {course_id}: {', '.join(present)}")
    return 0


def _roster(hub: dict) -> dict[str, dict]:
    return {person["login"]: person for person in hub["people"]}


def _grade_ids(notebook: Path) -> set[str]:
    cells = json.loads(notebook.read_text()).get("cells", [])
    return {c.get("metadata", {}).get("nbgrader", {}).get("grade_id") for c in cells} - {None}


def _judge(hub: dict, language: str, folder: str):
    """The course's own checks of a submission that passed exchange.py's screen."""
    people = _roster(hub)

    def judge(entry: exchange_rules.Entry) -> str | None:
        person = people[entry.student]
        if person["role"] != "student":
            return f"{entry.student} is not a student on the roster"
        if person["language"] != language:
            return f"{entry.student} is enrolled in the {person['language']} edition, not {EDITIONS[language][0]}"
        notebook = entry.files.get(f"{entry.chapter}.ipynb")
        if notebook is None:
            others = sorted(name for name in entry.files if name.endswith(".ipynb"))
            return f"it holds {', '.join(others) or 'no notebook'}, not {entry.chapter}.ipynb"
        try:
            cells = json.loads(notebook).get("cells", [])
            ids = {c.get("metadata", {}).get("nbgrader", {}).get("grade_id") for c in cells} - {None}
        except (ValueError, AttributeError):
            ids = set()
        if ids and not ids & _grade_ids(ROOT / folder / entry.chapter / f"{entry.chapter}.ipynb"):
            return f"its {entry.chapter}.ipynb is another chapter's notebook (none of {entry.chapter}'s exercises in it)"
        return None

    return judge


def _uids(hub: dict) -> dict[str, int]:
    uids = {}
    for login, person in _roster(hub).items():
        try:
            uids[login] = pwd.getpwnam(login).pw_uid
        except KeyError:
            pass  # an account removed by hand: nothing of theirs is collected
    return uids


def screen_inbound(hub: dict, chapter_list: list[str], staging: Path) -> tuple[dict, list[str], list]:
    """Screen every edition's inbound entries of `chapter_list` (exchange.py) and stage the ones to
    collect under `staging`. Returns {language: [chapters with submissions]}, one line per entry set
    aside, and the staged entries."""
    exchange, uids = Path(hub["exchange"]), _uids(hub)
    found, lines, staged = {}, [], []
    for language, (course_id, folder) in EDITIONS.items():
        entries, aside = exchange_rules.collect_safely(
            exchange, course_id, chapter_list, uids, staging, exchange / course_id / "set-aside",
            judge=_judge(hub, language, folder))
        lines += aside
        staged += entries
        if entries:
            found[language] = sorted({entry.chapter for entry in entries})
    return found, lines, staged


def record_received(entries: list) -> list[str]:
    """autograder/received.json: when the exchange received each collected submission, and what the
    student's own timestamp.txt claimed. Returns one line per claim earlier than the server's time
    by more than two minutes (a forged timestamp.txt)."""
    import datetime

    path = ROOT / "autograder" / "received.json"
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        record = {}
    lines = []
    for entry in entries:
        record.setdefault("submissions", {}).setdefault(entry.student, {})[entry.chapter] = {
            "received": entry.received_text, "claimed": entry.claimed, "entry": entry.name}
        try:
            claimed = datetime.datetime.strptime(entry.claimed or "", exchange_rules.TIMESTAMP_FORMAT)
            early = entry.received - claimed.replace(tzinfo=datetime.timezone.utc).timestamp()
        except ValueError:
            early = 0.0 if entry.claimed is None else float("inf")
        if early > 120:
            lines.append(f"{entry.student} / {entry.chapter}: timestamp.txt claims {entry.claimed!r}, but the exchange "
                         f"received it at {entry.received_text}; it counts at the exchange's time")
    work = path.with_suffix(".tmp")
    work.write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n")
    os.replace(work, path)
    return lines


def collect(args) -> int:
    hub = load_class()
    wanted = _wanted(args.chapters)
    _verified_exchange(hub)
    staging = ROOT / "autograder" / ".exchange-staging"
    found, lines, staged = screen_inbound(hub, wanted, staging)
    for line in lines:
        print(line)
    if not found:
        print(f"collected 0, set aside {len(lines)}")
        raise ClassError(f"nothing to collect: no submission of {', '.join(args.chapters) or 'any chapter'} "
                         f"in the exchange ({hub['exchange']})")
    for line in record_received(staged):
        print(line)
    for language, names in found.items():
        for result in exchange_step("collect", language, names, staging):
            for line in result["log"].splitlines():
                if "Collecting submission" in line or "Updating submission" in line:
                    print(line.split("] ", 1)[-1])
    print(f"collected {len(staged)}, set aside {len(lines)}")
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
    # nbgrader's release_feedback takes every page under autograder/feedback/*/<chapter>/: everyone whose
    # page is not ready here (the other edition, resubmitted since grading, off the roster) is excluded
    everyone = set(people) | ({p.name for p in pages.iterdir() if p.is_dir()} if pages.is_dir() else set())
    for language, by_chapter in ready.items():
        for chapter, logins in sorted(by_chapter.items()):
            exchange_step("feedback", language, [chapter], Path(hub["exchange"]), exclude=sorted(everyone - set(logins)))
            released += len(logins)
    print(f"feedback released: {released} pages")
    return 0


def reset_password(args) -> int:
    person = _roster(load_class()).get(args.login)
    if person is None:
        raise ClassError(f"{args.login} is not on the class's roster")
    secret = state_dir() / "secrets"
    password = passwords.reset_password(secret / "passwords.dbm", secret / "first-passwords.csv", args.login, person["name"])
    print(f"{args.login}: new first password {password} (also in {secret / 'first-passwords.csv'}); "
          "they change it at /hub/auth/change-password")
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
    hub.add_argument("--answers", choices=ANSWERS, default="visible",
                     help="visible: students' servers hold the reference library; hidden: without the graded answers")
    hub.add_argument("--hide", default="", help="with --answers hidden: only these chapters' answers (comma-separated; default all)")
    check = sub.add_parser("check-roster", help="read a roster and say what is wrong with it")
    check.add_argument("roster")
    for name in ("release", "collect", "feedback"):
        sub.add_parser(name).add_argument("chapters", nargs="*")
    sub.add_parser("remove-accounts", help="remove the Unix accounts the course created")
    sub.add_parser("reset-password", help="a new first password for one person").add_argument("login")
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
                "remove-accounts": remove, "reset-password": reset_password}[args.step](args)
    except (ClassError, RosterError, deadlines.ScheduleError) as exc:
        print(f"{Path(sys.argv[0]).name if argv is None else 'classhub'}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
