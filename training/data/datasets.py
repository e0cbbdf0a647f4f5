"""Datasets read from channel directories, or generated (the sampler that cuts them: training.data.sampler).

Formats (written by `prepare.corpus`, or by hand; each channel directory has a meta.json):
  tokens: {"format": "tokens", "dtype": "uint16", "vocab_size": V} and `*.bin` shards of raw token ids.
          A sample is a window of seq_len + 1 tokens inside one shard (windows step by seq_len).
  images: {"format": "images", "num_classes": K, "image_size": S, "channels": C} and pairs of
          `images-NNNNN.npy` (uint8, N x S x S x C) and `labels-NNNNN.npy` (int, N), memory-mapped.
  webdataset: {"format": "webdataset", "num_classes": K, "image_size": S, "channels": C} and `*.tar` shards of
          encoded images with `.cls` labels (training.data.tar_shards; `python -m prepare.images` converts
          an ImageFolder tree). Decoded and augmented per (seed, epoch, sample), in the loader's workers.
Text in JSONL or Parquet becomes token shards at prepare time: `python -m prepare.text`.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from contract.data_formats import (
    FORMATS,
    IMAGE_FORMATS,
    IMAGES,
    SHARD_GLOBS,
    TOKENS,
    WEBDATASET,
    how_to_prepare,
)
from contract.errors import ConfigError
from contract.hyperparameters import TrainConfig
from training.data.tar_shards import TarImageDataset, to_float_images
from training.environment import DataMissing, data_mode

SYNTHETIC_SAMPLES = 1 << 20


# What each format's meta.json may say about the model's shape: positive integers where given.
META_SIZES = ("vocab_size", "image_size", "channels", "num_classes")
_WRITE_IT = "write the channel with `python -m prepare.corpus` (tokens) or see training/data/datasets.py's formats"


def read_meta(directory: str | Path) -> dict:
    """The channel's meta.json as a dict, checked: JSON, an object, a known format, positive sizes."""
    path = Path(directory) / "meta.json"
    if not path.exists():
        raise DataMissing(f"{directory} has no meta.json: {how_to_prepare(Path(directory))}")
    try:
        meta = json.loads(path.read_text())
    except ValueError as e:  # JSONDecodeError, and UnicodeDecodeError for a binary file
        raise ConfigError(f"{path} is not JSON ({e}): {_WRITE_IT}") from None
    if not isinstance(meta, dict):
        raise ConfigError(f"{path} holds a JSON {type(meta).__name__}, not an object: "
                          f'write an object such as {{"format": "tokens", "dtype": "uint16", "vocab_size": 256}}')
    if meta.get("format") not in FORMATS:
        given = "has no \"format\"" if "format" not in meta else f"has format {meta['format']!r}"
        raise ConfigError(f"{path} {given}: set \"format\" to one of {', '.join(map(repr, FORMATS))}")
    for key in META_SIZES:
        value = meta.get(key)
        if value is not None and not (isinstance(value, int | float) and not isinstance(value, bool)
                                      and value == int(value) and value > 0):
            raise ConfigError(f"{path} has {key} {value!r}: it must be a positive integer")
    return meta


def _expect_format(directory: str | Path, meta: dict, wanted: str, reader: str) -> None:
    if meta["format"] != wanted and not (wanted == IMAGES and meta["format"] in IMAGE_FORMATS):
        raise ConfigError(f"{Path(directory) / 'meta.json'} has format {meta['format']!r} but {reader} reads "
                          f"{wanted}: give this channel {wanted} data, or choose a model that reads {meta['format']}")


