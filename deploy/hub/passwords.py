"""First passwords that the hub gives, never that the first visitor chooses.

FirstUseAuthenticator lets whoever logs in first with a roster login set its password: a student
who knows an instructor's login (instructors are the hub's admins) could become them, and any
student could take a classmate's account before they log in. Here `make hub` gives every roster
person without a password a one-time first password, stored as FirstUseAuthenticator stores any
password (a bcrypt hash in its dbm file) and written, in clear, only to a file root alone can read
(`first-passwords.csv`), for the instructor to hand out. Each person then changes it on the hub's
own page, `/hub/auth/change-password`. `classhub.py reset-password LOGIN` gives a new one to a
person who forgot theirs (FirstUseAuthenticator has no reset of its own).

`RosterAuthenticator` is FirstUseAuthenticator with first use turned off: a login with no stored
password is refused instead of being claimed.
"""

from __future__ import annotations

import csv
import dbm
import os
import secrets
from pathlib import Path

import bcrypt
from firstuseauthenticator import FirstUseAuthenticator

# Three groups of four letters and digits, without look-alikes (0/o, 1/l): easy to read out or copy,
# about 62 bits.
_ALPHABET = "abcdefghijkmnpqrstuvwxyz23456789"


def new_password() -> str:
    return "-".join("".join(secrets.choice(_ALPHABET) for _ in range(4)) for _ in range(3))


def _store(db_path: Path, login: str, password: str) -> None:
    with dbm.open(str(db_path), "c", 0o600) as db:
        db[login] = bcrypt.hashpw(password.encode("utf8"), bcrypt.gensalt())


def has_password(db_path: Path, login: str) -> bool:
    try:
        with dbm.open(str(db_path), "r") as db:
            return login.encode("utf8") in db
    except dbm.error:
        return False  # no password file yet


def issue_first_passwords(db_path: Path, sheet: Path, people: list[tuple[str, str]]) -> list[str]:
    """Give each (login, name) without a password a first one; returns the logins given one. The
    sheet (0600) lists the first passwords given, for the instructor to hand out."""
    rows = _read_sheet(sheet)
    given = []
    for login, name in people:
        if not has_password(db_path, login):
            rows[login] = (name, new_password())
            _store(db_path, login, rows[login][1])
            given.append(login)
    _write_sheet(sheet, rows)
    return given


def reset_password(db_path: Path, sheet: Path, login: str, name: str) -> str:
    rows = _read_sheet(sheet)
    rows[login] = (name, new_password())
    _store(db_path, login, rows[login][1])
    _write_sheet(sheet, rows)
    return rows[login][1]


def forget(db_path: Path, sheet: Path, login: str) -> None:
    """A person removed from the roster: their password goes, so the login cannot be used again."""
    try:
        with dbm.open(str(db_path), "w") as db:
            if login.encode("utf8") in db:
                del db[login]
    except dbm.error:
        pass
    rows = _read_sheet(sheet)
    if rows.pop(login, None) is not None:
        _write_sheet(sheet, rows)


def first_password(sheet: Path, login: str) -> str | None:
    row = _read_sheet(sheet).get(login)
    return row[1] if row else None


def _read_sheet(sheet: Path) -> dict[str, tuple[str, str]]:
    if not sheet.exists():
        return {}
    with open(sheet, newline="", encoding="utf-8") as f:
        return {row["login"]: (row["name"], row["first password"]) for row in csv.DictReader(f)}


def _write_sheet(sheet: Path, rows: dict[str, tuple[str, str]]) -> None:
    work = sheet.with_suffix(".tmp")
    with open(os.open(work, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["login", "name", "first password"])
        writer.writerows([login, name, password] for login, (name, password) in sorted(rows.items()))
    os.replace(work, sheet)


class RosterAuthenticator(FirstUseAuthenticator):
    """FirstUseAuthenticator whose first use never sets a password: `make hub` has set them all."""

    async def authenticate(self, handler, data):
        if not has_password(Path(self.dbm_path), self.normalize_username(data["username"])):
            return None
        return await super().authenticate(handler, data)
