"""50 students fetch and submit at the same moment on a class hub: is every submission collected,
whole and under its own name? How long does it take, and how much memory does the hub use?

    sudo .venv/bin/python benchmarks/bench_hub_load.py [--students 50]

The hub is the one `make hub` starts (tests/hub_harness.py: a scratch copy of the course, free
ports, Unix accounts with a random suffix, removed at the end). No kernels run: each simulated
student, all at once in their own thread,

1. gets a token from the hub's REST API (as a service with the admin scopes would hand one out) and
   asks the hub who they are with it (`GET /hub/api/user`);
2. fetches chapter 02 from the exchange with nbgrader, as their own Unix account (a fifth of them
   from the Chinese edition's course);
3. writes their login into the notebook (its metadata and the first answer cell: a mark that tells
   whose work it is) and submits it with nbgrader, as their own account.

Then `classhub collect` brings the submissions in, and every one is checked: present, valid JSON,
the same bytes the student submitted, carrying that student's mark. The hub's memory is read from
/proc (resident now, and its peak). The baseline for the times is one student doing the same alone,
measured in the same run.

The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import json
import os
import pwd
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
import hub_harness  # noqa: E402

CHAPTER = "02_self_attention"


def api(hub, path: str, token: str, method: str = "GET", body: dict | None = None) -> dict:
    request = urllib.request.Request(f"{hub.url}/hub/api{path}", method=method,
                                     data=json.dumps(body).encode() if body is not None else None,
                                     headers={"Authorization": f"token {token}"})
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read() or b"{}")


def one_student(hub, service_token: str, login: str, language: str) -> dict:
    course = "transformer-course-zh" if language == "zh" else "transformer-course"
    times = {}
    start = time.perf_counter()
    token = api(hub, f"/users/{login}/tokens", service_token, "POST", {"note": "load test"})["token"]
    assert api(hub, "/user", token)["name"] == login
    times["api"] = time.perf_counter() - start

    start = time.perf_counter()
    proc = hub.nbgrader(login, "fetch_assignment", CHAPTER, "--course", course, timeout=900)
    assert proc.returncode == 0, proc.stderr[-800:]
    times["fetch"] = time.perf_counter() - start

    account = pwd.getpwnam(login)
    notebook = Path(account.pw_dir) / CHAPTER / f"{CHAPTER}.ipynb"
    nb = json.loads(notebook.read_text())
    nb["metadata"]["load_test_student"] = login
    answer = next(c for c in nb["cells"] if c["metadata"].get("nbgrader", {}).get("solution"))
    answer["source"] = f"# the work of {login}\n" + "".join(answer["source"])
    notebook.write_text(json.dumps(nb, indent=1))
    os.chown(notebook, account.pw_uid, account.pw_gid)

    start = time.perf_counter()
    proc = hub.nbgrader(login, "submit", CHAPTER, "--course", course, timeout=900)
    assert proc.returncode == 0, proc.stderr[-800:]
    times["submit"] = time.perf_counter() - start
    return {"login": login, "digest": hashlib.sha256(notebook.read_bytes()).hexdigest(), "times": times}


def memory(pid: int) -> dict:
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    return {key: int(fields[key].split()[0]) / 1024 for key in ("VmRSS", "VmHWM")}  # MiB


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--students", type=int, default=50)
    args = parser.parse_args()
    why = hub_harness.why_not()
    if why:
        print(f"bench_hub_load: {why}", file=sys.stderr)
        return 2
    logins = hub_harness.suffixed(*[f"s{i:02d}" for i in range(args.students + 1)])  # +1: the baseline student
    instructor = hub_harness.suffixed("ti")[0]
    languages = {login: ("zh" if i % 5 == 4 else "en") for i, login in enumerate(logins)}
    people = [(instructor, "Instructor", "instructor", "en")] + [
        (login, f"Student {i}", "student", languages[login]) for i, login in enumerate(logins)]
    started = time.perf_counter()
    hub = hub_harness.start_class(people)
    service_token = hub.token  # the harness's admin service
    result = {"students": args.students}
    try:
        result["hub_start_s"] = round(time.perf_counter() - started, 1)
        hub.classhub("release", CHAPTER)
        hub_pid = int((hub.state / "secrets" / "jupyterhub.pid").read_text())
        result["hub_memory_idle_mib"] = round(memory(hub_pid)["VmRSS"], 1)

        baseline_login, class_logins = logins[0], logins[1:]
        start = time.perf_counter()
        baseline = one_student(hub, service_token, baseline_login, languages[baseline_login])
        result["one_student_alone_s"] = round(time.perf_counter() - start, 2)

        start = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(max_workers=len(class_logins)) as pool:
            done = list(pool.map(lambda login: one_student(hub, service_token, login, languages[login]), class_logins))
        wall = time.perf_counter() - start
        result["all_at_once_s"] = round(wall, 1)
        result["all_at_once_in_single_student_runs"] = round(wall / result["one_student_alone_s"], 2)
        for phase in ("api", "fetch", "submit"):
            values = sorted(d["times"][phase] for d in done)
            result[f"{phase}_median_s"] = round(values[len(values) // 2], 2)
            result[f"{phase}_max_s"] = round(values[-1], 2)
        mem = memory(hub_pid)
        result["hub_memory_mib"] = round(mem["VmRSS"], 1)
        result["hub_memory_peak_mib"] = round(mem["VmHWM"], 1)

        start = time.perf_counter()
        hub.classhub("collect", CHAPTER)
        result["collect_s"] = round(time.perf_counter() - start, 1)
        problems = []
        for student in [baseline, *done]:
            path = hub.course / "autograder" / "submitted" / student["login"] / CHAPTER / f"{CHAPTER}.ipynb"
            if not path.exists():
                problems.append(f"{student['login']}: not collected")
                continue
            data = path.read_bytes()
            try:
                mark = json.loads(data)["metadata"].get("load_test_student")
            except ValueError:
                problems.append(f"{student['login']}: not valid JSON (truncated?)")
                continue
            if mark != student["login"]:
                problems.append(f"{student['login']}: holds {mark}'s work")
            if hashlib.sha256(data).hexdigest() != student["digest"]:
                problems.append(f"{student['login']}: not the bytes the student submitted")
        result["collected_intact"] = len([baseline, *done]) - len(problems)
        result["problems"] = problems
    finally:
        hub_harness.stop_class(hub)
    print(f"{args.students} students at once: {result['all_at_once_s']} s "
          f"({result['all_at_once_in_single_student_runs']}x one student alone, {result['one_student_alone_s']} s); "
          f"fetch median {result['fetch_median_s']} s, max {result['fetch_max_s']} s; submit median "
          f"{result['submit_median_s']} s, max {result['submit_max_s']} s; hub memory {result['hub_memory_mib']} MiB "
          f"(peak {result['hub_memory_peak_mib']}, idle {result['hub_memory_idle_mib']}); collected whole and under "
          f"the right name: {result['collected_intact']} of {args.students + 1}")
    for problem in result["problems"]:
        print("PROBLEM:", problem)
    print(json.dumps(result))
    return 0 if not result["problems"] else 1


if __name__ == "__main__":
    sys.exit(main())
