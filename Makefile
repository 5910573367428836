# The commands README names. Each one sets itself up: on a fresh clone `make lab` and
# `make test` create .venv and install what pyproject.toml lists for them.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
# The venv belongs to one Python: `PYTHON=python3.12 make test` on a .venv made by 3.11 makes it again.
PY_VERSION := $(shell $(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)
STAMP  := $(VENV)/.installed-$(PY_VERSION)
export PYTHONHASHSEED := 0
# nbgrader calls alembic/jupyter by name: the venv's come first.
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
# Two labs. The learner's lab reads .lab/ (no instructor tools, no news pop-up, opens on
# chapters/README.md); the instructor's reads the course's nbgrader configuration.
LEARNER_CONFIG    := $(CURDIR)/.lab
INSTRUCTOR_CONFIG := $(CURDIR)/autograder

# Jupyter refuses to run as root unless told; containers and CI machines often are root.
ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root,)
LAB_PORT ?= 8888
# `make lab COURSE_LANG=zh`: the Chinese edition (chapters/zh, JupyterLab's menus in Chinese). Not LANG,
# which is the locale every program reads: LANG=zh would make them warn that no such locale exists.
COURSE_LANG ?= en
ifeq ($(COURSE_LANG),zh)
LAB_DIR  ?= chapters/zh
LEARNER_CONFIG := $(CURDIR)/.lab-zh
else
LAB_DIR  ?= chapters
endif
# `make release FORCE=1` may overwrite a chapter a learner has worked in; without it, release refuses.
FORCE    ?=

# Tests and notebook builds run two processes on two cores: one thread each, or small
# tensor ops spin-wait on each other (and thread counts change float reductions nbval compares).
test test-fast test-python notebooks grade: export OMP_NUM_THREADS = 1


.PHONY: help venv venv-grade venv-hub venv-test browser fonts sandbox lab formgrader test test-fast test-python notebooks release grade check clean-grading hub hub-release collect hub-feedback hub-remove-accounts hub-reset-password \
        hub-backup hub-prune grades-lms

help:
	@echo "make lab        the learner's JupyterLab on chapters/ (sets up .venv first)"
	@echo "make lab COURSE_LANG=zh   the same on the Chinese edition, chapters/zh/, with JupyterLab in Chinese"
	@echo "make formgrader the instructor's JupyterLab with nbgrader's Formgrader, on the whole course"
	@echo "make test       the whole suite: library, checkers, nbval on every solution, release and grading pipeline"
	@echo "make notebooks  rebuild and execute solutions/*/*.ipynb from their jupytext .py sources"
	@echo "make release    regenerate chapters/ from solutions/ (nbgrader generate_assignment)"
	@echo "make grade      autograde autograder/submitted/ in the sandbox, write feedback, export grades (JOBS=N, SCHEDULER=tcp://...)"
	@echo "                only what is new or changed since the last run; FORCE=1 grades everything again"
	@echo "sudo make hub ROSTER=roster.csv   a class's JupyterHub on this server (deploy/hub; README: Running a class)"
	@echo "sudo make hub-release | collect | hub-feedback   the term's steps through nbgrader's exchange (CHAPTERS=...)"
	@echo "sudo make hub-reset-password LOGIN=...   a new first password for one person"
	@echo "sudo make hub-backup    one tarball of the term (grades, submissions, hub state, exchange, homes) in BACKUP_DIR"
	@echo "sudo make hub-prune     old resubmissions out of the exchange's inbound/ (kept: the newest and the collected one)"
	@echo "make grades-lms         autograder/grades-canvas.csv and grades-moodle.csv for your LMS's grade import"

# Three installs from pyproject.toml, each a superset of the one before: the learner's lab
# (`make lab`: the course and JupyterLab), the grader's (`make grade`: + Dask), the maintainer's
# (`make test`, `make notebooks`: + pytest, nbval, jupytext, the browser robot, transformers).
venv: $(STAMP)-lab
venv-grade: $(STAMP)-grade
venv-hub: $(STAMP)-hub
venv-test: $(STAMP)-test

$(STAMP)-lab: pyproject.toml
	@test -n "$(PY_VERSION)" || { echo "$(PYTHON) does not run: set PYTHON to a Python 3.11, 3.12 or 3.13"; exit 1; }
	@if [ -x $(PY) ] && [ "$$($(PY) -c 'import sys; print("%d.%d" % sys.version_info[:2])')" != "$(PY_VERSION)" ]; then \
	  echo "$(VENV) was made by another Python: making it again with $(PYTHON) ($(PY_VERSION))"; rm -rf $(VENV); fi
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e .
	@touch $@

