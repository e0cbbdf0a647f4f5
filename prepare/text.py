"""Text in JSONL or Parquet, tokenized with a real tokenizer, written as the token-shard format (training.data.datasets).

    python -m prepare.text --tokenizer tokenizer.json --out DIR [--field text] [--eos-token TOKEN]
        [--val-fraction 0.05] [--shard-tokens 50000000] FILE [FILE ...]

FILEs are `*.jsonl` (one JSON object per line) or `*.parquet`; each document is the string in `--field`.
The tokenizer is a Hugging Face `tokenizers` file (`tokenizer.json`, as every model on the Hub ships one,
GPT-2's byte-level BPE, Llama's, or one trained with `tokenizers` itself). Why `tokenizers` and not tiktoken:
it reads any tokenizer.json from a local file, so a job's tokenizer is a file the team versions beside its
data, and it needs no network (tiktoken downloads its encodings on first use). Why pyarrow for Parquet: it is
the reference reader, and it streams row groups, so a large file is never read whole.

Tokenizing here, once, rather than in the training job keeps the job's input pipeline a memory-mapped slice
(the GPT path reads these shards unchanged) and makes the tokens a fixed artifact: the meta.json records the
tokenizer file's sha256. DIR/train and DIR/validation each get a meta.json and `shard-NNNNN.bin` files;
validation takes every k-th document, so both splits sample the whole corpus. Each document is followed by
the end-of-text token (`--eos-token`, default: the first of <|endoftext|>, </s>, [SEP], <eos> the vocabulary
has), so a window crossing two documents sees where one ends.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from prepare.staging import StagedFolder, interrupted, written_whole

EOS_CANDIDATES = ("<|endoftext|>", "</s>", "[SEP]", "<eos>")
ENCODE_BATCH = 1024  # documents per encode_batch call: the Rust side tokenizes a batch on every core
PROGRESS_EVERY = 100_000  # documents between progress lines (a large corpus takes minutes)


class PrepareError(SystemExit):
    """A user's mistake: one line naming the file or field, the value and the fix (no traceback)."""

    def __init__(self, message: str) -> None:
        super().__init__(f"error: {message}")


def load_tokenizer(path: Path):
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise PrepareError("the `tokenizers` package is missing: pip install -r requirements-train.txt") from None
    if not path.is_file():
        raise PrepareError(f"--tokenizer {path}: no such file; give a Hugging Face tokenizer.json")
    try:
        return Tokenizer.from_file(str(path))
    except Exception as e:  # the Rust side raises a bare Exception for a file it cannot parse
        raise PrepareError(f"--tokenizer {path} is not a Hugging Face tokenizer.json ({str(e)[:200]}): give the "
                           "tokenizer.json file a model ships, or one saved with tokenizers' Tokenizer.save") from None


def eos_id(tokenizer, token: str | None) -> tuple[str | None, int | None]:
    if token is not None:
        found = tokenizer.token_to_id(token)
        if found is None:
            raise PrepareError(f"--eos-token {token!r} is not in the tokenizer's vocabulary: give one it has "
                               f"(e.g. one of {', '.join(EOS_CANDIDATES)}), or leave the option out")
        return token, found
    for name in EOS_CANDIDATES:
        if (found := tokenizer.token_to_id(name)) is not None:
            return name, found
    return None, None


def read_documents(path: Path, field: str) -> Iterator[str]:
    """The documents of one file, in order."""
    if not path.is_file():
        raise PrepareError(f"{path}: no such file")
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".ndjson"):
        yield from _jsonl(path, field)
    elif suffix == ".parquet":
        yield from _parquet(path, field)
    else:
        raise PrepareError(f"{path} has the suffix {suffix or '(none)'!r}: give .jsonl (one JSON object a line) "
                           "or .parquet files")


