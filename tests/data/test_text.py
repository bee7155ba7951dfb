"""Text data: the Debian package-index reader, the 20news-bydate reader, the tokenizer, the splits.

The index files are written here in the real deb822 format (compressed as apt keeps them), so
nothing depends on the machine's own index.
"""

import gzip
import lzma
import shutil

import numpy as np
import pytest
import torch

from calibkit.data import debian as D
from calibkit.data import load
from calibkit.data.newsgroups import read_newsgroup_texts, strip_header
from calibkit.data.tokenizer import Vocabulary, tokenize

# ------------------------------------------------------------------------------ a tiny index

PACKAGES = """\
Package: foo
Version: 1.0-1
Section: games
Description: Puzzle game with falling blocks
Description-md5: 00000000000000000000000000000001
Tag: game::puzzle

Package: foo-data
Source: foo
Section: games
Description: Puzzle game with falling blocks (data)
Description-md5: 00000000000000000000000000000002

Package: mailx
Section: contrib/mail
Description: Simple mail reader
 Mailx reads and sends mail from the command line. It is a
 small mail client.
 .
 Mailx is old.
Description-md5: 00000000000000000000000000000003

Package: nosection
Description: A package without a section
Description-md5: 00000000000000000000000000000004

Package: pylib
Section: python
Description: Python library
Description-md5: 00000000000000000000000000000005

Package: orphan
Section: net
Description: Network tool without a translation
Description-md5: 00000000000000000000000000000006
"""

TRANSLATION = """\
Package: foo
Description-md5: 00000000000000000000000000000001
Description-en: Puzzle game with falling blocks
 Foo is a game where blocks fall. Stack
 the blocks; FOO counts points.
 .
 Play foo-like levels.

Package: foo-data
Description-md5: 00000000000000000000000000000002
Description-en: Puzzle game with falling blocks (data)
 Foo is a game where blocks fall. Stack
 the blocks; FOO counts points.
 .
 This package contains the data.

Package: orphan
Description-md5: ffffffffffffffffffffffffffffffff
Description-en: stale translation (md5 does not match)
 Not used.
"""


def write_index(folder, packages=PACKAGES, translation=TRANSLATION):
    folder.mkdir(parents=True, exist_ok=True)
    stem = "deb.example.org_debian_dists_x"
    (folder / f"{stem}_main_binary-amd64_Packages.gz").write_bytes(gzip.compress(packages.encode()))
    (folder / f"{stem}_main_i18n_Translation-en.xz").write_bytes(lzma.compress(translation.encode()))
    (folder / f"{stem}_InRelease").write_text("Suite: testing\nDate: Mon, 1 Jan 2024 00:00:00 UTC\n")
    return folder


def test_parse_stanzas_continuations_and_paragraphs():
    recs = list(D.parse_stanzas(PACKAGES))
    assert [r["Package"] for r in recs] == ["foo", "foo-data", "mailx", "nosection", "pylib", "orphan"]
    assert "Section" not in recs[3]
    short, long = D.long_description(recs[2]["Description"])
    assert short == "Simple mail reader"
    assert long == "Mailx reads and sends mail from the command line. It is a\nsmall mail client.\n\nMailx is old."
    assert recs[0]["Tag"] == "game::puzzle"


def test_remove_names_whole_words_any_case():
    text = "Foo is fun. FOO counts; foo-like levels, foobar and foo."
    assert D.remove_names(text, ["foo"]) == " is fun. counts; foo-like levels, foobar and ."


def test_read_documents_rules(tmp_path):
    folder = write_index(tmp_path / "lists")
    docs, stats = D.read_documents(folder, sections=("games", "mail", "net"))
    # foo and foo-data share a source: one document, the package named like the source;
    # mailx's long description is in Packages itself and its section loses the "contrib/" prefix;
    # orphan has no matching translation (md5 differs) and no long description: skipped.
    assert [(d.package, d.section) for d in docs] == [("foo", "games"), ("mailx", "mail")]
    assert docs[0].text == ("Puzzle game with falling blocks\n is a game where blocks fall. Stack\n"
                            "the blocks; counts points.\n\nPlay foo-like levels.")
    assert "mailx" not in docs[1].text.lower()
    assert stats == {"records": 6, "no_section": 1, "no_long_description": 1, "other_section": 1,
                     "family_duplicates": 0, "documents": 2}


