"""A term of a class on a real JupyterHub, driven through its login page in a real browser.

The hub is the one `make hub` starts (deploy/hub/classhub.py and jupyterhub_config.py: JupyterHub
6, configurable-http-proxy, FirstUseAuthenticator, LocalProcessSpawner, a Unix account per person,
nbgrader's exchange), on a scratch copy of the course, free ports, a temporary exchange and Unix
accounts with a random suffix that the test removes. One instructor and two students, one of them
reading the Chinese edition:

1. the instructor logs in and lands on Formgrader; `classhub release` puts chapter 02 in the exchange;
2. each student logs in, fetches the chapter in the Assignments tab, fills in the first exercise
   (one correctly, the other not), validates and submits;
3. the instructor collects and grades (`course.py grade`, sandboxed) and releases feedback;
4. each student fetches their feedback in the tab and opens it: their own score, in their language;
5. the Chinese student fixes the exercise and submits again; the next grading run grades that
   submission alone, and the student's new feedback shows the new score.

Then what a student must not reach (each its own test): another student's files in the exchange or
in their home, the course's solutions, Formgrader and the instructor's server (403 from the hub),
another student's feedback, and a submission in another student's name (`collect` sets it aside).
Then a hostile student, from their own account and shell: the exchange's course folders (taken,
renamed, removed), links, special files, hard links, huge or many files and a forged timestamp in
what `collect` reads as root, an instructor's login claimed before they logged in, a roster login
that is someone's existing account, and, in their server, a fork bomb and a memory hog (each
server's cgroups, deploy/hub/limits.py: the other student's kernel and the hub keep answering).

Needs root (Unix accounts), Node's npm (the proxy; `make test` installs it), chromium and useradd;
elsewhere it is skipped and says why.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import pwd
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from hub_harness import ROOT, Hub, Kernel, start_class, stop_class, suffixed, wait_for, why_not

CHAPTER = "02_self_attention"
PASSWORD = "a-long-password-1"
# Each server's limits (deploy/hub/limits.py), small enough to reach in a test, large enough for chapter 02.
MEMORY, PIDS, SHARE = "1500M", 256, 1024
CONTROLLERS = ("memory", "pids", "cpu")
LIMITS = f"""
os.environ.update(HUB_MEM_LIMIT={MEMORY!r}, HUB_PIDS_LIMIT="{PIDS}", HUB_CPU_SHARE="{SHARE}")
"""
CORRECT = "def project_qkv(x, w_q, w_k, w_v):\n    return x @ w_q, x @ w_k, x @ w_v\n"
SWAPPED = "def project_qkv(x, w_q, w_k, w_v):\n    return x @ w_k, x @ w_q, x @ w_v\n"


def _why_not() -> str | None:
    if not shutil.which("chromium"):
        return "chromium is not installed (make test installs it as root)"
    return why_not()


pytestmark = [pytest.mark.slow, pytest.mark.skipif(_why_not() is not None, reason=_why_not() or "")]


@pytest.fixture(scope="module")
def hub():
    instructor, alice, wang, absent = suffixed("ti", "ta", "tz", "tj")
    hub = start_class([(instructor, "Test Instructor", "instructor", "en"), (alice, "Alice Martin", "student", "en"),
                       (wang, "王小明", "student", "zh"), (absent, "Never Logged In", "instructor", "en")],
                      extra_config=LIMITS, answers="hidden", hide=CHAPTER)  # the chapter this class works on
    hub.instructor, hub.alice, hub.wang, hub.absent = instructor, alice, wang, absent
    hub.cgroups = cgroups_of(hub.process.pid)  # the course's cgroups go under the hub's own
    try:
        hub.classhub("release", CHAPTER)
        yield hub
    finally:
        try:
            # KEEP_HUB_LOG=1: a maintainer's look at a failure (the hub's log and the course copy stay)
            stop_class(hub, keep_files=bool(os.environ.get("KEEP_HUB_LOG")))
        finally:  # …and with the servers their cgroups: none of the class's is left under the hub's
            left = [str(folder / f"course-{login}") for folder in hub.cgroups.values() for login in hub.logins
                    if (folder / f"course-{login}").exists()]
            assert not left, f"cgroups left behind after the hub stopped: {left}"


# -- the browser ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=shutil.which("chromium"), args=["--no-sandbox"])
        yield chromium
        chromium.close()


def log_in(browser, hub: Hub, login: str, password: str | None = None):
    """Through the hub's login page, with the first password `make hub` gave (or `password`)."""
    page = browser.new_context(viewport={"width": 1400, "height": 900}).new_page()
    page.set_default_timeout(60_000)
    page.goto(f"{hub.url}/hub/login")
    page.fill("input[name=username]", login)
    page.fill("input[name=password]", password or hub.password(login))
    page.click("input[type=submit], button[type=submit]")
    page.wait_for_url(f"**/user/{login}/**", timeout=120_000)
    return page


def open_lab(page, hub: Hub, login: str) -> None:
    page.goto(f"{hub.url}/user/{login}/lab?reset")  # a fresh workspace: no tab from an earlier visit
    page.wait_for_selector("#jp-main-dock-panel")


