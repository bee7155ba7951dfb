"""Whether a PostgreSQL database (or schema) is calibkit's to use: read before any table is created.

Decided here (docs/store.md): calibkit keeps its three tables (``meta``, ``runs``, ``tuning``) in
a database or schema of their own. Opening a store refuses, with one line naming what was found:

* a ``runs``, ``tuning`` or ``meta`` table of another shape (it lacks calibkit's columns): another
  application's table of the same name, which calibkit must not write into;
* calibkit's tables owned by another role than the connection's (or a role it is a direct member
  of, such as a team's group role): another user's results;
* other tables in the schema (another application's): calibkit would create its own beside them.

A database shared on purpose (one schema for several applications, or the results of a team whose
members connect as different roles) is opened when its URL says so: ``calibkit_shared=1`` among
the URL's parameters (removed before the URL reaches libpq). A table of another shape is refused
even then: calibkit cannot use it. None of these is fixed by running the command again: each line
says what to choose instead.
"""

from __future__ import annotations

from calibkit.errors import UserError
from calibkit.store.common import COLUMNS, StoreError

SHARE_PARAM = "calibkit_shared"
_TRUE, _FALSE = ("1", "yes", "true", "on"), ("0", "no", "false", "off")
# The columns each calibkit table must have (COLUMNS of the results tables, meta's own two).
OWN_TABLES = {"meta": {"key", "value"}, "runs": COLUMNS["runs"] | {"id"}, "tuning": COLUMNS["tuning"] | {"id"}}
_ADVICE = ("give calibkit a database or schema of its own (e.g. ?options=-csearch_path%3Dcalibkit, a schema "
           "you create for it)")


def split_shared(url: str) -> tuple[str, bool]:
    """``(url without the calibkit_shared parameter, whether it allows a shared database)``.

    Raises:
        ValueError: the parameter has a value other than 1/yes/true/on or 0/no/false/off.
    """
    base, sep, query = url.partition("?")
    if not sep:
        return url, False
    kept, shared = [], False
    for part in query.split("&"):
        name, _, value = part.partition("=")
        if name != SHARE_PARAM:
            kept.append(part)
            continue
        if value.lower() not in _TRUE + _FALSE:
            raise UserError(f"--store: {SHARE_PARAM}={value!r}: expected 1 (share the database with other "
                             "applications or roles) or 0")
        shared = value.lower() in _TRUE
    return base + ("?" + "&".join(kept) if kept else ""), shared


def check_owned(con, where: str, shared: bool) -> None:
    """Refuse (:class:`StoreError`, one line) a schema that is not calibkit's; see the module's text.

    ``con``: a psycopg connection; the schema is its ``current_schema()``."""
    # each relation's owner, and whether it is this role or one this role is a direct member of (a
    # team's group role); pg_has_role is not used: it says yes to every role for a superuser
    rows = con.execute(
        "SELECT c.relname, pg_get_userbyid(c.relowner), current_user, current_schema(),"
        " c.relowner = r.oid OR EXISTS (SELECT 1 FROM pg_auth_members m WHERE m.roleid = c.relowner"
        " AND m.member = r.oid)"
        " FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace JOIN pg_roles r ON r.rolname = current_user"
        " WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p', 'v', 'm', 'f') ORDER BY c.relname").fetchall()
    if not rows:
        return
    owners = {name: owner for name, owner, _, _, _ in rows}
    mine = {name for name, _, _, _, ours in rows if ours}
    user, schema = rows[0][2], rows[0][3]
    for table, needed in OWN_TABLES.items():
        if table not in owners:
            continue
        have = {r[0] for r in con.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_schema = current_schema()"
            " AND table_name = %s", (table,))}
        missing = sorted(needed - have)
        if missing:
            raise StoreError(f"{where}: schema {schema} holds a table {table} that is not calibkit's (owner "
                             f"{owners[table]}; it lacks the columns {', '.join(missing[:6])}"
                             f"{', ...' if len(missing) > 6 else ''}); nothing was written: {_ADVICE}")
    if shared:
        return
    theirs = sorted(t for t in OWN_TABLES if t in owners and t not in mine)
    if theirs:
        raise StoreError(f"{where}: calibkit's tables in schema {schema} belong to role {owners[theirs[0]]}, not "
                         f"to {user} (this connection's role); nothing was written: connect as "
                         f"{owners[theirs[0]]}, {_ADVICE}, or add {SHARE_PARAM}=1 to the URL to share them")
    others = sorted(set(owners) - set(OWN_TABLES))
    if others:
        shown = ", ".join(others[:5]) + (f" and {len(others) - 5} more" if len(others) > 5 else "")
        raise StoreError(f"{where}: schema {schema} holds tables of another application ({shown}); nothing was "
                         f"written: {_ADVICE}, or add {SHARE_PARAM}=1 to the URL to keep calibkit's tables "
                         "beside them")
