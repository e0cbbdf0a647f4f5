"""The run as an MLflow run, logged by rank 0 when a tracking server is named (contract.container.
ENV_MLFLOW_TRACKING_URI: the platform config's `mlflow_tracking_server`, rendered by the launcher; `trainctl local
--mlflow URI`).

One MLflow run per training run, in the platform's (or team's) experiment (ENV_MLFLOW_EXPERIMENT), found again by
its run id tag on every attempt: a resumed attempt logs on into the same MLflow run. It holds
- parameters: the attempt's whole configuration (the request's hyperparameters as the launcher resolved them:
  strategy, degrees, micro-batch, accumulation...), and the request's fields it does not carry as `request.<field>`
  (dataset, instance, Spot...: contract.container.ENV_REQUEST); a value a later attempt changes (a resume on other
  instances re-plans accumulation) is kept as the tag `changed.<name>`, as MLflow never changes a logged parameter;
- metrics: every number of every metrics record (the `[metrics]` lines, metrics.jsonl), at its step;
- tags: RUN_ID_TAG, the team (its name prefix), the attempt, the instance type and count, the instance-hours the
  attempts ran, how the last attempt ended, and what the attempts cost: the on-demand price the launcher rendered
  (contract.container.ENV_PRICE, from the Price List API) times the hours they ran here (SageMaker also bills a
  job's start-up, and Spot bills less: `trainctl show RUN` has the billed cost once the run ends);
- artifacts: the exported model (model.safetensors and config.json) when it is at most MAX_MODEL_ARTIFACT_BYTES;
  a larger one is not copied (the platform keeps one copy of what costs money: the job's model.tar.gz) and the tag
  `model_dir` says where it is.

Metrics are logged asynchronously (MLflow's own queue): a slow or unreachable server never stalls a step. A server
that cannot be reached at the start is one line, and the run trains on without MLflow; so is an image without the
`mlflow` package (the MLflow client, `mlflow-skinny`; a SageMaker managed server's ARN also needs `sagemaker-mlflow`,
which signs the requests with the execution role).
"""

from __future__ import annotations

import json
import os
import time
import typing
from pathlib import Path

from contract.container import (
    ENV_EPOCH,
    ENV_LOCAL_WORKDIR,
    ENV_MLFLOW_EXPERIMENT,
    ENV_MLFLOW_TRACKING_URI,
    ENV_PRICE,
    ENV_REQUEST,
    ENV_RUN_ID,
    MLFLOW_ARN,
    MLFLOW_RUN_ID_TAG,
)
from contract.metrics import STEP
from training.environment import container
from training.export import CONFIG_FILE, MODEL_FILE
from training.metrics.logger import numbers

RUN_ID_TAG = MLFLOW_RUN_ID_TAG
WORKDIR_TAG = "trainctl.workdir"  # `trainctl local`'s: a run is its work folder (its run id is the request name's)
ATTEMPT_TAG = "trainctl.attempt"
INSTANCE_TYPE_TAG = "trainctl.instance_type"
INSTANCE_COUNT_TAG = "trainctl.instance_count"
INSTANCE_HOURS_TAG = "trainctl.instance_hours"
STATUS_TAG = "trainctl.status"
TEAM_TAG = "trainctl.team"  # the platform's (or team's) name prefix, whose experiment the run is in
MODEL_DIR_TAG = "trainctl.model_dir"
# The parameters of the request's own fields (contract.container.ENV_REQUEST) beside the configuration's.
REQUEST_PARAM = "request."
# The attempts' cost in USD, written only while every attempt had a price (absent: unknown), and what it counts.
COST_TAG = "trainctl.cost_usd"
COST_BASIS_TAG = "trainctl.cost_basis"
ON_DEMAND = "on-demand price x the hours the training ran"
SPOT = f"{ON_DEMAND}; Spot bills less (trainctl show RUN has the billed cost)"
DEFAULT_EXPERIMENT = "trainctl"
# A model up to this size is copied into the run's artifacts; a larger one only named (MODEL_DIR_TAG).
MAX_MODEL_ARTIFACT_BYTES = 2 * 1024**3
# MLflow's client retries a request 7 times with a doubling back-off (minutes), each waiting up to 120 s: a job whose
# server does not answer would wait that long at its start. These bound it to about half a minute (a job's own
# environment may set other values; MLflow reads them at each request).
HTTP_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "3", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}
# MLflow's run statuses for how an attempt ended (a stopped run is resumed into the same MLflow run: RUNNING again).
_ENDED = {"completed": "FINISHED", "early_stopped": "FINISHED", "stopped": "KILLED"}


def _instance_type(env: typing.Mapping[str, str]) -> str:
    """The toolkit's SM_CURRENT_INSTANCE_TYPE; its resource config's otherwise; "local" where neither is set."""
    if value := env.get("SM_CURRENT_INSTANCE_TYPE"):
        return value
    try:
        return json.loads(env.get("SM_RESOURCE_CONFIG", "{}")).get("current_instance_type") or "local"
    except (ValueError, AttributeError):
        return "local"


