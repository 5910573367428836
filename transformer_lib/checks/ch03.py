"""Checkers for chapter 03 (being written)."""

CHECKERS = []
