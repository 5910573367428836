"""transformer_lib: the reference implementation behind the Transformer course.

Every exercise in the course has its answer here, written to be read top to bottom.
Notebooks import from this package after each exercise, so a learner stuck on one
exercise can still run the rest of a chapter.
"""

__version__ = "0.1.0"