def _price(env: typing.Mapping[str, str]) -> tuple[float, bool] | None:
    """(USD an hour of the attempt's cluster, whether on Spot) as the launcher rendered it; None when it did not
    (no price known, a training plan, a local run) or rendered something else."""
    try:
        price = json.loads(env.get(ENV_PRICE) or "null")
        rate, spot = float(price["usd_per_hour"]), bool(price["spot"])
    except (ValueError, TypeError, KeyError):
        return None
    return (rate, spot) if rate >= 0 else None


def _request(env: typing.Mapping[str, str]) -> dict:
    """The request's fields the launcher (or trainctl local) rendered for the parameters; {} where none are."""
    try:
        fields = json.loads(env.get(ENV_REQUEST) or "{}")
    except ValueError:
        return {}
    return fields if isinstance(fields, dict) else {}


class Cost(typing.NamedTuple):
    """What the run's earlier attempts cost (None: unknown, one ran without a price) and whether one was on Spot."""
    usd: float | None = 0.0
    spot: bool = False

    @classmethod
    def logged(cls, tags: typing.Mapping[str, str], hours_before: float) -> Cost:
        try:
            return cls(float(tags[COST_TAG]), tags.get(COST_BASIS_TAG) == SPOT)
        except KeyError:  # no earlier attempt had a price, or none ran
            return cls(None if hours_before else 0.0)
        except ValueError:  # not a number (edited by hand): unknown from here on
            return cls(None)


