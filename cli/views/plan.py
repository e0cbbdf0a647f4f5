"""`trainctl plan`: a human summary of what a request would run, read off the rendered request itself.

Reading the rendered CreateTrainingJob request (not re-deriving from the job request) means the plan
shows exactly what SageMaker would be asked for: the image, the instances, the Spot settings, the
checkpoint prefix. The retry policy comes from the request's `retry` section, which the launcher follows.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from contract.hyperparameters import INTERLEAVED, TrainConfig, canonical_name, decode_hyperparameters
from contract.parallel import MODEL_PARALLEL, microbatches, stages_per_rank
from jobs.naming import NAME_NONCE_CHARS, RUN_TOKEN_CHARS, run_slug
from jobs.timestamps import duration

# Plans render with a stand-in run id: each execution gets its own (jobs.naming.new_run_id: the request name and
# RUN_TOKEN_CHARS random characters), and each attempt's name NAME_NONCE_CHARS random characters of its own, so the
# plan shows placeholders for both.
_PLAN_DIGEST = "0" * RUN_TOKEN_CHARS
PLAN_NONCE = "0" * NAME_NONCE_CHARS
_DIGEST_SHOWN = f"<{RUN_TOKEN_CHARS} random>"
_NONCE_SHOWN = f"<{NAME_NONCE_CHARS} random>"


def plan_run_id(request_name: str) -> str:
    return f"{run_slug(request_name)}-{_PLAN_DIGEST}"


def _hp(create: dict[str, Any], key: str) -> Any:
    return decode_hyperparameters(create.get("HyperParameters") or {}).get(key)


def _spec_text(instance_type: str) -> tuple[str, int]:
    """'8x A100 40 GiB, EFA' and the accelerator count, from the instance catalog."""
    from jobs.catalog import lookup

    spec = lookup(instance_type)
    if spec is None:
        return "not in the catalog", 0
    if not spec.accelerated:
        return f"CPU, {spec.vcpus} vCPUs", 0
    efa = ", EFA" if spec.efa else ""
    return f"{spec.accelerators}x {spec.accelerator} {spec.accelerator_memory_gib} GiB{efa}", spec.accelerators


def compute_rows(create: dict[str, Any], strategy: str) -> tuple[list[tuple[str, str]], int]:
    """Instance rows and the world size (processes torchrun starts over the whole job)."""
    resources = create["ResourceConfig"]
    groups = resources.get("InstanceGroups") or [
        {"InstanceGroupName": "", "InstanceType": resources["InstanceType"],
         "InstanceCount": resources["InstanceCount"]}]
    rows = []
    nodes = world = 0
    for group in groups:
        text, accelerators = _spec_text(group["InstanceType"])
        label = f" (group {group['InstanceGroupName']})" if group["InstanceGroupName"] else ""
        rows.append(("instances", f"{group['InstanceCount']} x {group['InstanceType']}{label}: {text}"))
        if accelerators or len(groups) == 1:  # heterogeneous CPU groups feed data; they run no rank
            nodes += group["InstanceCount"]
            world += group["InstanceCount"] * max(accelerators, 1)
    if strategy == "single":
        rows.append(("world", "1 process (single strategy)"))
        return rows, 1
    per_node = world // nodes
    rows.append(("world", f"{nodes} node(s) x {per_node} GPU(s) = world size {world}" if per_node > 1 or
                 _spec_text(groups[0]["InstanceType"])[1] else f"{nodes} node(s) x 1 process = world size {world}"))
    return rows, world


def model_text(request: Any, create: dict[str, Any]) -> str:
    """The model and its size: a reference model's preset, a model of one's own's `model_shape` (its preset is not
    what it trains)."""
    shape = request.model_shape
    if shape is None:
        return f"{_hp(create, 'model')} ({_hp(create, 'model_size')})"
    parts = [str(shape.kind)]
    if shape.layers and shape.hidden:
        parts.append(f"{shape.layers} layers x {shape.hidden} wide" + (f", {shape.heads} heads" if shape.heads else ""))
    if shape.params:
        parts.append(f"{shape.params / 1e9:.3g}B parameters")
    return f"{_hp(create, 'model')} (model_shape: {', '.join(parts)})"


def parallel_text(create: dict[str, Any], strategy: str, world: int) -> str:
    """How the world is split: SMP's degrees, FSDP's sharding, or DDP's replicas."""
    if strategy == "smp":
        mp = _hp(create, "mp_parameters") or {}
        tp = mp.get("tensor_parallel_degree", 1)
        cp = mp.get("context_parallel_degree", 1)
        data = world // (tp * cp)
        shard = mp.get("hybrid_shard_degree") or data
        sharding = (f"parameters sharded over all {data} data-parallel ranks" if shard == data else
                    f"parameters sharded within groups of {shard} data-parallel ranks, {data // shard} replicas")
        return f"SMP v2: tensor parallel {tp} x context parallel {cp} x data parallel {data}; {sharding}"
    if strategy == "fsdp":
        return f"FSDP: parameters, gradients and optimizer state sharded over {world} ranks"
    if strategy == "ddp":
        return f"DDP: {world} full replicas, gradients all-reduced"
    if strategy in MODEL_PARALLEL:
        text = f"{strategy}: " + mesh_lines(create, strategy)[0]
        pipeline = _hp(create, "pp_degree") or 1
        if pipeline > 1:
            schedule = _hp(create, "pp_schedule") or TrainConfig.pp_schedule
            per_rank = stages_per_rank(schedule, _hp(create, "pp_stages_per_rank"))
            text += (f"; {schedule}, {per_rank} stage(s) a rank, "
                     f"{microbatches(_hp(create, 'pp_microbatches'), pipeline)} micro-batches a step")
        return text
    return "none (one process)"


