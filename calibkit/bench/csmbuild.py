"""``bench --csm-build`` / ``tune --csm-build``: a CSM generated set for data calibkit ships none for.

CSM needs a generated set of semantic mixes (``docs/csm.md``). calibkit ships one for
Fashion-MNIST; for any other image data set the bench can build one in the output directory, with
the steps of ``calibkit csm train-generator`` and ``calibkit csm generate`` (the same functions):

1. the class-conditional generator is trained on the data set's official training images that lie
   in **no** validation split of the bench's seeds and of the selection seed
   (:func:`calibkit.methods.csm.inputs.training_images_outside_validation`), so that the generated
   images carry nothing of any validation (or test) image;
2. groups of 8 mixes are generated, as many images as the preset's real training images (the
   rule of the shipped set: 10,000 generated for 10,000 real), and at least one group per pair of
   classes (CSM mixes every pair).

Both steps resume (the generator from its checkpoint, the generation from its finished shards) and
print progress with an ETA; ``DIR/cache/csm-build/<preset>/seeds-<s>/`` holds the generator, the
store and ``build.json`` (written last: a finished build). Settings, overridable in the preset's
``csm`` table: :data:`BUILD_DEFAULTS` (the shipped generator's: 4000 steps of batch 64, 10 Heun
steps in bfloat16, guidance 3).

Without ``--csm-build``, :func:`cost_line` says in one line what the build would cost on this
device, from a measurement made there and then (:func:`measure`: two timed generator training
steps after one warm-up, and one group of 8 images sampled with the build's sampler settings), and
how to enable it.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import time
from pathlib import Path

import torch

import calibkit.data  # calibkit.data.load read at each call, so a replaced loader is the one used
from calibkit.bench.grid import grid_methods
from calibkit.bench.runner import train_config
from calibkit.bench.twostage import csm_source
from calibkit.distributed import resolve_device
from calibkit.errors import UserError
from calibkit.extras import require
from calibkit.methods.csm.generate import sample_groups
from calibkit.methods.csm.generator import CondDenoiser, GeneratorConfig, edm_loss
from calibkit.methods.csm.inputs import training_images_outside_validation
from calibkit.methods.csm.train_generator import GeneratorTrainConfig, train_generator

# The module, whose generate_store is read at each call, so that a replaced one is the one used
# (`import calibkit.methods.csm.generate as ...` would give the package's function of that name).
generate = importlib.import_module("calibkit.methods.csm.generate")

# The build's settings (keys of Preset.csm); the values of the shipped Fashion-MNIST set.
BUILD_DEFAULTS = {"build_steps": 4000, "build_batch_size": 64, "build_lr": 1e-3, "build_channels": (32, 64, 64),
                  "build_sampler_steps": 10, "build_guidance": 3.0, "build_precision": "bf16",
                  "build_sample_batch": 32, "build_images": None, "build_seed": 0}


def settings(preset) -> dict:
    """:data:`BUILD_DEFAULTS` with the preset's ``csm`` overrides."""
    out = dict(BUILD_DEFAULTS)
    out.update({k: v for k, v in preset.csm.items() if k in BUILD_DEFAULTS})
    return out


def build_seeds(preset, seeds=None) -> list[int]:
    """The seeds whose validation images the generator must not see: the bench's and the selection seed."""
    return sorted({*(int(s) for s in (preset.seeds if seeds is None else seeds)), int(preset.tune_seed)})


def build_dir(out, preset, seeds=None) -> Path:
    return Path(out) / "cache" / "csm-build" / preset.name / ("seeds-" + "-".join(map(str, build_seeds(preset, seeds))))


def store_path(out, preset, seeds=None) -> Path:
    """Where the built generated set lies (what the CSM runs use as ``--csm-store``)."""
    return build_dir(out, preset, seeds) / "store"


def is_built(out, preset, seeds=None) -> bool:
    return (build_dir(out, preset, seeds) / "build.json").is_file()


def _groups(preset, bundle, cfg) -> int:
    """Groups to generate: as many images as the real training images (``build_images`` if set),
    and at least one group per pair of classes (CSM mixes every pair)."""
    k = bundle.num_classes
    return max(math.ceil(int(cfg["build_images"] or len(bundle.train)) / 8), k * (k - 1) // 2)


def measure(preset, bundle, device="auto") -> dict:
    """Seconds per generator training step and sampled images per second on ``device``, measured
    now with untrained weights of the build's architecture (speed does not depend on the weights)."""
    cfg = settings(preset)
    dev = resolve_device(device)
    gen_cfg = GeneratorConfig.for_images(bundle.num_classes, bundle.in_channels, bundle.image_size[0],
                                         cfg["build_channels"])
    model = CondDenoiser(gen_cfg).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=cfg["build_lr"])
    g = torch.Generator().manual_seed(0)
    x = (torch.rand(cfg["build_batch_size"], gen_cfg.in_channels, gen_cfg.image_size, gen_cfg.image_size,
                    generator=g) * 2 - 1).to(dev)
    y = torch.eye(gen_cfg.num_classes)[torch.randint(gen_cfg.num_classes, (len(x),), generator=g)].to(dev)
    times = []
    for _ in range(3):  # one warm-up, two timed
        t0 = time.perf_counter()
        loss = edm_loss(model, x, y, g)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        times.append(time.perf_counter() - t0)
    model.eval()
    t0 = time.perf_counter()
    sample_groups(model, [0], seed=0, steps=cfg["build_sampler_steps"], guidance=cfg["build_guidance"],
                  batch_size=cfg["build_sample_batch"], precision=cfg["build_precision"])
    sample_s = time.perf_counter() - t0
    return {"step_s": sum(times[1:]) / 2, "images_per_s": 8 / sample_s, "device": str(dev)}