def test_families_across_sources_collapse_to_the_majority_section(tmp_path):
    # three sources share the first paragraph: one document, labelled with the majority section
    long = " Shared first paragraph about a toolkit.\n .\n Extra {}.\n"
    pk = "".join(f"Package: {p}\nSection: {s}\nDescription: {p} tool\n{long.format(p)}\n"
                 for p, s in [("alpha", "x11"), ("beta-long", "devel"), ("gamma", "devel")])
    docs, stats = D.read_documents(write_index(tmp_path / "l", pk, ""), sections=("x11", "devel"))
    assert [(d.package, d.section) for d in docs] == [("gamma", "devel")]
    assert stats["family_duplicates"] == 2


def test_missing_index_and_missing_translations_say_how_to_get_them(tmp_path):
    with pytest.raises(FileNotFoundError, match="Acquire::Languages=en"):
        D.read_documents(tmp_path / "nothing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no \\*_Packages"):
        D.read_documents(tmp_path / "empty")
    short_only = "Package: a\nSection: net\nDescription: short only\nDescription-md5: 1\n"
    with pytest.raises(FileNotFoundError, match="no long descriptions"):
        D.read_documents(write_index(tmp_path / "s", short_only, ""), sections=("net",))


def test_corrupt_index_file_is_named(tmp_path):
    folder = write_index(tmp_path / "lists")
    (folder / "deb.example.org_debian_dists_x_main_binary-amd64_Packages.gz").write_bytes(b"not gzip")
    with pytest.raises(ValueError, match="Packages.gz"):
        D.read_documents(folder)


@pytest.mark.skipif(not shutil.which("lz4"), reason="the lz4 program writes the test file")
def test_lz4_index_as_apt_keeps_it(tmp_path):
    import subprocess

    folder = write_index(tmp_path / "lists")
    plain = tmp_path / "Packages"
    plain.write_text(PACKAGES)
    gz = folder / "deb.example.org_debian_dists_x_main_binary-amd64_Packages.gz"
    gz.unlink()
    subprocess.run(["lz4", "-q", str(plain), str(gz.with_suffix(".lz4"))], check=True)
    assert D.read_index_file(gz.with_suffix(".lz4")) == PACKAGES


def test_class_split_proportions_cap_and_determinism():
    labels = np.repeat([0, 1, 2], [50, 20, 200])
    tr, va, te = D.class_split(labels, 3, test_frac=0.2, val_frac=0.1, cap=100)
    for k, n in enumerate([50, 20, 100]):  # class 2 capped at 100
        assert (labels[te] == k).sum() == round(0.2 * n) and (labels[va] == k).sum() == round(0.1 * n)
        assert (labels[tr] == k).sum() == n - round(0.2 * n) - round(0.1 * n)
    assert len(set(tr) | set(va) | set(te)) == len(tr) + len(va) + len(te)  # disjoint
    again = D.class_split(labels, 3, 0.2, 0.1, cap=100)
    assert all(np.array_equal(a, b) for a, b in zip((tr, va, te), again))
    other = D.class_split(labels, 3, 0.2, 0.1, cap=100, seed=1)
    assert not np.array_equal(te, other[2])
    # every part gets at least one document of each class; a class of 2 leaves none for training
    assert [(labels[p] == 1).sum() for p in D.class_split(labels, 3, 0.01, 0.01)] == [18, 1, 1]
    with pytest.raises(ValueError, match="class 1 has 2"):
        D.class_split(np.array([0] * 10 + [1] * 2), 2, 0.3, 0.2)


def _index_for_load(folder, per_section=12):
    words = {"games": "puzzle arcade level score player", "mail": "inbox message smtp imap letter",
             "net": "network socket packet router dns"}
    rng = np.random.default_rng(0)
    pk, tr = [], []
    for s, vocab in words.items():
        w = vocab.split()
        for i in range(per_section):
            name = f"{s}pkg{i}"
            body = " ".join(rng.choice(w, 6)) + f" item{i}{s}"
            pk.append(f"Package: {name}\nSection: {s}\nDescription: {s} tool {i}\nDescription-md5: {i}{s}\n")
            tr.append(f"Package: {name}\nDescription-md5: {i}{s}\nDescription-en: {s} tool {i}\n {body}\n")
    return write_index(folder, "\n".join(pk), "\n".join(tr))


