"""An offline topic-classification text set: Debian package descriptions labelled by section.

Every Debian-based machine that has run ``apt-get update`` holds the package index under
``/var/lib/apt/lists``: ``*_Packages*`` files (one deb822 record per package, with its ``Section``)
and, when apt fetches translations, ``*_Translation-en*`` files with the long descriptions. The
``debian`` data set turns them into a labelled text collection, without any network access.

Building the documents (:func:`read_documents`), all decisions fixed here:

1. **Records**: every ``Packages`` record with a ``Section``; a section ``contrib/net`` counts as
   ``net``; records without a section are skipped. A package listed by several index files
   (``bookworm``, ``-updates``, ``-security``) is taken from the first file in name order.
2. **Text** = the short description, a newline, then the long description (from the ``Packages``
   record itself when it carries one, else from ``Translation-en`` by package name and
   ``Description-md5``), with deb822 continuation lines unindented and ``" ."`` paragraph lines
   turned into blank lines. Every occurrence of the package's and its source package's name (as a
   whole word, any case) is deleted: the task is the topic, not recognising names. Records without
   a long description are skipped (counted).
3. **Classes** (:data:`SECTIONS`): 18 sections about topics. Left out: sections that a language
   name gives away (python, perl, haskell, rust, golang, javascript, java, ruby, gnu-r, php, ocaml,
   lisp, cli-mono, interpreters), sections that say how a package is packaged rather than what it
   is about (libs, libdevel, doc, debug, oldlibs, metapackages, tasks, introspection,
   localization), the catch-alls utils and misc, and sections too small to give every split its
   share (under ~140 documents).
4. **One document per package family**: binary packages built from one source share most of
   their description (``foo``, ``foo-data``, ``foo-common``), and so do families spread over
   several sources (``0ad``/``0ad-data``, 90 ``puppet-module-*``, the ``gap-*`` packages); keeping
   several would put near-copies into both training and test. First, one package per source: the
   one named like the source, else the shortest name (ties alphabetical). Then one per family of
   documents whose first long-description paragraph has the same words (:func:`family_key`): the
   family is labelled with its most frequent section (ties alphabetical) and represented by its
   shortest package name of that section.
5. **Split** (:func:`class_split`): per class, a seeded permutation (seed 0, part of the data
   set's definition) of its documents in package-name order; at most ``cap`` = 600 documents per
   class are kept (the largest sections have ~1,200, the smallest ~145, so the imbalance drops
   from 8.5:1 to about 4:1); of those, 20% go to test, 10% to validation, the rest to training.
   Every part has the same class proportions, so there is no label shift between training and
   test (a shift that would miscalibrate any classifier by itself).

The **snapshot** record (:func:`snapshot`) -- SHA-256 of every index file read, the suites and
dates of the ``InRelease`` files, and a checksum of the final documents -- is stored with every run,
so a result says which index it came from.

The out-of-distribution set of this data set (:data:`OOD_SECTIONS`) is made the same way from
sections that are not classes: electronics, hamradio, comm, otherosfs, tex, vcs.
"""

from __future__ import annotations

import bz2
import functools
import gzip
import hashlib
import lzma
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from calibkit.errors import UserError

APT_LISTS = "/var/lib/apt/lists"
SECTIONS = ("admin", "database", "devel", "editors", "fonts", "games", "gnome", "graphics", "kde", "mail",
            "math", "net", "science", "sound", "text", "video", "web", "x11")  # fmt: skip
OOD_SECTIONS = ("electronics", "hamradio", "comm", "otherosfs", "tex", "vcs")
SPLIT_SEED = 0
HOW_TO_GET = (
    "the Debian package index with English descriptions is needed: run "
    "`apt-get update -o Acquire::Languages=en` (as root; it fetches *_Packages and *_Translation-en into "
    f"{APT_LISTS}), or pass --data-dir with a folder holding *_Packages* and *_Translation-en* files"
)
_COMPRESSED = (".lz4", ".zst", ".gz", ".xz", ".bz2")


@dataclass(frozen=True)
class Document:
    """One package description: ``text`` (name removed) labelled with ``section``."""

    package: str
    source: str
    section: str
    text: str


# ----------------------------------------------------------------------------- files and parsing


