"""File checksums for checkpoint markers: GiB/s of each candidate, side by side, on one temp file.

Each candidate reads the file the way training.checkpoint.markers would (chunked `readinto` a reused buffer, or
`hashlib.file_digest`) and hashes it; "read only" is the same loop without hashing, the floor every candidate
pays. The file is written first and read once before timing, so it sits in the page cache, as a checkpoint
just written does (the save-side cost); pass --cold to drop it from the cache before each candidate
(`posix_fadvise DONTNEED`: the restore-side cost, disk-bound). The standard library's are always measured;
google-crc32c and xxhash only when importable (neither ships in the SageMaker PyTorch image).

    python -m bench.checksum                  # 1 GiB, page cache
    python -m bench.checksum --gib 4 --cold --dir /opt/ml/checkpoints
"""

from __future__ import annotations

import argparse
import hashlib
import os
import tempfile
import time
import zlib
from collections.abc import Callable

CHUNK = 8 << 20  # training.checkpoint.markers' read size


def chunked(update: Callable[[memoryview], None]) -> Callable[[str], None]:
    def run(path: str) -> None:
        buf = bytearray(CHUNK)
        view = memoryview(buf)
        with open(path, "rb", buffering=0) as f:
            while n := f.readinto(buf):
                update(view[:n])
    return run


def running(fn: Callable[[memoryview, int], int]) -> Callable[[str], None]:
    """A zlib-style checksum that carries its value from chunk to chunk."""
    def run(path: str) -> None:
        value = 0

        def update(data: memoryview) -> None:
            nonlocal value
            value = fn(data, value)
        chunked(update)(path)
    return run


def hashlib_chunked(name: str) -> Callable[[str], None]:
    def run(path: str) -> None:
        h = hashlib.new(name)
        chunked(h.update)(path)
    return run


def hashlib_file_digest(name: str) -> Callable[[str], None]:
    def run(path: str) -> None:
        with open(path, "rb") as f:
            hashlib.file_digest(f, name)
    return run


def candidates() -> dict[str, Callable[[str], None]]:
    found: dict[str, Callable[[str], None]] = {
        "read only": chunked(lambda data: None),
        "zlib.crc32": running(zlib.crc32),
        "zlib.adler32": running(zlib.adler32),
    }
    for name in ("md5", "sha1", "sha256", "blake2b"):
        found[f"hashlib {name}"] = hashlib_chunked(name)
        found[f"hashlib.file_digest {name}"] = hashlib_file_digest(name)
    try:
        import google_crc32c

        # Its C entry takes bytes only: a copy of each chunk (a memcpy, cheap next to the hashing).
        found["google_crc32c (dependency)"] = running(lambda data, value: google_crc32c.extend(value, bytes(data)))
    except ImportError:
        pass
    try:
        import xxhash

        def xxh3(path: str) -> None:
            h = xxhash.xxh3_64()
            chunked(h.update)(path)
        found["xxhash xxh3_64 (dependency)"] = xxh3
    except ImportError:
        pass
    return found


def write_file(path: str, gib: float) -> int:
    size = int(gib * (1 << 30))
    block = os.urandom(64 << 20)  # random bytes: nothing for a filesystem or cache to compress
    with open(path, "wb") as f:
        left = size
        while left > 0:
            f.write(block[:min(left, len(block))])
            left -= len(block)
    return size


def drop_cache(path: str) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


def measure(run: Callable[[str], None], path: str, repeats: int, cold: bool) -> float:
    """The best of `repeats` runs, in seconds."""
    best = float("inf")
    for _ in range(repeats):
        if cold:
            drop_cache(path)
        t0 = time.perf_counter()
        run(path)
        best = min(best, time.perf_counter() - t0)
    return best


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gib", type=float, default=1.0, help="size of the temp file in GiB")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--cold", action="store_true", help="drop the file from the page cache before each run")
    p.add_argument("--dir", default=None, help="folder for the temp file (default: the system's temp folder)")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        path = os.path.join(tmp, "payload.bin")
        size = write_file(path, args.gib)
        chunked(lambda data: None)(path)  # warm the page cache
        print(f"{size / (1 << 30):.2f} GiB, {'cold' if args.cold else 'page cache'}, best of {args.repeats}")
        print(f"{'candidate':34} {'GiB/s':>7} {'s/GiB':>7}")
        for name, run in candidates().items():
            seconds = measure(run, path, args.repeats, args.cold)
            rate = size / (1 << 30) / seconds
            print(f"{name:34} {rate:7.2f} {1 / rate:7.3f}", flush=True)


if __name__ == "__main__":
    main()
