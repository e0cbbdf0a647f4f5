"""An ImageFolder tree (ROOT/<class>/<image>) converted into WebDataset-layout tar shards (training.data.tar_shards).

    python -m prepare.images --imagefolder ROOT --out DIR --image-size S [--channels 3]
        [--val-fraction 0.05] [--shard-samples 1000] [--seed 0]

Classes are ROOT's sub-folders in sorted order, label i for the i-th (torchvision's ImageFolder convention, so a
team's existing class indices hold). The encoded files are copied as they are (no re-encode: no quality lost,
and a JPEG stays its compressed size, which is what makes tar shards cheap to store and read); each one is
opened once here so a corrupt file fails now, named, not in the middle of a job. Samples are written in a
seeded shuffled order, so every shard holds every class. DIR/train and DIR/validation each get `NNNNN.tar`
shards and a meta.json; validation takes every k-th image of the shuffled order.
"""

from __future__ import annotations

import argparse
import io
import json
import random
import sys
import tarfile
from pathlib import Path

from prepare.staging import StagedFolder, interrupted, written_whole
from training.data.tar_shards import IMAGE_SUFFIXES


class PrepareError(SystemExit):
    """A user's mistake: one line naming the file or option, the value and the fix (no traceback)."""

    def __init__(self, message: str) -> None:
        super().__init__(f"error: {message}")


def image_folder(root: Path) -> tuple[list[str], list[tuple[Path, int]]]:
    """(class names, [(file, label)]) of an ImageFolder tree."""
    if not root.is_dir():
        raise PrepareError(f"--imagefolder {root}: no such folder; give ROOT with one sub-folder of images per class")
    classes = sorted(p.name for p in root.iterdir() if p.is_dir())
    if not classes:
        raise PrepareError(f"--imagefolder {root} has no sub-folders: put each class's images in ROOT/<class>/")
    samples = [(path, label) for label, name in enumerate(classes)
               for path in sorted((root / name).rglob("*")) if path.suffix.lower() in IMAGE_SUFFIXES]
    if not samples:
        raise PrepareError(f"--imagefolder {root}: its class folders hold no {', '.join(IMAGE_SUFFIXES)} files")
    return classes, samples


def _check_image(path: Path) -> None:
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as image:
            image.verify()  # reads the structure (and a PNG's checksums) without a full decode
    except (UnidentifiedImageError, OSError, SyntaxError) as e:
        raise PrepareError(f"{path} is not a readable image ({e}): remove or replace it") from None


def write_shards(samples: list[tuple[Path, int]], out: Path, shard_samples: int, on_shard=None) -> int:
    """`samples` in tar shards of `shard_samples` into `out` (a split's staged folder: prepare.staging);
    `on_shard(number, of)` before each."""
    out.mkdir(parents=True, exist_ok=True)
    for start in range(0, len(samples), shard_samples):
        if on_shard is not None:
            on_shard(start // shard_samples + 1, -(-len(samples) // shard_samples))
        with tarfile.open(out / f"{start // shard_samples:05d}.tar", "w", format=tarfile.USTAR_FORMAT) as tar:
            for n, (path, label) in enumerate(samples[start : start + shard_samples], start):
                key = f"{n:08d}"
                for name, data in ((f"{key}{path.suffix.lower()}", path.read_bytes()),
                                   (f"{key}.cls", str(label).encode())):
                    info = tarfile.TarInfo(name)
                    info.size, info.mtime, info.mode = len(data), 0, 0o644  # byte-identical reruns
                    tar.addfile(info, io.BytesIO(data))
    return len(samples)


def prepare_images(root: Path, out: Path, image_size: int, channels: int = 3, val_fraction: float = 0.05,
                   shard_samples: int = 1000, seed: int = 0, progress=None) -> dict:
    """ImageFolder `root` into tar shards in out/train and out/validation, written whole or not at all
    (prepare.staging); `progress(line)` hears of each shard."""
    if image_size < 1 or channels not in (1, 3) or shard_samples < 1 or not 0 <= val_fraction < 1:
        raise PrepareError(f"--image-size {image_size}, --channels {channels}, --shard-samples {shard_samples}, "
                           f"--val-fraction {val_fraction}: give a positive size, channels 1 or 3, at least one "
                           "sample a shard and a fraction in [0, 1)")
    classes, samples = image_folder(root)
    for path, _ in samples:
        _check_image(path)
    random.Random(seed).shuffle(samples)
    every = round(1 / val_fraction) if val_fraction else 0
    splits = {"train": [s for n, s in enumerate(samples, 1) if not every or n % every]}
    if every:
        splits["validation"] = [s for n, s in enumerate(samples, 1) if n % every == 0]
    for name, items in splits.items():
        if not items:
            raise PrepareError(f"the {name} split got no images of {len(samples)}: add images, or lower "
                               "--val-fraction")
    staged = {name: StagedFolder(out / name) for name in splits}

    def write() -> dict:
        counts = {}
        for name, items in splits.items():
            counts[name] = write_shards(items, staged[name].path, shard_samples, progress and (
                lambda i, of, name=name: progress(f"[prepare] {name}: shard {i} of {of}")))
            meta = {"format": "webdataset", "num_classes": len(classes), "image_size": image_size,
                    "channels": channels, "classes": classes, "samples": counts[name]}
            (staged[name].path / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
        return {"counts": counts, "classes": classes}

    return written_whole(list(staged.values()), write)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m prepare.images", description=__doc__.splitlines()[0])
    parser.add_argument("--imagefolder", type=Path, required=True, help="ROOT holding one sub-folder per class")
    parser.add_argument("--out", type=Path, required=True, help="folder to write train/ and validation/ into")
    parser.add_argument("--image-size", type=int, required=True, help="the side the model takes (decoded to it)")
    parser.add_argument("--channels", type=int, default=3, choices=(1, 3))
    parser.add_argument("--val-fraction", type=float, default=0.05)
    parser.add_argument("--shard-samples", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0, help="seed of the shuffled order")
    args = parser.parse_args(argv)
    try:
        done = prepare_images(args.imagefolder, args.out, args.image_size, args.channels, args.val_fraction,
                              args.shard_samples, args.seed, progress=lambda line: print(line, file=sys.stderr, flush=True))
    except KeyboardInterrupt:
        return interrupted(args.out)
    print(f"wrote {done['counts']['train']:,} train and {done['counts'].get('validation', 0):,} validation images "
          f"of {len(done['classes'])} classes to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
