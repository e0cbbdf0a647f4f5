"""The final model, gathered in full, as `model.safetensors` plus `config.json` in the model dir.

The job must never need PyPI at run time (private subnets have no route to it, and the toolkit's
`pip install -r requirements.txt` would fail there), so the source dir ships no requirements.txt. The
`safetensors` package is used when the image has it; otherwise `_write_safetensors` writes the same
documented format (8-byte little-endian header length, JSON header, raw little-endian tensor bytes), and a
test checks that the real library reads what it writes.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from training.parallel.process_group import Dist
from training.resilience.heartbeat import Heartbeat, during

# What the model dir holds at the end: the weights and the model's config (also what an MLflow run attaches).
MODEL_FILE, CONFIG_FILE = "model.safetensors", "config.json"

_DTYPES = {
    torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.float64: "F64",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
    torch.bool: "BOOL",
}


def full_state_dict(model, dist: Dist) -> dict[str, torch.Tensor]:
    """Every parameter unsharded, on the CPU, on rank 0 (empty elsewhere). Collective."""
    if getattr(model, "pipeline_group", None) is not None:  # a pipeline rank: only its stages are here
        from training.parallel.pipeline_parallel import gather_full_state_dict

        return gather_full_state_dict(model, dist.is_main)
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    state = get_model_state_dict(model, options=options)
    return {k: v.detach().contiguous() for k, v in state.items()} if dist.is_main else {}


def save_model(model, dist: Dist, model_dir: str | Path, config: dict, heartbeat: Heartbeat | None = None) -> Path | None:
    with during(heartbeat, "the final export"):  # rank 0 writes while the others wait: the long allowance
        return _save_model(model, dist, model_dir, config)


def _save_model(model, dist: Dist, model_dir: str | Path, config: dict) -> Path | None:
    state = full_state_dict(model, dist)
    if not dist.is_main:
        return None
    out = Path(model_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / MODEL_FILE
    metadata = {"format": "pt"}
    try:
        from safetensors.torch import save_file
    except ImportError:
        _write_safetensors(state, path, metadata)
    else:
        save_file(state, str(path), metadata=metadata)
    (out / CONFIG_FILE).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return path


def _write_safetensors(state: dict[str, torch.Tensor], path: Path, metadata: dict[str, str]) -> None:
    header: dict = {"__metadata__": metadata}
    offset = 0
    blobs = []
    for name in sorted(state):
        t = state[name].contiguous().cpu()
        blob = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": _DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(blob)]}
        offset += len(blob)
        blobs.append(blob)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the format pads the header to 8-byte alignment with spaces
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for blob in blobs:
            f.write(blob)
