"""The class roster: who may log in to the hub, as what, in which edition.

A roster is a CSV file with the columns `login,name,role,language`:

    login,name,role,language
    ada,Ada Lovelace,instructor,en
    wang,王小明,student,zh

`login` becomes both the JupyterHub user name and the Unix account that user's server runs as, so it
must be a valid Unix login (lower-case letters, digits, `_` and `-`, starting with a letter, at most
32 characters) and nbgrader's student id (no `+` or `*`, which the exchange uses as separators).
`role` is `student` or `instructor`; `language` is `en` or `zh` (the edition the student is given,
and the language of their JupyterLab).

`read_roster` guarantees that a roster it returns is complete and unambiguous: every row has all
four fields, no login appears twice, every role and language is known. Anything else is a
`RosterError` whose message names the file, the line and the fix, in one line, and nothing has been
created yet when it is raised.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from pathlib import Path

COLUMNS = ("login", "name", "role", "language")
ROLES = ("student", "instructor")
LANGUAGES = ("en", "zh")
LOGIN = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")
# Accounts every Linux system has: a roster naming one would hand a system account a hub login.
RESERVED = {"root", "daemon", "bin", "sys", "sync", "games", "man", "lp", "mail", "news", "uucp", "proxy",
            "www-data", "backup", "list", "irc", "nobody", "systemd-network", "messagebus", "sshd", "admin"}


class RosterError(ValueError):
    pass


@dataclass(frozen=True)
class Person:
    login: str
    name: str
    role: str
    language: str

    @property
    def is_instructor(self) -> bool:
        return self.role == "instructor"


def read_roster(path: str | Path) -> list[Person]:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")  # a spreadsheet's "CSV UTF-8" starts with a BOM
    except FileNotFoundError:
        raise RosterError(f"{path}: no such roster file (columns: {','.join(COLUMNS)}; "
                          "see deploy/hub/roster.example.csv)") from None
    except UnicodeDecodeError:
        raise RosterError(f"{path}: not UTF-8 text; save the roster as CSV UTF-8") from None
    rows = csv.reader(text.splitlines())
    header = [column.strip().lower() for column in next(rows, [])]
    missing = [column for column in COLUMNS if column not in header]
    if missing:
        raise RosterError(f"{path}: missing column{'s' if len(missing) > 1 else ''} {', '.join(missing)} "
                          f"(the first line must name the columns {','.join(COLUMNS)})")
    index = {column: header.index(column) for column in COLUMNS}
    people, first_seen = [], {}
    for line, row in enumerate(rows, start=2):
        if not any(cell.strip() for cell in row):
            continue
        fields = {column: (row[i].strip() if i < len(row) else "") for column, i in index.items()}
        where = f"{path} line {line}"
        empty = [column for column in COLUMNS if not fields[column]]
        if empty:
            raise RosterError(f"{where}: no {' and no '.join(empty)}")
        login, role, language = fields["login"], fields["role"].lower(), fields["language"].lower()
        if not LOGIN.match(login) or login in RESERVED:
            raise RosterError(f"{where}: {login!r} cannot be a login (lower-case letters, digits, _ and -, "
                              "starting with a letter, at most 32 characters, not a system account)")
        if login in first_seen:
            raise RosterError(f"{where}: the login {login!r} appears twice (first on line {first_seen[login]})")
        if role not in ROLES:
            raise RosterError(f"{where}: unknown role {fields['role']!r} for {login} (student or instructor)")
        if language not in LANGUAGES:
            raise RosterError(f"{where}: unknown language {fields['language']!r} for {login} (en or zh)")
        first_seen[login] = line
        people.append(Person(login, fields["name"], role, language))
    if not people:
        raise RosterError(f"{path}: the roster names nobody")
    if not any(person.is_instructor for person in people):
        raise RosterError(f"{path}: the roster names no instructor (someone must release and grade)")
    return people