def assignments_tab(page, section: str) -> None:
    """Nbgrader ▸ Assignment List, then wait until `section` (released, fetched, submitted) lists the chapter."""
    page.click("#jp-MainMenu >> text=Nbgrader")
    page.locator(".lm-Menu-item:not(.lm-mod-disabled) .lm-Menu-itemLabel").first.click()
    page.wait_for_selector(f"#{section}_assignments_list >> text={CHAPTER}")


def fill_first_exercise(page, code: str) -> None:
    cell = page.locator(".jp-CodeCell", has_text="def project_qkv").first
    cell.locator(".cm-content").click()
    page.keyboard.press("Control+a")
    page.keyboard.insert_text(code)
    # On a busy machine the editor may hand its last change to the notebook after the save began, which
    # leaves the tab dirty with the saved file one edit behind: save again until the tab is clean.
    for attempt in range(4):
        page.locator(".jp-NotebookPanel-toolbar [data-command='docmanager:save']").first.click()
        try:
            page.wait_for_selector(".lm-TabBar-tab.lm-mod-current.jp-mod-dirty", state="detached", timeout=20_000)
            return
        except Exception:
            if attempt == 3:
                raise


def validate(page) -> str:
    try:
        page.locator(".jp-NotebookPanel-toolbar:visible").get_by_text("Validate").first.click()
    except Exception:
        page.screenshot(path="/tmp/hub-validate.png")
        raise
    dialog = page.wait_for_selector(".jp-Dialog", timeout=180_000)
    text = dialog.inner_text()
    page.click(".jp-Dialog button.jp-mod-accept")
    return text


def submit(page) -> None:
    assignments_tab(page, "fetched")
    before = page.locator("#submitted_assignments_list .list_item").count()
    page.click("#fetched_assignments_list button:has-text('Submit')")
    page.wait_for_function(
        f"document.querySelectorAll('#submitted_assignments_list .list_item').length > {before}", timeout=60_000)


def feedback_page(page) -> str:
    """Fetch Feedback in the tab, follow (view feedback) to its folder, open the page: its text."""
    assignments_tab(page, "submitted")
    page.locator("#submitted_assignments_list button:has-text('Fetch Feedback')").last.click()
    link = page.locator("#submitted_assignments_list a:has-text('view feedback')").last
    link.click()
    page.dblclick(f".jp-DirListing-item[title*='{CHAPTER}.html']")
    body = page.frame_locator(".jp-HTMLViewer iframe").last.locator("body")
    body.locator("h4").first.wait_for()
    text = " ".join(body.inner_text().split())
    page.click(".lm-TabBar-tab.lm-mod-current .lm-TabBar-tabCloseIcon")
    return text


def score(text: str) -> str:
    """The notebook's total as the page shows it: "(Score: 1.0 / 11.0)", or "（得分：1.0 / 11.0）" in Chinese."""
    found = re.search(r"(?:\(Score: |（得分：)([\d.]+) / ([\d.]+)(?:\)|）)", text)
    assert found, f"no score on the feedback page: {text[:500]}"
    return f"{float(found[1]):g}/{float(found[2]):g}"


# -- the term --------------------------------------------------------------------------------------------


def test_a_term_on_the_hub_from_release_to_resubmission(hub, browser):
    # The instructor's server: Formgrader on the course, listing the chapters.
    instructor = log_in(browser, hub, hub.instructor)
    instructor.goto(f"{hub.url}/user/{hub.instructor}/formgrader")
    try:
        instructor.wait_for_selector(f"text={CHAPTER}")
    except Exception:
        instructor.screenshot(path=str(hub.base / "formgrader.png"))
        raise
    instructor.context.close()

    students = {hub.alice: ("en", CORRECT), hub.wang: ("zh", SWAPPED)}
    pages = {}
    for login, (language, code) in students.items():
        page = pages[login] = log_in(browser, hub, login)
        open_lab(page, hub, login)
        if language == "zh":  # JupyterLab in Chinese
            page.wait_for_selector("#jp-MainMenu >> text=文件")
        assignments_tab(page, "released")
        page.click("#released_assignments_list button:has-text('Fetch')")
        page.wait_for_selector(f"#fetched_assignments_list >> text={CHAPTER}")
        page.click(f"#fetched_assignments_list a:has-text('{CHAPTER}')")
        page.dblclick(f".jp-DirListing-item[title*='{CHAPTER}']:not([title*='.ipynb'])")
        page.dblclick(f".jp-DirListing-item[title*='{CHAPTER}.ipynb']")
        page.wait_for_selector(".jp-Notebook .jp-CodeCell")
        fill_first_exercise(page, code)
        verdict = validate(page)
        if language == "zh":  # the swapped projections are named, in Chinese
            assert "对调" in verdict, verdict
        else:
            assert "project_qkv" not in verdict.split("attention_scores")[0], verdict
        submit(page)

    collected = hub.classhub("collect").stdout
    assert f"Collecting submission: {hub.alice} {CHAPTER}" in collected and hub.wang in collected, collected
    first = hub.grade()
    assert "grading 2 submissions" in first, first
    hub.classhub("feedback", CHAPTER)

    alice_page, wang_page = feedback_page(pages[hub.alice]), feedback_page(pages[hub.wang])
    assert score(alice_page) == "1/11" and score(wang_page) == "0/11"
    assert "project_qkv" in alice_page and "对调" in wang_page and "对调" not in alice_page
    assert "(Score: " in alice_page and "（得分：" in wang_page and "Score:" not in wang_page

    # The Chinese student fixes the exercise and submits again: that submission alone is graded.
    page = pages[hub.wang]
    page.goto(f"{hub.url}/user/{hub.wang}/lab/tree/{CHAPTER}/{CHAPTER}.ipynb")
    page.wait_for_selector(".jp-Notebook .jp-CodeCell")
    fill_first_exercise(page, CORRECT)
    assert "对调" not in validate(page)
    submit(page)
    collected = hub.classhub("collect").stdout
    assert f"Updating submission: {hub.wang} {CHAPTER}" in collected, collected
    # Feedback now would be the old submission's: hub-feedback holds it back until it is graded.
    held = hub.classhub("feedback", CHAPTER).stdout
    assert f"{hub.wang} / {CHAPTER}: resubmitted since it was graded" in held, held
    alice_feedback = hub.course / "autograder" / "feedback" / hub.alice / CHAPTER / f"{CHAPTER}.html"
    untouched = alice_feedback.stat().st_mtime_ns
    second = hub.grade()
    assert re.search(r"1 new or changed", second) and re.search(r"1 unchanged", second), second
    assert alice_feedback.stat().st_mtime_ns == untouched
    hub.classhub("feedback", CHAPTER)
    assert score(feedback_page(page)) == "1/11"
    for page in pages.values():
        page.context.close()