$(STAMP)-grade: $(STAMP)-lab
	$(PY) -m pip install --quiet -e ".[grade]"
	@touch $@

$(STAMP)-hub: $(STAMP)-grade
	$(PY) -m pip install --quiet -e ".[hub]"
	@touch $@

$(STAMP)-test: $(STAMP)-hub
	$(PY) -m pip install --quiet -e ".[test]"
	@touch $@

# The browser test drives Debian's chromium; as root, install it when it is missing.
# Elsewhere the test says it is skipped and why. The Chinese edition's figures need a CJK font
# (transformer_lib/figure_text.py; tests/test_zh_notebook_text.py draws them): as root, install
# WenQuanYi Micro Hei when matplotlib's usual CJK fonts are all missing.
browser: fonts
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing chromium for the browser test (apt-get)"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium fonts-wqy-microhei >/dev/null; \
	  else echo "chromium is not installed and cannot be installed here: the browser test will be skipped"; fi; }

# The Chinese edition's figures need a CJK font, in the test suite and on a class's hub alike.
fonts:
	@fc-list 2>/dev/null | grep -qiE "WenQuanYi|Noto Sans CJK|Source Han Sans|Noto Sans SC" || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing a Chinese font for the Chinese edition's figures (apt-get fonts-wqy-microhei)"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq fonts-wqy-microhei >/dev/null \
	      && rm -rf $${MPLCONFIGDIR:-$$HOME/.cache/matplotlib}/fontlist-*.json; \
	  else echo "no Chinese font found (install fonts-wqy-microhei or Noto Sans CJK SC): the Chinese edition's figures stay English and their tests fail"; fi; }

lab: venv
	COURSE_LANG=$(COURSE_LANG) JUPYTER_CONFIG_PATH=$(LEARNER_CONFIG) $(VENV)/bin/jupyter lab --notebook-dir=$(LAB_DIR) \
	  --ServerApp.ip=127.0.0.1 --ServerApp.port=$(LAB_PORT) $(ROOT_FLAG)

formgrader: venv
	JUPYTER_CONFIG_PATH=$(INSTRUCTOR_CONFIG) $(VENV)/bin/jupyter lab --notebook-dir=$(CURDIR) \
	  --ServerApp.ip=127.0.0.1 --ServerApp.port=$(LAB_PORT) --LabApp.default_url=/formgrader $(ROOT_FLAG)

# The suite's notebooks speak English whatever the shell says (transformer_lib/language.py reads these).
TEST_ENV := env -u COURSE_LANG -u JPY_SESSION_NAME

# The hub test (tests/test_hub.py) runs JupyterHub's proxy, configurable-http-proxy, from npm.
proxy:
	@test -x deploy/hub/state/proxy/node_modules/.bin/configurable-http-proxy || { \
	  if command -v npm >/dev/null 2>&1; then npm install --no-audit --no-fund --silent --prefix deploy/hub/state/proxy configurable-http-proxy@5.3.0; \
	  else echo "npm is not installed: the hub test will be skipped"; fi; }

test: venv-test browser sandbox proxy
	$(TEST_ENV) $(PY) -m pytest -p no:cacheprovider -n 2 --dist loadfile --nbval --nbval-current-env --nbval-cell-timeout=300 --durations=25 tests solutions

test-fast: venv-test
	$(TEST_ENV) $(PY) -m pytest -p no:cacheprovider -n 2 -m "not slow" tests

# The course on another Python (.ci/run: `make test-python PYTHON=python3.12 VENV=.venv-3.12`): the fast
# tests, one chapter's nbval, and a real grading run of that chapter.
test-python: venv-test sandbox
	$(TEST_ENV) $(PY) -m pytest -p no:cacheprovider -n 2 --dist loadfile -m "not slow" tests
	$(TEST_ENV) $(PY) -m pytest -p no:cacheprovider --nbval --nbval-current-env --nbval-cell-timeout=300 \
	  solutions/02_self_attention/02_self_attention.ipynb \
	  tests/test_grading_race.py::test_a_fault_preparing_one_chapter_costs_that_chapter_only

notebooks: venv-test
	$(PY) autograder/notebooks.py build $(CHAPTERS)

release: venv-test
	$(PY) autograder/notebooks.py check $(CHAPTERS)
	$(PY) autograder/course.py release $(if $(FORCE),--force,) $(CHAPTERS)

