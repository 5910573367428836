"""Checkers for chapter 04 (being written)."""

CHECKERS = []