def cost_line(preset, bundle, seeds=None, device="auto") -> str:
    """One line: no generated set, what building one costs here (measured now), how to enable it."""
    head = f"csm: no generated set for {preset.dataset}"
    how = "add --csm-build to build one in --out, pass --csm-store DIR, or leave csm out of --methods"
    try:
        require("diffusers", "building a CSM generated set")
    except ImportError as exc:
        return f"{head}; {how} ({exc})"
    cfg = settings(preset)
    speed = measure(preset, bundle, device)
    n_img = 8 * _groups(preset, bundle, cfg)
    train_s, gen_s = cfg["build_steps"] * speed["step_s"], n_img / speed["images_per_s"]
    return (f"{head}; building one here would take about {(train_s + gen_s) / 60:.0f} min on {speed['device']} "
            f"(generator: {cfg['build_steps']} steps x {speed['step_s']:.2f} s; {n_img} images at "
            f"{speed['images_per_s']:.1f} images/s; measured just now): {how}")


def build(preset, out, seeds=None, data_dir=None, device="auto", log=print) -> Path:
    """Train the generator and generate the set (resuming either); returns the store's path.

    Raises:
        ValueError: the data set is not images (CSM does not apply).
    """
    root, store = build_dir(out, preset, seeds), store_path(out, preset, seeds)
    if is_built(out, preset, seeds):
        return store
    require("diffusers", "building a CSM generated set")
    cfg, excl = settings(preset), build_seeds(preset, seeds)
    dev = resolve_device(device)
    images, labels, bundle, record = training_images_outside_validation(
        preset.dataset, excl, preset.train.get("val_size"), data_dir)
    if bundle.modality != "image":
        raise UserError(f"csm: {preset.dataset} is {bundle.modality}, not images; CSM does not apply to it")
    gen_cfg = GeneratorConfig.for_images(bundle.num_classes, bundle.in_channels, bundle.image_size[0],
                                         cfg["build_channels"])
    steps = int(cfg["build_steps"])
    log(f"csm build: training the generator for {steps} steps on {record['train_images']} training images "
        f"outside the validation splits of seeds {excl} ({root / 'generator'}, on {dev})")
    train_cfg = GeneratorTrainConfig(steps=steps, batch_size=int(cfg["build_batch_size"]), seed=int(cfg["build_seed"]),
                                     lr=float(cfg["build_lr"]))
    train_generator(images, labels, root / "generator", train_cfg, gen_cfg,
                    checkpoint_every=max(1, min(100, steps // 20)),
                    extra_meta={"data": preset.dataset, "class_names": bundle.class_names, "split": record,
                                "built_by": f"bench --csm-build (preset {preset.name})"}, device=dev)
    groups = _groups(preset, load_bundle(preset, excl[0], data_dir), cfg)
    log(f"csm build: generating {groups} groups ({groups * 8} images) into {store}")
    t0 = time.time()
    generate.generate_store(root / "generator", store, num_groups=groups, seed=int(cfg["build_seed"]),
                   steps=int(cfg["build_sampler_steps"]), guidance=float(cfg["build_guidance"]),
                   groups_per_shard=max(1, min(64, groups // 10 or 1)), distributed=None, device=dev,
                   batch_size=int(cfg["build_sample_batch"]), precision=cfg["build_precision"])
    (root / "build.json").write_text(json.dumps({"preset": preset.name, "dataset": preset.dataset,
                                                 "excluded_val_seeds": excl, "settings": _jsonable(cfg),
                                                 "groups": groups, "generation_s": round(time.time() - t0, 1),
                                                 "generator_split": record}, indent=1, sort_keys=True))
    return store


def load_bundle(preset, seed: int, data_dir=None):
    """The data set as the bench's CE run of ``seed`` loads it (its training images count)."""
    cfg = train_config(preset, "ce", seed, data_dir)
    return calibkit.data.load(cfg.data, data_dir=cfg.data_dir, seed=seed, val_size=cfg.val_size,
                              train_subset=cfg.train_subset)


def _jsonable(d: dict) -> dict:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}


def ensure(preset, out, seeds=None, methods=None, data_dir=None, device="auto", csm_store=None, log=print):
    """``--csm-build``: the generated set CSM's runs use, built when CSM is in the grid and has none.

    Returns:
        ``csm_store`` unchanged when CSM is not in the grid or already has a set (given, the
        preset's or the one shipped); else the path of the built set (built now unless a
        finished build is there).
    """
    if "csm" not in grid_methods(preset, methods)[0]:
        return csm_store
    src = csm_source(preset, csm_store)
    if src is not None and Path(src).is_dir():
        return csm_store
    if not is_built(out, preset, seeds) and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise UserError("--csm-build builds in one process: run it once without torchrun (e.g. with --methods csm "
                         "--seeds ...), then again under torchrun")
    return str(build(preset, out, seeds, data_dir, device, log))