class TokenDataset:
    data_format = TOKENS

    def __init__(self, directory: str | Path, seq_len: int) -> None:
        meta = read_meta(directory)
        _expect_format(directory, meta, TOKENS, "the decoder")
        self.directory = Path(directory)
        dtype = _token_dtype(self.directory / "meta.json", meta.get("dtype", "uint16"))
        shards = sorted(self.directory.glob(SHARD_GLOBS[TOKENS]))
        if not shards:
            raise DataMissing(f"{directory} holds no *.bin token shards: {_WRITE_IT}")
        for path in shards:
            _check_shard(path, dtype, shards)
        self.shards = [np.memmap(p, dtype=dtype, mode="r") for p in shards]
        self.seq_len = seq_len
        index = [
            np.stack([np.full(n, i), np.arange(n) * seq_len], axis=1)
            for i, s in enumerate(self.shards)
            if (n := (len(s) - 1) // seq_len) > 0
        ]
        if not index:
            longest = max(len(s) for s in self.shards)
            raise ConfigError(f"{directory}: no shard holds seq_len + 1 = {seq_len + 1} tokens (the longest holds "
                              f"{longest}): lower seq_len, or write longer shards")
        self.index = np.concatenate(index)

    def __len__(self) -> int:
        return len(self.index)

    def batch(self, indices: list[int], epoch: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        rows = [self.shards[s][o : o + self.seq_len + 1] for s, o in self.index[indices]]
        window = torch.from_numpy(np.stack(rows).astype(np.int64))
        return window[:, :-1], window[:, 1:]


def _token_dtype(meta_path: Path, name) -> np.dtype:
    try:
        dtype = np.dtype(name)
    except TypeError:
        dtype = None
    if dtype is None or dtype.kind not in "iu":
        raise ConfigError(f"{meta_path} has dtype {name!r}, not an integer type token ids can have: "
                          "set \"dtype\" to the one the shards were written with, e.g. \"uint16\" or \"uint32\"")
    return dtype


def _check_shard(path: Path, dtype: np.dtype, shards: list[Path]) -> None:
    """A shard must hold whole tokens: an empty or cut file is a failed write or copy (memmap would fail or
    silently drop the tail)."""
    size = path.stat().st_size
    if size == 0:
        alone = " (the channel's only shard)" if len(shards) == 1 else ""
        raise DataMissing(f"{path} is empty (0 bytes){alone}: rewrite it, or remove it from the channel")
    if size % dtype.itemsize:
        raise ConfigError(f"{path} has {size} bytes, not a multiple of {dtype.itemsize} (one {dtype.name} token, "
                          f"the dtype in {path.parent / 'meta.json'}): the shard was cut short or written with "
                          "another dtype; rewrite it, or set \"dtype\" to the one it was written with")


class ImageDataset:
    """`shape` (S, S, C) and `num_classes` are what the model takes; each defaults to the channel's meta.json."""

    data_format = IMAGES

    def __init__(self, directory: str | Path, shape: tuple[int, int, int] | None = None,
                 num_classes: int | None = None) -> None:
        meta = read_meta(directory)
        _expect_format(directory, meta, IMAGES, "the ViT")
        self.directory = Path(directory)
        meta_path = self.directory / "meta.json"
        said = (int(meta["image_size"]), int(meta["image_size"]), int(meta["channels"])) \
            if "image_size" in meta and "channels" in meta else None
        if shape and said and said != shape:
            raise ConfigError(f"{meta_path} says images are {_dims(said)} but the model takes {_dims(shape)} "
                              "(built from the train channel's meta.json): write this channel at the train "
                              "channel's image_size and channels")
        shape = shape or said
        num_classes = num_classes or (int(meta["num_classes"]) if "num_classes" in meta else None)
        pairs = sorted(self.directory.glob(SHARD_GLOBS[IMAGES]))
        if not pairs:
            raise DataMissing(f"{directory} holds no images-*.npy shards: see training/data/datasets.py's formats")
        self.images, self.labels = [], []
        for path in pairs:
            images = _load_array(path)
            labels = _load_array(path.with_name(path.name.replace("images-", "labels-", 1)))
            _check_images(path, images, shape, meta_path)
            _check_labels(path, images, labels, num_classes)
            self.images.append(images)
            self.labels.append(labels)
        self.index = np.concatenate([np.stack([np.full(len(x), i), np.arange(len(x))], 1)
                                     for i, x in enumerate(self.images)])

    def __len__(self) -> int:
        return len(self.index)

    def raw_batch(self, indices: list[int], epoch: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """uint8 images as stored and their labels (training.data.loader converts them on the device)."""
        pairs = self.index[indices]
        x = np.stack([self.images[s][o] for s, o in pairs])
        y = np.array([self.labels[s][o] for s, o in pairs], dtype=np.int64)
        return torch.from_numpy(x), torch.from_numpy(y)

    def batch(self, indices: list[int], epoch: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = self.raw_batch(indices, epoch)
        return to_float_images(x), y


def _dims(shape: tuple[int, ...]) -> str:
    return " x ".join(map(str, shape))


def _load_array(path: Path) -> np.ndarray:
    if not path.exists():
        raise DataMissing(f"{path} is missing: every images-NNNNN.npy needs its labels-NNNNN.npy beside it")
    try:
        return np.load(path, mmap_mode="r")
    except (ValueError, OSError, EOFError) as e:  # not an .npy file, cut short (or empty), pickled objects
        raise ConfigError(f"{path} is not a readable .npy array ({e}): rewrite it with numpy.save") from None


def _check_images(path: Path, images: np.ndarray, shape: tuple[int, int, int] | None, meta_path: Path) -> None:
    if images.dtype != np.uint8 or images.ndim != 4 or (shape and images.shape[1:] != shape):
        wanted = f"N x {_dims(shape)}" if shape else "N x S x S x C"
        raise ConfigError(f"{path} holds {images.dtype} images of shape {_dims(images.shape)}; {meta_path} and the "
                          f"model want uint8 {wanted}: rewrite the shard at that shape, or fix image_size and "
                          "channels in meta.json")


def _check_labels(path: Path, images: np.ndarray, labels: np.ndarray, num_classes: int | None) -> None:
    name = path.name.replace("images-", "labels-", 1)
    if labels.ndim != 1 or len(labels) != len(images) or labels.dtype.kind not in "iu":
        raise ConfigError(f"{path.with_name(name)} holds {labels.dtype} labels of shape {_dims(labels.shape)} for "
                          f"{len(images)} images in {path.name}: write one integer label per image")
    if num_classes and len(labels) and not 0 <= int(labels.min()) <= int(labels.max()) < num_classes:
        raise ConfigError(f"{path.with_name(name)} holds labels {int(labels.min())}..{int(labels.max())}, outside "
                          f"0..{num_classes - 1} (num_classes {num_classes}): fix the labels, or num_classes in "
                          "meta.json")


class SyntheticTokens:
    """Arithmetic sequences modulo the vocabulary: learnable, so a smoke test shows the loss fall."""

    def __init__(self, vocab_size: int, seq_len: int, seed: int) -> None:
        self.vocab_size, self.seq_len, self.seed = vocab_size, seq_len, seed

    def __len__(self) -> int:
        return SYNTHETIC_SAMPLES

    def batch(self, indices: list[int], epoch: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        rows = []
        for i in indices:
            g = torch.Generator().manual_seed(self.seed * 7919 + int(i))
            start, step = torch.randint(0, self.vocab_size, (2,), generator=g).tolist()
            rows.append((start + (step % 7 + 1) * torch.arange(self.seq_len + 1)) % self.vocab_size)
        window = torch.stack(rows)
        return window[:, :-1], window[:, 1:]


class SyntheticImages:
    """Noise images whose label is the brightest channel-quadrant: learnable, deterministic per index."""

    def __init__(self, image_size: int, channels: int, num_classes: int, seed: int) -> None:
        self.shape = (image_size, image_size, channels)
        self.num_classes, self.seed = num_classes, seed

    def __len__(self) -> int:
        return SYNTHETIC_SAMPLES

    def batch(self, indices: list[int], epoch: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        xs, ys = [], []
        for i in indices:
            g = torch.Generator().manual_seed(self.seed * 7919 + int(i))
            label = int(torch.randint(0, self.num_classes, (1,), generator=g))
            x = torch.randint(0, 128, self.shape, generator=g, dtype=torch.uint8)
            x.view(-1)[label :: self.num_classes] += 127  # a class-dependent stripe pattern
            xs.append(x)
            ys.append(label)
        return to_float_images(torch.stack(xs)), torch.tensor(ys)


def describe(dataset) -> str:
    """How a failure line names a dataset: its channel folder, or what stands in for one."""
    directory = getattr(dataset, "directory", None)
    return f"the channel {directory}" if directory else f"the {type(dataset).__name__} data"


def make_datasets(cfg: TrainConfig, kind: str, model, seq_len: int):
    """(train set, validation set or None) for the model's data kind: the channels, or generated data."""
    if data_mode(cfg) == "synthetic":
        if kind == "images":
            c = model.c
            make = lambda seed: SyntheticImages(c.image_size, c.channels, c.num_classes, seed)  # noqa: E731
        else:
            vocab = getattr(getattr(model, "c", None), "vocab_size", 256)
            make = lambda seed: SyntheticTokens(vocab, seq_len, seed)  # noqa: E731
        return make(cfg.seed), make(cfg.seed + 1)
    if kind == "images":
        c = getattr(model, "c", None)  # the reference ViT's shape; a bring-your-own model's comes from meta.json
        shape = (c.image_size, c.image_size, c.channels) if hasattr(c, "image_size") and hasattr(c, "channels") \
            else None
        num_classes = getattr(c, "num_classes", None)

        def load(d, train=True):
            meta = read_meta(d)
            if meta["format"] == WEBDATASET:  # augmented on the train channel only
                return TarImageDataset(d, meta, shape, num_classes, augment=train, seed=cfg.seed)
            return ImageDataset(d, shape, num_classes)
        return load(cfg.train_dir), (load(cfg.validation_dir, train=False) if cfg.validation_dir else None)
    else:
        load = lambda d: TokenDataset(d, seq_len)  # noqa: E731
    return load(cfg.train_dir), (load(cfg.validation_dir) if cfg.validation_dir else None)

