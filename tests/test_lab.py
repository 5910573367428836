"""`make lab` serves the chapters in a real JupyterLab."""

import json
import os
import re
import signal
import socket
import subprocess
import time
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


def test_make_lab_serves_the_chapters(tmp_path):
    port = _free_port()
    env = dict(os.environ, BROWSER="true", JUPYTER_RUNTIME_DIR=str(tmp_path))
    env.pop("JUPYTER_TOKEN", None)
    log = open(tmp_path / "lab.log", "w+")
    lab = subprocess.Popen(["make", "--no-print-directory", "lab", f"LAB_PORT={port}"], cwd=ROOT, env=env,
                           stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        # With no browser on the machine, the URL with its token is what the learner gets.
        deadline, url = time.time() + 120, None
        while url is None:
            log.seek(0)
            url = re.search(rf"http://127\.0\.0\.1:{port}/lab\?token=([0-9a-f]+)", log.read())
            if url is None and (lab.poll() is not None or time.time() > deadline):
                log.seek(0)
                pytest.fail(f"JupyterLab did not print its URL:\n{log.read()[-3000:]}")
            time.sleep(0.5)
        token = url.group(1)
        status, page = _get(f"http://127.0.0.1:{port}/lab", token)
        assert status == 200 and b"JupyterLab" in page
        status, body = _get(f"http://127.0.0.1:{port}/api/contents", token)
        names = {item["name"] for item in json.loads(body)["content"]}
        assert set(CHAPTERS) <= names, names  # the server's root is chapters/
    finally:
        os.killpg(lab.pid, signal.SIGTERM)
        lab.wait(timeout=30)
