"""The platform's run records on this machine, for `trainctl plan` (`--runs`): what each finished run measured
against the planner's figure (the `measured` section Summarize writes: jobs.planning.measured).

`trainctl runs` and `trainctl show` read executions' summaries from Step Functions anyway; they keep each run's
`measured` section in ~/.cache/trainctl/measured-runs.json ($XDG_CACHE_HOME/trainctl when set, beside the price
cache: cli.price_source), keyed by training job name, the KEEP given last (trainctl runs gives them oldest run first).
`trainctl plan` then reads that file, with no AWS call: `--runs cache` (the default), `--runs FILE.json` (a JSON
list of such sections, e.g. a team's shared one) or `--runs none` (the published rows only). A file that cannot be read, or a section it cannot use, is
said so and left out; the plan goes on.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cli.cache_files import cache_file, replace_file
from cli.errors import UserError

KEEP = 500  # sections kept: the last given (a plan reads a few matching runs; the file stays small)


def cache_path() -> Path:
    return cache_file("measured-runs.json")


@dataclass(frozen=True)
class RunRecords:
    """The `measured` sections a plan is corrected by, and where they come from."""

    sections: list[Any]
    source: str  # cache, file, none
    path: str | None = None
    note: str = ""  # why the file gave nothing

    def describe(self, usable: int) -> str:
        if self.source == "none":
            return "none (--runs none): the published rows only"
        where = f"{self.path}" + (" (filled by trainctl runs/show)" if self.source == "cache" else "")
        text = f"{len(self.sections)} run record(s) in {where}, {usable} usable"
        if self.note:
            text += f"; {self.note}"
        if len(self.sections) > usable:
            text += (f"; {len(self.sections) - usable} without a measured step time and the planner's figure for it "
                     "(older or malformed records) left out")
        return text


def read_sections(path: Path) -> tuple[list[Any], str]:
    """(the sections a file holds, a note when it holds none it can give); never raises for the file's content."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return [], ""
    except (OSError, ValueError) as exc:
        return [], f"{path} could not be read ({exc}): left out"
    sections = doc.get("runs") if isinstance(doc, dict) else doc
    if not isinstance(sections, list):
        return [], f"{path} holds no list of run records: left out"
    return sections, ""


def load_runs(option: str) -> RunRecords:
    """`--runs`: cache | none | FILE.json."""
    if option == "none":
        return RunRecords([], "none")
    if option == "cache":
        path = cache_path()
        sections, note = read_sections(path)
        return RunRecords(sections, "cache", str(path), note or ("" if path.exists() else
                                                                 "none yet: `trainctl runs` fills it"))
    path = Path(option)
    if not path.is_file():
        raise UserError(f"--runs {option}: no such file", "give cache, none, or a JSON file holding a list of run "
                                                          "records' measured sections")
    sections, note = read_sections(path)
    if note:
        raise UserError(f"--runs {option}: {note.removesuffix(': left out')}",
                        "give a JSON list of run records' measured sections (trainctl runs --json: record.measured)")
    return RunRecords(sections, "file", str(path))


def remember(sections: Iterable[Mapping[str, Any] | None]) -> str | None:
    """Add runs' `measured` sections, oldest first, to the cache (a section of a job already there replaces it and
    moves to the end; the first are dropped past KEEP); returns a note when the cache cannot be written (the
    command goes on without it)."""
    new = [s for s in sections if isinstance(s, Mapping) and s.get("job_name")]
    if not new:
        return None
    path = cache_path()
    kept, _ = read_sections(path)
    by_job = {s["job_name"]: s for s in kept if isinstance(s, Mapping) and s.get("job_name")}
    for section in new:
        by_job.pop(section["job_name"], None)
        by_job[section["job_name"]] = dict(section)
    try:
        replace_file(path, json.dumps(list(by_job.values())[-KEEP:], indent=1) + "\n")
    except OSError as exc:
        return f"the run records could not be cached in {path} ({exc}): trainctl plan goes without them"
    return None