def mesh_lines(create: dict[str, Any], strategy: str) -> list[str]:
    """The torch-native mesh: its shape, then per host which ranks hold which pipeline stage, replica, shard
    and tensor slice (jobs.request.parallelism, the layout training.parallel.mesh builds)."""
    from jobs.catalog import lookup
    from jobs.request.parallelism import describe_layout

    groups = create["ResourceConfig"].get("InstanceGroups") or [create["ResourceConfig"]]
    spec = lookup(groups[0]["InstanceType"])
    hosts = [f"algo-{i + 1}" for i in range(groups[0]["InstanceCount"])]
    return describe_layout(strategy, hosts, max(1, spec.accelerators if spec else 1),
                           tensor=_hp(create, "tp_degree") or 1, pipeline=_hp(create, "pp_degree") or 1,
                           shard=_hp(create, "dp_shard") or 0)


def input_rows(create: dict[str, Any]) -> list[tuple[str, str]]:
    rows = []
    for channel in create.get("InputDataConfig") or []:
        source = channel["DataSource"]
        if "S3DataSource" in source:
            where = source["S3DataSource"]["S3Uri"]
        else:
            fs = source["FileSystemDataSource"]
            where = f"FSx {fs['FileSystemId']}:{fs['DirectoryPath']} ({fs['FileSystemAccessMode']})"
        mode = "FSx" if "FileSystemDataSource" in source else channel.get("InputMode", "File")
        rows.append((f"channel {channel['ChannelName']}", f"{where} [{mode}]"))
    return rows


def retry_rows(request: Any) -> list[tuple[str, str]]:
    retry = request.retry
    fallbacks = request.instance.fallbacks if request.instance is not None else ()
    on_demand = ("stays on Spot" if retry.interruptions_before_on_demand is None
                 else f"on demand after {retry.interruptions_before_on_demand} interruptions")
    budget = (f"{retry.max_total_hours:g}h" if retry.max_total_hours is not None
              else f"{request.effective_max_total_hours:g}h (3 x max runtime)")
    return [
        ("fallbacks", " -> ".join((request.instance.type, *fallbacks)) if fallbacks
         else "none (capacity retries use the same type)"),
        ("retries", f"at most {retry.max_attempts} attempts within {budget}"),
        ("  capacity", f"wait {retry.capacity_wait_seconds}s doubling to {retry.capacity_wait_max_seconds}s, "
                       "then the next fallback type"),
        ("  spot", f"resume after {retry.interruption_wait_seconds}s; {on_demand}" if request.spot
         else "not used"),
        ("  internal error", f"{retry.internal_error_max_retries} retries after {retry.internal_error_wait_seconds}s"),
        ("  quota/throttle", f"{retry.api_error_max_retries} retries, {retry.api_error_wait_seconds}s doubling to "
                             f"{retry.api_error_wait_max_seconds}s"),
        ("  hardware", f"{retry.hardware_max_retries} new attempts with infra_check on, on the next fallback type"),
        ("  stopped", "by SageMaker or a training plan's end: resumed like an interruption (trainctl stop ends it)"),
        ("  your code/data", "no retry: the run ends with the job's failure reason"),
    ]


