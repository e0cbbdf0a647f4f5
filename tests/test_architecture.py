"""The rooms import one way (docs/ARCHITECTURE.md, "Which way imports run") and no module imports itself back.

Every import in every project module is read with `ast` (function-level imports too: a lazy import is still
a dependency), mapped to its room, and checked against the allowed edges below. The same graph, module by
module, must have no cycle.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# room -> the project rooms it may import (besides itself). Keep in step with docs/ARCHITECTURE.md.
ALLOWED = {
    "contract": set(),
    "bundles": set(),
    "training": {"contract"},
    "jobs": {"contract"},
    # The config checks values against the constructs' own facts (retention periods, EFA subnet sizing).
    "platform_config": {"contract", "jobs", "platform_constructs"},
    "platform_constructs": {"contract", "jobs", "bundles"},
    "stacks": {"contract", "jobs", "platform_config", "platform_constructs"},
    "app": {"contract", "jobs", "platform_config", "platform_constructs", "stacks"},
    "cli": {"contract", "jobs", "bundles"},
    "tools": {"contract", "jobs", "cli"},
    "bench": {"contract", "training", "prepare"},
    # The data preparers (run on a workstation, never by a job) may use the runtime's formats.
    "prepare": {"contract", "training"},
}
# Third-party packages a room may use; the runtime rooms are the strict ones.
THIRD_PARTY = {
    "contract": set(),
    "jobs": {"boto3", "botocore"},
    # smdistributed: SMDDP, present only in the SageMaker images that ship it (imported when asked for).
    # PIL: image decoding in the loader. boto3: training.metrics.cloudwatch alone, imported only when the launcher
    # names the team's metrics namespace (SageMaker's images ship it; a local run never imports it).
    # mlflow: training.metrics.mlflow_run alone, imported only when a tracking server is named (sagemaker_mlflow, its
    # plugin for a SageMaker MLflow ARN, only to say it is missing).
    "training": {"torch", "numpy", "safetensors", "smdistributed", "PIL", "boto3", "mlflow", "sagemaker_mlflow"},
    # tokenizers, pyarrow: prepare time only (prepare.text), so a job never imports them; PIL checks each image opens.
    "prepare": {"numpy", "tokenizers", "pyarrow", "PIL"},
}


def project_modules() -> dict[str, Path]:
    modules = {"app": ROOT / "app.py"}
    for room in ALLOWED:
        folder = ROOT / room
        if folder.is_dir():
            for path in folder.rglob("*.py"):
                parts = path.relative_to(ROOT).with_suffix("").parts
                name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
                modules[name] = path
    return modules


def imports_of(path: Path, module: str) -> set[str]:
    found = set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative import: resolve against the package
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                stem = ".".join([*base, node.module] if node.module else base)
            else:
                stem = node.module or ""
            found.add(stem)
            found.update(f"{stem}.{a.name}" for a in node.names)
    return found


MODULES = project_modules()
ROOMS = set(ALLOWED)


def room_of(name: str) -> str:
    return name.split(".")[0]


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_run_the_documented_way(module):
    room = room_of(module)
    stdlib = set(sys.stdlib_module_names)
    wrong = []
    for name in sorted(imports_of(MODULES[module], module)):
        top = room_of(name)
        if top == room or top == "__future__":
            continue
        if top in ROOMS:
            if top not in ALLOWED[room]:
                wrong.append(f"{name} (room {top!r})")
        elif room in THIRD_PARTY and top not in stdlib and top not in THIRD_PARTY[room]:
            wrong.append(f"{name} (third-party)")
    assert not wrong, f"{module} imports against docs/ARCHITECTURE.md: {', '.join(wrong)}"


def _module_graph() -> dict[str, set[str]]:
    graph = {}
    for module, path in MODULES.items():
        targets = set()
        for name in imports_of(path, module):
            # `from pkg import sub` names a module; `from pkg.mod import func` names the module pkg.mod.
            while name and name not in MODULES:
                name = name.rpartition(".")[0]
            if name and name != module and not module.startswith(name + "."):
                targets.add(name)
        graph[module] = targets
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The cycles of `graph` (node -> the nodes it imports), each as a depth-first walk first finds it."""
    state: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return cycles


