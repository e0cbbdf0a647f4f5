"""A metric's name has one home, contract/metrics.py: production code names a metric by its constant, so renaming it
there alone renames it everywhere (issue 20). Two checks: a scan of the production code for a metric's name written
as a string, and a child process that renames every metric in that file alone and runs the consumers for real."""

from __future__ import annotations

import ast
import functools
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from contract.metrics import HOST_METRICS, METRIC_NAMES, RECORD_TIME, RUN_STARTED
from tests.conftest import offline_env
from tests.test_architecture import MODULES

ROOT = Path(__file__).resolve().parents[1]
HOME = ROOT / "contract" / "metrics.py"
# Words that are also a field of some other record, where that file writes the field, not the metric.
OTHER_FIELDS = {
    ("training/resilience/watchdog.py", "step"): "a rank's hang report (the step it completed last)",
    ("training/checkpoint/state.py", "step"): "the loop state a checkpoint holds",
    ("training/checkpoint/storage.py", "step"): "a checkpoint's completion marker",
    ("training/resilience/outcome.py", "step"): "the status file and the exported model's config",
    ("training/data/sampler.py", "epoch"): "the sampler state a checkpoint holds",
    ("cli/commands/local.py", "step"): "the status file (training.resilience.outcome)",
    ("cli/commands/runs.py", "step"): "the run record's field (jobs.outcome.run_record)",
    ("jobs/outcome/run_record.py", "step"): "the run record's field",
    ("jobs/retry/run_state.py", "step"): "Attempt's field (job_figures)",
    ("jobs/retry/run_state.py", "checkpoint_saves"): "Attempt's field (job_figures)",
    ("jobs/outcome/summary.py", "step"): "the run record's field (jobs.outcome.run_record)",
}
# Named inside longer strings (messages, labels) too; the plain words (step, epoch, lr, mfu) are prose as often.
DISTINCT = tuple(name for name in METRIC_NAMES if "_" in name)


def _strings(tree: ast.AST) -> list[ast.Constant]:
    """The string constants of a module, docstrings left out (they may name a metric: they are its documentation)."""
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    return [node for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings]


def metric_literals(path: Path) -> list[tuple[int, str]]:
    """(line, metric name) for each string in `path` that is a metric's name or names one of DISTINCT as a word."""
    named = re.compile(r"\b(" + "|".join(map(re.escape, DISTINCT)) + r")\b")
    found = []
    for node in _strings(ast.parse(path.read_text(), filename=str(path))):
        if node.value in METRIC_NAMES:
            found.append((node.lineno, node.value))
        else:
            found += [(node.lineno, name) for name in named.findall(node.value)]
    return found


@functools.cache  # one scan of the tree for both tests below
def _production_literals() -> dict[tuple[str, str], list[int]]:
    """(file, metric name) -> the lines where production code outside contract/metrics.py writes the name."""
    found: dict[tuple[str, str], list[int]] = {}
    for path in sorted(set(MODULES.values()) - {HOME}):
        for line, name in metric_literals(path):
            found.setdefault((path.relative_to(ROOT).as_posix(), name), []).append(line)
    return found


def test_production_code_names_metrics_by_their_constants():
    offenders = [f"{where}:{lines}: {name!r}" for (where, name), lines in _production_literals().items()
                 if (where, name) not in OTHER_FIELDS]
    assert not offenders, ("metric names written as strings (import the name's constant from contract.metrics, "
                           f"e.g. TRAIN_LOSS, so that a rename there reaches them): {offenders}")


def test_every_other_field_listed_is_still_written():
    """An entry of OTHER_FIELDS whose file no longer writes the word would let a metric's name back in unseen."""
    stale = set(OTHER_FIELDS) - set(_production_literals())
    assert not stale, f"remove from OTHER_FIELDS: {sorted(stale)}"


def test_contract_metrics_writes_each_name_once():
    literals = [name for _, name in metric_literals(HOME) if name in METRIC_NAMES]
    assert sorted(literals) == sorted(METRIC_NAMES), "each name once: its constant's definition"


def test_the_scan_finds_a_metric_name_written_as_a_string(tmp_path):
    """The scan above could pass by finding nothing: it must see a key, a call argument and a message."""
    sample = tmp_path / "sample.py"
    sample.write_text('"""Docstrings may say train_loss."""\n'
                      'record = {"train_loss": 1.0}\n'
                      'value = record.get("data_wait_ms")\n'
                      'message = f"{value}: checkpoint_overdue above the threshold"\n'
                      'label = "step time"\n')
    assert metric_literals(sample) == [(2, "train_loss"), (3, "data_wait_ms"), (4, "checkpoint_overdue")]


