"""Checkers for chapter ch02 (being written)."""

CHECKERS = []
