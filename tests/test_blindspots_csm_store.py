"""The CSM store's errors name the problem (which file, which shard, how many images)."""

import json
import shutil

import pytest

from calibkit.methods.csm.store import (
    ANNOT_META,
    ANNOT_TENSORS,
    MANIFEST,
    load_annotations,
    load_store,
    read_manifest,
    shard_paths,
    write_annotations,
)
from calibkit.bench.twostage import SHIPPED_STORES

SHIPPED = SHIPPED_STORES["fmnist"]


@pytest.fixture
def store(tmp_path):
    dst = tmp_path / "store"
    shutil.copytree(SHIPPED, dst, ignore=shutil.ignore_patterns(ANNOT_META, ANNOT_TENSORS))
    return dst


def test_not_a_store_and_foreign_manifest(store, tmp_path):
    with pytest.raises(FileNotFoundError, match=rf"{tmp_path} is not a CSM store \(no {MANIFEST}\); run `calibkit csm generate`"):
        read_manifest(tmp_path)
    manifest = json.loads((store / MANIFEST).read_text())
    (store / MANIFEST).write_text(json.dumps({**manifest, "format": "other"}))
    with pytest.raises(ValueError, match=rf"{MANIFEST} is not a .* manifest"):
        read_manifest(store)


def test_incomplete_store_names_the_first_missing_shard(store):
    for k in (4, 2):
        shard_paths(store, k)[1].unlink()  # the index file marks a shard as done
    with pytest.raises(ValueError, match=r"incomplete: 2 shard\(s\) missing \(first: 2\); rerun the same "
                                         r"`calibkit csm generate` command to finish it"):
        load_store(store)


def test_wrong_image_count_is_reported(store):
    manifest = json.loads((store / MANIFEST).read_text())
    n = manifest["num_groups"] * manifest["group_size"]
    assert load_store(store)["images"].shape[0] == n
    (store / MANIFEST).write_text(json.dumps({**manifest, "group_size": manifest["group_size"] + 1}))
    with pytest.raises(ValueError, match=rf"holds {n} images, expected {n + manifest['num_groups']}$"):
        load_store(store)


@pytest.mark.parametrize("keep", [None, ANNOT_META, ANNOT_TENSORS])
def test_annotations_need_both_files(store, keep):
    import torch

    write_annotations(store, {"x": torch.zeros(2)}, {"encoder": "test"})
    tensors, meta = load_annotations(store)
    assert meta == {"encoder": "test"} and torch.equal(tensors["x"], torch.zeros(2))
    for name in (ANNOT_META, ANNOT_TENSORS):
        if name != keep:
            (store / name).unlink()
    with pytest.raises(FileNotFoundError, match=rf"store {store} has no annotations; run `calibkit csm annotate"):
        load_annotations(store)