# -- what a student must not reach ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def submitted(hub):
    """Both students have fetched and submitted chapter 02 from their shells (nbgrader's own commands)."""
    for login in (hub.alice, hub.wang):
        if not (Path(pwd.getpwnam(login).pw_dir) / CHAPTER).exists():
            proc = hub.nbgrader(login, "fetch_assignment", CHAPTER)
            assert proc.returncode == 0, proc.stderr
        proc = hub.nbgrader(login, "submit", CHAPTER)
        assert proc.returncode == 0, proc.stderr
    return hub


def test_with_hidden_answers_a_student_cannot_read_a_reference_answer(submitted):
    """`make hub ANSWERS=hidden` (this class): the servers import a library whose graded answers are
    stubs; the course's own library is closed. softmax is chapter 02's exercise 3."""
    hub = submitted
    library = Path(json.loads((hub.state / "class.json").read_text())["servers_prefix"])
    attention = next(library.glob("lib/python3*/site-packages/transformer_lib/attention.py"))
    for command in (["cat", str(hub.course / "transformer_lib" / "attention.py")],
                    ["ls", str(hub.course / "transformer_lib")]):
        proc = hub.as_user(hub.alice, *command)
        assert proc.returncode != 0 and "Permission denied" in proc.stderr, (command, proc.stdout[:200])
    # Neither its source line nor its docstring (kept in bytecode too) is anywhere in the servers' library.
    for text in ("x.amax(dim=dim, keepdim=True)", "Numerically stable softmax"):
        proc = hub.as_user(hub.alice, "grep", "-rlF", text, str(attention.parent))
        assert proc.returncode == 1 and not proc.stdout, (text, proc.stdout, proc.stderr)
    hub.start_server(hub.alice)
    kernel = Kernel(hub, hub.alice)
    try:
        out = kernel.run("import inspect, transformer_lib.attention as a\nprint(inspect.getsource(a.softmax))")
    finally:
        kernel.close()
    assert out["error"] is None and "hidden" in out["stdout"] and "exp(" not in out["stdout"], out


def test_a_student_cannot_read_anothers_work_or_the_solutions(submitted):
    hub = submitted
    inbound = hub.exchange / "transformer-course" / "inbound"
    wang_home = Path(pwd.getpwnam(hub.wang).pw_dir)
    for command in (["ls", str(inbound)], ["ls", str(wang_home)], ["cat", str(wang_home / CHAPTER / f"{CHAPTER}.ipynb")],
                    ["ls", str(hub.course / "solutions")], ["ls", str(hub.course / "autograder")]):
        proc = hub.as_user(hub.alice, *command)
        assert proc.returncode != 0 and "Permission denied" in proc.stderr, (command, proc.stdout[:300])
    # …while the Chinese student reads their own home (the check above is about whose files they are).
    assert hub.as_user(hub.wang, "ls", str(wang_home)).returncode == 0


