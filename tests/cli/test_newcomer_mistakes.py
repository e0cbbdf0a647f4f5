"""The mistakes a new user made trying trainctl from a fresh clone (issue 32), each answered with what is wrong and
the fix, never a traceback or a message about something else. Each test failed on the code before its fix."""

from __future__ import annotations

import pytest

from cli.commands.version import package_version
from jobs.request.field_rules import check_dataset
from tests.cli.conftest import run


@pytest.mark.parametrize("text", ["", "\n", "  \n\t\n", "\ufeff"], ids=["empty", "newline", "blanks", "bom-only"])
def test_an_empty_request_file_is_said_to_be_empty(tmp_path, platform_file, text):
    # Was: "not valid JSON: line 1 column 1: Expecting value".
    path = tmp_path / "request.json"
    path.write_text(text, encoding="utf-8")
    result = run("render", path, "--platform", platform_file)
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert f"{path} is empty: a job request is a JSON object" in result.stderr
    assert "Expecting value" not in result.stderr and "examples/" in result.stderr


@pytest.mark.parametrize(("uri", "length"), [("s3://b/p/", 1), ("s3://ab/p/", 2), (f"s3://{'a' * 64}/p/", 64)])
def test_a_bucket_name_of_the_wrong_length_is_named_as_such(uri, length):
    # Was: "'s3://b/p/' is not a valid S3 URI (s3://bucket/prefix/)", of a URI of exactly that form.
    problem = check_dataset(uri)
    assert problem and f"has {length} characters; S3 bucket names have 3 to 63" in problem
    assert "not a valid S3 URI" not in problem


def test_trainctl_version_as_a_command_prints_the_version():
    # Was: "No such command 'version'." (only --version worked).
    result = run("version")
    assert result.exit_code == 0 and result.stdout.strip() == f"trainctl {package_version()}"
    assert run("--version").stdout == result.stdout


@pytest.mark.parametrize(("value", "kind"), [("123", "a number"), ("null", "null"), ('["a"]', "an array"),
                                             ('{"t": 1}', "an object"), ("true", "a boolean")])
def test_a_text_field_that_is_not_a_string_is_said_to_hold_what_it_holds(tmp_path, value, kind):
    # Was: "has no string field 'text' (its keys are ['text'])": the key named as missing while listed.
    from prepare.text import PrepareError, _jsonl

    path = tmp_path / "c.jsonl"
    path.write_text(f'{{"text": "fine"}}\n{{"text": {value}}}\n')
    with pytest.raises(PrepareError) as info:
        list(_jsonl(path, "text"))
    assert f"{path}:2: field 'text' holds {kind}" in str(info.value) and "its keys are" not in str(info.value)


@pytest.mark.parametrize(("ended", "checkpointed", "code", "says"), [
    ("completed", True, 0, "done at step 5"),
    ("stopped", True, 3, "stopped at step 5 with a checkpoint in"),
    # Ctrl-C just after the start: no checkpoint yet. Was: "stopped at step 0 with a checkpoint in ..." (empty).
    ("stopped", False, 3, "stopped at step 5, before any checkpoint was written: nothing to resume"),
], ids=["completed", "stopped", "stopped-before-any-checkpoint"])
def test_a_local_run_s_exit_status_says_stopped_or_completed(tmp_path, monkeypatch, ended, checkpointed, code, says):
    # Was: 0 both when stopped and when completed, so `trainctl local r.json && next` went on after a Ctrl-C.
    import json

    import cli.container_emulator
    from cli.commands.local import EXIT_STOPPED
    from contract.container import CHECKPOINT_MARKER, STATUS_FILE
    from tests.cli.conftest import DATA

    def run_local(create: dict, *, workdir, **_: object) -> int:
        (workdir / "output" / "data").mkdir(parents=True, exist_ok=True)
        (workdir / "output" / "data" / STATUS_FILE).write_text(json.dumps({"status": ended, "step": 5}))
        (workdir / "checkpoints" / "step-4").mkdir(parents=True)
        if checkpointed:
            (workdir / "checkpoints" / "step-4" / CHECKPOINT_MARKER).write_text("{}")
        return 0

    monkeypatch.chdir(tmp_path)
    for split in ("train", "validation"):
        (tmp_path / "corpus" / split).mkdir(parents=True)
    monkeypatch.setattr(cli.container_emulator, "run_local", run_local)
    result = run("local", DATA / "local-tiny.json", "--workdir", tmp_path / "w")
    assert result.exit_code == code and (code != 3 or code == EXIT_STOPPED)
    assert says in " ".join(result.stdout.split())


def test_an_existing_workdir_the_run_cannot_write_in_is_refused_up_front(tmp_path, monkeypatch):
    # /proc/self: a system folder that exists and takes no new files, even as root (a read-only mount behaves
    # alike). Was: a PermissionError/FileNotFoundError traceback from deep in the checkpoint epoch's lock file.
    from tests.cli.conftest import DATA

    monkeypatch.chdir(tmp_path)
    for split in ("train", "validation"):
        (tmp_path / "corpus" / split).mkdir(parents=True)
    result = run("local", DATA / "local-tiny.json", "--workdir", "/proc/self", "--nproc", "1")
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "--workdir /proc/self: cannot write in it" in result.stderr and "pass another --workdir" in result.stderr


