"""`trainctl plan`'s sizing view: the table, the JSON document, and the chart (matplotlib optional)."""

from __future__ import annotations

import json
import sys

import pytest
from rich.console import Console

from cli.errors import UserError
from cli.plan_view import draw_chart, plan_json, print_sizing, sizing_result
from jobs.request import parse_request


def sized(**fields):
    return sizing_result(parse_request({"name": "sizing", "dataset": "s3://bucket/data/", **fields}), None)


def test_table_shows_the_recommendation_and_warnings():
    result = sized(model="gpt", model_size="1b", instance={"type": "ml.p4d.24xlarge", "count": 2},
                   sizing={"dataset_tokens": 300_000_000_000, "deadline_hours": 24})
    console = Console(record=True, width=200)
    print_sizing(console, result)
    text = console.export_text()
    assert "recommendation" in text and "deadline_unreachable" in text and "ml.p4d.24xlarge" in text


def test_json_document_round_trips():
    doc = json.loads(plan_json(sized(model="gpt", model_size="125m", instance={"type": "ml.g5.12xlarge"})))
    assert doc["recommendation"]["strategy"] in {"single", "ddp", "fsdp", "hsdp", "tp", "pp", "hybrid", "smp"}
    assert all(isinstance(w["code"], str) and w["message"] for w in doc["warnings"])
    assert len(doc["candidates"]) > 1


def test_unusable_input_is_a_user_error_naming_the_field():
    with pytest.raises(UserError, match="model_shape"):
        sized(model="my.pkg:net", instance={"type": "ml.p4d.24xlarge"})


def test_chart_without_matplotlib_gives_the_install_hint(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(UserError) as info:
        draw_chart(sized(model="gpt", model_size="125m", instance={"type": "ml.p4d.24xlarge"}), tmp_path / "c.png")
    assert "pip install" in info.value.hint


def test_chart_is_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "c.png"
    draw_chart(sized(model="gpt", model_size="125m", instance={"type": "ml.p4d.24xlarge"}), path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