def test_a_student_gets_403_from_formgrader_and_from_others_servers(hub, browser):
    for login in (hub.instructor, hub.wang):  # their servers running, as in class
        log_in(browser, hub, login).context.close()
    page = log_in(browser, hub, hub.alice)
    for url in (f"/user/{hub.instructor}/formgrader", f"/user/{hub.instructor}/lab", f"/user/{hub.wang}/lab",
                f"/user/{hub.wang}/files/{CHAPTER}/{CHAPTER}.ipynb"):
        response = page.goto(hub.url + url)
        assert response.status == 403, (url, response.status)
    # The hub's REST API does not even say whether another user exists (JupyterHub answers 404).
    response = page.goto(f"{hub.url}/hub/api/users/{hub.wang}")
    assert response.status == 404, response.status
    # Their own server has no Formgrader either.
    response = page.goto(f"{hub.url}/user/{hub.alice}/formgrader")
    assert response.status == 404, response.status
    page.context.close()


def test_a_student_cannot_fetch_anothers_feedback(submitted):
    hub = submitted
    feedback = hub.exchange / "transformer-course" / "feedback"
    if not list(feedback.glob("*.html")):  # run alone: the term's pages are not there yet
        hub.classhub("collect")
        hub.grade()
        hub.classhub("feedback", CHAPTER)
    pages = [p.name for p in feedback.glob("*.html")]
    assert pages
    # The feedback folder cannot be listed, and a page's name is a hash of a secret the student's
    # own submission holds: another student can neither list nor compute it.
    proc = hub.as_user(hub.wang, "ls", str(feedback))
    assert proc.returncode != 0 and "Permission denied" in proc.stderr
    wang_home = Path(pwd.getpwnam(hub.wang).pw_dir)
    before = set(wang_home.rglob("*.html"))
    hub.nbgrader(hub.wang, "fetch_feedback", CHAPTER, "--course", "transformer-course", f"--student={hub.alice}")
    assert set(wang_home.rglob("*.html")) == before, "the Chinese student fetched a feedback page that is not theirs"
    secret = hub.course / "autograder" / "submitted" / hub.alice / CHAPTER / "submission_secret.txt"
    assert hub.as_user(hub.wang, "cat", str(secret)).returncode != 0


def test_bad_input_gets_one_line_and_changes_nothing(hub, tmp_path):
    rosters = {
        "login,name,role\nann,Ann,student\n": "missing column language",
        "login,name,role,language\nann,Ann,instructor,en\nann,Ann B,student,en\n": "appears twice (first on line 2)",
        "login,name,role,language\nann,Ann,teacher,en\n": "unknown role 'teacher'",
        "login,name,role,language\nann,Ann,instructor,fr\n": "unknown language 'fr'",
    }
    for text, message in rosters.items():
        roster = tmp_path / "roster.csv"
        roster.write_text(text)
        proc = hub.classhub("check-roster", str(roster), check=False)
        assert proc.returncode == 1 and message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    # Not root: nothing is created.
    python = json.loads((hub.state / "class.json").read_text())["python"]
    proc = subprocess.run(["runuser", "-u", "nobody", "--", python, str(hub.course / "deploy" / "hub" / "classhub.py"),
                           "serve", "--roster", "/nonexistent.csv"], capture_output=True, text=True, env=hub.env)
    assert proc.returncode == 1 and "must run as root" in proc.stderr, proc.stderr
    # No Node.js (for the proxy): one line, before any account is made.
    roster = tmp_path / "roster.csv"
    roster.write_text("login,name,role,language\nzzhubnonode,Nobody,instructor,en\n")
    proc = hub.classhub("serve", "--roster", str(roster), check=False,
                        env=dict(hub.env, PATH=str(Path(hub.env["PATH"].split(os.pathsep)[0]))))
    assert proc.returncode == 1 and "needs Node.js and npm" in proc.stderr, proc.stderr
    # A Node.js older than the proxy needs (12 on Ubuntu 22.04, 18 on Debian 12 and Ubuntu 24.04): one line.
    old_node = tmp_path / "bin"
    old_node.mkdir()
    for tool, text in (("node", "v18.19.0"), ("npm", "9.2.0")):
        (old_node / tool).write_text(f"#!/bin/sh\necho {text}\n")
        (old_node / tool).chmod(0o755)
    proc = hub.classhub("serve", "--roster", str(roster), check=False,
                        env=dict(hub.env, PATH=f"{old_node}:{hub.env['PATH'].split(os.pathsep)[0]}:/usr/bin:/bin"))
    assert proc.returncode == 1 and "needs Node.js 20 or newer, and `node --version` says v18.19.0" in proc.stderr, \
        proc.stderr
    assert subprocess.run(["id", "zzhubnonode"], capture_output=True).returncode != 0
    # Nothing submitted for a chapter: collect says so.
    proc = hub.classhub("collect", "12_vision_transformers", check=False)
    assert proc.returncode == 1 and "nothing to collect" in proc.stderr, proc.stderr
    # A course in a folder other accounts cannot enter (a clone in /root, or in `mktemp -d`): one line,
    # before anything is made (the instructors' servers open the course folder).
    private = tmp_path / "private"
    (private / "course" / "deploy").mkdir(parents=True)
    private.chmod(0o700)
    shutil.copytree(hub.course / "deploy" / "hub", private / "course" / "deploy" / "hub",
                    ignore=shutil.ignore_patterns("state"))
    proc = subprocess.run([sys.executable, str(private / "course" / "deploy" / "hub" / "classhub.py"), "serve",
                           "--roster", str(roster)], env=hub.env, capture_output=True, text=True)
    assert proc.returncode == 1 and f"the course is in {private / 'course'}, which other accounts cannot enter" \
        in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