class MlflowRun:
    def __init__(self, client, run_id: str, instances: int, hours_before: float = 0.0,
                 price: tuple[float, bool] | None = None, cost_before: Cost | None = None) -> None:
        self.client, self.run_id, self.instances = client, run_id, instances
        self.hours_before = hours_before  # the instance-hours the run's earlier attempts logged
        self.price, self.cost_before = price, cost_before or Cost()
        self.began = time.monotonic()
        self.pending: list = []  # the queued batches not yet known sent (MLflow's RunOperations)

    @classmethod
    def from_environment(cls, config: dict, env: typing.Mapping[str, str] | None = None, *,
                         is_main: bool) -> MlflowRun | None:
        """The MLflow run of this training run, found or created, on rank 0 when a tracking server is named; None
        elsewhere, or (with one line saying why) where the client is missing or the server cannot be reached."""
        env = os.environ if env is None else env
        uri = env.get(ENV_MLFLOW_TRACKING_URI)
        if not (uri and is_main):
            return None
        for name, value in HTTP_DEFAULTS.items():
            os.environ.setdefault(name, value)
        try:
            from mlflow import MlflowClient
        except ImportError:
            print(f"[mlflow] {ENV_MLFLOW_TRACKING_URI}={uri} but the mlflow package is not installed in this image: "
                  "no MLflow run (pip install mlflow-skinny, plus sagemaker-mlflow for a SageMaker MLflow ARN)",
                  flush=True)
            return None
        if MLFLOW_ARN.fullmatch(uri):
            try:
                import sagemaker_mlflow  # noqa: F401 - MLflow's plugin for ARN URIs: signs each request with the role
            except ImportError:
                print(f"[mlflow] {ENV_MLFLOW_TRACKING_URI} is a SageMaker MLflow ARN but the sagemaker-mlflow package, "
                      "which signs the requests with the job's role, is not installed in this image: no MLflow run "
                      "(pip install sagemaker-mlflow)", flush=True)
                return None
        try:
            return cls._open(MlflowClient(tracking_uri=uri), config, env)
        except Exception as e:  # noqa: BLE001 - any client or server error: the run trains on without MLflow
            first = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
            print(f"[mlflow] the tracking server {uri} could not be reached ({type(e).__name__}: {first}): this "
                  "attempt logs no MLflow run and trains on", flush=True)
            return None

    @classmethod
    def _open(cls, client, config: dict, env: typing.Mapping[str, str]) -> MlflowRun:
        from mlflow.entities import Param, RunTag

        run_id = env.get(ENV_RUN_ID) or "local"
        attempt = env.get(ENV_EPOCH) or "1"
        hosts = container(env).hosts
        experiment = env.get(ENV_MLFLOW_EXPERIMENT) or DEFAULT_EXPERIMENT
        found = client.get_experiment_by_name(experiment)
        experiment_id = found.experiment_id if found else client.create_experiment(experiment)
        identity = {RUN_ID_TAG: run_id, **({WORKDIR_TAG: env[ENV_LOCAL_WORKDIR]} if env.get(ENV_LOCAL_WORKDIR) else {})}
        runs = client.search_runs([experiment_id], max_results=1, filter_string=" AND ".join(
            f"tags.`{tag}` = '{_quoted(value)}'" for tag, value in identity.items()))
        tags = {ATTEMPT_TAG: attempt, INSTANCE_TYPE_TAG: _instance_type(env), INSTANCE_COUNT_TAG: str(len(hosts)),
                STATUS_TAG: "running", TEAM_TAG: experiment}
        params = {**{k: _param(v) for k, v in sorted(config.items())},
                  **{f"{REQUEST_PARAM}{k}": _param(v) for k, v in _request(env).items()}}
        if runs:
            run = runs[0]
            client.update_run(run.info.run_id, status="RUNNING")
            logged = run.data.params
            tags.update({f"changed.{k}": f"{logged[k]} -> {v} (attempt {attempt})" for k, v in params.items()
                         if k in logged and logged[k] != v})
            params = {k: v for k, v in params.items() if k not in logged}
            mlflow_id, hours_before = run.info.run_id, float(run.data.tags.get(INSTANCE_HOURS_TAG, 0))
            cost_before = Cost.logged(run.data.tags, hours_before)
        else:
            mlflow_id = client.create_run(experiment_id, tags=identity, run_name=run_id).info.run_id
            hours_before, cost_before = 0.0, Cost()
        # (MLflow's client splits a batch at the REST API's limits: 100 parameters or tags a request.)
        client.log_batch(mlflow_id, params=[Param(k, v) for k, v in params.items()],
                         tags=[RunTag(k, v) for k, v in tags.items()])
        print(f"[mlflow] logging to run {mlflow_id} of experiment {experiment!r} at {client.tracking_uri}",
              flush=True)
        return cls(client, mlflow_id, len(hosts), hours_before, _price(env), cost_before)

    def write(self, record: dict) -> None:
        """Each number of a metrics record, at the record's step (queued: MLflow sends it from its own thread)."""
        from mlflow.entities import Metric

        step = record.get(STEP)
        if step is None:
            return
        now = int(time.time() * 1000)
        metrics = [Metric(name, value, now, int(step)) for name, value in numbers(record).items()]
        if metrics:
            self.pending.append(self.client.log_batch(self.run_id, metrics=metrics, synchronous=False))

    def close(self) -> None:
        """Nothing to do as the metrics stop: the run ends with the attempt (end)."""

    def end(self, status: str, model_path: str | Path | None = None) -> None:
        """The attempt ended as `status` (training.resilience.outcome's: completed, stopped, failed...): its
        instance-hours added to the run's, the model attached (or named), and the MLflow run's status set. Never
        raises: the training run's outcome is not MLflow's to change."""
        from mlflow.entities import RunTag

        lost = 0
        for queued in self.pending:  # every metric sent before the run ends
            try:
                queued.wait()
            except Exception:  # noqa: BLE001 - MLflow's client has retried; count what it gave up on
                lost += 1
        if lost:
            print(f"[mlflow] {lost} of {len(self.pending)} metrics records could not be sent to the tracking server",
                  flush=True)
        ran = (time.monotonic() - self.began) / 3600
        hours = self.hours_before + self.instances * ran
        tags = {INSTANCE_HOURS_TAG: f"{hours:.6f}", STATUS_TAG: status, **self._cost(ran)}
        _safely("the attempt's instance-hours, cost and status", lambda: self.client.log_batch(
            self.run_id, tags=[RunTag(k, v) for k, v in tags.items()]))
        if model_path is not None and not _safely("the model", lambda: self._attach(Path(model_path).parent)):
            _safely("the model's folder", lambda: self.client.set_tag(self.run_id, MODEL_DIR_TAG,
                                                                      str(Path(model_path).parent)))
        _safely("the run's status", lambda: self.client.set_terminated(self.run_id, _ENDED.get(status, "FAILED")))

    def _cost(self, hours: float) -> dict[str, str]:
        """The cost tags after an attempt that ran `hours`: none when this attempt or an earlier one had no price."""
        if self.price is None or self.cost_before.usd is None:
            return {}
        rate, spot = self.price
        usd = self.cost_before.usd + rate * hours
        return {COST_TAG: f"{usd:.4f}", COST_BASIS_TAG: SPOT if spot or self.cost_before.spot else ON_DEMAND}

    def _attach(self, model_dir: Path) -> None:
        """The model's files as the run's artifacts; a model above MAX_MODEL_ARTIFACT_BYTES only named (its folder),
        never copied. On a SageMaker managed server the files go to its artifact store in S3, which the execution
        role must be able to write (not granted here: the store is the server's); without it the folder is named."""
        files = [model_dir / name for name in (MODEL_FILE, CONFIG_FILE) if (model_dir / name).exists()]
        if sum(f.stat().st_size for f in files) <= MAX_MODEL_ARTIFACT_BYTES:
            for f in files:
                self.client.log_artifact(self.run_id, str(f), artifact_path="model")
        else:
            self.client.set_tag(self.run_id, MODEL_DIR_TAG, str(model_dir))


def _safely(what: str, action) -> bool:
    """Run one logging action; a failure is one line (MLflow's client has retried), never the training run's."""
    try:
        action()
        return True
    except Exception as e:  # noqa: BLE001
        print(f"[mlflow] {what} could not be logged ({type(e).__name__}: {str(e).strip()[:300]})", flush=True)
        return False


def _param(value) -> str:
    return value if isinstance(value, str) else json.dumps(value, default=str)


def _quoted(text: str) -> str:
    """A value inside MLflow's search filter's single quotes."""
    return text.replace("\\", "\\\\").replace("'", "\\'")
