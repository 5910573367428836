"""Checkers for chapter 05 (being written)."""

CHECKERS = []
