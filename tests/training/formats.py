"""Small real-format datasets the tests make offline: a JSONL/Parquet corpus with a BPE tokenizer trained here,
and an ImageFolder tree of JPEGs converted to WebDataset tar shards."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

WORDS = ("the", "cat", "sat", "on", "mat", "dog", "ran", "to", "a", "red", "ball", "and", "blue", "box")


def documents(n: int, seed: int = 0) -> list[str]:
    """Sentences with structure (a word follows from the previous one), so a tiny GPT's loss can fall."""
    rng = np.random.default_rng(seed)
    docs = []
    for _ in range(n):
        i = int(rng.integers(len(WORDS)))
        words = [WORDS[(i + 3 * k) % len(WORDS)] for k in range(int(rng.integers(6, 14)))]
        docs.append(" ".join(words) + ".")
    return docs


def train_tokenizer(path: Path, texts: list[str], vocab_size: int = 320) -> Path:
    """A byte-level BPE tokenizer.json trained on `texts` (prepare.tokenizer's, with a small vocabulary)."""
    from prepare.tokenizer import train_bpe

    return train_bpe(texts, vocab_size, path)


def write_jsonl(path: Path, texts: list[str], field: str = "text") -> Path:
    path.write_text("".join(json.dumps({field: t, "id": i}) + "\n" for i, t in enumerate(texts)))
    return path


def write_imagefolder(root: Path, per_class: int = 12, classes: int = 3, side: int = 24, seed: int = 0) -> Path:
    """JPEGs whose class is a colour (red, green, blue dominant) with noise: learnable, and really encoded."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    for c in range(classes):
        folder = root / f"class_{c}"
        folder.mkdir(parents=True, exist_ok=True)
        for k in range(per_class):
            pixels = rng.integers(0, 110, (side, side, 3), dtype=np.uint8)
            pixels[..., c % 3] += 140
            Image.fromarray(pixels).save(folder / f"img_{k:03d}.jpg", quality=90)
    return root
