"""Checkers for chapter 07 (being written)."""

CHECKERS = []