def _jsonl(path: Path, field: str) -> Iterator[str]:
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError as e:
                raise PrepareError(f"{path}:{number} is not JSON ({e}): write one JSON object per line") from None
            text = record.get(field) if isinstance(record, dict) else None
            if isinstance(record, dict) and field in record and not isinstance(text, str):
                # The key is there; its value is not text: say what it holds, not that the key is missing.
                raise PrepareError(f"{path}:{number}: field {field!r} holds {_json_kind(text)} "
                                   f"({json.dumps(text)[:40]}), not a string: write the text as a JSON string, or set "
                                   "--field to the key that holds it")
            if not isinstance(text, str):
                has = f"its keys are {sorted(record)[:10]}" if isinstance(record, dict) else \
                    f"it is a JSON {type(record).__name__}"
                raise PrepareError(f"{path}:{number} has no string field {field!r} ({has}): set --field to the "
                                   "key that holds the text")
            yield text


def _json_kind(value: object) -> str:
    """What a decoded JSON value is, in JSON's words."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    return "an array" if isinstance(value, list) else "an object"


def _parquet(path: Path, field: str) -> Iterator[str]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise PrepareError("the `pyarrow` package is missing: pip install -r requirements-train.txt") from None
    try:
        parquet = pq.ParquetFile(path)
    except Exception as e:  # ArrowInvalid for a file that is not Parquet
        raise PrepareError(f"{path} is not a readable Parquet file ({str(e)[:200]})") from None
    columns = parquet.schema_arrow.names
    if field not in columns:
        raise PrepareError(f"{path} has no column {field!r} (its columns: {', '.join(columns[:20])}): set --field "
                           "to the column that holds the text")
    kind = parquet.schema_arrow.field(field).type
    import pyarrow as pa

    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        raise PrepareError(f"{path} column {field!r} holds {kind}, not strings: set --field to the text column")
    # Row group by row group: memory stays at one batch whatever the file's size.
    for batch in parquet.iter_batches(batch_size=ENCODE_BATCH, columns=[field]):
        for text in batch.column(0).to_pylist():
            if text is not None:  # a null row is an absent document, not an empty one
                yield text


class ShardWriter:
    """Token ids appended in order, cut into `shard-NNNNN.bin` files of about `shard_tokens` tokens, in the split's
    staged folder (prepare.staging: moved into place once every split is whole)."""

    def __init__(self, out: Path, dtype: np.dtype, shard_tokens: int) -> None:
        self.staged = StagedFolder(out)
        self.out, self.dtype, self.shard_tokens = self.staged.path, dtype, shard_tokens
        self.pending: list[np.ndarray] = []
        self.size = self.index = self.tokens = self.documents = 0

    def add(self, ids: list[int]) -> None:
        self.pending.append(np.asarray(ids, dtype=self.dtype))
        self.size += len(ids)
        self.tokens += len(ids)
        self.documents += 1
        if self.size >= self.shard_tokens:
            self.flush()

    def flush(self) -> None:
        if self.pending:
            np.concatenate(self.pending).tofile(self.out / f"shard-{self.index:05d}.bin")
            self.pending, self.size, self.index = [], 0, self.index + 1


def prepare_text(files: list[Path], tokenizer_path: Path, out: Path, field: str = "text",
                 eos_token: str | None = None, val_fraction: float = 0.05,
                 shard_tokens: int = 50_000_000, progress=None) -> dict:
    """Tokenize `files` into out/train and out/validation; returns the counts and the meta written. The splits are
    written beside their folders and moved into place at the end: an interruption (Ctrl-C) or an error leaves the
    folders as they were. `progress(line)` hears of each file and every PROGRESS_EVERY documents."""
    if not 0 <= val_fraction < 1:
        raise PrepareError(f"--val-fraction {val_fraction}: give a fraction in [0, 1), e.g. 0.05 (0: no validation)")
    if not files:
        raise PrepareError("no input files: give one or more .jsonl or .parquet files")
    tokenizer = load_tokenizer(tokenizer_path)
    vocab = tokenizer.get_vocab_size(with_added_tokens=True)
    # uint16 holds ids below 65,536 (GPT-2's 50,257): half the bytes of uint32, which larger vocabularies need.
    dtype = np.dtype(np.uint16 if vocab <= 1 << 16 else np.uint32)
    eos_name, eos = eos_id(tokenizer, eos_token)
    every = round(1 / val_fraction) if val_fraction else 0
    splits = {"train": ShardWriter(out / "train", dtype, shard_tokens)}
    if every:
        splits["validation"] = ShardWriter(out / "validation", dtype, shard_tokens)
    return written_whole([w.staged for w in splits.values()], lambda: _write_splits(
        files, tokenizer, tokenizer_path, field, splits, every, eos, eos_name, vocab, dtype, progress or print_nothing))


def print_nothing(line: str) -> None:
    pass


def _write_splits(files, tokenizer, tokenizer_path, field, splits, every, eos, eos_name, vocab, dtype,
                  progress) -> dict:
    total = sum(p.stat().st_size for p in files if p.is_file())
    read = 0

    def documents() -> Iterator[str]:
        nonlocal read
        for i, path in enumerate(files, 1):
            progress(f"[prepare] {path} ({i} of {len(files)}, {read / 2**20:,.0f} of {total / 2**20:,.0f} MiB read)")
            yield from read_documents(path, field)
            read += path.stat().st_size

    number = 0
    batch: list[str] = []

    def encode(texts: list[str]) -> None:
        nonlocal number
        for encoding in tokenizer.encode_batch(texts, add_special_tokens=False):
            ids = encoding.ids + ([eos] if eos is not None else [])
            number += 1
            split = "validation" if every and number % every == 0 else "train"
            splits[split].add(ids)
            if number % PROGRESS_EVERY == 0:
                progress(f"[prepare] {number:,} documents, {sum(w.tokens for w in splits.values()):,} tokens")

    for text in documents():
        batch.append(text)
        if len(batch) == ENCODE_BATCH:
            encode(batch)
            batch = []
    if batch:
        encode(batch)
    digest = hashlib.sha256(tokenizer_path.read_bytes()).hexdigest()
    counts = {}
    for name, writer in splits.items():
        writer.flush()
        if not writer.tokens:
            raise PrepareError(f"the {name} split got no tokens from {len(files)} file(s) ({number} documents): "
                               "give more documents, or a smaller --val-fraction")
        meta = {"format": "tokens", "dtype": dtype.name, "vocab_size": vocab,
                "tokenizer": {"file": tokenizer_path.name, "sha256": digest, "eos_token": eos_name},
                "source": [p.name for p in files], "field": field, "documents": writer.documents,
                "tokens": writer.tokens}
        (writer.out / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
        counts[name] = writer.tokens
    return {"counts": counts, "documents": number, "vocab_size": vocab, "dtype": dtype.name, "eos_token": eos_name}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m prepare.text", description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", type=Path, help=".jsonl or .parquet files, read in the order given")
    parser.add_argument("--tokenizer", type=Path, default=None,
                        help="a Hugging Face tokenizer.json file (default: the shipped one, prepare.tokenizer)")
    parser.add_argument("--out", type=Path, required=True, help="folder to write train/ and validation/ into")
    parser.add_argument("--field", default="text", help="the JSON key or Parquet column holding the text")
    parser.add_argument("--eos-token", default=None, help="token appended to every document")
    parser.add_argument("--val-fraction", type=float, default=0.05)
    parser.add_argument("--shard-tokens", type=int, default=50_000_000)
    args = parser.parse_args(argv)
    if args.tokenizer is None:
        from prepare.tokenizer import default_tokenizer

        args.tokenizer = default_tokenizer()
    try:
        done = prepare_text(args.files, args.tokenizer, args.out, args.field, args.eos_token, args.val_fraction,
                            args.shard_tokens, progress=lambda line: print(line, file=sys.stderr, flush=True))
    except KeyboardInterrupt:
        return interrupted(args.out)
    eos = done["eos_token"] or "none (the vocabulary has no end-of-text token; give --eos-token)"
    print(f"wrote {done['counts'].get('train', 0):,} train and {done['counts'].get('validation', 0):,} validation "
          f"tokens ({done['dtype']}, vocab {done['vocab_size']:,}, eos {eos}) from {done['documents']:,} "
          f"documents to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