# -- a hostile student against the exchange, collect and logins ------------------------------------------


def _entry(hub: Hub, login: str, name: str, course: str = "transformer-course") -> Path:
    """A fresh inbound entry written by `login` as nbgrader's submit writes one (their own folder)."""
    entry = hub.exchange / course / "inbound" / name
    proc = hub.as_user(login, "mkdir", str(entry))
    assert proc.returncode == 0, proc.stderr
    return entry


def _stamp(suffix: str) -> str:
    import datetime

    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f UTC") + suffix


def test_a_student_can_neither_take_nor_move_a_course_in_the_exchange(submitted):
    hub = submitted
    zh = hub.exchange / "transformer-course-zh"
    # The root and every course folder are root's, made before anyone logged in.
    assert (hub.exchange.stat().st_uid, oct(hub.exchange.stat().st_mode & 0o7777)) == (0, "0o755")
    assert oct((zh / "inbound").stat().st_mode & 0o7777) == "0o3733"
    for command in (["mkdir", str(hub.exchange / "transformer-course-fr")],  # squat a course not yet there
                    ["mv", str(zh), str(hub.exchange / "moved")],  # rename a course away
                    ["rm", "-rf", str(zh / "outbound")],
                    ["touch", str(hub.exchange / "planted")]):
        proc = hub.as_user(hub.alice, *command)
        assert proc.returncode != 0 and "Permission denied" in proc.stderr, (command, proc.stderr)
    # inbound/ is sticky: even knowing its name, a student cannot move or delete another's entry.
    wang_entry = next((hub.exchange / "transformer-course-zh" / "inbound").glob(f"{hub.wang}+*"))
    for command in (["mv", str(wang_entry), str(wang_entry) + "x"], ["rm", "-rf", str(wang_entry)]):
        proc = hub.as_user(hub.alice, *command)
        assert proc.returncode != 0, command
    assert wang_entry.exists()
    # An exchange someone changed is refused, naming the path, before nbgrader touches it.
    os.chown(zh, pwd.getpwnam(hub.alice).pw_uid, -1)  # as if a student had made it under the old 0777 root
    try:
        proc = hub.classhub("release", CHAPTER, check=False)
        assert proc.returncode == 1 and f"the exchange folder {zh} belongs to {hub.alice}, not root" in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1
    finally:
        os.chown(zh, 0, -1)
    os.chmod(hub.exchange, 0o777)
    try:
        proc = hub.classhub("collect", CHAPTER, check=False)
        assert proc.returncode == 1 and f"{hub.exchange} has mode 0777, not 0755" in proc.stderr, proc.stderr
    finally:
        os.chmod(hub.exchange, 0o755)


