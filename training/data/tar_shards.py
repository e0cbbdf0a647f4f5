"""Image datasets as WebDataset-layout tar shards: encoded images (JPEG, PNG, WebP) with their labels.

Layout (what `python -m prepare.images` writes from an ImageFolder tree, and what webdataset's own
TarWriter writes): a channel folder with a meta.json
    {"format": "webdataset", "num_classes": K, "image_size": S, "channels": C}
and `*.tar` shards whose members come in groups sharing a key: `KEY.jpg` (or .jpeg, .png, .webp) and
`KEY.cls`, the class index as ASCII digits.

Read by random access, not as a stream: at start each shard's member headers are read once (tarfile) into an
index of (shard, data offset, size) per sample, so sample i is one seek and one read, and the package's
GlobalBatchSampler (every rank's exact position, resumable on any world size) addresses the tar shards as it
does token windows. webdataset's own reader streams a shard front to back, which is what makes its resume
approximate; its random-access sibling (wids) wants a shard list with sample counts and a local cache, which
the channel folder already is. So the format is webdataset's and the reader is the standard library's.

Decoding is Pillow's (the SageMaker PyTorch images ship it; torchvision's decoders would tie the package to
one torchvision per torch version, and the tested torch set has several): JPEG's draft mode decodes at
1/2, 1/4 or 1/8 scale when the target is that much smaller, which is most of a large photo's decode time.
Training augmentation (a random resized crop and a horizontal flip) draws from a generator seeded by
(seed, epoch, sample): the same sample in the same epoch gets the same crop on any rank, in any worker, after
any resume; validation takes the centre crop.
"""

from __future__ import annotations

import io
import math
import os
import tarfile
import time
from pathlib import Path

import numpy as np
import torch

from contract.data_formats import SHARD_GLOBS, WEBDATASET
from contract.errors import ConfigError
from training.environment import DataMissing

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp")
# The crop's share of the image's area and its aspect ratio range (torchvision's RandomResizedCrop defaults,
# the scale floor raised: tiny images have little to lose).
CROP_SCALE = (0.35, 1.0)
CROP_RATIO = (3 / 4, 4 / 3)


def scan_shard(path: Path) -> list[tuple[int, int, int]]:
    """(data offset, size, label) of each sample in one tar shard, in member order; refuses what it cannot use."""
    images: dict[str, tuple[int, int]] = {}
    labels: dict[str, int] = {}
    order: list[str] = []
    try:
        with tarfile.open(path) as tar:
            for member in tar:
                if not member.isfile():
                    continue
                name = member.name.rsplit("/", 1)[-1]
                stem, dot, suffix = name.partition(".")  # webdataset: the key ends at the basename's first dot
                key = member.name[: len(member.name) - len(name)] + stem
                if not dot:
                    continue
                suffix = "." + suffix.lower()
                if suffix in IMAGE_SUFFIXES:
                    if key not in images:
                        order.append(key)
                    images[key] = (member.offset_data, member.size)
                elif suffix == ".cls":
                    raw = tar.extractfile(member).read().strip()
                    if not raw.isdigit():
                        raise ConfigError(f"{path}: {name} holds {raw[:20]!r}, not a class index: write the label "
                                          "as ASCII digits (e.g. b'3')")
                    labels[key] = int(raw)
    except (tarfile.TarError, EOFError) as e:
        raise ConfigError(f"{path} is not a readable tar file ({e}): rewrite the shard (python -m "
                          "prepare.images)") from None
    missing = [k for k in order if k not in labels]
    if missing:
        raise ConfigError(f"{path}: {len(missing)} image(s) have no .cls label, e.g. {missing[0]}: write a "
                          f"{missing[0]}.cls member (the class index) beside each image")
    return [(*images[k], labels[k]) for k in order]


