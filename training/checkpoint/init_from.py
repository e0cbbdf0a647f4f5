"""Starting a run from other weights (`init_from`), when its own folder holds no complete checkpoint.

Starting from another run's weights is explicit: `init_from` (a `step-N` folder, a checkpoint folder's
newest complete step, or a `model.safetensors`) loads the model's parameters alone (DCP with only the
"model" key, so any strategy reshards it; a safetensors file through `set_model_state_dict`, broadcast from
rank 0) when the run's own folder holds no complete checkpoint; the optimizer, data position, schedule and
RNG start fresh at step 0. Once the run has checkpoints of its own, `init_from` is ignored (one line).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.distributed as torch_dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from torch.distributed.checkpoint.stateful import Stateful

from contract.errors import ConfigError
from contract.failures import FailureCode
from training.checkpoint.markers import MARKER, STEP_DIR, first_few, step_dirs, why_invalid
from training.checkpoint.ownership import Owner
from training.checkpoint.restore import error_causes, load_failure, load_parts
from training.export import MODEL_FILE
from training.parallel.process_group import Dist
from training.resilience.outcome import TrainingFailure


def start_from(given: str, dist: Dist, parts: dict[str, Stateful]) -> None:
    """Load the model's parameters alone from `given` (see the module docstring); ConfigError, on every
    rank, for a path that holds no usable weights or whose tensors do not fit this model. Collective."""
    found = dist.broadcast_object(init_source(given) if dist.is_main else None)
    if isinstance(found, str):
        raise ConfigError(found)
    kind, path, shapes, about = found
    model = parts["model"]
    if kind == "safetensors" and getattr(model.model, "pipeline_group", None) is not None:
        raise ConfigError(f"init_from={given}: a safetensors file cannot start a pipeline (pp, hybrid) run here: "
                          "give a checkpoint's step-N folder instead (it reshards into the stages)")
    _check_fits(given, shapes, dist, parts)
    why = load_parts(dist, parts, Path(path), ["model"]) if kind == "dcp" else _load_full(path, dist, parts)
    if why:
        raise TrainingFailure(FailureCode.CHECKPOINT_UNREADABLE,
                              f"init_from={given} {why}: give an intact checkpoint or model file, or unset init_from")
    if dist.is_main:
        print(f"[checkpoint] started from the weights of {path} ({about}, {len(shapes)} tensors); the optimizer, "
              "data position, learning-rate schedule and RNG start fresh at step 0", flush=True)


def _check_fits(given: str, shapes: dict[str, list[int]], dist: Dist, parts: dict[str, Stateful]) -> None:
    """Every tensor of this model is in the source at the same (global) shape, and the source has no other
    model tensors; otherwise ConfigError naming the first few, on every rank. Collective."""
    mine = {k: list(v.shape) for k, v in parts["model"].state_dict().items()}
    problems = [f"tensor {k!r} is not there" if k not in shapes else
                f"tensor {k!r} is {shapes[k]} there and {shape} in this model"
                for k, shape in mine.items() if shapes.get(k) != shape]
    everyone = {k for keys in dist.all_gather_object(sorted(mine)) for k in keys}
    problems += [f"tensor {k!r} there is not in this model" for k in sorted(set(shapes) - everyone)]
    problems = sorted({p for rank_problems in dist.all_gather_object(problems) for p in rank_problems})
    if problems:
        raise ConfigError(f"init_from={given} does not fit this model: {first_few(problems, 3)}: start from "
                          "weights of the same model and shape (model, model_size, seq_len, the data's "
                          "vocabulary), or unset init_from")


def _load_full(path: str, dist: Dist, parts: dict[str, Stateful]) -> str | None:
    """Set the model from a full state dict in a safetensors file, read on rank 0 and broadcast (every
    strategy but pipelines shards it on set). None when every rank set it; otherwise why. Collective."""
    causes: list[str] = []
    try:
        state = _read_safetensors(path) if dist.is_main else {}
        options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=torch_dist.is_initialized())
        set_model_state_dict(parts["model"].model, state, options=options)
    except (KeyboardInterrupt, SystemExit):
        raise
    except Exception as e:
        causes = error_causes(e)
    return load_failure(dist, causes)


INIT_FIX = "give a checkpoint's step-N folder, a checkpoint folder, or a model.safetensors file"

def init_source(given: str) -> tuple[str, str, dict[str, list[int]], str] | str:
    """(kind "dcp" or "safetensors", path, {tensor: shape} of the model there, what it is for the log line) for
    an `init_from` value; or why it cannot be used (the ConfigError's text). Reads headers only."""
    path = Path(given)
    if not path.exists():
        return f"init_from={given} does not exist (on rank 0's host): {INIT_FIX} that this job can read"
    if path.is_dir() and not (path / MARKER).exists() and not STEP_DIR.match(path.name):
        if (path / MODEL_FILE).is_file() and not step_dirs(path):
            path = path / MODEL_FILE  # an exported model folder
        else:
            newest = next((p for _, p in step_dirs(path) if why_invalid(p) is None), None)
            if newest is None:
                return f"init_from={given} holds no complete checkpoint (no step-N folder with its {MARKER}): {INIT_FIX}"
            path = newest
    if path.is_dir():
        if (why := why_invalid(path)) is not None:
            return f"init_from={given} is not a complete checkpoint ({why}): {INIT_FIX}"
        shapes = _dcp_model_shapes(path)
        if isinstance(shapes, str):
            return f"init_from={given}: {shapes}: {INIT_FIX}"
        marker = json.loads((path / MARKER).read_text())
        writer = Owner(marker.get("run_id")).name if marker.get("run_id") else "a run without a run id"
        return "dcp", str(path), shapes, f"{path.name} of {writer}"
    shapes = _safetensors_shapes(path)
    if isinstance(shapes, str):
        return f"init_from={given}: {shapes}: {INIT_FIX}"
    return "safetensors", str(path), shapes, "a safetensors file"

def _dcp_model_shapes(path: Path) -> dict[str, list[int]] | str:
    """{parameter: global shape} of the "model" part of a DCP checkpoint, from its .metadata; or why not."""
    try:
        entries = dcp.FileSystemReader(str(path)).read_metadata().state_dict_metadata
    except Exception as e:
        return f"its .metadata cannot be read ({error_causes(e)[0]})"
    shapes = {k.removeprefix("model."): list(m.size) for k, m in entries.items()
              if k.startswith("model.") and isinstance(m, TensorStorageMetadata)}
    return shapes or "it holds no model tensors"

def _safetensors_shapes(path: Path) -> dict[str, list[int]] | str:
    """{tensor: shape} from a safetensors file's header; or why not."""
    try:
        from safetensors import safe_open
    except ImportError:
        return "reading a safetensors file needs the safetensors package, which this image lacks"
    try:
        with safe_open(str(path), framework="pt") as f:
            return {k: list(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118 (safe_open is not iterable)
    except Exception as e:
        return f"not a readable safetensors file ({error_causes(e)[0]})"

def _read_safetensors(path: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(path, device="cpu")
