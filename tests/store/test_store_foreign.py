"""A PostgreSQL database that is not calibkit's is refused with one line naming what was found,
unless its URL says the database is shared (``calibkit_shared=1``). Needs the server of
``.ci/services.sh`` (``CALIBKIT_TEST_POSTGRES``) except the URL parameter's own test."""

import uuid

import pytest

from calibkit.cli import main
from calibkit.store import PostgresStore, StoreError
from calibkit.store.pgowner import split_shared
from calibkit.store.postgres import SCHEMA


def test_the_shared_parameter_is_read_and_removed_before_the_url_reaches_libpq():
    assert split_shared("postgresql://h/db") == ("postgresql://h/db", False)
    assert split_shared("postgresql://h/db?calibkit_shared=1") == ("postgresql://h/db", True)
    assert split_shared("postgresql:///db?host=/s&calibkit_shared=yes&options=-csearch_path%3Dx") == (
        "postgresql:///db?host=/s&options=-csearch_path%3Dx", True)
    assert split_shared("postgresql://h/db?sslmode=require&calibkit_shared=0") == (
        "postgresql://h/db?sslmode=require", False)
    with pytest.raises(ValueError, match=r"^--store: calibkit_shared='maybe': expected 1 .* or 0$"):
        split_shared("postgresql://h/db?calibkit_shared=maybe")


def _tables(con) -> list[str]:
    return [r[0] for r in con.execute("SELECT table_name FROM information_schema.tables "
                                      "WHERE table_schema = current_schema() ORDER BY 1")]


@pytest.fixture
def pg(pg_url):
    """``(url, connection)``: the test's empty schema and an autocommit connection to it."""
    psycopg = pytest.importorskip("psycopg")
    with psycopg.connect(pg_url, autocommit=True) as con:
        yield pg_url, con


@pytest.mark.postgres
def test_a_runs_table_of_another_shape_is_refused_even_when_shared(pg, tmp_path):
    url, con = pg
    con.execute("CREATE TABLE runs (id SERIAL PRIMARY KEY, name TEXT, started TIMESTAMP)")
    for given in (url, url + "&calibkit_shared=1"):
        for readonly in (False, True):
            with pytest.raises(StoreError) as err:
                PostgresStore(given, root=tmp_path, readonly=readonly)
            line = str(err.value)
            assert "holds a table runs that is not calibkit's (owner " in line and "lacks the columns attempts" in line
            assert "\n" not in line and "run the same command" not in line and "database or schema of its own" in line
    assert _tables(con) == ["runs"]  # nothing created beside it


@pytest.mark.postgres
def test_another_applications_tables_are_refused_unless_the_url_shares_the_database(pg, tmp_path):
    url, con = pg
    con.execute("CREATE TABLE users (id SERIAL PRIMARY KEY, email TEXT)")
    con.execute("CREATE TABLE orders (id SERIAL PRIMARY KEY, user_id INT)")
    with pytest.raises(StoreError, match=r"holds tables of another application \(orders, users\); nothing was "
                                         r"written: .*or add calibkit_shared=1 to the URL"):
        PostgresStore(url, root=tmp_path)
    assert _tables(con) == ["orders", "users"]
    with PostgresStore(url + "&calibkit_shared=1", root=tmp_path) as db:  # opted in: beside them
        assert db.claim("p/ce/0", preset="p", method="ce", seed=0)
        assert "calibkit_shared" not in db.where
    assert _tables(con) == ["meta", "orders", "runs", "tuning", "users"]
    with pytest.raises(StoreError, match="tables of another application"):  # each opening says so again
        PostgresStore(url, root=tmp_path, readonly=True)


@pytest.mark.postgres
def test_calibkit_tables_of_another_role_are_refused_unless_shared(pg, tmp_path):
    url, con = pg
    role = f"calibkit_other_{uuid.uuid4().hex[:8]}"
    con.execute(f"CREATE ROLE {role}")
    try:
        con.execute(f"GRANT ALL ON SCHEMA {con.execute('SELECT current_schema()').fetchone()[0]} TO {role}")
        con.execute(f"SET ROLE {role}")
        for statement in SCHEMA.split(";"):
            if statement.strip():
                con.execute(statement)
        con.execute("INSERT INTO meta VALUES ('schema_version', '2')")
        con.execute("RESET ROLE")
        with pytest.raises(StoreError) as err:
            PostgresStore(url, root=tmp_path)
        assert "calibkit's tables in schema t_" in str(err.value)
        assert f"belong to role {role}, not to " in str(err.value) and "add calibkit_shared=1" in str(err.value)
        with PostgresStore(url + "&calibkit_shared=1", root=tmp_path) as db:
            assert db.claim("p/ce/0", preset="p", method="ce", seed=0)
        # a member of the owning role (a team's group role) uses them without saying so
        me = con.execute("SELECT current_user").fetchone()[0]
        con.execute(f"GRANT {role} TO {me}")
        PostgresStore(url, root=tmp_path).close()
    finally:
        con.execute("RESET ROLE")
        con.execute(f"DROP OWNED BY {role} CASCADE")
        con.execute(f"DROP ROLE {role}")


@pytest.mark.postgres
def test_the_command_line_names_the_foreign_tables_in_one_line_without_the_run_again_advice(pg, tmp_path, capsys):
    url, con = pg
    con.execute("CREATE TABLE invoices (id INT)")
    rc = main(["bench", "--preset", "smoke", "--methods", "ce", "--out", str(tmp_path / "b"), "--store", url,
               "--no-report"])
    err = capsys.readouterr().err
    assert rc == 1 and err.count("\n") == 1, err
    assert "holds tables of another application (invoices)" in err and "run the same command" not in err
    assert _tables(con) == ["invoices"]
