# The commands README names. Each one sets itself up: on a fresh clone `make lab` and
# `make test` create .venv and install everything pyproject.toml lists.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
export PYTHONHASHSEED := 0
# nbgrader finds its configuration here, and calls alembic/jupyter from the venv.
export JUPYTER_CONFIG_PATH := $(CURDIR)/autograder
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

# Jupyter refuses to run as root unless told; containers and CI machines often are root.
ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root,)
LAB_PORT ?= 8888

# Tests and notebook builds run two processes on two cores: one thread each, or small
# tensor ops spin-wait on each other (and thread counts change float reductions nbval compares).
test test-fast notebooks grade: export OMP_NUM_THREADS = 1

.PHONY: help venv lab test test-fast notebooks release grade check clean-grading

help:
	@echo "make lab        JupyterLab on chapters/ (sets up .venv first)"
	@echo "make test       the whole suite: library, checkers, nbval on every solution, release and grading pipeline"
	@echo "make notebooks  rebuild and execute solutions/*/*.ipynb from their jupytext .py sources"
	@echo "make release    regenerate chapters/ from solutions/ (nbgrader generate_assignment)"
	@echo "make grade      autograde autograder/submitted/, write feedback, export grades"

venv: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e .
	@touch $(STAMP)

lab: venv
	$(VENV)/bin/jupyter lab --notebook-dir=chapters --ServerApp.ip=127.0.0.1 --ServerApp.port=$(LAB_PORT) $(ROOT_FLAG)

test: venv
	$(PY) -m pytest -p no:cacheprovider -n 2 --dist loadfile --nbval --nbval-current-env --nbval-cell-timeout=300 tests solutions

test-fast: venv
	$(PY) -m pytest -p no:cacheprovider -n 2 -m "not slow" tests

notebooks: venv
	$(PY) autograder/notebooks.py build $(CHAPTERS)

release: venv
	$(PY) autograder/notebooks.py check $(CHAPTERS)
	$(PY) autograder/course.py release $(CHAPTERS)

grade: venv
	$(PY) autograder/course.py grade

clean-grading:
	rm -rf autograder/autograded autograder/feedback autograder/gradebook.db autograder/grades.csv autograder/report.csv autograder/.release
