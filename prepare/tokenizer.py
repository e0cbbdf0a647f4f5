"""The tokenizer that ships: a byte-level BPE (GPT-2's scheme) of 8,192 tokens and `<|endoftext|>`, trained with
Hugging Face tokenizers on Python's standard library, the corpus every Python already has (prepare.corpus reads the
same files). Built on first use, the same on every run with the same Python (files in sorted order, a fixed byte
budget), and kept in ~/.cache/trainctl ($XDG_CACHE_HOME/trainctl when set): bringing one's own text then needs no
tokenizer of one's own (`python -m prepare.text FILES --out DIR` uses it when --tokenizer is not given).

    python -m prepare.tokenizer --out tokenizer.json    # a copy, to ship with a dataset or look at
"""

from __future__ import annotations

import argparse
import os
import shutil
from collections.abc import Iterable
from pathlib import Path

from prepare.corpus import stdlib_sources

VOCAB_SIZE = 8192
EOS = "<|endoftext|>"
TRAINING_BYTES = 4_000_000  # of the standard library's sources, in sorted order: seconds to train, stable merges


def train_bpe(texts: Iterable[str], vocab_size: int, path: Path) -> Path:
    """A byte-level BPE tokenizer.json of `vocab_size` tokens (EOS included) trained on `texts`, written to `path`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(texts, trainer)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    tokenizer.save(str(partial))
    partial.replace(path)  # whole or not at all: an interrupted build leaves no half a tokenizer
    return path


def _stdlib_texts(budget: int) -> Iterable[str]:
    read = 0
    for source in stdlib_sources():
        if read >= budget:
            return
        text = source.read_text(encoding="utf-8", errors="replace")
        read += len(text)
        yield text


def default_path() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "trainctl" / f"tokenizer-stdlib-{VOCAB_SIZE}.json"


def default_tokenizer(budget: int = TRAINING_BYTES) -> Path:
    """The shipped tokenizer's file, built there on first use."""
    path = default_path()
    if not path.is_file():
        print(f"[prepare] building the shipped tokenizer (byte-level BPE, {VOCAB_SIZE:,} tokens, on Python's standard "
              f"library) into {path}", flush=True)
        train_bpe(_stdlib_texts(budget), VOCAB_SIZE, path)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m prepare.tokenizer", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="where to write the tokenizer.json")
    args = parser.parse_args(argv)
    shutil.copyfile(default_tokenizer(), args.out)
    print(f"wrote the shipped tokenizer ({VOCAB_SIZE:,} tokens, end of text {EOS}) to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
