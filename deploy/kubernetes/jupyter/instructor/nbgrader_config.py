# An instructor's nbgrader on the course's JupyterHub (deploy/kubernetes). It comes first on
# JUPYTER_CONFIG_PATH, before the course's own autograder/nbgrader_config.py (course_id, directories),
# and adds only where the shared exchange is mounted.
import os

c = get_config()  # noqa: F821 (provided by traitlets when nbgrader loads this file)

c.Exchange.root = os.environ.get("NBGRADER_EXCHANGE", "/srv/nbgrader/exchange")
