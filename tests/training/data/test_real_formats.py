"""Formats teams keep their data in, through `trainctl local`'s engine: JSONL text tokenized at prepare time by a
Hugging Face tokenizer trained here (no network), and JPEGs from an ImageFolder tree in WebDataset tar shards."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from cli.container_emulator import run_local
from prepare.images import prepare_images
from prepare.text import prepare_text
from tests.training.formats import documents, train_tokenizer, write_imagefolder, write_jsonl
from tests.training.helpers import config, create_request, spawn, weights
from training.data.datasets import TokenDataset
from training.data.loader import BatchSource
from training.data.sampler import GlobalBatchSampler
from training.data.tar_shards import TarImageDataset

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def text_corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("text")
    docs = documents(240)
    tokenizer = train_tokenizer(root / "tokenizer.json", docs)
    write_jsonl(root / "docs.jsonl", docs)
    prepare_text([root / "docs.jsonl"], tokenizer, root / "tokens", val_fraction=0.1)
    return root


@pytest.fixture(scope="module")
def jpeg_shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """36 JPEGs of 3 colour classes from an ImageFolder tree, in tar shards of 10: train 27, validation 9."""
    root = tmp_path_factory.mktemp("jpegs")
    write_imagefolder(root / "imagefolder")
    prepare_images(root / "imagefolder", root / "shards", image_size=16, val_fraction=0.25, shard_samples=10)
    return root / "shards"


def metrics_of_dir(output: Path) -> list[dict]:
    return [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]


def metrics_of(work: Path) -> list[dict]:
    """A `trainctl local` run's metrics: its output data folder is work/output/data."""
    return metrics_of_dir(work / "output" / "data")


def test_jsonl_tokenized_by_a_real_tokenizer_is_the_token_format_the_gpt_reads(text_corpus):
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(text_corpus / "tokenizer.json"))
    meta = json.loads((text_corpus / "tokens" / "train" / "meta.json").read_text())
    assert meta["vocab_size"] == tokenizer.get_vocab_size() > 256 and meta["dtype"] == "uint16"
    assert meta["tokenizer"]["eos_token"] == "<|endoftext|>" and len(meta["tokenizer"]["sha256"]) == 64
    # The shards hold the tokenizer's own ids, documents in order, each ended by the end-of-text id: the first
    # training document (every 10th goes to validation) decodes back to its text.
    ids = np.fromfile(text_corpus / "tokens" / "train" / "shard-00000.bin", dtype=np.uint16).tolist()
    eos = tokenizer.token_to_id("<|endoftext|>")
    assert tokenizer.decode(ids[: ids.index(eos)]) == documents(240)[0]
    assert meta["documents"] == 216 and ids.count(eos) == 216
    assert len(TokenDataset(text_corpus / "tokens" / "train", 16)) > 50


@pytest.mark.trainctl_local
def test_a_tiny_gpt_trains_on_jsonl_text_through_trainctl_local(text_corpus, tmp_path, capfd):
    hps = {"strategy": "single", "model": "gpt", "model_size": "tiny", "max_steps": 12, "micro_batch_size": 8,
           "seq_len": 16, "log_interval": 1, "lr": 0.01, "warmup_steps": 0, "eval_interval": 12, "seed": 3}
    data = {"train": text_corpus / "tokens" / "train", "validation": text_corpus / "tokens" / "validation"}
    assert run_local(create_request(hps), workdir=tmp_path, nproc=1, data_dirs=data) == 0
    losses = [m["train_loss"] for m in metrics_of(tmp_path) if "train_loss" in m]
    assert len(losses) == 12 and losses[-1] < losses[0] - 0.5
    # auto: memory-mapped tokens stay on the training thread.
    assert "0 loader worker(s) per rank (data_workers=auto)" in capfd.readouterr().out
    config = json.loads((tmp_path / "model" / "config.json").read_text())
    assert config["vocab_size"] == json.loads((text_corpus / "tokens" / "train" / "meta.json").read_text())["vocab_size"]


