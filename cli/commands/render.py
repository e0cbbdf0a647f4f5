"""`trainctl plan` and `trainctl render`: a request rendered into the CreateTrainingJob request SageMaker gets.

Both run offline when the platform settings come from a file; otherwise they read the deployed stack's.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
from pathlib import Path
from typing import Any

import typer

from cli.aws import Aws
from cli.console import out
from cli.errors import UserError
from cli.request_file import LoadedRequest, load_request, validate_for_platform


def render_for_platform(loaded: LoadedRequest, platform: Any, *, attempt: int, run_id: str | None,
                        instance_type: str | None, on_demand: bool) -> dict[str, Any]:
    """The CreateTrainingJob request of one attempt; a request the renderer refuses is a UserError."""
    from cli.views.plan import PLAN_NONCE, plan_run_id
    from contract.errors import RequestInvalid
    from jobs.render.training_job import render_create_training_job

    if instance_type is not None:
        check_instance_override(loaded.request, platform, instance_type)
    # Without --run-id, a stand-in the same on every call: zeros where the launcher draws random characters.
    nonce = None if run_id else PLAN_NONCE
    run_id = run_id or plan_run_id(loaded.request.name)
    try:
        return render_create_training_job(loaded.request, platform, run_id=run_id, attempt=attempt,
                                          instance_type=instance_type, spot=False if on_demand else None,
                                          name_nonce=nonce)
    except RequestInvalid as exc:
        raise UserError(f"cannot render {loaded.path}:\n  " + str(exc).replace("\n", "\n  ")) from None
    except ValueError as exc:  # a --run-id that cannot make a SageMaker job name
        raise UserError(str(exc), f"use letters, digits and dashes in --run-id, e.g. {plan_run_id('my-run')}") from None


def check_instance_override(request: Any, platform: Any, instance_type: str) -> None:
    """--instance-type gets the checks the request's own types get (catalog, platform's allowed list)."""
    from jobs.catalog import instance_types, lookup

    if request.instance_groups:
        raise UserError("--instance-type does not apply to a request with instance_groups")
    if lookup(instance_type) is None:
        close = difflib.get_close_matches(instance_type, instance_types(), n=1, cutoff=0.6)
        raise UserError(f"--instance-type: unknown instance type {instance_type!r}"
                        + (f"; did you mean {close[0]!r}?" if close else ""))
    allowed = platform.allowed_instance_types
    if allowed and instance_type not in allowed:
        raise UserError(f"--instance-type: {instance_type} is not allowed on this platform",
                        f"allowed: {', '.join(sorted(allowed))}")
    if problems := _problems_on(request, platform, instance_type):
        raise UserError(f"--instance-type {instance_type}: the request cannot run on it:\n  " + "\n  ".join(problems),
                        f"pick a type the request runs on, e.g. its own: {', '.join(request.instance_types)}")


def _problems_on(request: Any, platform: Any, instance_type: str) -> list[str]:
    """The request's rules and the platform's, with instance_type as its only type. The request's own types were
    checked when it was read; an override was not, and the renderer fails deep inside on a type the request's
    strategy cannot use (no SMP image for a CPU instance: KeyError 'cpu')."""
    from contract.errors import RequestInvalid
    from jobs.request.cross_rules import cross_field_problems
    from jobs.request.platform_rules import validate_for_platform

    trial = dataclasses.replace(request, instance=dataclasses.replace(request.instance, type=instance_type,
                                                                      fallbacks=()))
    problems = [str(p) for p in cross_field_problems(trial)]
    try:
        validate_for_platform(trial, platform)
    except RequestInvalid as exc:
        problems += [str(p) for p in exc.problems]
    return problems


def _loaded_for_platform(request: Path, platform: Path | None, aws: Aws) -> tuple[LoadedRequest, Any]:
    from cli.platform_source import load_platform

    loaded = load_request(request)
    settings = load_platform(platform, aws)
    validate_for_platform(loaded, settings)
    return loaded, settings


def show_plan(request: Path, platform: Path | None, aws: Aws, *, as_json: bool = False,
              chart: Path | None = None, prices: str = "auto", runs: str = "cache") -> None:
    """`trainctl plan`: validate, render the first attempt, print what would run and how it is sized, its costs
    from the prices `--prices` names (cli.price_source)."""
    from cli.price_source import resolve_prices
    from cli.run_cache import load_runs
    from cli.views.plan import draw_chart, plan_json, print_plan, print_sizing, sizing_result

    if chart is not None:
        from cli.views.charts import check_chart_option

        check_chart_option(chart)  # before any work: matplotlib refuses a bad name only at the end, with a traceback
    loaded, settings = _loaded_for_platform(request, platform, aws)
    create = render_for_platform(loaded, settings, attempt=1, run_id=None,
                                 instance_type=None, on_demand=False)
    table = resolve_prices(prices, getattr(settings, "region", None), aws)
    records = load_runs(runs)
    result = sizing_result(loaded.request, settings, table.prices, aws=None if platform is not None else aws,
                           runs=records.sections)
    if chart is not None:
        draw_chart(result, chart, table)
    if as_json:
        # A document for other programs, fitting or not: its recommendation says `fits` and the warning why.
        typer.echo(plan_json(result, table, records))
        return
    _refuse_unfit(loaded.request, result)
    print_plan(out(), loaded.request, settings, create)
    print_sizing(out(), result, table, records)


def _refuse_unfit(request: Any, result: Any) -> None:
    """A plan is a promise: a request whose layout does not fit the GPUs is an error (exit 2) naming the nearest
    layout that fits, never "valid" (`trainctl submit` would start a job that runs out of memory); `--json` shows
    every candidate. What the request runs: auto's pick, or the layout its strategy and degrees name (none for smp,
    whose layout is SMP's own, which the planner does not size)."""
    from jobs.planning.candidates import requested_layouts
    from jobs.planning.warnings import nearest_fit, shape_words

    if result.recommendation is None:
        return
    runs = ([result.auto] if result.auto else []) if request.strategy.value == "auto" else \
        requested_layouts(result.every_layout, request)
    if not runs or any(c.fits for c in runs):
        return
    worst = min(runs, key=lambda c: c.memory_gib)
    nearest = nearest_fit(result)
    fix = (f"nearest that fits: {shape_words(nearest)}, request fields "
           f"{json.dumps(nearest.to_dict()['request'])}" if nearest else
           "nothing the plan compared fits: set hyperparameters.activation_checkpointing or lower micro_batch_size")
    raise UserError(f"{request.name} does not fit: {shape_words(worst)} needs {worst.memory_gib:.1f} GiB per GPU of "
                    f"{worst.capacity_gib:.0f}", fix)


def print_rendered(request: Path, platform: Path | None, aws: Aws, *, attempt: int, run_id: str | None,
                   instance_type: str | None, on_demand: bool) -> None:
    """`trainctl render`: the CreateTrainingJob request as JSON on stdout."""
    loaded, settings = _loaded_for_platform(request, platform, aws)
    create = render_for_platform(loaded, settings, attempt=attempt, run_id=run_id, instance_type=instance_type,
                                 on_demand=on_demand)
    # Plain print, not rich: the output is a document for other programs.
    typer.echo(json.dumps(create, indent=2))
