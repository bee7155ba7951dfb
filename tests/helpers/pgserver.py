"""Stopping and starting the PostgreSQL test server (``.ci/services.sh``) from a test, to cut the
connections of a store the way a server restart does: ``pg_ctl`` as the owner of the data
directory, the server started again with the options it was started with (``postmaster.opts``)."""

import os
import pwd
import shlex
import subprocess

import pytest

from tests.helpers import pglock


class PgServer:
    """The server behind ``url`` (a superuser's libpq URL): :meth:`stop` and :meth:`start`."""

    def __init__(self, url: str):
        import psycopg

        with psycopg.connect(url, autocommit=True) as con:
            self.data = con.execute("SHOW data_directory").fetchone()[0]
            bindir = con.execute("SELECT setting FROM pg_config WHERE name = 'BINDIR'").fetchone()[0]
        owner = pwd.getpwuid(os.stat(self.data).st_uid).pw_name
        if os.getuid() == 0:
            self.prefix = ["runuser", "-u", owner, "--"]
        elif os.getuid() == os.stat(self.data).st_uid:
            self.prefix = []
        else:
            pytest.skip(f"the test server's data directory belongs to {owner}: cannot restart it")
        with open(os.path.join(self.data, "postmaster.opts")) as f:
            words = shlex.split(f.read())[1:]
        i = words.index("-D")
        self.options = shlex.join(words[:i] + words[i + 2:])
        self.pg_ctl = os.path.join(bindir, "pg_ctl")

    def _run(self, *words) -> None:
        subprocess.run([*self.prefix, self.pg_ctl, "-D", self.data, "-w", "-t", "60", *words],
                       check=True, capture_output=True)

    def stop(self) -> None:
        """A fast shutdown: every connection is cut, open transactions are rolled back. Waits
        for the other test processes' server tests to end first (tests/helpers/pglock.py)."""
        pglock.exclusive()
        self._run("stop", "-m", "fast")

    def start(self) -> None:
        self._run("start", "-o", self.options, "-l", os.path.join(self.data, "restarts.log"))
        pglock.shared()

    def running(self) -> bool:
        return subprocess.run([*self.prefix, self.pg_ctl, "-D", self.data, "status"],
                              capture_output=True).returncode == 0