def test_load_debian_is_deterministic_for_a_snapshot(tmp_path, monkeypatch):
    from calibkit.data import textsets

    monkeypatch.setattr(D, "SECTIONS", ("games", "mail", "net"))
    monkeypatch.setattr(textsets, "DEBIAN", textsets.TextSettings(length=8, min_count=1, max_size=50,
                                                                  val_frac=0.2, test_frac=0.3, cap=10))
    folder = _index_for_load(tmp_path / "lists")
    a, b = load("debian", data_dir=str(folder), seed=0), load("debian", data_dir=str(folder), seed=3)
    assert a.modality == "text" and a.class_names == ["games", "mail", "net"]
    assert (len(a.train), len(a.val), len(a.test)) == (3 * 5, 3 * 2, 3 * 3)  # 10 of 12 per class: 3 test, 2 val
    for part in ("train", "val", "test"):  # the split and the encoding do not depend on the run seed
        assert torch.equal(getattr(a, part).images, getattr(b, part).images)
    assert a.train.images.dtype == torch.int64 and a.train.images.shape[1] == 8
    assert a.in_channels == len(a.vocab) and int(a.train.images.max()) < a.in_channels
    snap = a.split["snapshot"]
    assert snap["releases"]["deb.example.org_debian_dists_x_InRelease"] == {"Suite": "testing",
                                                                           "Date": "Mon, 1 Jan 2024 00:00:00 UTC"}
    assert a.split["vocab_checksum"] == a.vocab.checksum()
    # another snapshot (one description changed) has another checksum
    gz = next(folder.glob("*Translation-en.xz"))
    gz.write_bytes(lzma.compress(lzma.decompress(gz.read_bytes()).replace(b"tool 3", b"tool three")))
    c = load("debian", data_dir=str(folder))
    assert c.split["snapshot"]["index_sha256"] != snap["index_sha256"]
    assert c.split["snapshot"]["documents_sha256"] != snap["documents_sha256"]
    with pytest.raises(ValueError, match="fixed validation split"):
        load("debian", data_dir=str(folder), val_size=3)


# ------------------------------------------------------------------------------ 20 Newsgroups


def write_bydate(root, groups=("alt.atheism", "sci.space"), n_train=6, n_test=3):
    for part, n in (("20news-bydate-train", n_train), ("20news-bydate-test", n_test)):
        for g in groups:
            d = root / part / g
            d.mkdir(parents=True)
            for i in range(n):
                body = f"Body {g} message {i}.\n\nSecond paragraph caf\xe9.\n"
                (d / str(1000 + 3 * i)).write_bytes(f"From: someone@{g}\nSubject: m{i}\n\n{body}".encode("latin-1"))
    return root


def test_strip_header():
    assert strip_header("From: a\r\nSubject: b\r\n\r\nHello\r\n\r\nWorld") == "Hello\n\nWorld"
    assert strip_header("no header at all") == "no header at all"


def test_bydate_layout(tmp_path):
    root = write_bydate(tmp_path / "20news")
    (train_t, train_y), (test_t, test_y), groups = read_newsgroup_texts(root)
    assert groups == ["alt.atheism", "sci.space"]
    assert train_y == [0] * 6 + [1] * 6 and test_y == [0] * 3 + [1] * 3
    assert train_t[0] == "Body alt.atheism message 0.\n\nSecond paragraph caf\xe9.\n"  # header dropped, latin-1
    assert "From:" not in " ".join(train_t + test_t)
    # the parent folder of an extracted 20news-bydate/ also works
    parent = tmp_path / "p"
    shutil.copytree(root, parent / "20news-bydate")
    assert read_newsgroup_texts(parent)[2] == groups
    bundle = load("20newsgroups", data_dir=str(root))
    assert bundle.modality == "text" and len(bundle.test) == 6 and bundle.num_classes == 2
    assert len(bundle.train) + len(bundle.val) == 12 and torch.bincount(bundle.val.labels).tolist() == [1, 1]
    assert bundle.train.images.shape[1] == 1000


def test_bydate_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="20news-bydate-train"):
        read_newsgroup_texts(tmp_path)
    root = write_bydate(tmp_path / "a")
    shutil.rmtree(root / "20news-bydate-test" / "sci.space")
    with pytest.raises(FileNotFoundError, match="sci.space"):
        read_newsgroup_texts(root)
    with pytest.raises(ValueError, match="needs data_dir"):
        load("20newsgroups")