# ---- renaming every metric in contract/metrics.py alone ----------------------------------------------------

# What one fp32 decoder process on a CPU cannot print: throughput in samples (it counts tokens), MFU (no GPU peak),
# the loss scale (fp16 only) and the straggler metrics (one rank).
NOT_PRINTED_HERE = {"samples_per_sec", "mfu", "loss_scale", "straggler_rank", "slowest_rank_ratio"}
# SageMaker's own names, and the hosts' GPU metrics a job sends to its team's namespace (not a line's metrics).
INSTANCE_METRICS = {"GPUUtilization", "GPUMemoryUtilization", *HOST_METRICS}


@pytest.fixture(scope="module")
def renamed(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("renamed") / "result.json"
    done = subprocess.run([sys.executable, "-m", "tests.renamed_metrics", str(out)], cwd=ROOT, env=offline_env(),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(out.read_text())


def _new(renamed: dict, names) -> set[str]:
    return {renamed["renames"][n] for n in names}


def _keys(line: str) -> list[str]:
    return re.findall(r"(\S+?)=", line.removeprefix("[metrics]"))


def test_each_metric_is_defined_by_one_constant(renamed):
    assert set(renamed["renames"]) == set(METRIC_NAMES)
    assert all(new != old for old, new in renamed["renames"].items())


def test_the_training_package_prints_the_new_names(renamed):
    printed = _new(renamed, set(METRIC_NAMES) - NOT_PRINTED_HERE)
    assert {k for line in renamed["lines"] for k in _keys(line)} == printed
    assert {k for record in renamed["records"] for k in record} == printed | {RECORD_TIME, RUN_STARTED}
    for old in METRIC_NAMES:
        assert not re.search(rf"\b{old}=", renamed["stdout"]), old
    # The value's format follows the name (losses to 4 decimals): format_value reads the constants too.
    assert all(re.search(rf"\b{renamed['renames']['train_loss']}=\d+\.\d{{4}} ", line)
               for line in renamed["lines"] if "train_loss" in line)


def test_the_job_definition_summary_and_run_record_follow(renamed):
    assert renamed["definitions"] == [renamed["renames"][n] for n in METRIC_NAMES]
    printed = _new(renamed, set(METRIC_NAMES) - NOT_PRINTED_HERE)
    assert set(renamed["final_metrics"]) == printed
    assert set(renamed["input_bound"]) == _new(renamed, {"data_wait_ms", "data_wait_share"}) | {"input_bound_share"}
    # The run record read its figures from the renamed metrics (a name it missed would leave None).
    figures = renamed["figures"]
    assert figures["step"] == 6 and figures["checkpoint_saves"] == 1
    assert None not in (figures["startup_seconds"], figures["train_seconds"], figures["checkpoint_seconds"],
                        figures["eval_seconds"], figures["checkpoint_age_seconds"])
    final = renamed["notification"].split("Final metrics: ")[1].splitlines()[0]
    assert set(_keys(final)) == printed


def test_trainctl_shows_and_charts_the_new_names(renamed):
    shown = _keys(renamed["progress"].split("job_status=")[1])  # after the job status: the metrics
    assert shown == [renamed["renames"][n] for n in METRIC_NAMES if n not in NOT_PRINTED_HERE]
    assert renamed["throughput"] == renamed["renames"]["tokens_per_sec"]
    # Six steps, evaluations at 3 and 6: the loss, the validation loss and the throughput are all drawn.
    assert renamed["chart"] == [[["run 1 train", 6], ["run 1 validation", 2]], [["run 1", 6]]]
    assert renamed["chart_x"] == renamed["renames"]["step"]


def test_the_dashboard_and_alarm_follow(renamed):
    body = renamed["dashboard"]
    plotted = set(re.findall(r'MetricName=\\+"(\w+)\\+"', body)) | set(re.findall(r"SELECT MAX\((\w+)\)", body))
    assert plotted - INSTANCE_METRICS <= set(renamed["renames"].values())
    assert _new(renamed, {"train_loss", "tokens_per_sec", "checkpoint_overdue", "data_wait_share"}) <= plotted
    assert not plotted & set(METRIC_NAMES)
    assert f"(metric {renamed['renames']['checkpoint_overdue']})" in body  # the alarm's description names it
