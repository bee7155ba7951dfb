"""The 20 Newsgroups ``20news-bydate`` archive, read from its extracted folders.

Layout (the archive ``20news-bydate.tar.gz`` as distributed, extracted)::

    DATA_DIR/20news-bydate-train/<group>/<message number>
    DATA_DIR/20news-bydate-test/<group>/<message number>

(``DATA_DIR`` may also be a folder that contains the extracted ``20news-bydate/`` folder.) One
folder per group -- the class names are the 20 group names in sorted order, identical in train
and test -- and one file per message, read as Latin-1 (every byte is a character, as in the MbLS
code). Train and test are the archive's own date-based split (11,314 / 7,532 messages).

**Headers**: each message starts with mail headers (``From:``, ``Subject:``, ``Organization:``,
``Lines:``, ...) and a blank line. As in the MbLS text experiment, everything before the first
blank line is dropped: the headers name senders and organisations that identify a group without
being its topic (a message without a blank line is kept whole). Quoted replies and signatures in
the body are kept.
"""

from __future__ import annotations

from pathlib import Path

from calibkit.errors import UserError

TRAIN_DIR, TEST_DIR = "20news-bydate-train", "20news-bydate-test"
HOW_TO_GET = ("pass --data-dir with the extracted 20news-bydate archive (the folders 20news-bydate-train/ and "
              "20news-bydate-test/, one folder per group, one file per message)")


def strip_header(message: str) -> str:
    """The body of a message: everything after the first blank line (the whole text if none)."""
    text = message.replace("\r\n", "\n")
    head, sep, body = text.partition("\n\n")
    return body if sep else text


def _root(data_dir) -> Path:
    root = Path(data_dir)
    for cand in (root, root / "20news-bydate"):
        if (cand / TRAIN_DIR).is_dir() and (cand / TEST_DIR).is_dir():
            return cand
    raise FileNotFoundError(f"20newsgroups: {root} has no {TRAIN_DIR}/ and {TEST_DIR}/ folders; {HOW_TO_GET}")


def _read_part(folder: Path, groups: list[str]) -> tuple[list[str], list[int]]:
    texts, labels = [], []
    for k, group in enumerate(groups):
        gdir = folder / group
        if not gdir.is_dir():
            raise FileNotFoundError(f"20newsgroups: {gdir} is missing (the groups of train and test must match)")
        files = sorted((p for p in gdir.iterdir() if p.is_file()), key=lambda p: (len(p.name), p.name))
        for p in files:
            texts.append(strip_header(p.read_bytes().decode("latin-1")))
            labels.append(k)
    return texts, labels


def read_newsgroup_texts(data_dir) -> tuple[tuple[list[str], list[int]], tuple[list[str], list[int]], list[str]]:
    """``((train_texts, train_labels), (test_texts, test_labels), groups)`` of the bydate archive.

    Messages are read group by group (sorted names), files in numeric-name order; headers stripped.

    Raises:
        FileNotFoundError: the folders are missing, or a group exists only in train or only in test.
        ValueError: no groups, or a group without messages.
    """
    root = _root(data_dir)
    groups = sorted(p.name for p in (root / TRAIN_DIR).iterdir() if p.is_dir())
    test_groups = sorted(p.name for p in (root / TEST_DIR).iterdir() if p.is_dir())
    if not groups:
        raise UserError(f"20newsgroups: {root / TRAIN_DIR} has no group folders")
    if groups != test_groups:
        only = sorted(set(groups) ^ set(test_groups))
        raise FileNotFoundError(f"20newsgroups: train and test groups differ ({', '.join(only)}); {HOW_TO_GET}")
    train = _read_part(root / TRAIN_DIR, groups)
    test = _read_part(root / TEST_DIR, groups)
    for name, (_, labels) in (("train", train), ("test", test)):
        empty = sorted(set(range(len(groups))) - set(labels))
        if empty:
            raise UserError(f"20newsgroups: no {name} messages in {', '.join(groups[k] for k in empty)}")
    return train, test, groups