class TarImageDataset:
    """Samples of a webdataset channel, decoded to uint8 and augmented per (seed, epoch, sample) in `batch`.

    Picklable without its open files (each DataLoader worker opens its own), and safe after fork: a handle is
    keyed by the process that opened it.
    """

    data_format = WEBDATASET  # the loader's `data_workers=auto` gives this format worker processes

    def __init__(self, directory: str | Path, meta: dict, shape: tuple[int, int, int] | None = None,
                 num_classes: int | None = None, augment: bool = True, seed: int = 0) -> None:
        self.directory = Path(directory)
        meta_path = self.directory / "meta.json"
        for key in ("image_size", "channels", "num_classes"):
            if key not in meta and not (key == "num_classes" and num_classes):
                raise ConfigError(f"{meta_path} has no {key!r}: the webdataset format needs image_size, channels "
                                  "and num_classes (python -m prepare.images writes them)")
        said = (int(meta["image_size"]), int(meta["image_size"]), int(meta["channels"]))
        if shape and shape != said:
            raise ConfigError(f"{meta_path} says images are {' x '.join(map(str, said))} but the model takes "
                              f"{' x '.join(map(str, shape))} (built from the train channel's meta.json): give this "
                              "channel the train channel's image_size and channels")
        if said[2] not in (1, 3):
            raise ConfigError(f"{meta_path} has channels {said[2]}: encoded images decode to 1 (grey) or 3 (RGB)")
        self.shape, self.augment, self.seed = said, augment, seed
        self.num_classes = num_classes or int(meta["num_classes"])
        self.shards = sorted(self.directory.glob(SHARD_GLOBS[WEBDATASET]))
        if not self.shards:
            raise DataMissing(f"{directory} holds no *.tar shards: write them with `python -m "
                              "prepare.images --imagefolder DIR --out DIR`")
        rows = []
        for i, path in enumerate(self.shards):
            for offset, size, label in scan_shard(path):
                if not 0 <= label < self.num_classes:
                    raise ConfigError(f"{path} holds label {label}, outside 0..{self.num_classes - 1} (num_classes "
                                      f"{self.num_classes} in {meta_path}): fix the label or num_classes")
                rows.append((i, offset, size, label))
        if not rows:
            raise DataMissing(f"{directory}: its tar shards hold no images ({', '.join(IMAGE_SUFFIXES)})")
        self.index = np.array(rows, dtype=np.int64)
        self._files: dict[tuple[int, int], object] = {}
        # Tests only: seconds of extra work per decoded sample (a slow decode, to see the loop wait for data).
        self.slow_decode_s = float(os.environ.get("TRAINING_TEST_SLOW_DECODE_S", "0") or 0)

    def __len__(self) -> int:
        return len(self.index)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_files": {}}

    def _read(self, shard: int, offset: int, size: int) -> bytes:
        key = (os.getpid(), shard)
        handle = self._files.get(key)
        if handle is None:
            handle = self._files[key] = open(self.shards[shard], "rb")  # noqa: SIM115 (kept open: one per process)
        handle.seek(offset)
        return handle.read(size)

    def decode(self, i: int, epoch: int) -> np.ndarray:
        """Sample i as uint8 S x S x C: decoded, cropped (random per (seed, epoch, i) when augmenting), resized."""
        from PIL import Image, UnidentifiedImageError

        shard, offset, size, _ = (int(v) for v in self.index[i])
        try:
            return self._decode(i, epoch, shard, offset, size)
        except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as e:  # UnidentifiedImageError: OSError
            # PIL's "cannot identify image file <_io.BytesIO object at 0x...>" names nothing the user has.
            why = "no image format recognised" if isinstance(e, UnidentifiedImageError) else str(e)[:200]
            raise ConfigError(f"{self.shards[shard]}: sample {i} ({size} bytes at offset {offset}) is not a "
                              f"decodable image ({why}): rewrite the shard from its source images "
                              "(python -m prepare.images checks each one)") from None

    def _decode(self, i: int, epoch: int, shard: int, offset: int, size: int) -> np.ndarray:
        from PIL import Image

        size_px = self.shape[0]
        with Image.open(io.BytesIO(self._read(shard, offset, size))) as image:
            mode = "RGB" if self.shape[2] == 3 else "L"
            image.draft(mode, (size_px, size_px))  # JPEG: decode at a reduced scale when the target allows
            image = image.convert(mode)
            if self.augment:
                g = torch.Generator().manual_seed(((self.seed * 1_000_003 + epoch) * 2_147_483_647 + i) % (1 << 63))
                box, flip = _random_crop(image.size, g), bool(torch.rand((), generator=g) < 0.5)
            else:
                box, flip = _centre_crop(image.size), False
            image = image.resize((size_px, size_px), Image.Resampling.BILINEAR, box=box)
            if flip:
                image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
            array = np.asarray(image, dtype=np.uint8)
        if self.slow_decode_s:
            time.sleep(self.slow_decode_s)  # waits without using a core: a worker's decode overlaps it
        return array.reshape(self.shape)

    def raw_batch(self, indices: list[int], epoch: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """uint8 N x S x S x C images and their labels: what a loader worker sends (a quarter of the float's
        bytes through shared memory and over PCIe); `to_float_images` runs on the device."""
        x = np.stack([self.decode(int(i), epoch) for i in indices])
        y = self.index[indices, 3].astype(np.int64)
        return torch.from_numpy(x), torch.from_numpy(y)

    def batch(self, indices: list[int], epoch: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = self.raw_batch(indices, epoch)
        return to_float_images(x), y


def to_float_images(x: torch.Tensor) -> torch.Tensor:
    """uint8 N x S x S x C -> float N x C x S x S in [-1, 1]: what the ViT takes, for every image format."""
    return x.permute(0, 3, 1, 2).float().div_(127.5).sub_(1.0)


def _random_crop(size: tuple[int, int], g: torch.Generator) -> tuple[float, float, float, float]:
    """A box of CROP_SCALE of the area at an aspect ratio in CROP_RATIO (log-uniform), inside the image."""
    width, height = size
    area = width * height
    u = torch.rand(3, generator=g).tolist()
    scale = CROP_SCALE[0] + u[0] * (CROP_SCALE[1] - CROP_SCALE[0])
    ratio = math.exp(math.log(CROP_RATIO[0]) + u[1] * (math.log(CROP_RATIO[1]) - math.log(CROP_RATIO[0])))
    w = min(width, math.sqrt(area * scale * ratio))
    h = min(height, math.sqrt(area * scale / ratio))
    left = u[2] * (width - w)
    top = float(torch.rand((), generator=g)) * (height - h)
    return (left, top, left + w, top + h)


def _centre_crop(size: tuple[int, int]) -> tuple[float, float, float, float]:
    width, height = size
    side = min(width, height)
    left, top = (width - side) / 2, (height - side) / 2
    return (left, top, left + side, top + side)
