"""The CSM store's errors name the problem (which file, which shard, how many images)."""

import json
import shutil

import pytest
import torch

from calibkit.bench.twostage import SHIPPED_STORES
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

SHIPPED = SHIPPED_STORES["fmnist"]


@pytest.fixture
def store(tmp_path):
    dst = tmp_path / "store"
    shutil.copytree(SHIPPED, dst, ignore=shutil.ignore_patterns(ANNOT_META, ANNOT_TENSORS))
    return dst


def test_not_a_store_and_foreign_manifest(store, tmp_path):
    with pytest.raises(FileNotFoundError,
                       match=rf"{tmp_path} is not a CSM store \(no {MANIFEST}\); run `calibkit csm generate`"):
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


def _index_lines(store, shards):
    return [line for k in range(shards) for line in shard_paths(store, k)[1].read_text().splitlines()]


@pytest.mark.parametrize("groups", [1, 1250])
def test_subset_store_keeps_the_first_groups_at_both_ends_of_the_range(store, tmp_path, groups):
    """One group and every group are both valid sizes; the copy is the source's first rows."""
    from calibkit.methods.csm.store import subset_store

    src = load_store(store)
    assert src["manifest"]["num_groups"] == 1250  # the shipped store the bounds below refer to
    man = subset_store(store, tmp_path / "sub", groups)
    got, n = load_store(tmp_path / "sub"), groups * 8
    for k in ("images", "group", "member", "c1", "c2", "lam"):
        assert torch.equal(got[k], src[k][:n]), k
    assert _index_lines(tmp_path / "sub", 1) == _index_lines(store, 1)[:n]
    assert man["num_groups"] == man["groups_per_shard"] == groups


@pytest.mark.parametrize("groups", [0, 1251, -1])
def test_subset_store_refuses_sizes_outside_the_store(store, tmp_path, groups):
    from calibkit.methods.csm.store import subset_store

    with pytest.raises(ValueError) as err:
        subset_store(store, tmp_path / "sub", groups)
    assert str(err.value) == f"num_groups must be in [1, 1250], got {groups}"
    assert not (tmp_path / "sub").exists()  # refused before anything is written


def test_subset_store_manifest_names_its_source_and_the_folder_may_be_nested_or_exist(store, tmp_path):
    from calibkit.methods.csm.store import subset_store

    dst = tmp_path / "a" / "b" / "sub"  # parents created
    subset_store(store, dst, 3)
    man = subset_store(store, dst, 2)  # an existing folder is written over
    on_disk = json.loads((dst / MANIFEST).read_text())
    assert on_disk == man
    source = read_manifest(store)
    assert man == {**source, "num_groups": 2, "groups_per_shard": 2,
                   "subset_of": {"store": str(store), "num_groups": 1250}}
    assert len(load_store(dst)["images"]) == 16