def index_files(folder) -> tuple[list[Path], list[Path]]:
    """``(packages_files, translation_files)`` in ``folder``, sorted by name (compressed or not)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"debian: folder {folder} does not exist; {HOW_TO_GET}")

    def pick(marker: str) -> list[Path]:
        out = []
        for p in sorted(folder.iterdir()):
            name = p.name
            for ext in _COMPRESSED:
                name = name.removesuffix(ext)
            if p.is_file() and name.endswith(marker):
                out.append(p)
        return out

    return pick("_Packages") or pick("Packages"), pick("_Translation-en") or pick("Translation-en")


def read_index_file(path) -> str:
    """The text of one index file, decompressed by its suffix (.gz, .xz, .bz2 in Python; .lz4 and
    .zst with apt's own ``apt-helper cat-file`` or the ``lz4cat``/``zstdcat`` programs)."""
    path = Path(path)
    try:
        if path.suffix == ".gz":
            data = gzip.decompress(path.read_bytes())
        elif path.suffix == ".xz":
            data = lzma.decompress(path.read_bytes())
        elif path.suffix == ".bz2":
            data = bz2.decompress(path.read_bytes())
        elif path.suffix in (".lz4", ".zst"):
            data = _external_decompress(path)
        else:
            data = path.read_bytes()
    except (OSError, EOFError, lzma.LZMAError, ValueError) as exc:
        raise UserError(f"{path}: cannot be read or decompressed ({exc})") from exc
    return data.decode("utf-8", errors="replace")


def _external_decompress(path: Path) -> bytes:
    tool = "lz4cat" if path.suffix == ".lz4" else "zstdcat"
    for cmd in (["/usr/lib/apt/apt-helper", "cat-file"], [shutil.which(tool) or ""]):
        if cmd[0] and os.access(cmd[0], os.X_OK):
            done = subprocess.run([*cmd, str(path)], capture_output=True, check=False)
            if done.returncode == 0:
                return done.stdout
            raise UserError(done.stderr.decode(errors="replace").strip() or f"exit status {done.returncode}")
    raise UserError(f"no decompressor for {path.suffix} (needs /usr/lib/apt/apt-helper or {tool})")


def parse_stanzas(text: str) -> Iterator[dict[str, str]]:
    """deb822 records of ``text``: ``{field: value}``, continuation lines joined with ``"\\n"``.

    Records are separated by blank lines; a line starting with a space or tab continues the
    previous field (kept with its leading whitespace); ``#`` comment lines are ignored.
    """
    record: dict[str, str] = {}
    last = None
    for line in text.splitlines():
        if not line.strip():
            if record:
                yield record
            record, last = {}, None
        elif line[0] in " \t":
            if last is not None:
                record[last] += "\n" + line
        elif not line.startswith("#") and ":" in line:
            key, _, value = line.partition(":")
            last = key.strip()
            record[last] = value.strip()
    if record:
        yield record


def long_description(value: str) -> tuple[str, str]:
    """``(short, long)`` of a deb822 description value (first line, then the continuation lines).

    Continuation lines lose one leading space; a line that is only ``"."`` becomes an empty line
    (a paragraph break).
    """
    first, _, rest = value.partition("\n")
    lines = []
    for line in rest.split("\n") if rest else []:
        line = line[1:] if line[:1] in (" ", "\t") else line
        lines.append("" if line.strip() == "." else line.rstrip())
    return first.strip(), "\n".join(lines).strip()


def remove_names(text: str, names) -> str:
    """``text`` without any whole-word, case-insensitive occurrence of the given names."""
    for name in sorted({n for n in names if n}, key=len, reverse=True):
        text = re.sub(rf"(?<![\w+.-]){re.escape(name)}(?![\w+-]|\.\w)", "", text, flags=re.IGNORECASE)
    return re.sub(r"[ \t]{2,}", " ", text)


# ----------------------------------------------------------------------------- documents


def read_documents(folder=APT_LISTS, sections=SECTIONS) -> tuple[list[Document], dict]:
    """The deduplicated documents of ``sections`` (see the module docstring) and counts of what was
    skipped, in package-name order.

    Parsing the whole index takes seconds, so the result is kept in memory for the files as they
    are (name, size, modification time): a bench that loads the data set for every run parses once.

    Raises:
        FileNotFoundError: no ``Packages`` files, or no long descriptions anywhere (the message says
            how to get them).
    """
    pk_files, tr_files = index_files(folder)
    if not pk_files:
        raise FileNotFoundError(f"debian: no *_Packages files in {folder}; {HOW_TO_GET}")
    def stamp(files):
        return tuple((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in files)

    docs, stats = _read_documents(stamp(pk_files), stamp(tr_files), tuple(sections))
    return list(docs), dict(stats)


@functools.lru_cache(maxsize=4)
def _read_documents(pk_stamp: tuple, tr_stamp: tuple, sections: tuple) -> tuple[tuple[Document, ...], dict]:
    pk_files, tr_files = [Path(e[0]) for e in pk_stamp], [Path(e[0]) for e in tr_stamp]
    folder = pk_files[0].parent
    stats = {"records": 0, "no_section": 0, "no_long_description": 0, "other_section": 0}
    candidates = _by_source(pk_files, _translations(tr_files), set(sections), stats)
    if not candidates and stats["no_long_description"]:
        raise FileNotFoundError(f"debian: the index in {folder} has no long descriptions (no *_Translation-en "
                                f"files); {HOW_TO_GET}")
    docs = []
    for source, members in candidates.items():
        pkg, section, desc = min(members, key=lambda m: (m[0] != source, len(m[0]), m[0]))
        short, long = long_description(desc)
        docs.append(Document(pkg, source, section, remove_names(f"{short}\n{long}", (pkg, source)).strip()))
    kept = _one_per_family(docs, stats)
    stats["documents"] = len(kept)
    return tuple(kept), stats


def _translations(files) -> dict[tuple[str, str], str]:
    """``(package, Description-md5) -> Description-en`` of the ``Translation-en`` files."""
    out: dict[tuple[str, str], str] = {}
    for path in files:
        for rec in parse_stanzas(read_index_file(path)):
            key = (rec.get("Package", ""), rec.get("Description-md5", ""))
            if "Description-en" in rec and key not in out:
                out[key] = rec["Description-en"]
    return out


def _by_source(files, translations, wanted: set, stats: dict) -> dict[str, list[tuple[str, str, str]]]:
    """``source -> [(package, section, full description)]`` of the usable records in ``wanted``."""
    seen: set[str] = set()
    out: dict[str, list[tuple[str, str, str]]] = {}
    for path in files:
        for rec in parse_stanzas(read_index_file(path)):
            pkg = rec.get("Package")
            if not pkg or pkg in seen:
                continue
            seen.add(pkg)
            stats["records"] += 1
            section = rec.get("Section", "").split("/")[-1].strip()
            if not section or section not in wanted:
                stats["no_section" if not section else "other_section"] += 1
                continue
            desc = rec.get("Description", "")
            if "\n" not in desc:  # short only: the long text comes from Translation-en
                desc = translations.get((pkg, rec.get("Description-md5", "")), desc)
            if not long_description(desc)[1]:
                stats["no_long_description"] += 1
                continue
            out.setdefault((rec.get("Source") or pkg).split()[0], []).append((pkg, section, desc))
    return out


def _one_per_family(docs: list[Document], stats: dict) -> list[Document]:
    """One document per :func:`family_key`: the family's majority section, its shortest package."""
    families: dict[str, list[Document]] = {}
    for d in docs:
        families.setdefault(family_key(d.text), []).append(d)
    stats["family_duplicates"] = sum(len(f) - 1 for f in families.values())
    kept = []
    for family in families.values():
        votes: dict[str, int] = {}
        for d in family:
            votes[d.section] = votes.get(d.section, 0) + 1
        section = min(votes, key=lambda s: (-votes[s], s))
        kept.append(min((d for d in family if d.section == section), key=lambda d: (len(d.package), d.package)))
    return sorted(kept, key=lambda d: d.package)


def family_key(text: str) -> str:
    """The near-duplicate key of a document: the words of its first long-description paragraph.

    Lower-cased word characters joined by single spaces (the whole text when that paragraph has
    no words).
    """
    short, _, long = text.partition("\n")
    key = " ".join(re.findall(r"\w+", long.strip().split("\n\n")[0].lower()))
    return key or " ".join(re.findall(r"\w+", text.lower()))


def class_split(labels, num_classes: int, test_frac: float, val_frac: float, cap: int | None = None,
                seed: int = SPLIT_SEED) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-class seeded split with the same class proportions in every part: ``(train, val, test)``.

    For each class k, its indices (in the given order) are permuted with
    ``numpy.random.default_rng([seed, k])`` and the first ``min(n_k, cap)`` kept; of those,
    ``round(test_frac * n)`` go to test, the next ``round(val_frac * n)`` to validation (at least one
    each when the fraction is > 0), the rest to training. Returned arrays are int64, ascending;
    indices beyond a class's cap are in none.

    Raises:
        ValueError: a class left without training documents.
    """
    labels = np.asarray(labels)
    parts: tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]] = ([], [], [])
    for k in range(num_classes):
        idx = np.flatnonzero(labels == k)
        idx = idx[np.random.default_rng([seed, k]).permutation(len(idx))][:cap]
        n_test, n_val = (max(1, round(f * len(idx))) if f > 0 else 0 for f in (test_frac, val_frac))
        if len(idx) - n_test - n_val < 1:
            raise UserError(f"class {k} has {len(idx)} documents: too few for a split with test fraction "
                             f"{test_frac} and validation fraction {val_frac}")
        parts[2].append(idx[:n_test])
        parts[1].append(idx[n_test:n_test + n_val])
        parts[0].append(idx[n_test + n_val:])
    train, val, test = (np.sort(np.concatenate(p)).astype(np.int64) for p in parts)
    return train, val, test


def snapshot(folder, docs: list[Document]) -> dict:
    """Which index the documents came from: per-file SHA-256, suite dates, document checksum."""
    pk_files, tr_files = index_files(folder)
    files = {}
    whole = hashlib.sha256()
    for p in pk_files + tr_files:
        digest = hashlib.sha256(p.read_bytes()).hexdigest()
        files[p.name] = digest
        whole.update(p.name.encode() + b"\0" + digest.encode())
    releases = {}
    for p in sorted(Path(folder).glob("*InRelease")) + sorted(Path(folder).glob("*_Release")):
        fields = dict(re.findall(r"^(Suite|Date): (.*)$", p.read_text(errors="replace"), flags=re.MULTILINE))
        if fields:
            releases[p.name] = fields
    docsum = hashlib.sha256()
    for d in docs:
        docsum.update(f"{d.package}\0{d.section}\0{d.text}\0".encode())
    return {"index_sha256": whole.hexdigest()[:16], "documents_sha256": docsum.hexdigest()[:16],
            "files": files, "releases": releases}