def test_collect_takes_only_a_students_own_plain_files(submitted):
    hub = submitted
    inbound = hub.exchange / "transformer-course" / "inbound"
    alice_home, wang_home = (Path(pwd.getpwnam(login).pw_dir) for login in (hub.alice, hub.wang))
    wang_notebook = wang_home / CHAPTER / f"{CHAPTER}.ipynb"
    hub.classhub("collect", CHAPTER)  # the honest submissions first
    wang_collected = hub.course / "autograder" / "submitted" / hub.wang / CHAPTER / f"{CHAPTER}.ipynb"
    wang_before = wang_collected.read_bytes()
    release = hub.course / "chapters" / CHAPTER / f"{CHAPTER}.ipynb"  # a notebook of this chapter, as fetched
    own = release.read_text()
    name = lambda tag: f"{hub.alice}+{CHAPTER}+{_stamp('')}+{tag}"  # noqa: E731
    attacks = {}
    # 1. her notebook is a link to the other student's (root would follow it)
    entry = _entry(hub, hub.alice, name("link"))
    hub.as_user(hub.alice, "ln", "-s", str(wang_notebook), str(entry / f"{CHAPTER}.ipynb"))
    attacks[entry.name] = "it holds a symbolic link"
    # 2. an entry in the other student's name, dated 2099, that is a link to their working folder
    forged = inbound / f"{hub.wang}+{CHAPTER}+2099-01-01 00:00:00.000000 UTC+link"
    hub.as_user(hub.alice, "ln", "-s", str(wang_home / CHAPTER), str(forged))
    attacks[forged.name] = "it is a symbolic link"
    # 3. a named pipe beside a real notebook (it stopped the whole collect)
    entry = _entry(hub, hub.alice, name("fifo"))
    hub.as_user(hub.alice, "cp", str(alice_home / CHAPTER / f"{CHAPTER}.ipynb"), str(entry))
    hub.as_user(hub.alice, "mkfifo", str(entry / "notes.txt"))
    attacks[entry.name] = "it holds a named pipe (notes.txt)"
    # 4. a hard link to another's file (root makes it: fs.protected_hardlinks stops students here)
    entry = _entry(hub, hub.alice, name("hardlink"))
    os.link(wang_notebook, entry / f"{CHAPTER}.ipynb")
    attacks[entry.name] = f"it holds {CHAPTER}.ipynb, which belongs to {hub.wang}"
    # 5. too big, and 6. too many files
    entry = _entry(hub, hub.alice, name("big"))
    hub.as_user(hub.alice, "dd", "if=/dev/zero", f"of={entry / 'weights.bin'}", "bs=1M", "count=21", "status=none")
    attacks[entry.name] = "it holds more than 20 MB"
    entry = _entry(hub, hub.alice, name("many"))
    hub.as_user(hub.alice, "sh", "-c", f"cd '{entry}' && for i in $(seq 60); do : > f$i.txt; done")
    attacks[entry.name] = "it holds more than 50 files"
    # 7. her notebook submitted with nbgrader to the Chinese course in the other student's name
    proc = hub.nbgrader(hub.alice, "submit", CHAPTER, "--course", "transformer-course-zh", f"--student={hub.wang}")
    assert proc.returncode == 0, proc.stderr
    in_wangs_name = max((hub.exchange / "transformer-course-zh" / "inbound").glob(f"{hub.wang}+*"),
                        key=lambda path: path.stat().st_ctime_ns)  # the newest entry there: hers
    # 8. another chapter's notebook in chapter 02's name
    entry = _entry(hub, hub.alice, name("chapter03"))
    hub.as_user(hub.alice, "cp", str(hub.course / "chapters" / "03_multi_head_attention" / "03_multi_head_attention.ipynb"),
                str(entry / f"{CHAPTER}.ipynb"))
    attacks[entry.name] = f"its {CHAPTER}.ipynb is another chapter's notebook"
    # 9. her own real resubmission, its timestamp.txt forged to look early (collected, at the server's time)
    entry = _entry(hub, hub.alice, name("honest"))
    hub.as_user(hub.alice, "cp", str(release), str(entry))
    hub.as_user(hub.alice, "sh", "-c", f"printf '2020-01-01 00:00:00.000000 UTC' > '{entry}/timestamp.txt'")

    proc = hub.classhub("collect", CHAPTER)
    out = proc.stdout
    assert re.search(rf"set aside transformer-course-zh/inbound/{re.escape(in_wangs_name.name)}: it claims to be "
                     rf"{hub.wang}'s but was written by {hub.alice}", out), out
    for entry_name, why in attacks.items():
        assert re.search(rf"set aside transformer-course/inbound/{re.escape(entry_name)}: {re.escape(why)}", out), (why, out)
        assert not os.path.lexists(inbound / entry_name)
    assert f"Updating submission: {hub.alice} {CHAPTER}" in out, out
    assert re.search(rf"{hub.alice} / {CHAPTER}: timestamp.txt claims '2020-01-01 .*it counts at the exchange's time", out), out
    assert f"set aside {len(attacks) + 1}" in out, out
    # What was graded is hers, stamped with the server's time; the other student's is untouched.
    collected = hub.course / "autograder" / "submitted" / hub.alice / CHAPTER
    assert (collected / f"{CHAPTER}.ipynb").read_text() == own
    assert not (collected / f"{CHAPTER}.ipynb").is_symlink()
    assert (collected / "timestamp.txt").read_text().startswith(_stamp("")[:4])
    received = json.loads((hub.course / "autograder" / "received.json").read_text())["submissions"][hub.alice][CHAPTER]
    assert received["claimed"].startswith("2020-01-01") and received["received"][:4] == _stamp("")[:4]
    assert wang_collected.read_bytes() == wang_before


def test_nobody_becomes_someone_else(hub, browser, tmp_path):
    # A student who knows the login of an instructor who has not logged in yet cannot set their password.
    page = browser.new_context().new_page()
    page.goto(f"{hub.url}/hub/login")
    page.fill("input[name=username]", hub.absent)
    page.fill("input[name=password]", "chosen-by-a-student")
    page.click("input[type=submit], button[type=submit]")
    page.wait_for_selector("text=Invalid username or password")
    page.context.close()
    # A forgotten password: the instructor gives a new first password; the old one stops working.
    old = hub.password(hub.wang)
    out = hub.classhub("reset-password", hub.wang).stdout
    assert hub.password(hub.wang) != old and hub.password(hub.wang) in out
    log_in(browser, hub, hub.wang).context.close()
    # A roster login that is an account the course did not create is refused, before anything is made.
    (staff,) = suffixed("ts")
    subprocess.run(["useradd", "--no-create-home", staff], check=True)
    try:
        roster = tmp_path / "roster.csv"
        roster.write_text(f"login,name,role,language\n{hub.instructor},I,instructor,en\n{staff},Staff,student,en\n")
        proc = hub.classhub("serve", "--roster", str(roster), check=False)
        assert proc.returncode == 1 and f"{staff} is already an account on this server" in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1
    finally:
        subprocess.run(["userdel", staff], check=True)