def test_parquet_reads_the_named_column_and_mistakes_name_the_file_the_value_and_the_fix(text_corpus, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    tokenizer = text_corpus / "tokenizer.json"
    pq.write_table(pa.table({"body": documents(30), "n": list(range(30))}), tmp_path / "t.parquet",
                   row_group_size=7)  # several row groups, read in order
    done = prepare_text([tmp_path / "t.parquet"], tokenizer, tmp_path / "pq", field="body", val_fraction=0)
    assert done["documents"] == 30 and not (tmp_path / "pq" / "validation").exists()
    via_jsonl = prepare_text([write_jsonl(tmp_path / "same.jsonl", documents(30))], tokenizer, tmp_path / "js",
                             val_fraction=0)
    assert (tmp_path / "pq/train/shard-00000.bin").read_bytes() == (tmp_path / "js/train/shard-00000.bin").read_bytes()
    assert via_jsonl["counts"] == done["counts"]

    def error(*args, **kwargs) -> str:
        with pytest.raises(SystemExit) as info:
            prepare_text(*args, **kwargs)
        return str(info.value)

    assert error([tmp_path / "t.parquet"], tokenizer, tmp_path / "x") == (
        f"error: {tmp_path / 't.parquet'} has no column 'text' (its columns: body, n): set --field to the column "
        "that holds the text")
    assert "column 'n' holds int64, not strings" in error([tmp_path / "t.parquet"], tokenizer, tmp_path / "x",
                                                            field="n")
    (tmp_path / "bad.jsonl").write_text('{"text": "fine"}\n{"body": "x"}\n')
    assert error([tmp_path / "bad.jsonl"], tokenizer, tmp_path / "x") == (
        f"error: {tmp_path / 'bad.jsonl'}:2 has no string field 'text' (its keys are ['body']): set --field to the "
        "key that holds the text")
    assert "is not a Hugging Face tokenizer.json" in error([tmp_path / "bad.jsonl"], tmp_path / "bad.jsonl",
                                                            tmp_path / "x")
    assert "--eos-token '<nope>' is not in the tokenizer's vocabulary" in error(
        [tmp_path / "t.parquet"], tokenizer, tmp_path / "x", field="body", eos_token="<nope>")
    (tmp_path / "a.csv").write_text("text\nhello\n")
    assert "a.csv has the suffix '.csv': give .jsonl" in error([tmp_path / "a.csv"], tokenizer, tmp_path / "x")


def test_imagefolder_jpegs_become_webdataset_tar_shards(jpeg_shards, tmp_path):
    import tarfile

    meta = json.loads((jpeg_shards / "train" / "meta.json").read_text())
    assert meta == {**meta, "format": "webdataset", "num_classes": 3, "image_size": 16, "channels": 3,
                    "classes": ["class_0", "class_1", "class_2"], "samples": 27}
    with tarfile.open(jpeg_shards / "train" / "00000.tar") as tar:
        names = tar.getnames()
        first = tar.extractfile(names[0]).read()
    # WebDataset's layout: KEY.jpg then KEY.cls, the JPEG's own bytes (not re-encoded).
    assert names[:2] == ["00000000.jpg", "00000000.cls"] and first[:3] == b"\xff\xd8\xff"
    train = TarImageDataset(jpeg_shards / "train", meta, seed=1)
    assert len(train) == 27 and sorted(set(train.index[:, 3].tolist())) == [0, 1, 2]
    x, y = train.batch([0, 1, 2, 3], epoch=0)
    assert x.shape == (4, 3, 16, 16) and -1 <= x.min() < x.max() <= 1
    # Decoded colours carry the class: the labelled channel is the brightest.
    assert x.mean(dim=(2, 3)).argmax(dim=1).tolist() == y.tolist()
    # Augmentation is a function of (seed, epoch, sample): the same again, another epoch another crop; none in
    # validation.
    assert x.equal(train.batch([0, 1, 2, 3], epoch=0)[0]) and not x.equal(train.batch([0, 1, 2, 3], epoch=1)[0])
    val = TarImageDataset(jpeg_shards / "validation", meta, augment=False)
    assert val.batch([0], epoch=0)[0].equal(val.batch([0], epoch=5)[0])


def test_broken_shards_and_image_folders_are_named_with_the_fix(jpeg_shards, tmp_path):
    import io
    import tarfile

    from contract.errors import ConfigError

    meta = {"format": "webdataset", "num_classes": 3, "image_size": 16, "channels": 3}
    bad = tmp_path / "nolabel"
    bad.mkdir()
    with tarfile.open(bad / "00000.tar", "w") as tar:
        info = tarfile.TarInfo("a.jpg")
        info.size = 3
        tar.addfile(info, io.BytesIO(b"abc"))
    with pytest.raises(ConfigError, match=r"00000.tar: 1 image\(s\) have no .cls label, e.g. a: write a a.cls"):
        TarImageDataset(bad, meta)
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    with tarfile.open(corrupt / "00000.tar", "w") as tar:
        for name, data in (("a.jpg", b"\xff\xd8\xff not really"), ("a.cls", b"1")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    dataset = TarImageDataset(corrupt, meta)
    # A sample that fails to decode at run time is one line naming the shard and the sample, from the training
    # thread and from a worker alike (not the worker's traceback).
    for workers in (0, 1):
        source = BatchSource(dataset, GlobalBatchSampler(1, 1, 0, 1, seed=0), 1, torch.device("cpu"), workers)
        with pytest.raises(ConfigError) as info:
            source.next()
        source.close()
        assert str(info.value).startswith(f"{corrupt / '00000.tar'}: sample 0 (14 bytes at offset 512) is not a "
                                          "decodable image (no image format recognised): rewrite the shard from its "
                                          "source images")
    with pytest.raises(ConfigError, match=r"holds label 2, outside 0..1 \(num_classes 2 in"):
        TarImageDataset(jpeg_shards / "train", {**meta, "num_classes": 2})
    (tmp_path / "tree" / "cats").mkdir(parents=True)
    (tmp_path / "tree" / "cats" / "x.jpg").write_bytes(b"not a jpeg")
    with pytest.raises(SystemExit, match=r"x.jpg is not a readable image .*: remove or replace it"):
        prepare_images(tmp_path / "tree", tmp_path / "out", 16)
    with pytest.raises(SystemExit, match=r"--imagefolder .*nope: no such folder"):
        prepare_images(tmp_path / "nope", tmp_path / "out", 16)


@pytest.mark.trainctl_local
def test_a_tiny_vit_trains_on_jpeg_tar_shards_through_trainctl_local(jpeg_shards, tmp_path, capfd):
    hps = {"strategy": "single", "model": "vit", "model_size": "tiny", "max_steps": 10, "micro_batch_size": 9,
           "log_interval": 1, "lr": 0.003, "warmup_steps": 0, "eval_interval": 10, "eval_batches": 1, "seed": 3}
    data = {"train": jpeg_shards / "train", "validation": jpeg_shards / "validation"}
    assert run_local(create_request(hps), workdir=tmp_path, nproc=1, data_dirs=data) == 0
    records = metrics_of(tmp_path)
    losses = [m["train_loss"] for m in records if "train_loss" in m]
    assert len(losses) == 10 and losses[-1] < losses[0]
    assert any("val_loss" in m for m in records)
    config = json.loads((tmp_path / "model" / "config.json").read_text())
    assert config["image_size"] == 16 and config["num_classes"] == 3
    # auto: JPEG decoding gets worker processes (min(4, CPUs - 1), at least 1).
    workers = re.search(r"(\d+) loader worker\(s\) per rank \(data_workers=auto\)", capfd.readouterr().out)
    assert workers and int(workers.group(1)) >= 1
    assert all("data_wait_ms" in m for m in records if "train_loss" in m)


def vit_run(root: Path, shards: Path, **overrides) -> dict:
    values = dict(model="vit", train_dir=str(shards / "train"), validation_dir="", micro_batch_size=3, max_steps=6,
                  lr=3e-3, warmup_steps=0, log_interval=1, seed=11)
    return vars(config(root, shards, **{**values, **overrides}))


def test_a_stop_and_resume_with_workers_is_bit_identical_on_two_ranks(jpeg_shards, tmp_path):
    """2 gloo ranks, DDP, 2 loader workers each, 27 JPEGs in global batches of 6 (an epoch is 4 steps, so the run
    crosses one and its new crops): stopped at step 3 and resumed it ends on the straight run's weights, and
    both on the weights of a run that builds its batches on the training thread."""
    ddp = {"strategy": "ddp"}
    straight = vit_run(tmp_path / "straight", jpeg_shards, data_workers=2, **ddp)
    resumed = vit_run(tmp_path / "resumed", jpeg_shards, data_workers=2, **ddp)
    inline = vit_run(tmp_path / "inline", jpeg_shards, data_workers=0, **ddp)
    spawn(2, [(straight, None), (resumed, 3), (resumed, None), (inline, None)])
    assert (tmp_path / "resumed" / "checkpoints" / "step-3").is_dir()
    reference = weights(tmp_path / "straight")
    for other in ("resumed", "inline"):
        got = weights(tmp_path / other)
        assert all(torch.equal(got[k], reference[k]) for k in reference), other


def test_workers_deliver_the_samples_the_sampler_names_across_a_changed_world_size(jpeg_shards):
    """A position saved by 2 ranks at step 3 resumes on 1 rank with workers: the loader's batches are exactly
    the ones the 2 ranks would have read next, pooled, in order (the loader checks every key against the
    sampler and would raise on a drift)."""
    meta = json.loads((jpeg_shards / "train" / "meta.json").read_text())
    data = TarImageDataset(jpeg_shards / "train", meta, seed=2)
    two = [GlobalBatchSampler(len(data), 6, r, 2, seed=2) for r in range(2)]
    for sampler in two:
        for _ in range(3):
            sampler.next_indices()
    one = GlobalBatchSampler(len(data), 6, 0, 1, seed=2)
    one.load_state_dict(two[0].state_dict())
    source = BatchSource(data, one, 3, torch.device("cpu"), workers=2)
    try:
        for _ in range(3):  # crosses into epoch 1
            expected = [i for s in two for i in s.next_indices()]
            epoch = two[0].epoch
            batches = source.next()
            assert len(batches) == 2 and source.data_wait_s > 0
            x = torch.cat([b[0] for b in batches])
            assert x.equal(data.batch(expected, epoch)[0])
    finally:
        source.close()
    assert one.state_dict() == {**two[0].state_dict(), "batch": two[0].batch}


SHARE = 0.01  # the test's input_bound_share (see the docstring below)


def test_a_slow_decode_makes_the_run_input_bound_and_workers_take_the_wait_off_the_step(jpeg_shards, tmp_path,
                                                                                          monkeypatch, capsys):
    """The test hook sleeps 15 ms per decoded image: 9 images a step wait ~135 ms on the training thread, and
    the log names the run input bound with its rates; 2 workers decode ahead while the step runs.

    The sleeps set a floor under the waits whatever the machine's load; the steps' compute does not (a loaded
    machine made it 0.7 s, under a share of 0.1). So the bound lines are checked against the records' own shares,
    at a threshold (0.01) that only a step of over 13 s could keep every step under."""
    from training.loop import train
    from training.parallel.process_group import setup
    from training.resilience.stop import StopFlag

    monkeypatch.setenv("TRAINING_TEST_SLOW_DECODE_S", "0.015")
    waits, outputs, shares = {}, {}, {}
    for workers in (0, 2):
        cfg = config(tmp_path / f"w{workers}", jpeg_shards, **{**vit_run(tmp_path / f"w{workers}", jpeg_shards),
                                                                "micro_batch_size": 9, "max_steps": 8,
                                                                "data_workers": workers,
                                                                "input_bound_share": SHARE})
        train(cfg, setup(cfg), StopFlag())
        outputs[workers] = capsys.readouterr().out
        records = metrics_of_dir(tmp_path / f"w{workers}" / "output")
        # From step 3: the first steps also wait for the workers to start.
        waits[workers] = np.mean([r["data_wait_ms"] for r in records if r["step"] >= 3])
        shares[workers] = {r["step"]: r["data_wait_share"] for r in records}
        lines = [line for line in outputs[workers].splitlines() if line.startswith("[metrics]")]
        assert all("data_wait_ms=" in line and "data_wait_share=" in line for line in lines)
    assert waits[0] > 9 * 15 * 0.9, waits  # every image's sleep, on the step's critical path
    assert waits[2] < waits[0] / 2, waits
    bound = [line for line in outputs[0].splitlines() if "input bound" in line]
    assert all("waited" in line and "samples/s" in line and "data_workers=0" in line for line in bound), bound
    named = {int(line.split("input bound at step ")[1].split(":")[0]) for line in bound}
    assert named == {step for step, share in shares[0].items() if share > SHARE} and len(named) >= 6, (named, shares)
    # The attempt's last metrics line carries the run's mean wait (SageMaker keeps each metric's last value).
    last = [line for line in outputs[0].splitlines() if line.startswith("[metrics]")][-1]
    assert "train_s=" in last and float(last.split("data_wait_ms=")[1].split()[0]) > 9 * 15 * 0.9
    print(f"slow decode: data_wait_ms {waits[0]:.1f} inline, {waits[2]:.1f} with 2 workers")
