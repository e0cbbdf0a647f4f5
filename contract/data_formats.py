"""The training package's data formats, how many loader workers `data_workers: auto` starts, and how fast one CPU
process loads a sample of each format: defined once for the loader (training.data.loader), the planner's input check
(jobs.planning.input_check) and the bench (bench.data prints these figures beside its fresh measurement).

Formats (each channel folder's meta.json says which; training/data/datasets.py reads them):
  tokens      uint16 token shards; a sample is a window of seq_len + 1 tokens (memory-mapped slice)
  images      uint8 .npy arrays, pre-decoded (memory-mapped slice)
  webdataset  tar shards of encoded images (JPEG) with labels, decoded and augmented per sample

Load rates (MEASURED): samples/s one process delivers, on the training thread (`data_workers=0`) and as one
worker process (`data_workers=1`: the decode plus the copy through shared memory), from `bench.data` on this
project's development machine: 2 vCPUs of an AMD EPYC family 25 model 17 (Zen 4) under KVM, 2026-11-27 06:24-06:25
UTC, load average 0.65-0.73 (another process held up to one core), one run per row:

    for s in "256 32 48" "1024 224 320" "4096 448 640"; do set -- $s
      python -m bench.data --workers 0 1 --steps 60 --seq-len $1 --image-size $2 --source-size $3; done

Each row is keyed by the quantity its time per sample grows with: tokens per sample, the stored image's pixels
(npy), the encoded image's pixels (webdataset: decoding touches every source pixel; the bench's JPEGs are 1.43x
the training side, 320 -> 224). Between rows the time per sample is interpolated linearly in that quantity,
beyond them extrapolated from the nearest two. Repeat runs on the same machine moved single cells by up to 30%
(640 -> 448 px: 111 and 180 per worker at load 0.7 and 1.2): these are the figures' error.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

TOKENS, IMAGES, WEBDATASET = "tokens", "images", "webdataset"
FORMATS = (TOKENS, IMAGES, WEBDATASET)
IMAGE_FORMATS = (IMAGES, WEBDATASET)
# The files that hold each format's samples in a channel folder (the readers glob them; trainctl local checks one is
# there before it starts anything).
SHARD_GLOBS = {TOKENS: "*.bin", IMAGES: "images-*.npy", WEBDATASET: "*.tar"}
# Formats whose samples are decoded: `data_workers: auto` gives them worker processes. The memory-mapped ones
# are faster on the training thread (a worker only adds the copy through shared memory: the rates below).
DECODED = (WEBDATASET,)

# data_workers auto: per rank, min(AUTO_MAX_WORKERS, CPUs per rank - 1) for decoded formats (one CPU stays with
# the rank's training thread), 0 for memory-mapped ones.
AUTO_MAX_WORKERS = 4


def auto_workers(data_format: str, cpus_per_rank: int) -> int:
    if data_format not in DECODED:
        return 0
    return max(1, min(AUTO_MAX_WORKERS, cpus_per_rank - 1))


# The bench's JPEGs are 320 px for a 224 px training side. A request names the training side only, so the planner
# takes encoded images to be this much larger (ImageNet's mean photo, ~400 x 350 for 224 training, is larger still).
JPEG_SOURCE_SCALE = 320 / 224
# Bytes per encoded pixel, for the input-bandwidth check: ImageNet-1k's training set is ~138 GB for 1.28M JPEGs
# of ~400 x 350 px, ~0.8 B/px (public figures, rounded). The bench's generated JPEGs (quality 90) measure 0.33 B/px:
# smoother than photos, so they are not used here.
JPEG_BYTES_PER_PIXEL = 0.8

# ASSUMPTION, not measured: one vCPU of a GPU instance loads at this fraction of the rate measured here. A GPU
# instance's vCPU is one hardware thread, two to a core, all busy when the loader is (p4d/p4de: Xeon 8275CL,
# Cascade Lake; p5/g6/g6e: EPYC 7R13, Zen 3; g5: EPYC 7R32, Zen 2), against a Zen 4 vCPU here: older cores
# (~0.75-0.9x per clock) and a shared core (SMT gives ~1.25x per core, ~0.6x per thread). Measure on the
# instance (`python -m bench.data --workers 0 4 8 ...` there) and change it here.
GPU_HOST_VCPU_RATIO = 0.5


@dataclass(frozen=True)
class LoadRate:
    work: int  # what the time per sample grows with: tokens per sample, or pixels (side x side) per image
    thread: float  # samples/s on the training thread (data_workers=0)
    worker: float  # samples/s one worker process delivers (data_workers=1)


MEASURED: dict[str, tuple[LoadRate, ...]] = {
    TOKENS: (LoadRate(256, 225_530, 31_896), LoadRate(1024, 214_165, 23_667), LoadRate(4096, 129_594, 11_133)),
    IMAGES: (LoadRate(32 * 32, 132_245, 18_059),
             LoadRate(224 * 224, 11_371, 3_186),
             LoadRate(448 * 448, 624, 585)),
    WEBDATASET: (LoadRate(48 * 48, 5_139, 3_058),
                 LoadRate(320 * 320, 694, 682),
                 LoadRate(640 * 640, 145, 111)),
}


def load_rate(data_format: str, work: float, worker: bool) -> float:
    """Samples/s one process of this machine loads a sample of `work` (tokens, or pixels) at: the time per sample
    interpolated between the measured rows (linear in `work`), extrapolated from the nearest two beyond them."""
    rows = MEASURED[data_format]
    times = [(r.work, 1 / (r.worker if worker else r.thread)) for r in rows]
    i = next((k for k in range(1, len(times) - 1) if work <= times[k][0]), len(times) - 1)
    (w0, t0), (w1, t1) = times[i - 1], times[i]
    seconds = t0 + (t1 - t0) * (work - w0) / (w1 - w0)
    return 1 / max(seconds, min(t0, t1) / 10)  # far below the first row: never faster than 10x its rate


# What a folder without a channel's meta.json holds, by its files' suffixes, and the preparer that makes it a
# channel (the training package's refusal and trainctl local's check before any process starts say the same).
_RAW_TEXT = (".jsonl", ".parquet")
_IMAGE_FILES = (".jpg", ".jpeg", ".png")


def how_to_prepare(folder: Path) -> str:
    """The preparer for a folder that is not yet a channel, from the names of its files and sub-folders (an
    unreadable folder reads as an empty one)."""
    try:
        entries = list(folder.iterdir())
    except OSError:
        entries = []
    names = [p.name for p in entries if p.is_file()]
    subfolders = [p.name for p in entries if p.is_dir()]
    suffixes = {n[n.rfind("."):].lower() for n in names if "." in n}
    if suffixes & set(_RAW_TEXT):
        return (f"{folder} holds raw text ({', '.join(sorted(suffixes & set(_RAW_TEXT)))}): tokenize it into a "
                f"channel first: python -m prepare.text {folder}/*.jsonl --tokenizer tokenizer.json --out DIR "
                "(give --data DIR)")
    if ".tar" in suffixes:
        return (f"{folder} holds tar shards but no meta.json: a webdataset channel needs one beside them (format, "
                "image_size, num_classes); python -m prepare.images --imagefolder ROOT --out DIR writes both")
    if suffixes & set(_IMAGE_FILES) or (subfolders and not names):
        return (f"{folder} looks like images (or an ImageFolder tree of class folders): make tar shards of them "
                f"first: python -m prepare.images --imagefolder {folder} --out DIR --image-size N (give --data DIR)")
    return ("write the channel with python -m prepare.corpus (byte tokens), prepare.text (JSONL or Parquet through a "
            "tokenizer) or prepare.images (an ImageFolder tree); each writes the meta.json a channel needs")