def test_no_import_cycles():
    graph = _module_graph()
    # A package's __init__ importing its own submodules is how Python packages work, not a cycle of concerns.
    for module, targets in graph.items():
        graph[module] = {t for t in targets if not t.startswith(module + ".")}
    cycles = find_cycles(graph)
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_the_checker_sees_a_wrong_import(tmp_path):
    """The check above could fail: a training module importing jobs is caught."""
    bad = tmp_path / "bad.py"
    bad.write_text("from jobs.request.parse import parse_request\nimport tokenizers\n")
    names = imports_of(bad, "training.bad")
    assert "jobs.request.parse" in names and "tokenizers" in names
    assert "jobs" not in ALLOWED["training"] and "tokenizers" not in THIRD_PARTY["training"]


# Every room of code: docs/ARCHITECTURE.md's "Where is..." names each of their modules.
WHERE_IS_ROOMS = ("jobs", "cli", "training", "prepare", "contract", "platform_config", "platform_constructs",
                  "stacks", "bundles", "tools", "bench")


def test_every_module_of_every_room_is_named_where_people_look():
    """docs/ARCHITECTURE.md's "Where is..." table answers "where is X" by folder name: every module of every room
    (but the planner's, which its own __init__ lists, and the strategies', which training/README.md's table lists)
    is named there by its path, or by its file name in its folder's row; `tests/` answers by mirroring them."""
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    where = text[text.index("## Where is..."):]
    where = where[: where.index("\n## ", 1)]
    assert "`tests/`" in where
    modules = [p for room in WHERE_IS_ROOMS for p in (ROOT / room).rglob("*.py")
               if p.name not in ("__init__.py", "__main__.py") and "planning" not in p.parts
               and "strategies" not in p.parts]
    unnamed = []
    for path in modules:
        rel = path.relative_to(ROOT).as_posix()
        folder, _, name = rel.rpartition("/")
        # A row names a module by its path, or by its file name in the row of its folder.
        rows = [line for line in where.splitlines() if f"`{folder}/`" in line]
        if f"`{rel}`" not in where and not any(f"`{name}`" in row for row in rows):
            unnamed.append(rel)
    assert not unnamed, f"not in docs/ARCHITECTURE.md's 'Where is...' table: {unnamed}"


# The layers of jobs/, lowest first (docs/ARCHITECTURE.md, "Inside jobs/"): a unit is a folder of jobs/ or one of
# its top-level modules; a unit imports only units of lower layers (and itself), never one of its own layer or above.
JOBS_LAYERS: tuple[tuple[str, ...], ...] = (
    ("timestamps", "naming", "catalog", "registry"),  # facts every folder reads
    ("prices", "platform"),  # read the catalog, the naming facts
    ("planning",),  # the planner: sizing `strategy: auto` needs
    ("request",),  # the request, its schema and rules (auto's strategy from the planner)
    ("render", "retry"),  # the CreateTrainingJob of attempt N; what happens when an attempt ends
    ("outcome",),  # the summary and the run record (the run state, the planner's measured section)
    ("handler", "reference"),  # the Lambda entry points; README's reference tables
)


def jobs_unit(module: str) -> str | None:
    """The unit of jobs/ a module belongs to: `jobs.request.parse` -> `request`, `jobs.handler` -> `handler`."""
    parts = module.split(".")
    return parts[1] if parts[0] == "jobs" and len(parts) > 1 else None


def jobs_unit_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """unit -> the other units of jobs/ its modules import."""
    units: dict[str, set[str]] = {}
    for module, targets in graph.items():
        if (unit := jobs_unit(module)) is not None:
            units.setdefault(unit, set()).update(t for target in targets
                                                 if (t := jobs_unit(target)) is not None and t != unit)
    return units