def test_bydate_messages_in_numeric_order_and_every_error_in_full(tmp_path):
    root = write_bydate(tmp_path / "a", n_train=1, n_test=1)
    group = root / "20news-bydate-train" / "sci.space"
    for name in ("9", "100", "10"):  # numeric order 9, 10, 100 (by name it would be 10, 100, 9)
        (group / name).write_bytes(f"Subject: s\n\nmessage {name}".encode("latin-1"))
    (train_t, train_y), _, _ = read_newsgroup_texts(root)
    assert (train_t[1:]
            == ["message 9", "message 10", "message 100", "Body sci.space message 0.\n\nSecond paragraph caf\xe9.\n"])
    # only one of the two folders
    half = tmp_path / "half"
    shutil.copytree(root / "20news-bydate-train", half / "20news-bydate-train")
    with pytest.raises(FileNotFoundError, match=r"^20newsgroups: .*half has no 20news-bydate-train/ and "
                                                r"20news-bydate-test/ folders; pass --data-dir"):
        read_newsgroup_texts(half)
    # no group folders
    bare = tmp_path / "bare"
    (bare / "20news-bydate-train").mkdir(parents=True)
    (bare / "20news-bydate-test").mkdir()
    with pytest.raises(ValueError, match=r"^20newsgroups: .*bare/20news-bydate-train has no group folders$"):
        read_newsgroup_texts(bare)
    # a group in one part only
    odd = write_bydate(tmp_path / "odd", n_train=1, n_test=1)
    (odd / "20news-bydate-test" / "talk.extra").mkdir()
    (odd / "20news-bydate-train" / "talk.more").mkdir()
    with pytest.raises(FileNotFoundError,
                       match=r"^20newsgroups: train and test groups differ \(talk.extra, talk.more\); "
                                                r"pass"):
        read_newsgroup_texts(odd)
    # a group without messages, in test and then in train
    for part in ("test", "train"):
        empty = write_bydate(tmp_path / f"empty_{part}", groups=("alt.atheism", "rec.autos", "sci.space"),
                             n_train=1, n_test=1)
        for g in ("alt.atheism", "sci.space"):
            for f in (empty / f"20news-bydate-{part}" / g).iterdir():
                f.unlink()
        with pytest.raises(ValueError, match=rf"^20newsgroups: no {part} messages in alt.atheism, sci.space$"):
            read_newsgroup_texts(empty)


# ------------------------------------------------------------------------------ tokenizer


def test_tokenize():
    assert tokenize("GNU's C++ compiler, v2.0!  don't_stop") == ["gnu's", "c", "compiler", "v2", "0", "don't", "stop"]
    assert tokenize("Café ÜBER") == ["café", "über"]


def test_vocabulary_order_min_count_max_size_and_encoding():
    texts = ["b a a c", "a b d", "e"]  # counts: a 3, b 2, c 1, d 1, e 1
    v = Vocabulary.build(texts, length=4, min_count=1, max_size=5)
    assert v.itos == ["<pad>", "<unk>", "a", "b", "c"]  # most frequent first, ties alphabetical, cut at 5
    assert Vocabulary.build(texts, length=4, min_count=2).itos == ["<pad>", "<unk>", "a", "b"]
    ids = v.encode(["a b z", "c c c c c c", ""])
    assert ids.dtype == torch.int64
    assert ids.tolist() == [[2, 3, 1, 0], [4, 4, 4, 4], [0, 0, 0, 0]]  # unknown -> 1, pad 0 at the end, cut
    assert v.decode(ids[0]) == "a b <unk>"
    back = Vocabulary.from_dict(v.to_dict())
    assert back == v and back.checksum() == v.checksum()
    assert Vocabulary.build(texts, length=5, min_count=1, max_size=5).checksum() != v.checksum()
    with pytest.raises(ValueError, match="calibkit word vocabulary"):
        Vocabulary.from_dict({"kind": "other"})
    with pytest.raises(ValueError, match="max_size"):
        Vocabulary.build(texts, length=4, max_size=2)