def _shown(text: str) -> str:
    return text.replace(f"-{_PLAN_DIGEST}-{PLAN_NONCE}-", f"-{_DIGEST_SHOWN}-{_NONCE_SHOWN}-").replace(
        f"-{_PLAN_DIGEST}", f"-{_DIGEST_SHOWN}")


def plan_rows(request: Any, create: dict[str, Any]) -> list[tuple[str, str]]:
    strategy = _hp(create, "strategy")
    if request.strategy == "auto":
        from jobs.planning.auto_strategy import plan_for_request

        chosen = plan_for_request(request)
        strategy_text = f"auto -> {strategy} ({chosen.reason})"
    else:
        strategy_text = str(strategy)
    resources = create["ResourceConfig"]
    stopping = create["StoppingCondition"]
    spot = bool(create.get("EnableManagedSpotTraining"))
    instances, world = compute_rows(create, strategy)
    rows = [
        ("request", request.name),
        ("strategy", strategy_text),
        ("model", model_text(request, create)),
        *instances,
        ("parallelism", parallel_text(create, strategy, world)),
        *(("  " + line.split(":", 1)[0], line.split(":", 1)[1].strip())
          for line in (mesh_lines(create, strategy)[1:] if strategy in MODEL_PARALLEL else [])),
        ("image", create["AlgorithmSpecification"]["TrainingImage"]),
        *input_rows(create),
        ("spot", f"yes, max wait {duration(stopping.get('MaxWaitTimeInSeconds'))}" if spot else "no (on demand)"),
        ("max runtime", f"{duration(stopping.get('MaxRuntimeInSeconds'))} per attempt"),
        ("checkpoints", f"{_shown(create['CheckpointConfig']['S3Uri'])} every {_hp(create, 'checkpoint_interval')} "
                        f"steps{_minutes_text(create)}"),
        ("output", _shown(create["OutputDataConfig"]["S3OutputPath"])),
    ]
    if resources.get("KeepAlivePeriodInSeconds"):
        rows.append(("warm pool", duration(resources["KeepAlivePeriodInSeconds"])))
    if resources.get("TrainingPlanArn"):
        rows.append(("training plan", resources["TrainingPlanArn"]))
    rows += retry_rows(request)
    rows.append(("job names", f"{_shown(create['TrainingJobName'])}, -a2, ... (a fresh name per attempt; every "
                              "attempt resumes from the run's one checkpoint prefix)"))
    rows.append(("run id", "<16 random> is drawn once per execution: a new run (and prefix) per execution"))
    return rows


def _minutes_text(create: dict[str, Any]) -> str:
    """The time cadence the job was rendered with: the request's checkpoint_minutes (any spelling), else the
    planner's Young/Daly interval that jobs.render.training_job sets."""
    keys = [k for k in create.get("HyperParameters") or {} if canonical_name(k) == "checkpoint_minutes"]
    minutes = _hp(create, keys[0]) if keys else None
    return f" and every {minutes:g} min" if minutes else ""


def print_plan(console: Console, request: Any, platform: Any, create: dict[str, Any]) -> None:
    table = Table(show_header=False, box=None, pad_edge=False, title=f"plan for {escape(request.name)}",
                  title_justify="left")
    table.add_column(style="bold", no_wrap=True)
    table.add_column(overflow="fold")
    for label, value in plan_rows(request, create):
        table.add_row(label, escape(str(value)))
    console.print(table)
    console.print(f"[green]valid[/]: {escape(request.name)} renders a CreateTrainingJob request for "
                  f"{escape(platform.region)}; `trainctl render` prints it, `trainctl submit` starts it.")


# ---- sizing: the planner's candidates (jobs.planning) -------------------------------------------------------


def sizing_result(request: Any, platform: Any, prices: Any = None, aws: Any = None, runs: Any = ()) -> Any:
    """The planner's result; an input it cannot use is a UserError naming the field. `prices`: instance type ->
    on-demand training USD per hour (cli.price_source.PriceTable.prices); None: no prices (every cost unknown). `aws`:
    where the plan may read an S3 dataset's meta.json (cli.dataset_meta); None: it reads no S3. `runs`: the
    platform's run records' measured sections (cli.run_cache) that correct the step times."""
    from cli.dataset_meta import dataset_meta
    from cli.errors import UserError
    from jobs.planning import PlanInputError, plan_request

    try:
        return plan_request(request, platform, prices=prices, dataset_meta=dataset_meta(request.dataset, aws),
                            runs=runs)
    except PlanInputError as exc:
        raise UserError(f"cannot size {request.name}: {exc}") from None