# Grading runs submitted code only inside bubblewrap's sandbox (autograder/isolation.py); as root,
# install it when it is missing. Elsewhere `make grade` says which fallback it used, loudly.
sandbox:
	@command -v bwrap >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing bubblewrap for the grading sandbox (apt-get)"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null; \
	  else echo "bubblewrap is not installed and cannot be installed here: grading falls back to weaker isolation"; fi; }

# make grade [JOBS=N] [SCHEDULER=tcp://host:8786] [CELL_TIMEOUT=S] [FORCE=1]: N parallel jobs (default:
# all cores), or the jobs on a Dask cluster; one process writes the gradebook either way. Only the
# submissions that are new or changed since the last run are graded (autograder/graded.json); FORCE=1
# grades every one again.
JOBS         ?=
SCHEDULER    ?=
CELL_TIMEOUT ?=
grade: venv-grade sandbox
	$(PY) autograder/course.py grade $(if $(FORCE),--all,) $(if $(JOBS),--jobs $(JOBS),) $(if $(SCHEDULER),--scheduler $(SCHEDULER),) \
	  $(if $(CELL_TIMEOUT),--cell-timeout $(CELL_TIMEOUT),)

# A class on this server (deploy/hub/classhub.py; README "Running a class"). As root: each person's
# server runs as their own Unix account. ROSTER: a CSV with login,name,role,language.
ROSTER   ?=
HUB_PORT ?= 8000
SPAWNER  ?= local
AUTH     ?= firstuse
ANSWERS  ?= visible
HIDE     ?=
hub: venv-hub sandbox fonts
	@test -n "$(ROSTER)" || { echo "make hub needs ROSTER=path/to/roster.csv (columns login,name,role,language; see deploy/hub/roster.example.csv)"; exit 1; }
	$(PY) deploy/hub/classhub.py serve --roster $(ROSTER) --port $(HUB_PORT) --spawner $(SPAWNER) --auth $(AUTH) --answers $(ANSWERS) $(if $(HIDE),--hide $(HIDE),)

hub-release: venv-hub
	$(PY) deploy/hub/classhub.py release $(CHAPTERS)

collect: venv-hub
	$(PY) deploy/hub/classhub.py collect $(CHAPTERS)

hub-feedback: venv-hub
	$(PY) deploy/hub/classhub.py feedback $(CHAPTERS)

hub-remove-accounts:
	@$(GUARD) remove-accounts
	$(PY) deploy/hub/classhub.py remove-accounts

# sudo make hub-reset-password LOGIN=wang: a new first password for one person (forgotten, or mistyped)
hub-reset-password:
	@test -n "$(LOGIN)" || { echo "make hub-reset-password needs LOGIN=<the roster login>"; exit 1; }
	$(PY) deploy/hub/classhub.py reset-password $(LOGIN)

clean-grading:
	@$(GUARD) clean-grading
	rm -rf autograder/autograded autograder/feedback autograder/gradebook.db autograder/grades.csv autograder/report.csv autograder/.release autograder/.sandbox autograder/graded.json autograder/class_report.html autograder/mistakes.csv autograder/received.json autograder/.exchange-staging autograder/grades-canvas.csv autograder/grades-moodle.csv

# What a term cannot lose (deploy/hub/backup.py; README "Running a class", step 10). `sudo make hub-backup`:
# one tarball (grades, submissions, feedback, the hub's state and passwords, the exchange, the homes) in
# BACKUP_DIR, default /var/backups/transformer-course. clean-grading and hub-remove-accounts refuse, in one
# line, to delete what no backup newer than it holds, unless CONFIRM=1. These run on the standard library
# alone ($(PYTHON), not the venv): a backup must work on a server whose venv is gone.
BACKUP_DIR ?=
CONFIRM    ?=
GUARD = $(PYTHON) deploy/hub/backup.py guard $(if $(BACKUP_DIR),--backups $(BACKUP_DIR),) $(if $(CONFIRM),--confirmed,)

hub-backup:
	$(PYTHON) deploy/hub/backup.py backup $(if $(BACKUP_DIR),--to $(BACKUP_DIR),)

# sudo make hub-prune: each student's old resubmissions out of the exchange's inbound/ into <course>/pruned/
# (root only), keeping the newest and the one collected (deploy/hub/prune.py)
hub-prune:
	$(PYTHON) deploy/hub/prune.py

# make grades-lms [ROSTER=roster.csv] [CHAPTERS=...]: autograder/grades-canvas.csv and grades-moodle.csv,
# the grades after late penalties in the forms Canvas's and Moodle's grade import read (deploy/hub/lms.py)
grades-lms:
	$(PYTHON) deploy/hub/lms.py $(if $(ROSTER),--roster $(ROSTER),) $(CHAPTERS)
