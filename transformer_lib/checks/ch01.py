"""Checkers for chapter ch01 (being written)."""

CHECKERS = []
