"""calibkit.data.debian: which index files are read and how, deb822 parsing, the document rules, the snapshot."""

import bz2
import gzip
import hashlib
import os
import shutil
import subprocess

import numpy as np
import pytest

from calibkit.data import debian as D

HELPER = "/usr/lib/apt/apt-helper"


def _pk(name, section="net", long=" A long text.\n", md5=None, source=None):
    out = f"Package: {name}\n" + (f"Source: {source}\n" if source else "")
    out += (f"Section: {section}\n" if section else "") + f"Description: {name} short\n{long}"
    return out + (f"Description-md5: {md5}\n" if md5 else "") + "\n"


def test_index_files_prefer_apt_names_and_skip_folders(tmp_path):
    for name in ("a_Packages", "b_Packages.gz", "Packages", "c_Translation-en.xz", "Translation-en", "x.txt"):
        (tmp_path / name).write_text("")
    (tmp_path / "d_Packages").mkdir()  # a folder named like an index file is not one
    pk, tr = D.index_files(tmp_path)
    assert [p.name for p in pk] == ["a_Packages", "b_Packages.gz"]  # apt's names first; a bare file is a fallback
    assert [p.name for p in tr] == ["c_Translation-en.xz"]
    for name in ("a_Packages", "b_Packages.gz", "c_Translation-en.xz"):
        (tmp_path / name).unlink()
    pk, tr = D.index_files(tmp_path)
    assert [p.name for p in pk] == ["Packages"] and [p.name for p in tr] == ["Translation-en"]


def test_index_files_of_every_compression_read_alike(tmp_path):
    text = "Package: a\nDescription: caf\u00e9\n"
    raw = text.encode() + b"\xff\n"  # one byte that is not UTF-8: replaced, not an error
    want = text + "\ufffd\n"
    (tmp_path / "p").write_bytes(raw)
    (tmp_path / "p.bz2").write_bytes(bz2.compress(raw))
    (tmp_path / "p.gz").write_bytes(gzip.compress(raw))
    names = ["p", "p.bz2", "p.gz"]
    if shutil.which("zstd"):  # the program writes the test file; apt-helper or zstdcat reads it
        subprocess.run(["zstd", "-q", str(tmp_path / "p"), "-o", str(tmp_path / "p.zst")], check=True)
        names.append("p.zst")
    for name in names:
        assert D.read_index_file(tmp_path / name) == want, name


@pytest.mark.skipif(not os.access(HELPER, os.X_OK), reason="apt-helper decompresses .zst first")
def test_a_corrupt_zst_file_reports_the_decompressors_error(tmp_path):
    (tmp_path / "p.zst").write_bytes(b"garbage")
    with pytest.raises(ValueError, match=r"p.zst: cannot be read or decompressed \(E: .*p.zst"):
        D.read_index_file(tmp_path / "p.zst")


@pytest.mark.skipif(not (shutil.which("lz4") and shutil.which("zstd")), reason="the programs write the test files")
def test_without_apt_helper_lz4cat_and_zstdcat_decompress(tmp_path, monkeypatch):
    real = os.access
    monkeypatch.setattr(D.os, "access", lambda p, mode: p != HELPER and real(p, mode))
    (tmp_path / "p").write_text("Package: z\n")
    subprocess.run(["lz4", "-q", str(tmp_path / "p"), str(tmp_path / "p.lz4")], check=True)
    subprocess.run(["zstd", "-q", str(tmp_path / "p"), "-o", str(tmp_path / "p.zst")], check=True)
    assert D.read_index_file(tmp_path / "p.lz4") == D.read_index_file(tmp_path / "p.zst") == "Package: z\n"
    calls = []
    run = subprocess.run
    monkeypatch.setattr(D.subprocess, "run", lambda cmd, **kw: calls.append(cmd[0]) or run(cmd, **kw))
    D.read_index_file(tmp_path / "p.lz4"), D.read_index_file(tmp_path / "p.zst")
    assert [os.path.basename(c) for c in calls] == ["lz4cat", "zstdcat"]
    monkeypatch.setattr(D.shutil, "which", lambda tool: None)
    with pytest.raises(ValueError,
                       match=r"\(no decompressor for \.zst \(needs /usr/lib/apt/apt-helper or zstdcat\)\)$"):
        D.read_index_file(tmp_path / "p.zst")


def test_parse_stanzas_skips_comments_stray_lines_and_orphan_continuations():
    text = " orphan continuation\nPackage: a\n# note: not a field\nstray line\nXtra: 1\n more\n"
    assert list(D.parse_stanzas(text)) == [{"Package": "a", "Xtra": "1\n more"}]


