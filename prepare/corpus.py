"""Write a real small corpus into the token-shard format: the byte tokens of Python's standard library.

    python -m prepare.corpus --out DIR [--val-fraction 0.05] [--max-bytes 8000000] [--shard-bytes 4000000]

DIR/train and DIR/validation each get a meta.json and `shard-NNNNN.bin` files (uint16 byte values,
vocab 256). Files are read in sorted order and split by file, so the output is the same on every run
with the same Python; validation takes every k-th file, so both splits cover the whole library.
"""

from __future__ import annotations

import argparse
import json
import sys
import sysconfig
from pathlib import Path

from prepare.staging import StagedFolder, interrupted, written_whole

BYTE_VOCAB = 256


def stdlib_sources() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    return sorted(p for p in root.rglob("*.py") if "site-packages" not in p.parts and "test" not in p.parts)


def as_uint16(data: bytes) -> bytes:
    """Each byte as a uint16 in this machine's byte order (numpy's "uint16", as the reader maps the shards). Without
    numpy: `trainctl local` points a `[cli]` install, which has none, here to make its data."""
    wide = bytearray(2 * len(data))
    wide[0 if sys.byteorder == "little" else 1 :: 2] = data
    return bytes(wide)


def write_split(files: list[Path], out: Path, shard_bytes: int) -> int:
    """`files`' bytes as token shards in `out` (a split's staged folder: prepare.staging)."""
    out.mkdir(parents=True, exist_ok=True)
    shard, size, index, total = [], 0, 0, 0

    def flush() -> None:
        nonlocal shard, size, index
        if shard:
            (out / f"shard-{index:05d}.bin").write_bytes(as_uint16(b"".join(shard)))
            shard, size, index = [], 0, index + 1

    for path in files:
        data = path.read_bytes() + b"\n"
        shard.append(data)
        size += len(data)
        total += len(data)
        if size >= shard_bytes:
            flush()
    flush()
    meta = {"format": "tokens", "dtype": "uint16", "vocab_size": BYTE_VOCAB, "tokenizer": "bytes",
            "source": "python-stdlib", "tokens": total}
    (out / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    return total


def prepare(out: Path, val_fraction: float = 0.05, max_bytes: int = 8_000_000, shard_bytes: int = 4_000_000) -> dict:
    if not 0 < val_fraction < 1:
        raise SystemExit("error: --val-fraction must be between 0 and 1, e.g. 0.05")
    files, budget = [], 0
    for path in stdlib_sources():
        if budget >= max_bytes:
            break
        files.append(path)
        budget += path.stat().st_size
    every = max(2, round(1 / val_fraction))
    val = files[every - 1 :: every]
    train = [f for i, f in enumerate(files) if (i + 1) % every]
    if not val:  # a split of no file would be a channel of no tokens, which the job refuses only once it started
        raise SystemExit(f"error: --max-bytes {max_bytes} reads {len(files)} source file(s), too few for a validation "
                         f"split of every {every}th file: raise --max-bytes or --val-fraction")
    staged = {name: StagedFolder(out / name) for name in ("train", "validation")}
    return written_whole(list(staged.values()), lambda: {
        "train": write_split(train, staged["train"].path, shard_bytes),
        "validation": write_split(val, staged["validation"].path, shard_bytes)})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m prepare.corpus", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder to write train/ and validation/ into")
    parser.add_argument("--val-fraction", type=float, default=0.05)
    parser.add_argument("--max-bytes", type=int, default=8_000_000, help="stop reading sources after this much")
    parser.add_argument("--shard-bytes", type=int, default=4_000_000)
    args = parser.parse_args(argv)
    try:
        counts = prepare(args.out, args.val_fraction, args.max_bytes, args.shard_bytes)
    except KeyboardInterrupt:
        return interrupted(args.out)
    print(f"wrote {counts['train']:,} train and {counts['validation']:,} validation byte tokens to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
