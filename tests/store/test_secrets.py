"""No password is printed: the one masking function on every form, and every surface that names a
store (error lines, the interrupt line, the summary's database name, the driver's own messages)."""

import argparse

import pytest

from calibkit.cli import _kept, main
from calibkit.store import describe_store, redact
from calibkit.store.secrets import passwords, scrub

FORMS = [
    ("postgresql://u:s3cret@db:5432/x", "postgresql://u:***@db:5432/x"),
    ("postgres://u:s3cret@db/x", "postgres://u:***@db/x"),
    ("postgresql://:s3cret@db/x", "postgresql://:***@db/x"),
    ("postgresql://u:s3c?ret@db/x", "postgresql://u:***@db/x"),
    ("postgresql://u:s3c@ret@db/x", "postgresql://u:***@db/x"),
    ("postgresql://u:s3c/ret@db", "postgresql://u:***@db"),
    ("postgresql://u:s3 cret@db/x", "postgresql://u:***@db/x"),
    ("postgresql://u:s3cret@h1:5,h2:6/x", "postgresql://u:***@h1:5,h2:6/x"),
    ("postgresql://127.0.0.1:1/db?password=s3cret&user=u", "postgresql://127.0.0.1:1/db?password=***&user=u"),
    ("postgresql://db/x?user=u&PassWord=s3cret", "postgresql://db/x?user=u&PassWord=***"),
    ("postgresql://db/x?pass%77ord=s3cret", "postgresql://db/x?pass%77ord=***"),
    ("postgresql://db/x?sslpassword=s3cret&passfile=/home/u/.pgpass",
     "postgresql://db/x?sslpassword=***&passfile=/home/u/.pgpass"),
    ("POSTGRESQL://u:s3cret@db/x", "POSTGRESQL://u:***@db/x"),
    ("host=db password=s3cret user=u", "host=db password=*** user=u"),
    ("host=db PASSWORD = 's3 \\' cret' user=u", "host=db PASSWORD = *** user=u"),
    ("host=db passfile=/p sslpassword=s3cret", "host=db passfile=/p sslpassword=***"),
    ("cannot reach 'postgresql://u:s3cret@db/x': refused", "cannot reach 'postgresql://u:***@db/x': refused"),
]
UNCHANGED = ["postgresql://u@db:5432/x", "postgresql:///x?host=/run/postgresql", "postgresql://db/x?options=-c%20a%3Db",
             "/data/runs/c10/runs.db", "no finished runs of preset 'smoke'"]


@pytest.mark.parametrize("text,masked", FORMS)
def test_every_form_is_masked(text, masked):
    assert redact(text) == masked
    assert "s3" not in redact(text) and redact(redact(text)) == redact(text)


@pytest.mark.parametrize("text", UNCHANGED)
def test_text_without_a_password_is_unchanged(text):
    assert redact(text) == text and passwords(text) == []


def test_scrub_removes_the_values_a_driver_quotes():
    url = "postgresql://127.0.0.1:1/db?password=s3cret%zz"
    assert passwords(url) == ["s3cret%zz"]
    assert scrub('invalid percent-encoded token: "s3cret%zz"', url) == 'invalid percent-encoded token: "***"'
    assert scrub("pw=abc and abcd", "postgresql://u:abc@h/x") == "pw=*** and abcd"  # a short one: whole words only
    assert scrub("xs3cret%21y", "postgresql://u:s3cret%21@h/x") == "x***y"
    assert scrub("got s3cret!", "postgresql://u:s3cret%21@h/x") == "got ***"  # the decoded form too


def test_describe_store_and_the_interrupt_line():
    url = "postgresql://127.0.0.1:1/db?password=s3cret&user=u"
    assert describe_store("/o", url) == "postgresql://127.0.0.1:1/db?password=***&user=u"
    args = argparse.Namespace(command="bench", out="/o", store=url)
    assert "s3cret" not in _kept(args, interrupted=True) and "password=***" in _kept(args, interrupted=True)


URLS = ["postgresql://127.0.0.1:1/db?password=s3cret&user=u",
        "postgresql://127.0.0.1:1/db?PASSWORD=s3cret", "postgresql://127.0.0.1:1/db?password=s3cret%zz",
        "postgresql://u:s3cret@[::1:1/db", "host=127.0.0.1 port=1 password=s3cret"]


@pytest.mark.parametrize("url", URLS)
@pytest.mark.parametrize("command", ["bench", "tune", "report"])
def test_error_lines_of_an_unreachable_server_show_no_password(tmp_path, capsys, monkeypatch, url, command):
    pytest.importorskip("psycopg", reason="psycopg is not installed (pip install 'calibkit[postgres]')")
    monkeypatch.setenv("CALIBKIT_STORE_RETRY_S", "0.5")  # the wait for a restarting server, kept short here
    out = tmp_path / "out"
    out.mkdir()
    argv = {"bench": ["bench", "--preset", "smoke", "--out", str(out), "--no-report"],
            "tune": ["tune", "--preset", "smoke", "--methods", "ls", "--out", str(out)],
            "report": ["report", str(out)]}[command]
    assert main([*argv, "--store", url]) == 1
    said = capsys.readouterr()
    assert "s3cret" not in said.out + said.err
    assert said.err.startswith(f"calibkit {command}: error: ") and "***" in said.err, said.err
