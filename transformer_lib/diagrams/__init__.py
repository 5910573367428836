"""Conceptual diagrams the chapters draw (data flow, which axes a norm uses, a block's wiring).

Drawn with matplotlib, so nothing is downloaded and the pictures live in the notebooks.
`draw.py` holds the few shapes every diagram is made of; each chapter's diagrams are in
their own module (`ch02.py`, ...), one function per picture.
"""
