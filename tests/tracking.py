"""Where a run's metrics show up, read back with the tools' own readers: TensorBoard event files, and an MLflow run
on a real tracking server on loopback (SQLite behind it, artifacts in a folder), started as MLflow's documentation
starts one (`mlflow server`, uvicorn, one worker). The server's access log says which REST endpoints a run called,
so a test holds them to the actions the execution role is granted (contract.container.MLFLOW_RUN_ACTIONS).
"""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tests.training.helpers import free_port
from tools.local_server import answers

# Its start-up (imports, the SQLite schema's migrations) measured 6-26 s on the 2-core machine, the longer with the
# suite's other worker busy: a minute is room.
START_TIMEOUT_S = 60
_ENDPOINT = re.compile(r'"(?:GET|POST|PATCH|DELETE|PUT) /api/2\.0/mlflow/([a-z\-/]+)')


@dataclass
class MlflowServer:
    uri: str
    process: subprocess.Popen
    log: Path

    def mark(self) -> int:
        """Where the access log is now: endpoints(since=mark) are what was called after it."""
        return self.log.stat().st_size

    def endpoints(self, since: int = 0) -> set[str]:
        """Every /api/2.0/mlflow/ endpoint the server answered (experiments/create, runs/log-batch...) since `since`."""
        with self.log.open("rb") as f:
            f.seek(since)
            return set(_ENDPOINT.findall(f.read().decode(errors="replace")))

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def start(folder: Path) -> MlflowServer:
    folder.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log = folder / "server.log"
    process = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
         "--backend-store-uri", f"sqlite:///{folder / 'mlflow.db'}", "--artifacts-destination",
         str(folder / "artifacts")],
        stdout=log.open("w"), stderr=subprocess.STDOUT)
    server = MlflowServer(f"http://127.0.0.1:{port}", process, log)
    if answers(f"{server.uri}/health", process, START_TIMEOUT_S):
        return server
    if process.poll() is not None:
        raise RuntimeError(f"mlflow server exited with {process.returncode}: {log.read_text()[-2000:]}")
    server.stop()
    raise RuntimeError(f"mlflow server did not answer in {START_TIMEOUT_S} s: {log.read_text()[-2000:]}")


def logged_run(uri: str, tags: dict[str, str]):
    """The one MLflow run carrying these tags (the training run's id, a local run's work folder), with the history
    of each of its metrics."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    experiments = [e.experiment_id for e in client.search_experiments()]
    [run] = client.search_runs(experiments, filter_string=" AND ".join(f"tags.`{k}` = '{v}'" for k, v in tags.items()))
    history = {name: [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, name)]
               for name in run.data.metrics}
    return client, run, history


def check_run(server: MlflowServer, since: int, tags: dict[str, str], records: list[dict], params: dict[str, str],
              model_dir: Path, *, status: str = "FINISHED", ended: str = "completed", instance_type: str,
              instances: int = 1) -> object:
    """The training run's MLflow run as training.metrics.mlflow_run logs it; returns it."""
    from contract.container import MLFLOW_RUN_ACTIONS
    from training.metrics.mlflow_run import (
        ATTEMPT_TAG,
        INSTANCE_COUNT_TAG,
        INSTANCE_HOURS_TAG,
        INSTANCE_TYPE_TAG,
        STATUS_TAG,
    )

    # Least privilege holds only if the run called nothing the execution role is not granted.
    called = server.endpoints(since)
    assert called and called <= set(MLFLOW_RUN_ACTIONS), called - set(MLFLOW_RUN_ACTIONS)
    client, run, history = logged_run(server.uri, tags)
    assert not (problems := metrics_problems(records, history)), "\n".join(problems)
    assert run.info.status == status
    assert {k: run.data.params.get(k) for k in params} == params
    assert run.data.tags[STATUS_TAG] == ended and run.data.tags[ATTEMPT_TAG] == "1"
    assert (run.data.tags[INSTANCE_TYPE_TAG], run.data.tags[INSTANCE_COUNT_TAG]) == (instance_type, str(instances))
    assert float(run.data.tags[INSTANCE_HOURS_TAG]) > 0
    folder = Path(client.download_artifacts(run.info.run_id, "model", str(model_dir.parent / "from-mlflow")))
    for name in ("model.safetensors", "config.json"):
        assert (folder / name).read_bytes() == (model_dir / name).read_bytes(), name
    return run


def metrics_problems(records: list[dict], history: dict[str, list[tuple[int, float]]]) -> list[str]:
    """Where the MLflow run's metrics are not every number of every metrics-file record at its step, and nothing else
    (the file's own time stamps aside). MLflow keeps doubles: equal, not close."""
    from contract.metrics import RECORD_TIME, RUN_STARTED, STEP

    wanted: dict[str, list[tuple[int, float]]] = {}
    for record in records:
        for name, value in record.items():
            if name not in (STEP, RECORD_TIME, RUN_STARTED) and isinstance(value, int | float) \
                    and not isinstance(value, bool):
                wanted.setdefault(name, []).append((record[STEP], float(value)))
    return [f"{name}: MLflow has {sorted(history.get(name, []))}, the metrics file {sorted(wanted.get(name, []))}"
            for name in sorted(set(wanted) | set(history)) if sorted(history.get(name, [])) != sorted(wanted.get(name, []))]


def tensorboard_problems(folder: Path, records: list[dict], names=("train_loss", "lr", "tokens_per_sec", "val_loss")):
    """Where rank 0's event files in `folder`, read with tensorboard's own reader, do not hold each of these metrics
    at the metrics file's steps (float32 in the event file: within 1e-6)."""
    import pytest
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder))
    events.Reload()
    problems = []
    for name in names:
        logged = [(r["step"], r[name]) for r in records if name in r]
        seen = [(e.step, e.value) for e in events.Scalars(name)] if name in events.Tags()["scalars"] else []
        if not logged or seen != [(step, pytest.approx(value, rel=1e-6)) for step, value in logged]:
            problems.append(f"{name}: TensorBoard has {seen}, the metrics file {logged}")
    return problems


def rank_problems(folder: Path, records: list[dict], world: int) -> list[str]:
    """Where rank 0's event files do not hold each rank's own step time (contract.metrics.RANK_STEP_TIME_MS, one tag
    per rank), a positive number of milliseconds, at exactly the steps the straggler check judged (the records that
    carry slowest_rank_ratio); or hold a rank that is not there."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from contract.metrics import RANK_STEP_TIME_MS, SLOWEST_RANK_RATIO

    events = EventAccumulator(str(folder))
    events.Reload()
    judged = [r["step"] for r in records if SLOWEST_RANK_RATIO in r]
    tags = sorted(t for t in events.Tags()["scalars"] if t.startswith(f"{RANK_STEP_TIME_MS}/"))
    problems = [] if judged else ["no record carries slowest_rank_ratio"]
    if tags != sorted(f"{RANK_STEP_TIME_MS}/rank_{r}" for r in range(world)):
        problems.append(f"per-rank tags {tags}, expected one for each of {world} ranks")
    for tag in tags:
        seen = events.Scalars(tag)
        if [e.step for e in seen] != judged or not all(e.value > 0 for e in seen):
            problems.append(f"{tag}: {[(e.step, e.value) for e in seen]}, judged at steps {judged}")
    return problems
