"""Every bad input names itself: one failure line naming the file, the value found and the fix, exit 2, and no
traceback. Each case writes a tiny channel that is wrong in one way and runs the entry script's `main` in this
process; every one fails before the first step."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from contract.failures import FailureCode, parse_failure_line
from tests.training.helpers import SEQ, write_tokens
from training.train import main

DATA, CONFIG = FailureCode.DATA_MISSING, FailureCode.CONFIG_INVALID
IMAGE = 16  # a ViT/tiny (patch 8) at 16 x 16 pixels, 3 channels, 10 classes
IMAGE_META = {"format": "images", "image_size": IMAGE, "channels": 3, "num_classes": 10}


def tokens(n: int) -> np.ndarray:
    return np.arange(n) % 64


def token_channel(root: Path, shards: list[np.ndarray] | None = None) -> Path:
    """A good token channel: 2 shards of 8 windows of SEQ + 1 tokens."""
    return write_tokens(root, shards if shards is not None else [tokens(SEQ * 8 + 1), tokens(SEQ * 8 + 1)])


def set_meta(channel: Path, text: str) -> Path:
    (channel / "meta.json").write_text(text)
    return channel / "meta.json"


def image_channel(root: Path, n: int = 8, shape: tuple[int, ...] = (IMAGE, IMAGE, 3), labels: int | None = None,
                  meta: dict | None = None) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    np.save(root / "images-00000.npy", np.zeros((n, *shape), dtype=np.uint8))
    np.save(root / "labels-00000.npy", np.arange(n if labels is None else labels) % 10)
    (root / "meta.json").write_text(json.dumps(meta or IMAGE_META))
    return root


# Each case: the channels it writes under `root` -> (arguments, the file the message must name, its code,
# what else the message says). Token runs are gpt/tiny at seq_len SEQ; image runs vit/tiny.
def empty_shard_among_others(root):
    train = token_channel(root / "train", [tokens(SEQ * 8 + 1), np.zeros(0)])
    return [], train / "shard-00001.bin", DATA, ["is empty (0 bytes)", "rewrite it"]


def only_shard_empty(root):
    train = token_channel(root / "train", [np.zeros(0)])
    return [], train / "shard-00000.bin", DATA, ["0 bytes", "only shard"]


def meta_not_json(root):
    return [], set_meta(token_channel(root / "train"), '{"format": "tokens",'), CONFIG, ["is not JSON", "prepare"]


def meta_not_an_object(root):
    return [], set_meta(token_channel(root / "train"), '["tokens"]'), CONFIG, ["JSON list, not an object"]


def meta_without_format(root):
    meta = set_meta(token_channel(root / "train"), '{"dtype": "uint16"}')
    return [], meta, CONFIG, ['has no "format"', "'tokens', 'images'"]


def meta_unknown_format(root):
    meta = set_meta(token_channel(root / "train"), '{"format": "text"}')
    return [], meta, CONFIG, ["format 'text'", "'tokens', 'images'"]


def images_for_the_decoder(root):
    return [], image_channel(root / "train") / "meta.json", CONFIG, ["format 'images'", "the decoder reads tokens"]


def vocab_size_not_a_number(root):
    meta = set_meta(token_channel(root / "train"), '{"format": "tokens", "vocab_size": "many"}')
    return [], meta, CONFIG, ["vocab_size 'many'", "positive integer"]


def odd_bytes_for_uint16(root):
    train = token_channel(root / "train")
    with open(train / "shard-00001.bin", "ab") as f:
        f.write(b"\0")  # half a token: a cut copy
    size = (SEQ * 8 + 1) * 2 + 1
    return [], train / "shard-00001.bin", CONFIG, [f"{size} bytes, not a multiple of 2", "uint16", "rewrite it"]


def unknown_dtype(root):
    meta = set_meta(token_channel(root / "train"), '{"format": "tokens", "dtype": "uint17"}')
    return [], meta, CONFIG, ["dtype 'uint17'", '"uint16"']


def float_dtype(root):
    meta = set_meta(token_channel(root / "train"), '{"format": "tokens", "dtype": "float32"}')
    return [], meta, CONFIG, ["dtype 'float32'", "not an integer type"]


def images_and_labels_disagree(root):
    train = image_channel(root / "train", n=8, labels=7)
    return ["--model", "vit"], train / "labels-00000.npy", CONFIG, ["shape 7", "for 8 images", "one integer label"]


def labels_file_missing(root):
    train = image_channel(root / "train")
    (train / "labels-00000.npy").unlink()
    return ["--model", "vit"], train / "labels-00000.npy", DATA, ["is missing", "labels-NNNNN.npy beside it"]


def image_shape_not_the_meta(root):
    train = image_channel(root / "train", shape=(IMAGE, IMAGE, 1))
    return ["--model", "vit"], train / "images-00000.npy", CONFIG, [f"8 x {IMAGE} x {IMAGE} x 1",
                                                                     f"uint8 N x {IMAGE} x {IMAGE} x 3"]


def validation_image_size_not_the_train(root):
    image_channel(root / "train")
    val = image_channel(root / "validation", shape=(8, 8, 3), meta={**IMAGE_META, "image_size": 8})
    return (["--model", "vit", "--validation_dir", str(val)], val / "meta.json", CONFIG,
            ["8 x 8 x 3 but the model takes 16 x 16 x 3", "train channel's image_size"])


def label_beyond_the_classes(root):
    train = image_channel(root / "train", meta={**IMAGE_META, "num_classes": 4})
    return ["--model", "vit"], train / "labels-00000.npy", CONFIG, ["labels 0..7, outside 0..3", "num_classes 4"]


def validation_smaller_than_a_global_batch(root):
    token_channel(root / "train")
    val = token_channel(root / "validation", [tokens(SEQ * 3 + 1)])  # 3 windows; the global batch is 4
    return (["--validation_dir", str(val), "--eval_interval", "2"], val, CONFIG,
            [f"the channel {val}, holds 3 samples, fewer than one global batch (4 = micro_batch_size 4 x 1 ranks",
             "add validation data", "eval_interval=0"])


def train_smaller_than_a_global_batch(root):
    token_channel(root / "train", [tokens(SEQ * 3 + 1)])
    return [], None, CONFIG, [f"the channel {root / 'train'} has 3 samples, fewer than one global batch (4)",
                              "global_batch_size"]


CASES = [empty_shard_among_others, only_shard_empty, meta_not_json, meta_not_an_object, meta_without_format,
         meta_unknown_format, images_for_the_decoder, vocab_size_not_a_number, odd_bytes_for_uint16, unknown_dtype,
         float_dtype, images_and_labels_disagree, labels_file_missing, image_shape_not_the_meta,
         validation_image_size_not_the_train, label_beyond_the_classes, validation_smaller_than_a_global_batch,
         train_smaller_than_a_global_batch]


@pytest.mark.parametrize("case", CASES, ids=[c.__name__ for c in CASES])
def test_a_bad_input_is_one_line_naming_it_and_exit_2(case, tmp_path, monkeypatch, capsys):
    args, names, code, says = case(tmp_path / "data")
    monkeypatch.setenv("SM_OUTPUT_DATA_DIR", str(tmp_path / "output" / "data"))
    monkeypatch.setenv("SM_CHANNEL_TRAIN", str(tmp_path / "data" / "train"))
    monkeypatch.delenv("SM_CHANNEL_VALIDATION", raising=False)
    run = ["--seq_len", str(SEQ), "--micro_batch_size", "4", "--max_steps", "2", "--checkpoint_interval", "0",
           "--checkpoint_dir", str(tmp_path / "checkpoints"), "--model_dir", str(tmp_path / "model")]
    assert main([*run, *args]) == 2
    lines = (tmp_path / "output" / "failure").read_text().splitlines()
    assert len(lines) == 1
    found, message = parse_failure_line(lines[0])
    assert found is code, message
    for text in ([str(names)] if names else []) + says:
        assert text in message, f"{text!r} not in {message!r}"
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("error: ") == 1
    assert not (tmp_path / "model").exists()  # refused before training
