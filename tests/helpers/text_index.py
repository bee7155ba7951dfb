"""A synthetic Debian package index in the real on-disk format, with every class section of the
``debian`` text set and every held-out section, for the trainer and bench tests.

Each section has its own 12 topic words; a description is 14 words drawn mostly from its section's
topic words plus a few shared filler words, so the classes are learnable but not trivially.
"""

import gzip

import numpy as np

from calibkit.data import debian as D

FILLER = "the a of and for with program tool support data files system".split()


def write_synthetic_index(folder, per_section: int = 40, seed: int = 0):
    rng = np.random.default_rng(seed)
    packages, translations = [], []
    for section in D.SECTIONS + D.OOD_SECTIONS:
        topic = [f"{section.replace('-', '')}{w}" for w in "abcdefghijkl"]
        for i in range(per_section):
            name = f"{section}-pkg{i}"
            words = [topic[j] if rng.random() < 0.7 else FILLER[j % len(FILLER)] for j in rng.integers(0, 12, 14)]
            md5 = f"{abs(hash((section, i))) % 10**12:032d}"
            packages.append(f"Package: {name}\nSection: {section}\nDescription: {section} tool {i}\n"
                            f"Description-md5: {md5}\n")
            translations.append(f"Package: {name}\nDescription-md5: {md5}\nDescription-en: {section} tool {i}\n"
                                f" {' '.join(words)} unique{section.replace('-', '')}{i}\n .\n Second paragraph.\n")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "deb.example.org_debian_dists_x_main_binary-amd64_Packages.gz").write_bytes(
        gzip.compress("\n".join(packages).encode()))
    (folder / "deb.example.org_debian_dists_x_main_i18n_Translation-en.gz").write_bytes(
        gzip.compress("\n".join(translations).encode()))
    return folder
