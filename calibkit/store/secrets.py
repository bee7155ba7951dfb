"""Passwords out of every message: the one masking function for store URLs and for any text that
quotes one (error lines, logs, the report).

Decided: every value libpq would read as a password is replaced by ``***``, in each form it
accepts, and a little more where a value is ambiguous (masking too much only hides text):

* URL userinfo, ``postgresql://user:PW@host/db`` -> ``postgresql://user:***@host/db`` (also with
  an empty user, and a password holding ``?``, ``/`` or ``@``: everything up to the last ``@`` of
  the authority counts);
* URL query parameters whose name, percent-decoded and in any case, contains ``password``
  (``?password=PW``, ``&PASSWORD=PW``, ``?pass%77ord=PW``, ``&sslpassword=PW``);
* keyword/value connection strings, ``host=h password=PW`` or ``password = 'P W'`` (calibkit only
  accepts URLs for ``--store``, but it may quote whatever it was given in an error line).

``passfile`` and ``sslkey`` name files, not secrets, and are shown. A driver's own message (psycopg
quotes the connection string in some of its errors, e.g. ``invalid percent-encoded token``) goes
through :func:`scrub`, which also removes the password values themselves.
"""

from __future__ import annotations

import re
from urllib.parse import unquote

MASK = "***"

_SCHEME = re.compile(r"postgres(?:ql)?://", re.I)
# A URL inside a longer text ends at white space or a quote.
_URL_IN_TEXT = re.compile(r"postgres(?:ql)?://[^\s'\"<>]*", re.I)
# keyword = value of a libpq connection string; the value quoted ('...', backslash escapes) or bare.
_KEYWORD = re.compile(r"(?i)(\b\w*password\s*=\s*)('(?:[^'\\]|\\.)*(?:'|$)|\S+)")


def _secret_name(name: str) -> bool:
    return "password" in unquote(name).lower()


def _mask_url(url: str, found: list[str]) -> str:
    """``url`` (one whole ``postgresql://`` URL) with its userinfo password and its password
    query parameters masked; their values are appended to ``found``."""
    scheme = _SCHEME.match(url)
    assert scheme is not None  # the callers pass only what _SCHEME matched
    start = scheme.end()
    rest = url[start:]
    # libpq ends the userinfo at the first '@' before a '/'. Decided: the last '@' before the
    # query of the path counts, so that a password holding '@', '/' or '?' is masked all the same.
    slash = rest.find("/")
    query_at = rest.find("?", slash) if slash >= 0 else -1
    cut = rest.rfind("@", 0, query_at if query_at >= 0 else len(rest))
    if cut >= 0 and ":" in rest[:cut]:
        colon = rest.index(":")
        found.append(rest[colon + 1:cut])
        rest = rest[:colon + 1] + MASK + rest[cut:]
    head, question, query = rest.partition("?")
    if question:
        params = []
        for param in query.split("&"):
            name, eq, value = param.partition("=")
            if eq and _secret_name(name):
                found.append(value)
                param = f"{name}={MASK}"
            params.append(param)
        rest = head + "?" + "&".join(params)
    return url[:start] + rest


def _mask_keywords(text: str, found: list[str]) -> str:
    def one(match):
        found.append(match.group(2))
        return match.group(1) + MASK

    return _KEYWORD.sub(one, text)


def _mask(text: str, found: list[str]) -> str:
    if _SCHEME.match(text):  # first as one URL (a password may hold spaces a search stops at), then as text
        text = _mask_url(text, found)
    parts, last = [], 0
    for match in _URL_IN_TEXT.finditer(text):
        parts += [_mask_keywords(text[last:match.start()], found), _mask_url(match.group(0), found)]
        last = match.end()
    return "".join(parts) + _mask_keywords(text[last:], found)


def redact(text: str) -> str:
    """``text`` (a store URL, a connection string, or a message quoting either) with every
    password replaced by ``***``.

    Example:
        >>> redact("postgresql://u:pw@db/x?sslpassword=k&passfile=/p")
        'postgresql://u:***@db/x?sslpassword=***&passfile=/p'
    """
    return _mask(str(text), [])


def passwords(location: str) -> list[str]:
    """The password values of a store URL or connection string, as written and percent-decoded."""
    found: list[str] = []
    _mask(str(location), found)
    values: set[str] = set()
    for value in found:
        if value.startswith("'"):
            value = value.strip("'")
        values.update(v for v in (value, unquote(value)) if v and v != MASK)
    return sorted(values, key=len, reverse=True)


def scrub(message: str, location: str) -> str:
    """``message`` (e.g. a driver's error about ``location``) with every password masked: the
    forms :func:`redact` knows, and each password value of ``location`` wherever it appears.

    A value of four characters or more is masked anywhere in the message; a shorter one only where
    it stands as a word of its own, lest the mask eat ordinary words.
    """
    text = redact(message)
    for value in passwords(location):
        if len(value) >= 4:
            text = text.replace(value, MASK)
        else:
            text = re.sub(rf"(?<![\w%]){re.escape(value)}(?!\w)", MASK, text)
    return text
