"""`trainctl plan`'s sizing view: the table, the JSON document, and the chart (matplotlib optional)."""

from __future__ import annotations

import json
import sys

import pytest
from rich.console import Console

from cli.errors import UserError
from cli.price_source import load_price_file
from cli.views.plan import draw_chart, plan_json, print_sizing, sizing_result
from jobs.catalog import lookup
from jobs.planning.calibration import calibration_of
from jobs.request.parse import parse_request


def sized(prices=None, **fields):
    return sizing_result(parse_request({"name": "sizing", "dataset": "s3://bucket/data/", **fields}), None, prices)


def test_table_shows_the_recommendation_and_warnings():
    result = sized(model="gpt", model_size="1b", instance={"type": "ml.p4d.24xlarge", "count": 2},
                   sizing={"dataset_tokens": 300_000_000_000, "deadline_hours": 24})
    console = Console(record=True, width=200)
    print_sizing(console, result)
    text = console.export_text()
    assert "recommendation" in text and "deadline_unreachable" in text and "ml.p4d.24xlarge" in text
    # A100: llm-foundry's tables, Llama 3 8B, GPT 175B; the band is the largest error of the held-out rows
    # (jobs.planning.calibration).
    band, rows = calibration_of(lookup("ml.p4d.24xlarge").gpu)
    assert f"time model: throughput within {band:.0%} of every published run on this GPU generation the fit was not " \
           "given" in text
    assert [r.split(":")[0] for r in rows] == ["torchtitan docs/performance.md (Apr 2024)",
                                               "Korthikanti et al. 2022, Tables 3 and 5",
                                               "llm-foundry scripts/train/benchmarking/README.md"]


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


# ml.p4d.24xlarge with a synthetic price, for the priced side of the view (real ones: trainctl plan --prices).
PRICES = {"ml.p4d.24xlarge": 10.0}


def table_text(result, prices=None) -> str:
    console = Console(record=True, width=250, soft_wrap=True)
    print_sizing(console, result, prices)
    return console.export_text()


def test_an_unpriced_type_says_price_unknown_and_never_a_figure():
    result = sized(model="gpt", model_size="125m", instance={"type": "ml.p5en.48xlarge"},
                   sizing={"dataset_tokens": 10**9, "budget_usd": 100})
    text = table_text(result)
    assert "price unknown" in text and "price_unknown" in text and "cannot check sizing.budget_usd=100" in text
    rows = [line for line in text.splitlines() if "x ml.p5en.48xlarge" in line]
    assert rows and all("price unknown" in row and "$" not in row for row in rows)
    assert json.loads(plan_json(result))["recommendation"]["cost_usd"] is None


def test_a_priced_type_shows_its_cost_and_checks_the_budget(tmp_path):
    table = load_price_file(price_file(tmp_path))
    result = sized(table.prices, model="gpt", model_size="125m", instance={"type": "ml.p4d.24xlarge"},
                   sizing={"dataset_tokens": 10**10, "budget_usd": 1})
    rec = result.recommendation
    assert rec.cost_usd == pytest.approx(rec.hours * 10.0)
    text = table_text(result, table)
    assert f"${rec.cost_usd:,.0f}" in text and "over_budget" in text and "price_unknown" not in text
    assert f"prices: on-demand training USD per instance-hour from file {tmp_path / 'prices.json'} (modified " in text


def price_file(tmp_path):
    path = tmp_path / "prices.json"
    path.write_text(json.dumps(PRICES))
    return path


@pytest.mark.parametrize("instance_type", ["ml.p5en.48xlarge", "ml.p4d.24xlarge"])
def test_the_chart_says_when_the_price_is_unknown_and_where_prices_come_from(monkeypatch, tmp_path, instance_type):
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    figures = []
    monkeypatch.setattr(Figure, "savefig", lambda self, *a, **k: figures.append(self))
    table = load_price_file(price_file(tmp_path))
    draw_chart(sized(table.prices, model="gpt", model_size="125m", instance={"type": instance_type}),
               tmp_path / "c.png", table)
    labels = [ax.get_ylabel() for ax in figures[0].axes]
    assert ("cost: price unknown for ml.p5en.48xlarge" in labels) == (instance_type == "ml.p5en.48xlarge")
    assert ("USD" in labels) == (instance_type == "ml.p4d.24xlarge")
    assert figures[0].axes[0].get_title() == f"on-demand prices: prices.json, {table.date:%Y-%m-%d}"
