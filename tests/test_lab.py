"""`make lab` serves the chapters in a real JupyterLab, without the instructor's tools;
`make formgrader` is the instructor's lab with them."""

import json
import os
import re
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request

import pytest

from course_files import CHAPTERS, ROOT

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, token: str):
    request = urllib.request.Request(url, headers={"Authorization": f"token {token}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.status, response.read()


def _start(target: str, tmp_path, path_pattern: str, *variables: str):
    """Start `make TARGET` on a free port; return (process, port, token) once it printed its URL."""
    port = _free_port()
    env = dict(os.environ, BROWSER="true", JUPYTER_RUNTIME_DIR=str(tmp_path))
    env.pop("JUPYTER_TOKEN", None)
    log = open(tmp_path / f"{target}.log", "w+")
    proc = subprocess.Popen(["make", "--no-print-directory", target, f"LAB_PORT={port}", *variables], cwd=ROOT, env=env,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    # With no browser on the machine, the URL with its token is what the learner gets.
    deadline, url = time.time() + 120, None
    while url is None:
        log.seek(0)
        url = re.search(rf"http://127\.0\.0\.1:{port}{path_pattern}\?token=([0-9a-f]+)", log.read())
        if url is None and (proc.poll() is not None or time.time() > deadline):
            log.seek(0)
            os.killpg(proc.pid, signal.SIGTERM)
            pytest.fail(f"`make {target}` did not print its URL:\n{log.read()[-3000:]}")
        time.sleep(0.5)
    return proc, port, url.group(1)


def _status(url: str, token: str) -> int:
    try:
        return _get(url, token)[0]
    except urllib.error.HTTPError as exc:
        return exc.code


def test_make_lab_serves_the_chapters_as_a_learners_lab(tmp_path):
    lab, port, token = _start("lab", tmp_path, "/lab/tree/README.md")
    try:
        status, page = _get(f"http://127.0.0.1:{port}/lab", token)
        assert status == 200 and b"JupyterLab" in page
        status, body = _get(f"http://127.0.0.1:{port}/api/contents", token)
        names = {item["name"] for item in json.loads(body)["content"]}
        assert set(CHAPTERS) <= names and "README.md" in names, names  # the server's root is chapters/
        # No instructor tools: nbgrader's formgrader and course/assignment lists are not served...
        for path in ["/formgrader", "/formgrader/api/assignments", "/assignments", "/courses"]:
            assert _status(f"http://127.0.0.1:{port}{path}", token) == 404, path
        # ...their lab plugins and JupyterLab's news are disabled, Validate stays.
        config = json.loads(re.search(rb'id="jupyter-config-data"[^>]*>(.*?)</script>', page, re.S).group(1))
        disabled = set(config["disabledExtensions"])
        assert {"@jupyter/nbgrader:formgrader", "@jupyter/nbgrader:create-assignment", "@jupyter/nbgrader:menu",
                "@jupyter/nbgrader:assignment-list", "@jupyter/nbgrader:course-list",
                "@jupyterlab/apputils-extension:announcements"} <= disabled
        assert "@jupyter/nbgrader:validate-assignment" not in disabled
    finally:
        os.killpg(lab.pid, signal.SIGTERM)
        lab.wait(timeout=30)


def test_make_lab_in_chinese_serves_the_chinese_edition_with_chinese_menus(tmp_path):
    lab, port, token = _start("lab", tmp_path, "/lab/tree/README.md", "COURSE_LANG=zh")
    try:
        status, body = _get(f"http://127.0.0.1:{port}/api/contents", token)
        names = {item["name"] for item in json.loads(body)["content"]}
        assert set(CHAPTERS) <= names and "README.md" in names, names  # the server's root is chapters/zh/
        status, body = _get(f"http://127.0.0.1:{port}/api/contents/README.md?type=file&format=text", token)
        assert "从零到一" in json.loads(body)["content"]  # the Chinese start page
        status, body = _get(f"http://127.0.0.1:{port}/lab/api/settings/@jupyterlab/translation-extension:plugin", token)
        # JupyterLab's menus in Chinese (the learner's config overrides the setting's default)...
        assert json.loads(body)["schema"]["properties"]["locale"]["default"] == "zh_CN"
        status, body = _get(f"http://127.0.0.1:{port}/lab/api/translations/zh_CN", token)
        catalog = json.loads(body)["data"]["jupyterlab"]  # ...from the language pack pyproject.toml installs
        assert catalog["Run All Cells"] == ["运行所有单元格"]
        status, body = _get(f"http://127.0.0.1:{port}/api/contents/02_self_attention/02_self_attention.ipynb", token)
        notebook = json.loads(body)["content"]
        assert notebook["metadata"]["course"] == {"language": "zh"}
    finally:
        os.killpg(lab.pid, signal.SIGTERM)
        lab.wait(timeout=30)


def test_make_formgrader_is_the_instructors_lab(tmp_path):
    lab, port, token = _start("formgrader", tmp_path, "/formgrader")
    try:
        assert _status(f"http://127.0.0.1:{port}/formgrader", token) == 200
        status, body = _get(f"http://127.0.0.1:{port}/api/contents", token)
        names = {item["name"] for item in json.loads(body)["content"]}
        assert {"solutions", "chapters", "autograder"} <= names, names  # the whole course
    finally:
        os.killpg(lab.pid, signal.SIGTERM)
        lab.wait(timeout=30)