def test_root_never_follows_a_students_link_into_their_home(hub):
    """The hub puts START.md in a student's home as root: a link left there in its place (to a file
    root would create, here a path in the test's own folder) must be neither followed nor chowned."""
    home = Path(pwd.getpwnam(hub.alice).pw_dir)
    target = hub.base / "made-by-root-through-a-link"
    hub.as_user(hub.alice, "rm", "-f", str(home / "START.md"))
    assert hub.as_user(hub.alice, "ln", "-s", str(target), str(home / "START.md")).returncode == 0
    hub.api("DELETE", f"/hub/api/users/{hub.alice}/server")
    wait_for("the server stopped", lambda: not hub.api("GET", f"/hub/api/users/{hub.alice}")[1].get("servers"), 60)
    hub.start_server(hub.alice)  # the hub's pre-spawn step runs again
    assert not os.path.lexists(target), "root followed the student's link"
    assert (home / "START.md").is_symlink()
    hub.as_user(hub.alice, "rm", "-f", str(home / "START.md"))


# -- one student cannot take the class down (deploy/hub/limits.py) ----------------------------------------
#
# Every attack is bounded: the bomb forks at most 400 sleeping children for at most 8 s and kills them,
# the hog takes at most 2 GiB for at most 30 s.

def fork_bomb(children: int, seconds: float) -> str:
    """Code that forks up to `children` sleeping children for up to `seconds`, kills them all, and
    prints how many it made and how many forks were refused (EAGAIN)."""
    return BOMB.replace("400", str(children)).replace("< 8", f"< {seconds}").replace("8 s", f"{seconds} s")


BOMB = r"""
import errno, os, signal, time
kids, refused, started = [], 0, time.monotonic()
try:
    # Bounded: 400 children at most, each asleep, for 8 s at most; then every one is killed.
    while len(kids) < 400 and time.monotonic() - started < 8:
        try:
            pid = os.fork()
        except OSError as exc:
            if exc.errno != errno.EAGAIN:
                raise
            refused += 1
            time.sleep(0.02)
            continue
        if pid == 0:
            try:
                time.sleep(30)
            finally:
                os._exit(0)
        kids.append(pid)
finally:
    for pid in kids:
        os.kill(pid, signal.SIGKILL)
    for pid in kids:
        os.waitpid(pid, 0)
print(len(kids), refused)
"""

HOG = r"""
import time
hog, started = [], time.monotonic()
try:
    # Bounded: 2 GiB at most (the limit is 1500M), 16 MiB at a time, each piece written to.
    while len(hog) < 128 and time.monotonic() - started < 30:
        hog.append(b"x" * (16 * 2**20))
    print("allocated", len(hog) * 16)
except MemoryError:
    print("MemoryError at", len(hog) * 16)
finally:
    del hog
"""


def cgroups_of(pid: int) -> dict[str, Path]:
    """{controller: folder} of a process's memory, pids and cpu cgroups (v1 under /sys/fs/cgroup/<name>,
    or v2 under /sys/fs/cgroup)."""
    lines = [line.split(":", 2) for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines()]
    v1 = {name: path for _, names, path in lines for name in names.split(",") if name in CONTROLLERS}
    if v1:
        return {name: Path("/sys/fs/cgroup", name, path.lstrip("/")) for name, path in v1.items()}
    path = next(path for _, names, path in lines if names == "")
    return dict.fromkeys(CONTROLLERS, Path("/sys/fs/cgroup", path.lstrip("/")))


def read(folder: Path, *names: str) -> str:
    """The first of these files there is in the folder (v1 and v2 name them differently)."""
    return next((folder / name).read_text() for name in names if (folder / name).exists())


def counter(text: str, key: str) -> int:
    """A `key value` line's value in a cgroup's events file."""
    return next(int(line.split()[1]) for line in text.splitlines() if line.split()[0] == key)



@pytest.fixture(scope="module")
def kernels(hub):
    """A kernel in each student's server, started as JupyterLab starts one (A: alice, B: wang)."""
    for login in (hub.alice, hub.wang):
        hub.start_server(login)
    hub.a, hub.b = hub.alice, hub.wang
    hub.kernel_a, hub.kernel_b = Kernel(hub, hub.a), Kernel(hub, hub.b)
    yield hub
    for kernel in (hub.kernel_a, hub.kernel_b):
        if kernel:
            kernel.close()


def test_a_students_kernel_runs_in_their_own_cgroups_with_the_limits(kernels):
    hub = kernels
    pid = int(hub.kernel_a.run("import os; print(os.getpid())")["stdout"])
    groups = cgroups_of(pid)
    for controller in CONTROLLERS:
        assert groups[controller] == hub.cgroups[controller] / f"course-{hub.a}", (controller, groups[controller])
    assert int(read(groups["memory"], "memory.limit_in_bytes", "memory.max")) == int(MEMORY[:-1]) * 2**20
    assert read(groups["pids"], "pids.max").strip() == str(PIDS)
    assert read(groups["cpu"], "cpu.shares", "cpu.weight").strip() in (str(SHARE), "100")
    # The floor that holds without cgroups: the account's processes (twice the pids cgroup's limit).
    limits = Path(f"/proc/{pid}/limits").read_text()
    assert next(line for line in limits.splitlines() if line.startswith("Max processes")).split()[2] == str(2 * PIDS)
    # B's server is in B's groups, not A's.
    b_pid = int(hub.kernel_b.run("import os; print(os.getpid())")["stdout"])
    assert cgroups_of(b_pid)["pids"] == hub.cgroups["pids"] / f"course-{hub.b}"