def _money(value: float | None) -> str:
    """A cost, or "price unknown" where the plan's prices have none for the type (never a made-up figure)."""
    return "price unknown" if value is None else f"${value:,.0f}"


def _instance_types(result: Any) -> list[str]:
    return list(dict.fromkeys(c.instance_type for c in result.candidates))


def prices_line(result: Any, prices: Any) -> str:
    """Where the costs come from (cli.price_source.PriceTable), and how many of the plan's instance types it prices."""
    if prices is None:
        return "none: no price table was given"
    if prices.source == "none":
        return prices.describe()
    from jobs.catalog import SPOT_SAVINGS

    types = _instance_types(result)
    priced = sum(1 for t in types if t in prices.prices)
    text = (f"on-demand training USD per instance-hour from {prices.describe()}; {priced} of the {len(types)} "
            "instance types sized have a price")
    if any(c.spot and c.cost_usd is not None for c in result.candidates):
        text += f"; Spot costs take {SPOT_SAVINGS:.0%} off (an assumption, jobs/catalog.py [spot])"
    return text


def prices_document(result: Any, prices: Any) -> dict[str, Any]:
    """`--json`'s `prices`: the source, its date, and the price of each instance type sized (null: unknown)."""
    if prices is not None:
        return prices.to_dict(_instance_types(result))
    return {"source": "none", "description": prices_line(result, None), "date": None,
            "usd_per_hour": dict.fromkeys(_instance_types(result))}


def shortlist(result: Any) -> list[Any]:
    """What a terminal shows: every candidate on the requested shape, then per other instance type its fastest
    and its cheapest fitting candidate (`--json` has them all)."""
    rec = result.recommendation
    same = [c for c in result.candidates if (c.instance_type, c.layout.nodes) == (rec.instance_type, rec.layout.nodes)]
    rows = [rec, *(c for c in same if c is not rec)]
    for instance_type in dict.fromkeys(c.instance_type for c in result.candidates):
        fitting = [c for c in result.candidates if c.instance_type == instance_type and c.fits and c not in rows]
        picks = [min(fitting, key=lambda c: c.hours)] if fitting else []
        priced = [c for c in fitting if c.cost_usd is not None]
        if priced:
            picks.append(min(priced, key=lambda c: c.cost_usd))
        rows.extend(dict.fromkeys(picks))
    return rows


def sizing_table(result: Any) -> Table:
    rows = shortlist(result)
    left = len(result.candidates) - len(rows)
    title = "sizing (estimates: docs in jobs/planning)" + (f"; {left} more with --json" if left else "")
    table = Table(title=title, title_justify="left")
    unit = result.recommendation.to_dict()["throughput_unit"]  # one model: every candidate counts the same
    for column in ("", "strategy", "degrees r/s/t/p", "instances", "GPUs", "GiB/GPU", "step s", unit, "eff",
                   "hours", "cost", "ckpt min"):
        table.add_column(column, overflow="fold")
    rec = result.recommendation
    for c in rows:
        d = c.to_dict()
        mark = "*" if c is rec else ""
        strategy = d["strategy"]
        degrees = "/".join(str(v) for v in d["degrees"].values()) + (
            f" interleaved, {d['pipeline_stages_per_rank']} a rank" if d["pipeline_schedule"] == INTERLEAVED else "")
        fit = f"{d['memory_per_gpu_gib']:.1f}" + ("" if d["fits"] else " (no fit)")
        table.add_row(mark, strategy, degrees, f"{d['instance_count']} x {d['instance_type']}", str(d["gpus"]), fit,
                      f"{d['step_time_s']:.3g}", f"{d['throughput']:,.0f}", f"{d['scaling_efficiency']:.0%}",
                      f"{d['hours']:.2f}", _money(d["cost_usd"]), f"{d['checkpoint_minutes']:.0f}")
    return table