def layer_violations(graph: dict[str, set[str]], layers=JOBS_LAYERS) -> list[str]:
    """Each import of jobs/ that runs sideways or up the layers, or whose unit no layer names."""
    layer = {unit: i for i, units in enumerate(layers) for unit in units}
    wrong = []
    for module, targets in sorted(graph.items()):
        unit = jobs_unit(module)
        if unit is None:
            continue
        if unit not in layer:
            wrong.append(f"{module}: {unit!r} is in no layer of JOBS_LAYERS")
            continue
        for target in sorted(targets):
            other = jobs_unit(target)
            if other is not None and other != unit and layer.get(other, len(layers)) >= layer[unit]:
                wrong.append(f"{module} -> {target} ({unit} is not above {other})")
    return wrong


def test_jobs_folders_import_no_cycle():
    cycles = find_cycles(jobs_unit_graph(_module_graph()))
    assert not cycles, "cycles between jobs/ folders: " + "; ".join(" -> ".join(c) for c in cycles)


def test_jobs_folders_import_only_downward():
    wrong = layer_violations(_module_graph())
    assert not wrong, "imports against jobs/' layers (JOBS_LAYERS, docs/ARCHITECTURE.md):\n" + "\n".join(wrong)


def test_the_layer_check_sees_an_upward_edge_and_a_cycle():
    """The two checks above could fail: a request module importing render (up) and render importing request back."""
    graph = {"jobs.request.rules": {"jobs.render.build", "jobs.naming"}, "jobs.render.build": {"jobs.request.rules"},
             "jobs.naming": set()}
    assert find_cycles(jobs_unit_graph(graph)) == [["render", "request", "render"]]
    assert layer_violations(graph) == ["jobs.request.rules -> jobs.render.build (request is not above render)"]
    assert layer_violations({"jobs.newfolder.x": set()}) == ["jobs.newfolder.x: 'newfolder' is in no layer of JOBS_LAYERS"]
    # Sideways is refused too: two units of one layer stay independent.
    assert layer_violations({"jobs.render.a": {"jobs.retry.b"}}) == ["jobs.render.a -> jobs.retry.b (render is not above retry)"]


def test_each_of_the_newcomers_twenty_questions_is_answered_by_a_path_and_a_name_there():
    """docs/ARCHITECTURE.md's twenty questions: each answer's module exists and defines the name it gives (a
    function, a class or a constant at the top of the module), so a move or a rename fails here until the docs
    follow."""
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    table = text[text.index("## A newcomer's twenty questions"):]
    table = table[: table.index("\n## ", 1)]
    answers = re.findall(r"^\| [^|]+\? \| `([^`]+)` `([^`]+)` \|$", table, flags=re.M)
    assert len(answers) >= 20, answers
    missing = []
    for path, name in answers:
        source = ROOT / path
        defined = source.is_file() and re.search(rf"^(?:def|class) {name}\b|^{name}\b\s*[:=]", source.read_text(),
                                                 flags=re.M)
        if not defined:
            missing.append(f"{path} {name}")
    assert not missing, f"answers that no longer hold: {missing}"


# A class this long does several jobs, or says at its top why it does not (issue 29: the checkpoint manager was 391
# lines, the watchdog 184 with a second job; torchtitan and NVIDIA's resiliency extension split theirs).
CLASS_LINES = 200
CLASS_REASON = "Over 200 lines because"


def long_classes(source: str) -> list[str]:
    """Classes of `source` over CLASS_LINES lines whose docstring does not give CLASS_REASON."""
    return [f"{node.name} ({node.end_lineno - node.lineno + 1} lines)" for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno + 1 > CLASS_LINES
            and CLASS_REASON not in (ast.get_docstring(node) or "")]


def test_no_class_is_over_200_lines_without_its_reason():
    found = {path.relative_to(ROOT).as_posix(): names for room in WHERE_IS_ROOMS for path in (ROOT / room).rglob("*.py")
             if (names := long_classes(path.read_text()))}
    assert not found, f"split these, or say at their top why not ({CLASS_REASON} ...): {found}"


def test_the_class_length_check_could_fail():
    body = "\n".join(f"    x{i} = {i}" for i in range(CLASS_LINES + 1))
    assert long_classes(f"class Big:\n{body}\n") == [f"Big ({CLASS_LINES + 2} lines)"]
    assert long_classes(f'class Big:\n    """{CLASS_REASON} it is a table."""\n{body}\n') == []
