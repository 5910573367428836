"""Checkers for chapter 06 (being written)."""

CHECKERS = []
