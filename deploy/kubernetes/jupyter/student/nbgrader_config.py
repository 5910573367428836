# A student's nbgrader on the course's JupyterHub (deploy/kubernetes): the Assignments tab fetches
# from and submits to the course of the student's edition in the shared exchange. The hub sets both
# variables per user (deploy/kubernetes/course_config.py); nothing else is configured here.
import os

c = get_config()  # noqa: F821 (provided by traitlets when nbgrader loads this file)

c.CourseDirectory.course_id = os.environ.get("NBGRADER_COURSE_ID", "transformer-course")
c.Exchange.root = os.environ.get("NBGRADER_EXCHANGE", "/srv/nbgrader/exchange")
