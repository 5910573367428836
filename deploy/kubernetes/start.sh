#!/bin/sh
# The image's entry point (user servers and Dask pods alike), then the command it is given.
set -e
# The hub runs each user's server as a uid of its own (course_config.py). nbgrader asks the passwd
# database for that uid's name: give it one, named jovyan, so that nbgrader takes the student's
# name from JUPYTERHUB_USER (nbgrader.utils.get_username).
if ! whoami >/dev/null 2>&1 && [ -w /etc/passwd ]; then
  echo "jovyan:x:$(id -u):$(id -g):jovyan:${HOME:-/home/jovyan}:/bin/sh" >> /etc/passwd
fi
# A student's home starts with their edition's start page; its links open the chapters once
# they are fetched from the Assignments tab (each lands in a folder of its name).
if [ -n "$COURSE_START_PAGE" ] && [ -n "$HOME" ] && [ -d "$HOME" ] && [ ! -e "$HOME/README.md" ]; then
  cp "$COURSE_START_PAGE" "$HOME/README.md" || true
fi
exec "$@"
