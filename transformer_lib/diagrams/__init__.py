"""Conceptual diagrams the chapters draw (data flow, which axes a norm uses, a block's wiring).

Drawn with matplotlib, so nothing is downloaded and the pictures live in the notebooks.
`draw.py` holds the few shapes every diagram is made of; each chapter's diagrams are in
their own module (`ch02.py`, ...), one function per picture.

Their text is English; in the Chinese edition every text of every figure, these diagrams' included,
is drawn in Chinese (transformer_lib/figure_text.py, installed here: each chapter imports its
diagrams in its first code cell).
"""

from transformer_lib.figure_text import install

install()
