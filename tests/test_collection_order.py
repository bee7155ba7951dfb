"""The collection order of the longest test files (``tests/conftest.py``, ``LONGEST_FIRST``)."""

import os

from tests.conftest import LONGEST_FIRST, ROOT


def test_every_longest_first_entry_is_a_test_file_named_once():
    # a renamed or removed file would silently drop out of the ordering
    assert len(set(LONGEST_FIRST)) == len(LONGEST_FIRST)
    for path in LONGEST_FIRST:
        assert path.startswith("tests/") and os.path.basename(path).startswith("test_"), path
        assert os.path.isfile(os.path.join(ROOT, path)), path
