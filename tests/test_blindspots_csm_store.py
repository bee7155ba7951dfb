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
    # Declare the store as 5 shards of 250 groups; shards 0, 1 and 3 are marked done by their
    # index files (the file that marks a shard as done), shards 2 and 4 are missing.
    manifest = json.loads((store / MANIFEST).read_text())
    (store / MANIFEST).write_text(json.dumps({**manifest, "groups_per_shard": manifest["num_groups"] // 5}))
    for k in (1, 3):
        for src, dst in zip(shard_paths(store, 0), shard_paths(store, k)):
            shutil.copy(src, dst)
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