def calibration_line(candidate: Any) -> str:
    """How far the step time has been off on the candidate's GPU generation (its JSON error_band)."""
    d = candidate.to_dict()
    if runs := d.get("measured_runs"):
        band = f"; they spread {d['error_band']:.0%} around it" if runs["spread"] is not None else \
            "; one run: no spread, the published band stays" + (f" ({d['error_band']:.0%})" if d["error_band"] else "")
        return (f"corrected by {runs['count']} run{'s' if runs['count'] != 1 else ''} of the platform ("
                f"{runs['matched_on']}): measured step time {runs['measured_over_predicted']:.2f}x the model's "
                f"(median){band} (--json: measured_runs, calibrated_from)")
    if d["error_band"] is None:
        return ("no published run on this GPU generation: its efficiencies are borrowed from another "
                "(--json: calibrated_from)")
    return (f"throughput within {d['error_band']:.0%} of every published run on this GPU generation the fit was "
            "not given (--json: error_band, calibrated_from)")


def print_sizing(console: Console, result: Any, prices: Any = None, runs: Any = None) -> None:
    """The table, the recommendation, where the prices come from, and the warnings (the planner's, then the
    prices')."""
    if result.recommendation is None:
        console.print(f"[yellow]not sized[/]: {escape(result.reason)}")
    else:
        console.print(sizing_table(result))
        console.print(f"[bold]recommendation[/] (*): {escape(result.reason)}")
        console.print(f"[bold]time model[/]: {escape(calibration_line(result.recommendation))}")
        if runs is not None:
            console.print(f"[bold]run records[/]: {escape(runs.describe(result.runs[1]))}")
        console.print(f"[bold]prices[/]: {escape(prices_line(result, prices))}")
        if result.input is not None:
            console.print(f"[bold]input[/]: {escape(result.input.text())}")
    for w in result.warnings:
        console.print(f"[yellow]{w.code}[/]: {escape(w.message)}")
    for code, message in prices.warnings() if prices is not None else []:
        console.print(f"[yellow]{code}[/]: {escape(message)}")


def plan_json(result: Any, prices: Any = None, runs: Any = None) -> str:
    doc = result.to_dict() | {"prices": prices_document(result, prices)}
    if runs is not None:
        doc["measured_runs"] |= {"source": runs.source, "path": runs.path,
                                 "description": runs.describe(result.runs[1])}
    return json.dumps(doc, indent=2)


def draw_chart(result: Any, path: Any, prices: Any = None) -> None:
    """Hours and cost against GPU count for the recommendation's instance type, the recommendation marked; the
    title names the prices' source."""
    from cli.errors import UserError
    from cli.views.charts import save_figure

    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UserError("--chart needs matplotlib", "pip install 'sagemaker-training-platform[chart]' (or pip install matplotlib)") \
            from None
    rec = result.recommendation
    if rec is None:
        raise UserError("--chart: nothing was sized for this request (no GPU instance)")
    same = sorted((c for c in result.candidates if c.instance_type == rec.instance_type and c.fits),
                  key=lambda c: c.layout.gpus)
    best_per_gpus = {}
    for c in same:
        if c.layout.gpus not in best_per_gpus or c.hours < best_per_gpus[c.layout.gpus].hours:
            best_per_gpus[c.layout.gpus] = c
    pts = sorted(best_per_gpus.values(), key=lambda c: c.layout.gpus)
    fig, hours_ax = plt.subplots(figsize=(7, 4))
    hours_ax.plot([c.layout.gpus for c in pts], [c.hours for c in pts], "o-", label="hours")
    hours_ax.set_xscale("log", base=2)
    hours_ax.set_xlabel(f"GPUs ({rec.instance_type})")
    hours_ax.set_ylabel("hours")
    cost_ax = hours_ax.twinx()
    costs = [(c.layout.gpus, c.cost_usd) for c in pts if c.cost_usd is not None]
    if costs:
        cost_ax.plot(*zip(*costs, strict=True), "s--", color="tab:orange", label="cost (USD)")
        cost_ax.set_ylabel("USD")
    else:  # no price for the type: say so on the chart rather than leave the cost axis silently empty
        cost_ax.set_yticks([])
        cost_ax.set_ylabel(f"cost: price unknown for {rec.instance_type}")
    hours_ax.set_title(f"on-demand prices: {prices.short() if prices is not None else 'none'}", fontsize=9)
    hours_ax.plot([rec.layout.gpus], [rec.hours], "r*", markersize=16, label="recommendation")
    hours_ax.legend(loc="upper center")
    fig.tight_layout()
    try:
        save_figure(fig, Path(path))
    finally:
        plt.close(fig)