def test_the_vocabulary_is_built_on_the_training_texts_only():
    from calibkit.data.textsets import TextSettings, encode_splits

    settings = TextSettings(length=3, min_count=1, max_size=None, val_frac=0.1)
    train = (["apt tool", "tool mail"], [0, 1])
    val = (["valword tool", "valword valword"], [0, 1])  # words seen only in validation and test
    test = (["testword apt"], [1])
    raw = encode_splits(train, val, test, ["a", "b"], settings, {})
    assert raw.vocab.itos == ["<pad>", "<unk>", "tool", "apt", "mail"]
    assert raw.in_channels == 5 and raw.record["vocab_size"] == 5
    assert raw.val.images.tolist() == [[1, 2, 0], [1, 1, 0]]  # validation words are <unk>
    assert raw.test.images.tolist() == [[1, 3, 0]]
    assert raw.train.labels.tolist() == [0, 1] and raw.val.labels.tolist() == [0, 1]


def test_token_ids_must_lie_below_the_vocabulary_size():
    from calibkit.data.inputs import TokenInputs

    pipe = TokenInputs(5)
    x = torch.tensor([[0, 4, 1]])
    assert pipe.eval_batch(x) is x  # the largest valid id is V - 1
    for bad in (5, -1):
        with pytest.raises(ValueError, match=r"values must lie in \[0, 5\) \(the vocabulary size\), got "):
            pipe.eval_batch(torch.tensor([[0, bad, 1]]))
    assert pipe.eval_batch(torch.zeros(0, 3, dtype=torch.int64)).shape == (0, 3)


def test_vocabulary_rules_record_and_checksum_in_full():
    import hashlib
    import json

    from calibkit.data.tokenizer import WORD_PATTERN

    assert (Vocabulary(["a"], length=1).length == 1
            and Vocabulary(["a"], length=1).min_count == 1)  # the shortest encoding; recorded min_count 1
    with pytest.raises(ValueError, match=r"^length must be >= 1, got 0$"):
        Vocabulary(["a"], length=0)
    for tokens in (["a", "a"], ["<pad>", "a"], ["a", "<unk>"]):
        with pytest.raises(ValueError, match=r"^tokens must be distinct and must not contain <pad> or <unk>$"):
            Vocabulary(tokens, length=2)
    # build's defaults: words seen at least twice, at most 20000 entries
    texts = [f"w{i} w{i}" for i in range(20001)] + ["once"]
    v = Vocabulary.build(texts, length=2)
    assert len(v) == 20000 and "once" not in v.stoi and (v.min_count, v.max_size) == (2, 20000)
    assert len(Vocabulary.build(["a b c a b c"], length=2, max_size=3)) == 3
    with pytest.raises(ValueError, match=r"^max_size must be >= 3 \(<pad>, <unk> and one word\), got 2$"):
        Vocabulary.build(["a"], length=2, max_size=2)
    with pytest.raises(ValueError, match=r"^min_count must be >= 1, got 0$"):
        Vocabulary.build(["a"], length=2, min_count=0)
    # the record and its checksum: SHA-256 of the sorted-key JSON, non-ASCII kept as UTF-8, 16 hex digits
    w = Vocabulary(["café", "b"], length=3, min_count=2, max_size=10)
    d = w.to_dict()
    assert d == {"kind": "calibkit-words", "pattern": WORD_PATTERN, "lowercase": True, "length": 3,
                 "min_count": 2, "max_size": 10, "itos": ["<pad>", "<unk>", "café", "b"]}
    blob = json.dumps(d, sort_keys=True, ensure_ascii=False).encode("utf-8")
    assert w.checksum() == hashlib.sha256(blob).hexdigest()[:16]
    # from_dict: a missing min_count is 1; the kind and the pattern are both checked
    old = {k: v for k, v in d.items() if k != "min_count"}
    assert Vocabulary.from_dict(old).min_count == 1 and Vocabulary.from_dict(d) == w
    with pytest.raises(ValueError,
                       match=r"^vocabulary: not a calibkit word vocabulary \(kind or word pattern differs\)$"):
        Vocabulary.from_dict({**d, "pattern": r"\w+"})
    with pytest.raises(ValueError, match=r"^vocabulary: ids 0 and 1 must be <pad> and <unk>$"):
        Vocabulary.from_dict({**d, "itos": ["<unk>", "<pad>", "a"]})
    assert w != d and not (w == "café")  # only a Vocabulary equals a Vocabulary
