"""One home per naming fact (docs/ARCHITECTURE.md, "Where each shared fact lives"): no second definition.

Each fact below is defined in its home and imported everywhere else. The check reads every project module with
`ast` (not the tests, which may spell a value to check it) and fails on a code string, an assignment or a call
outside the fact's home that restates it: the run-id tag key, the job-name and run-id formats, the failure
line's regex, the out-of-memory advice, timestamp parsing, the hours in a month. Docstrings and comments may name
a fact in words; code may not spell it again.
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from contract.failures import OUT_OF_MEMORY_ADVICE

ROOT = Path(__file__).resolve().parents[1]
ROOMS = ("contract", "jobs", "training", "cli", "bundles", "platform_config", "platform_constructs", "stacks", "tools",
         "bench")


def code_strings(tree: ast.AST) -> Iterator[ast.Constant]:
    """Every string constant of the module but its docstrings (an f-string's literal parts included)."""
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(id(first.value))
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            yield node


def strings_matching(pattern: str) -> Callable[[ast.AST], list[int]]:
    found = re.compile(pattern)
    return lambda tree: [node.lineno for node in code_strings(tree) if found.search(node.value)]


def calls_to(*names: str) -> Callable[[ast.AST], list[int]]:
    def lines(tree: ast.AST) -> list[int]:
        return [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Call)
                and getattr(node.func, "attr", getattr(node.func, "id", None)) in names]
    return lines


def defines(name: str, value: float) -> Callable[[ast.AST], list[int]]:
    """An assignment to `name`, or the number `value` written as a literal."""
    def lines(tree: ast.AST) -> list[int]:
        out = [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Assign | ast.AnnAssign)
               for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
               if isinstance(target, ast.Name) and target.id == name]
        return out + [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Constant)
                      and type(node.value) in (int, float) and node.value == value]
    return lines


@dataclass(frozen=True)
class Fact:
    name: str
    home: str  # the one module that may define it
    find: Callable[[ast.AST], list[int]]  # the lines of a module that restate it


FACTS = (
    # The run-id tag key (an IAM boundary): `<name_prefix>:run-id` (trainctl's `--run-id` option is not it).
    Fact("the run-id tag key", "jobs/naming.py", strings_matching(r"(?<![-\w])run-id(?![-\w])")),
    # SageMaker's name characters (job names, run ids, name prefixes), the run token's alphabet, the attempt suffix.
    Fact("the job-name and run-id formats", "jobs/naming.py",
         strings_matching(r"\(-\*\[(?:a-zA-Z0-9|A-Za-z0-9)\]\)|\[a-z2-7\]|-a\(\\d\+\)")),
    # The wildcard of a platform's (a team's) job names, `<name_prefix>-*`: the launcher's, the job role's and the
    # engineers' IAM resources and the listing of a team's own jobs.
    Fact("the job names' wildcard", "jobs/naming.py", strings_matching(r"^-\*")),
    Fact("the failure line's regex", "contract/failures.py", strings_matching(r"\\\[training:")),
    Fact("the out-of-memory advice", "contract/failures.py", strings_matching(re.escape(OUT_OF_MEMORY_ADVICE[:40]))),
    Fact("how a timestamp is read", "jobs/timestamps.py", calls_to("fromisoformat", "strptime")),
    Fact("the hours in a month", "jobs/prices.py", defines("HOURS_PER_MONTH", 730)),
)


def project_files() -> list[Path]:
    return [ROOT / "app.py"] + sorted(p for room in ROOMS if (ROOT / room).is_dir() for p in (ROOT / room).rglob("*.py"))


@functools.cache
def parsed(path: Path) -> ast.AST:
    return ast.parse(path.read_text(), filename=str(path))


def second_homes(fact: Fact, files: list[Path]) -> list[str]:
    out = []
    for path in files:
        rel = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else path.name
        if rel == fact.home:
            continue
        out += [f"{rel}:{line}" for line in fact.find(parsed(path))]
    return out


@pytest.mark.parametrize("fact", FACTS, ids=lambda f: f.name)
def test_each_naming_fact_has_one_home(fact):
    files = project_files()
    assert (ROOT / fact.home) in files, f"{fact.home} is gone: update FACTS with {fact.name}'s new home"
    again = second_homes(fact, files)
    assert not again, f"{fact.name} is {fact.home}'s; import it from there instead of restating it at {again}"


def test_the_check_finds_a_second_definition(tmp_path):
    """The check above could fail: a module restating each fact is caught, line by line, and one that imports
    them (or names them in its docstring and comments) is not."""
    bad = tmp_path / "bad.py"
    bad.write_text('''"""Tags every job with `<prefix>:run-id` (only a docstring: allowed)."""
import re
from datetime import datetime
TAG = f"{prefix}:run-id"
RUN = re.compile(r"[a-zA-Z0-9](-*[a-zA-Z0-9])*-[a-z2-7]{16}")
LINE = re.compile(r"\\[training:(?P<code>[a-z_]+)\\] (?P<message>.*)")
ADVICE = "lower hyperparameters.micro_batch_size (keep global_batch_size: grad_accum grows), or shard"
WHEN = datetime.strptime("2026-01-01", "%Y-%m-%d")
HOURS_PER_MONTH = 24 * 365 / 12
ATTEMPT = re.compile(r"-a(\\d+)$")
JOBS = f"arn:aws:sagemaker:us-east-1:1:training-job/{prefix}-*"
''')
    found = {fact.name: second_homes(fact, [bad]) for fact in FACTS}
    assert found == {
        "the run-id tag key": ["bad.py:4"],
        "the job-name and run-id formats": ["bad.py:5", "bad.py:10"],
        "the failure line's regex": ["bad.py:6"],
        "the out-of-memory advice": ["bad.py:7"],
        "how a timestamp is read": ["bad.py:8"],
        "the hours in a month": ["bad.py:9"],
        "the job names' wildcard": ["bad.py:11"],
    }
    good = tmp_path / "good.py"
    good.write_text('"""Reads `<prefix>:run-id` and `[training:<code>]` lines."""\n'
                    "from jobs.naming import RUN_ID, run_id_tag_key  # the run-id tag key's home\n"
                    "from jobs.prices import HOURS_PER_MONTH\n"
                    "OPTION = '--run-id'\n")
    assert all(second_homes(fact, [good]) == [] for fact in FACTS)