def test_long_description_keeps_indentation_and_takes_tabs():
    assert D.long_description("short\n first\n   code  \n .\n\tlast") == ("short", "first\n  code\n\nlast")
    assert D.long_description("short\nunindented") == ("short", "unindented")


def test_translations_take_the_first_description_and_need_one(tmp_path):
    pk = _pk("a", long="", md5="1") + _pk("b", long="") + _pk("c", long="")
    tr = ("Package: a\nDescription-md5: 1\nDescription-en: a short\n first\n\n"
          "Package: a\nDescription-md5: 1\nDescription-en: a short\n second\n\n"
          "Package: b\nDescription-en: b short\n text of it\n\n"  # no md5 on either side: matched by name
          "Package: c\nDescription-md5: 3\n\n")  # no description: nothing to take
    (tmp_path / "x_Packages").write_text(pk)
    (tmp_path / "x_Translation-en").write_text(tr)
    docs, stats = D.read_documents(tmp_path, ("net",))
    assert [(d.package, d.text) for d in docs] == [("a", "short\nfirst"), ("b", "short\ntext of it")]
    assert stats["no_long_description"] == 1


def test_records_are_taken_once_and_counted(tmp_path):
    first = _pk("dup", long=" the first one\n") + _pk("n1", section="") + _pk("n2", section="") + _pk("s1", long="")
    second = _pk("dup", long=" a later copy\n") + _pk("s2", long="") + _pk("o", section="games") + _pk("z")
    (tmp_path / "a_Packages").write_text(first + "Package: nodesc\nSection: net\n\n")
    (tmp_path / "b_Packages").write_text(second)
    (tmp_path / "b_Translation-en").write_text("Package: z\nDescription-en: z short\n translated\n")
    docs, stats = D.read_documents(tmp_path, ("net",))
    assert [(d.package, d.text) for d in docs] == [("dup", "short\nthe first one"), ("z", "short\nA long text.")]
    assert stats == {"records": 8, "no_section": 2, "no_long_description": 3, "other_section": 1,
                     "family_duplicates": 0, "documents": 2}


def test_a_family_takes_its_majority_section_not_the_first_name():
    docs = [D.Document(p, p, s, "x\nshared words") for p, s in [("a", "devel"), ("b", "x11"), ("c", "x11")]]
    stats = {}
    assert [(d.package, d.section) for d in D._one_per_family(docs, stats)] == [("b", "x11")]


def test_family_key_is_the_first_paragraphs_words():
    assert D.family_key("Short Line\nFirst, PARA-graph\nline two\n\nSecond para") == "first para graph line two"
    assert D.family_key("Only Short: words\n\n") == "only short words"  # no long words: the whole text


def test_a_class_may_keep_a_single_training_document():
    labels = np.array([0, 0, 0, 1, 1, 1, 1])
    tr, va, te = D.class_split(labels, 2, 0.1, 0.1)
    assert [(labels[p] == 0).sum() for p in (tr, va, te)] == [1, 1, 1]


def test_snapshot_records_files_releases_and_checksums(tmp_path):
    (tmp_path / "x_Packages").write_text(_pk("a"))
    (tmp_path / "x_Translation-en").write_text("")
    (tmp_path / "x_Release").write_bytes(b"Suite: stable\nDate: today\nOrigin: caf\xe9\n")
    docs = [D.Document("a", "a", "net", "short\ntext")]
    snap = D.snapshot(tmp_path, docs)
    digests = {n: hashlib.sha256((tmp_path / n).read_bytes()).hexdigest() for n in ("x_Packages", "x_Translation-en")}
    whole = hashlib.sha256(b"".join(n.encode() + b"\0" + d.encode() for n, d in digests.items()))
    assert snap == {"index_sha256": whole.hexdigest()[:16],
                    "documents_sha256": hashlib.sha256(b"a\0net\0short\ntext\0").hexdigest()[:16],
                    "files": digests, "releases": {"x_Release": {"Suite": "stable", "Date": "today"}}}


def test_a_decompressors_message_that_is_not_utf8_is_still_reported(tmp_path, monkeypatch):
    real = os.access
    monkeypatch.setattr(D.os, "access", lambda p, mode: p != HELPER and real(p, mode))
    tool = tmp_path / "zstdcat"
    tool.write_text("#!/bin/sh\nprintf 'bad \\377 input' >&2\nexit 3\n")
    tool.chmod(0o755)
    monkeypatch.setattr(D.shutil, "which", lambda name: str(tool))
    (tmp_path / "p.zst").write_bytes(b"x")
    with pytest.raises(ValueError, match="cannot be read or decompressed \\(bad \ufffd input\\)$"):
        D.read_index_file(tmp_path / "p.zst")