def test_data_without_a_validation_folder_does_not_validate_on_the_request_s_own_set(tmp_path, monkeypatch, capsys):
    # --data DIR with no validation/: DIR is the train channel. Was: the request's validation_dataset (another
    # corpus, other tokens) still rendered and read, a meaningless validation loss without a word.
    from cli.commands.local import run_request_locally
    from cli.request_file import load_request
    from tests.cli.conftest import DATA
    from tests.cli.test_local import FakeRunLocal

    monkeypatch.chdir(tmp_path)
    for split in ("train", "validation"):
        (tmp_path / "corpus" / split).mkdir(parents=True)
    flat = tmp_path / "flat"
    flat.mkdir()
    fake = FakeRunLocal()
    run_request_locally(load_request(DATA / "local-tiny.json"), workdir=tmp_path / "w", nproc=1, data=flat,
                        run_local=fake)
    ((create, kwargs),) = fake.calls
    assert [c["ChannelName"] for c in create["InputDataConfig"]] == ["train"]
    assert kwargs["data_dirs"] == {"train": flat}
    said = " ".join(capsys.readouterr().out.split())
    assert f"--data {flat} has no validation/ folder: this run validates on nothing" in said


def test_the_second_interrupt_kills_the_run_and_is_not_blamed_on_memory(tmp_path):
    # The documented "signal again to kill": the emulator's own SIGKILL. Was: "killed by SIGKILL ... usually means
    # this machine ran out of memory".
    import os
    import signal
    import subprocess
    import threading

    from cli.commands.local import local_outcome
    from cli.container_emulator import KILLED_ON_SECOND_SIGNAL, _wait_stopping_on_signal

    procs = [subprocess.Popen(["sleep", "30"], start_new_session=True) for _ in range(2)]
    stopped = []
    timers = [threading.Timer(t, os.kill, (os.getpid(), signal.SIGINT)) for t in (0.3, 0.6)]
    for t in timers:
        t.start()
    codes, killed = _wait_stopping_on_signal(procs, lambda: stopped.append(True))
    assert stopped == [True] and killed and codes == [-signal.SIGKILL] * 2
    said = local_outcome(KILLED_ON_SECOND_SIGNAL, tmp_path, since=0.0)
    assert "killed at your second interrupt" in said and "memory" not in said


def test_ctrl_c_while_preparing_text_leaves_the_output_as_it_was(tmp_path, monkeypatch, capsys):
    # Was: a KeyboardInterrupt traceback and a half-written train/ (its old shards already deleted).
    import prepare.text as text
    from tests.training.formats import documents, train_tokenizer, write_jsonl

    docs = documents(60)
    tokenizer = train_tokenizer(tmp_path / "tokenizer.json", docs)
    write_jsonl(tmp_path / "a.jsonl", docs)
    write_jsonl(tmp_path / "b.jsonl", docs)
    out = tmp_path / "tokens"
    assert text.main([str(tmp_path / "a.jsonl"), "--tokenizer", str(tokenizer), "--out", str(out)]) == 0
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    said = capsys.readouterr().err
    assert f"[prepare] {tmp_path / 'a.jsonl'} (1 of 1, 0 of 0 MiB read)" in said  # progress, on stderr

    real = text.read_documents

    def interrupted(path, field):
        if path.name == "b.jsonl":  # the second file: the first one's shards are being written
            raise KeyboardInterrupt
        yield from real(path, field)

    monkeypatch.setattr(text, "read_documents", interrupted)
    monkeypatch.setattr(text, "ENCODE_BATCH", 7)  # several encode batches, so shards are on disk when it stops
    assert text.main([str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl"), "--tokenizer", str(tokenizer),
                      "--out", str(out), "--shard-tokens", "50"]) == 130
    assert f"interrupted: {out} is as it was" in capsys.readouterr().err
    after = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert after == before and not list(out.glob(".*.partial"))


def test_ctrl_c_while_preparing_images_leaves_the_output_as_it_was(tmp_path, monkeypatch, capsys):
    import prepare.images as images
    from tests.training.formats import write_imagefolder

    write_imagefolder(tmp_path / "folder")
    out = tmp_path / "shards"
    args = ["--imagefolder", str(tmp_path / "folder"), "--out", str(out), "--image-size", "16", "--shard-samples", "5",
            "--val-fraction", "0.25"]
    assert images.main(args) == 0
    assert "[prepare] train: shard 1 of" in capsys.readouterr().err
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    real, calls = images.write_shards, []

    def stopped_in_validation(samples, folder, shard_samples, on_shard=None):
        calls.append(folder)
        if len(calls) == 2:  # train written in full, validation under way
            raise KeyboardInterrupt
        return real(samples, folder, shard_samples, on_shard)

    monkeypatch.setattr(images, "write_shards", stopped_in_validation)
    assert images.main([*args, "--seed", "1"]) == 130
    assert f"interrupted: {out} is as it was" in capsys.readouterr().err
    assert {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    assert not list(out.glob(".*.partial"))