def test_a_fork_bomb_is_refused_inside_a_while_b_and_the_hub_answer(kernels):
    hub = kernels
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        bomb = pool.submit(hub.kernel_a.run, BOMB, 60)
        time.sleep(1.0)  # the bomb at its limit
        probes = []
        while not bomb.done() and len(probes) < 30:  # every 0.25 s while the bomb lasts (8 s at most)
            time.sleep(0.25)
            started = time.monotonic()
            answer = hub.kernel_b.run("1 + 1", timeout=10)
            b_seconds = time.monotonic() - started
            started = time.monotonic()
            with urllib.request.urlopen(f"{hub.url}/hub/api", timeout=10) as response:
                hub_ok = response.status == 200
            probes.append((answer["result"], round(b_seconds, 2), hub_ok, round(time.monotonic() - started, 2)))
        result = bomb.result()
    kids, refused = map(int, result["stdout"].split())
    print(f"A: {kids} children, {refused} forks refused; B and the hub during the bomb: {probes}")  # pytest -rP
    assert refused > 0 and kids < PIDS, f"A forked {kids} children and no fork was refused (limit {PIDS})"
    assert probes, "the bomb ended before B could be asked anything"
    for b_answer, b_seconds, hub_ok, hub_seconds in probes:
        assert b_answer == "2" and b_seconds < 5, f"B's kernel during A's fork bomb: {probes}"
        assert hub_ok and hub_seconds < 5, f"the hub's API during A's fork bomb: {probes}"
    # It was A's pids cgroup that refused them (not only the account's RLIMIT_NPROC, twice as high).
    events = read(hub.cgroups["pids"] / f"course-{hub.a}", "pids.events")
    assert counter(events, "max") > 0, events


def test_a_memory_hog_ends_inside_a(kernels):
    hub = kernels
    result = hub.kernel_a.run(HOG, timeout=90)
    print(f"A's memory hog: {result}")  # pytest -rP
    assert result["died"] or result["error"] == "MemoryError" or result["stdout"].startswith("MemoryError"), \
        f"A's kernel {result['stdout'].strip()} MiB past its {MEMORY} limit"
    if result["died"]:  # killed by the kernel's OOM killer inside A's memory cgroup, not elsewhere
        folder = hub.cgroups["memory"] / f"course-{hub.a}"
        events = read(folder, "memory.oom_control", "memory.events")
        assert counter(events, "oom_kill") > 0, events
    # A's server is still up (its restarter gives A a fresh kernel), and B never noticed.
    assert hub.api("GET", f"/user/{hub.a}/api/status")[0] == 200
    assert hub.kernel_b.run("1 + 1", timeout=10)["result"] == "2"


def test_stopping_a_server_removes_its_cgroups(kernels):
    hub = kernels
    folders = [folder / f"course-{hub.a}" for folder in hub.cgroups.values()]
    assert all(folder.exists() for folder in folders)
    hub.kernel_a.close()
    hub.kernel_a = None
    status, _ = hub.api("DELETE", f"/hub/api/users/{hub.a}/server")
    assert status in (202, 204), status
    wait_for(f"{hub.a}'s server stopped", lambda: not hub.api("GET", f"/hub/api/users/{hub.a}")[1].get("servers"),
             timeout=60)
    left = [str(folder) for folder in folders if folder.exists()]
    assert not left, f"cgroups left after A's server stopped: {left}"
    # B's stay until the hub stops (the fixture checks they go then).
    assert (hub.cgroups["pids"] / f"course-{hub.b}").exists()


FLOOR = fork_bomb(100, 3) + r"""
hog = []
try:
    while len(hog) < 64:  # bounded: 1 GiB at most
        hog.append(b"x" * (16 * 2**20))
    print("allocated", len(hog) * 16)
except MemoryError:
    print("MemoryError at", len(hog) * 16)
"""


def test_without_cgroups_the_rlimits_alone_stop_a_fork_bomb_and_a_hog(hub):
    """As on a server where the hub may make no cgroup: the spawner's own preexec step, with no cgroup
    to join, run as the account of the instructor who never logged in (RLIMIT_NPROC counts per account)."""
    sys.path.insert(0, str(ROOT / "deploy" / "hub"))
    import limits

    spawner = limits.LimitedSpawner(pids_limit=40, mem_limit="300M")
    assert spawner.cgroups == {}
    python = json.loads((hub.state / "class.json").read_text())["python"]
    proc = subprocess.run([python, "-c", FLOOR], preexec_fn=spawner.make_preexec_fn(hub.absent),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    kids, refused, outcome = proc.stdout.split(maxsplit=2)
    assert int(kids) < 40 and int(refused) > 0, proc.stdout
    assert outcome.startswith("MemoryError"), proc.stdout
