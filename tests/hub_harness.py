"""A class on a JupyterHub started the way `make hub` starts it, on a scratch copy of the course:
the harness tests/test_hub.py and benchmarks/bench_hub_load.py share.

`start_class(people)` copies what a hub and a grading run need of the course into a temporary folder
outside root's own, makes the roster, and starts `deploy/hub/classhub.py serve` on free ports with
its own exchange, hub state and instructors' group; logins get a random suffix so that nothing
collides with an account already on the machine. `stop_class` stops the hub (which stops the
servers it spawned), removes the accounts and group the class created, and checks that no
account, group, process or port is left.
"""

from __future__ import annotations

import json
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROXY = ROOT / "deploy" / "hub" / "state" / "proxy" / "node_modules" / ".bin" / "configurable-http-proxy"


def why_not() -> str | None:
    """Why a hub cannot run here, or None."""
    if os.geteuid() != 0:
        return "a class hub creates Unix accounts: run it as root"
    if not PROXY.exists():
        return "configurable-http-proxy is not installed (make test installs it with npm)"
    if not shutil.which("useradd"):
        return "no useradd on this machine"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Hub:
    """The running class: where everything is, and the instructor's and students' commands."""

    def __init__(self, base: Path, suffix: str):
        self.group = f"tci{suffix}"
        self.base = base
        self.course = base / "course"
        self.state = base / "state"
        self.exchange = base / "exchange"
        self.servers = base / "servers"
        self.port, self.hub_port, self.api_port = free_port(), free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = dict(os.environ, HUB_STATE=str(self.state), COURSE_EXCHANGE=str(self.exchange),
                        HUB_SERVERS=str(self.servers),
                        HUB_INSTRUCTOR_GROUP=self.group, OMP_NUM_THREADS="1", PYTHONHASHSEED="0",
                        PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
        self.process = None
        self.token = secrets.token_hex(16)  # the test's own admin service (start_class adds it)

    # -- the hub's REST API, as an admin service ----------------------------------------------------
    def api(self, method: str, path: str, body: dict | None = None, timeout: float = 30) -> tuple[int, dict]:
        """(status, JSON) of a request to the hub or, through its proxy, to a person's server."""
        request = urllib.request.Request(self.url + path, method=method, headers={"Authorization": f"token {self.token}"},
                                         data=None if body is None else json.dumps(body).encode())
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                text = response.read()
                return response.status, json.loads(text) if text else {}
        except urllib.error.HTTPError as exc:
            return exc.code, {}

    def start_server(self, login: str) -> None:
        status, _ = self.api("POST", f"/hub/api/users/{login}/server")
        assert status in (201, 202, 400), f"the hub did not start {login}'s server: HTTP {status}"  # 400: running
        wait_for(f"{login}'s server ready", lambda: self.api("GET", f"/hub/api/users/{login}")[1]
                 .get("servers", {}).get("", {}).get("ready"))

    # -- the instructor's side, as the Makefile runs it ------------------------------------------
    def classhub(self, *args: str, check: bool = True, env: dict | None = None) -> subprocess.CompletedProcess:
        proc = subprocess.run([sys.executable, str(self.course / "deploy" / "hub" / "classhub.py"), *args],
                              env=env or self.env, capture_output=True, text=True, timeout=300)
        if check and proc.returncode != 0:
            raise AssertionError(f"classhub {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}")
        return proc

    def grade(self) -> str:
        proc = subprocess.run([sys.executable, str(self.course / "autograder" / "course.py"), "grade", "--jobs", "2"],
                              env=self.env, capture_output=True, text=True, timeout=600, cwd=self.course)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        return proc.stdout + proc.stderr

    # -- a student's shell on the server ------------------------------------------------------------
    def as_user(self, login: str, *command: str, timeout: float = 120) -> subprocess.CompletedProcess:
        home = pwd.getpwnam(login).pw_dir
        klass = json.loads((self.state / "class.json").read_text())
        language = next(p["language"] for p in klass["people"] if p["login"] == login)
        config = os.pathsep.join([str(Path(klass["configs"]) / f"student-{language}"),
                                  str(Path(klass["servers_prefix"]) / "etc" / "jupyter")])
        return subprocess.run(["runuser", "-u", login, "--", "env", f"HOME={home}", f"JUPYTER_CONFIG_PATH={config}",
                               f"PATH={Path(klass['python']).parent}:/usr/bin:/bin", *command],
                              cwd=home, capture_output=True, text=True, timeout=timeout)

    def password(self, login: str) -> str:
        """The first password `make hub` gave `login` (what the instructor hands out)."""
        import csv

        with open(self.state / "secrets" / "first-passwords.csv", newline="") as f:
            return next(row["first password"] for row in csv.DictReader(f) if row["login"] == login)

    def nbgrader(self, login: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        python = json.loads((self.state / "class.json").read_text())["python"]
        return self.as_user(login, python, "-m", "nbgrader", *args, timeout=timeout)


def wait_for(what: str, check, timeout: float = 120):
    deadline = time.monotonic() + timeout
    while not (result := check()):
        assert time.monotonic() < deadline, f"{what}: not after {timeout:.0f} s"
        time.sleep(0.5)
    return result


class Kernel:
    """A kernel in a person's server, started and run the way JupyterLab does: REST, then the websocket."""

    def __init__(self, hub: Hub, login: str):
        import websocket

        status, model = hub.api("POST", f"/user/{login}/api/kernels", {})
        assert status == 201, f"no kernel in {login}'s server: HTTP {status}"
        self.id, self.session = model["id"], uuid.uuid4().hex
        self.ws = websocket.create_connection(
            f"ws://127.0.0.1:{hub.port}/user/{login}/api/kernels/{self.id}/channels?session_id={self.session}",
            header=[f"Authorization: token {hub.token}"], timeout=60)

    def run(self, code: str, timeout: float = 60) -> dict:
        """{"stdout", "result", "error", "died"}: died when the kernel was killed while running it."""
        import websocket

        msg_id = uuid.uuid4().hex
        self.ws.send(json.dumps({
            "header": {"msg_id": msg_id, "msg_type": "execute_request", "session": self.session,
                       "username": "test", "version": "5.3"},
            "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
            "content": {"code": code, "silent": False, "store_history": False, "user_expressions": {},
                        "allow_stdin": False, "stop_on_error": True}}))
        out = {"stdout": "", "result": None, "error": None, "died": False}
        replied = idle = False
        deadline = time.monotonic() + timeout
        while not (replied and idle):
            self.ws.settimeout(max(0.1, deadline - time.monotonic()))
            try:
                msg = json.loads(self.ws.recv())
            except websocket.WebSocketConnectionClosedException:
                return dict(out, died=True)
            except websocket.WebSocketTimeoutException:
                raise AssertionError(f"no answer from the kernel in {timeout:.0f} s to {code[:60]!r}") from None
            kind, content = msg["msg_type"], msg["content"]
            if kind == "status" and content["execution_state"] in ("restarting", "dead"):
                return dict(out, died=True)  # the server's restarter found the kernel gone
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if kind == "stream" and content["name"] == "stdout":
                out["stdout"] += content["text"]
            elif kind == "execute_result":
                out["result"] = content["data"].get("text/plain")
            elif kind == "error":
                out["error"] = content["ename"]
            elif kind == "execute_reply":
                replied = True
            elif kind == "status" and content["execution_state"] == "idle":
                idle = True
        return out

    def close(self) -> None:
        self.ws.close()


def _copy_course(target: Path) -> None:
    """What a hub and a grading run need of the course, without its venvs, history or grading outputs."""
    skip = shutil.ignore_patterns(".venv*", ".git", "__pycache__", "submitted", "autograded", "feedback",
                                  "gradebook.db", ".sandbox", ".release", "state", "*.egg-info", "grades.csv",
                                  "report.csv", "graded.json")
    target.mkdir(parents=True)
    for name in ["autograder", "chapters", "solutions", "deploy", "transformer_lib", ".lab", ".lab-zh"]:
        shutil.copytree(ROOT / name, target / name, ignore=skip)
    # Every user's server reads the start page and the role configurations through these folders.
    for path in [target.parent, target]:
        os.chmod(path, 0o755)


def _stop(hub: Hub) -> None:
    if hub.process and hub.process.poll() is None:
        os.killpg(hub.process.pid, signal.SIGTERM)  # the hub stops the servers it spawned (cleanup_servers)
        try:
            hub.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(hub.process.pid, signal.SIGKILL)
    for login in hub.logins:
        subprocess.run(["pkill", "-KILL", "-u", login], capture_output=True)
    hub.classhub("remove-accounts", check=False)
    shutil.rmtree(hub.exchange, ignore_errors=True)
    # Nothing of the class is left on the machine: accounts, group, processes, ports.
    left = [login for login in hub.logins if _exists(login)]
    assert not left, f"accounts left behind: {left}"
    assert subprocess.run(["getent", "group", hub.group], capture_output=True).returncode != 0, hub.group
    for port in (hub.port, hub.hub_port, hub.api_port):
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", port)) != 0, f"port {port} still answers after the hub stopped"
    leftover = subprocess.run(["pgrep", "-f", str(hub.base)], capture_output=True, text=True).stdout.split()
    assert not leftover, f"processes left behind: {leftover}"


def _exists(login: str) -> bool:
    try:
        pwd.getpwnam(login)
        return True
    except KeyError:
        return False




def start_class(people: list[tuple[str, str, str, str]], extra_config: str = "", answers: str = "visible",
                hide: str = "") -> Hub:
    """people: (login, name, role, language) with logins already suffixed; see `suffixed`. answers,
    hide: `make hub ANSWERS=... HIDE=...`."""
    base = Path(tempfile.mkdtemp(prefix="course-hub-"))
    os.chmod(base, 0o755)
    hub = Hub(base, people[0][0][-6:])
    hub.logins = [login for login, *_ in people]
    _copy_course(hub.course)
    (hub.course / "deploy" / "hub" / "state").mkdir(exist_ok=True)
    os.symlink(PROXY.parents[2], hub.course / "deploy" / "hub" / "state" / "proxy")
    hub.state.mkdir(parents=True, exist_ok=True)
    (hub.state / "extra_config.py").write_text(f"""
# The test's own admin service: start and stop servers, and reach them, through the REST APIs.
c.JupyterHub.services = [{{"name": "class-test", "api_token": {hub.token!r}}}]
c.JupyterHub.load_roles = [{{"name": "class-test", "services": ["class-test"],
                            "scopes": ["admin:users", "admin:servers", "access:servers", "tokens"]}}]
""" + extra_config)
    roster = base / "roster.csv"
    roster.write_text("login,name,role,language\n" + "".join(f"{','.join(row)}\n" for row in people))
    hub.log = open(base / "hub.log", "w")
    hub.process = subprocess.Popen(
        [sys.executable, str(hub.course / "deploy" / "hub" / "classhub.py"), "serve", "--roster", str(roster),
         "--ip", "127.0.0.1", "--port", str(hub.port), "--hub-port", str(hub.hub_port),
         "--proxy-api-port", str(hub.api_port), "--answers", answers, "--hide", hide],
        env=hub.env, stdout=hub.log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(f"{hub.url}/hub/api", timeout=2)
                return hub
            except OSError:
                if hub.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the hub did not start:\n" + (base / "hub.log").read_text()[-4000:])
                time.sleep(0.5)
    except BaseException:
        stop_class(hub)
        raise


def suffixed(*prefixes: str) -> list[str]:
    """Logins no account on this machine has: each prefix and one random suffix."""
    suffix = secrets.token_hex(3)
    return [f"{prefix}{suffix}" for prefix in prefixes]


def stop_class(hub: Hub, keep_files: bool = False) -> None:
    try:
        _stop(hub)
    finally:
        hub.log.close()
        if not keep_files:
            shutil.rmtree(hub.base, ignore_errors=True)
