"""A child process for tests/test_metric_names.py: every metric renamed in contract/metrics.py alone, then the
consumers run for real (a tiny training run, the rendered MetricDefinitions, SageMaker's scrape, the summary and
its notification, the run record's figures, trainctl's progress line and chart, the dashboard) and what each one
names is written as JSON to the path in argv[1].

`python -m tests.renamed_metrics OUT`: the renamed module is installed as `contract.metrics` before anything
imports it, exactly as if the file had been edited; nothing else of the project is touched.
"""

from __future__ import annotations

import ast
import contextlib
import io
import json
import re
import sys
import tempfile
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
METRICS_SOURCE = ROOT / "contract" / "metrics.py"
SUFFIX = "_renamed"


def renamed_source(source: str) -> tuple[str, dict[str, str]]:
    """contract/metrics.py with each metric's defining string (`NAME = "name"`, a name in METRIC_NAMES) renamed to
    name + SUFFIX; and old -> new. Only the definitions are edited, so every other use must follow by reference."""
    original = types.ModuleType("original_metrics")
    exec(compile(source, str(METRICS_SOURCE), "exec"), original.__dict__)
    names = set(original.METRIC_NAMES)
    lines = source.splitlines(keepends=True)
    renames = {}
    for node in ast.parse(source).body:
        if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and node.value.value in names
                and node.value.lineno == node.value.end_lineno):
            old, row = node.value.value, node.value.lineno - 1
            line = lines[row]
            lines[row] = line[:node.value.col_offset] + repr(old + SUFFIX) + line[node.value.end_col_offset:]
            renames[old] = old + SUFFIX
    return "".join(lines), renames


def install(source: str) -> types.ModuleType:
    import contract

    module = types.ModuleType("contract.metrics")
    module.__file__ = str(METRICS_SOURCE)
    sys.modules["contract.metrics"] = module
    exec(compile(source, str(METRICS_SOURCE), "exec"), module.__dict__)
    contract.metrics = module
    return module


def train_tiny(root: Path) -> str:
    """One process, 6 steps with an evaluation and a checkpoint every 3: the run's stdout."""
    from tests.training.helpers import config, write_corpus
    from training.loop import train
    from training.parallel.process_group import setup
    from training.resilience.stop import StopFlag

    write_corpus(root / "corpus")
    cfg = config(root / "run", root / "corpus", max_steps=6, eval_interval=3, eval_batches=1, checkpoint_interval=3)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        train(cfg, setup(cfg), StopFlag())
    return out.getvalue()


def job_description(lines: list[str], definitions: list[dict[str, str]]) -> dict:
    """What DescribeTrainingJob would say of a job that logged `lines`: each definition's last match."""
    final = {}
    for definition in definitions:
        for line in lines:
            if match := re.search(definition["Regex"], line):
                final[definition["Name"]] = float(match.group(1))
    return {"TrainingJobName": "gpt-1", "TrainingJobStatus": "Completed", "SecondaryStatus": "Completed",
            "CreationTime": "2027-01-15T08:00:00Z", "TrainingStartTime": "2027-01-15T08:01:00Z",
            "TrainingEndTime": "2027-01-15T08:11:00Z", "TrainingTimeInSeconds": 600, "BillableTimeInSeconds": 600,
            # Below any wait for data: the summary names the run input bound, with the metrics' names.
            "HyperParameters": {"input_bound_share": "-1"},
            "FinalMetricDataList": [{"MetricName": k, "Value": v} for k, v in final.items()]}


def launcher_side(lines: list[str]) -> dict:
    from jobs.outcome.summary import describe_in_words, summary
    from jobs.render.training_job import render_create_training_job
    from jobs.request.parse import parse_request
    from jobs.retry.run_state import finish_attempt, job_figures, new_run, start_attempt
    from tests.jobs.conftest import load_platform

    request = parse_request(json.loads((ROOT / "examples" / "ddp-gpt-125m.json").read_text()))
    create = render_create_training_job(request, load_platform(), run_id="gpt-1234abcd", attempt=1)
    definitions = create["AlgorithmSpecification"]["MetricDefinitions"]
    job = job_description(lines, definitions)
    run = new_run(request, run_id="gpt-1234abcd", execution={"name": "e"}, now=1_800_000_000.0)
    start_attempt(run, create, attempt=1, now=1_800_000_000.0)
    finish_attempt(run, now=1_800_000_600.0, job=job)
    made = summary(run, job=job, decision=None, now=1_800_000_700.0)
    return {"definitions": [d["Name"] for d in definitions], "job": job,
            "figures": job_figures(job), "final_metrics": sorted(made["final_metrics"]),
            "input_bound": sorted(made["input_bound"] or {}), "notification": describe_in_words(made)[1]}


def trainctl_side(job: dict, metrics_file: Path) -> dict:
    from cli.execution_history import job_metrics
    from cli.views.charts import read_metrics_file, render, split_runs, throughput_metric
    from cli.views.progress import Snapshot, ordered_metrics

    snapshot = Snapshot("RUNNING", "Launch", 1, "gpt-1", "ml.p4d.24xlarge", "InProgress", "Training",
                        ordered_metrics(job_metrics(job)))
    runs = split_runs(read_metrics_file(metrics_file))
    figure = render(runs, "renamed")
    return {"progress": snapshot.line(), "throughput": (throughput_metric(runs) or [None])[0],
            # Each plotted line's label and points, by axes (loss, throughput), and the step axis's label.
            "chart": [[(line.get_label(), len(line.get_xdata())) for line in axes.lines] for axes in figure.axes],
            "chart_x": figure.axes[1].get_xlabel()}


def dashboard_body() -> str:
    from aws_cdk import App, Stack
    from aws_cdk import aws_sns as sns
    from aws_cdk import aws_stepfunctions as sfn

    from platform_constructs.monitoring import LauncherMonitoring, LauncherMonitoringProps

    app = App()
    stack = Stack(app, "M")
    machine = sfn.StateMachine(stack, "Machine", definition_body=sfn.DefinitionBody.from_chainable(sfn.Pass(stack, "P")))
    LauncherMonitoring(stack, "Monitoring", LauncherMonitoringProps(name_prefix="mltrain", state_machine=machine,
                                                                    topic=sns.Topic(stack, "T")))
    template = app.synth().get_stack_by_name("M").template
    return json.dumps([r["Properties"] for r in template["Resources"].values()
                       if r["Type"] in ("AWS::CloudWatch::Dashboard", "AWS::CloudWatch::Alarm")])


def main(out: Path) -> None:
    from contract.container import METRICS_FILE  # contract.container does not import contract.metrics

    source, renames = renamed_source(METRICS_SOURCE.read_text())
    install(source)
    with tempfile.TemporaryDirectory() as tmp:
        stdout = train_tiny(Path(tmp))
        metrics_file = Path(tmp) / "run" / "output" / METRICS_FILE
        lines = [line for line in stdout.splitlines() if line.startswith("[metrics]")]
        launcher = launcher_side(lines)
        result = {"renames": renames, "stdout": stdout, "lines": lines,
                  "records": [json.loads(r) for r in metrics_file.read_text().splitlines()],
                  **launcher, **trainctl_side(launcher["job"], metrics_file), "dashboard": dashboard_body()}
    out.write_text(json.dumps(result))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
