"""The time model against published runs (jobs.planning.calibration): the held-out rows it was not fitted to, per GPU
generation (the issue's bar: mean error at most 5%); the rows it was fitted to; the package's own runs; their memory
as the planner sizes it; and what `trainctl plan --json` says about the fit (`error_band`, `calibrated_from`).

    python -m pytest -q -n 0 -s tests/jobs/test_planner_calibration.py    # prints the summaries
    python -m jobs.planning.calibration                                    # every row: predicted, measured, error
    python -m tools.fit_planner                                            # the fit again, beside the constants

Rows the planner cannot express exactly are expressed as closely as it can (calibration.Row.expressed): Llama 3
8B's gated MLP and grouped-query attention as a GPT block (its op-level selective checkpointing is the package's
own), GPT 175B's selective recomputation of attention's core as none (its interleaved TP 8 x PP 8 schedule is
the planner's hybrid layout with the interleaved schedule).
"""

from __future__ import annotations

import dataclasses

import pytest

from jobs.catalog import GPUS, lookup
from jobs.planning import calibration, timing
from jobs.planning.calibration import (
    DGXC,
    FITTED,
    HAND_ROWS,
    HELD_OUT,
    LLM_FOUNDRY,
    OWN_RUNS,
    ROWS,
    Row,
    calibration_of,
    mpt_shape,
    own_error,
    predict,
    summary,
    throughput_error,
)
from jobs.planning.layout import Layout, numerics
from jobs.planning.memory import GIB, memory_per_gpu
from jobs.planning.shape import model_facts, shape_facts
from jobs.planning.timing import micro_compute


def _facts(row: Row):
    from types import SimpleNamespace
    sh = row.shape
    return shape_facts(SimpleNamespace(kind="decoder", layers=sh["layers"], hidden=sh["hidden"], heads=sh["heads"],
                                       vocab_size=sh["vocab_size"], seq_len=sh["seq_len"], params=sh.get("params"),
                                       flops_per_sample=None, image_size=None, patch_size=None), sh["seq_len"])


def _printed(name: str, rows) -> dict:
    result = summary(rows)
    for gen, s in result.items():
        print(f"\n{name} {gen}: {s['rows']} rows, mean |error| {100 * s['mean']:.1f}%, largest {100 * s['max']:.1f}%, "
              f"{s['beyond_15']} beyond 15%")
    return result


def test_held_out_published_runs_are_predicted_within_5_percent_on_average_on_a100_and_h100():
    # 112 rows the fit never saw (every second row of llm-foundry's and NVIDIA's dgxc-benchmarking tables, chosen
    # before fitting). Measured (2026-11-29, with Megatron's H100 rows): A100 69 rows, mean 3.5%, largest 23.1%; H100
    # 43 rows, mean 3.8%, largest 11.3% (llm-foundry's alone, before the contention: 4.4%, 15.1%). Beyond 15%: 5 on
    # A100 (MPT-13B on 8 x A100 40GB at 16 micro-batches, 16-19% slower than predicted in fitted and held-out rows
    # alike, where the same model on 16 to 128 GPUs is within 2%; MPT-1B on 32 x A100 40GB, 19% below the same run on
    # 16 and 64 GPUs; MPT-760M at micro 96), none on H100: listed by the next test.
    held = _printed("held out", HELD_OUT)
    assert set(held) == {"ampere", "hopper"}
    assert all(s["mean"] <= 0.05 for s in held.values())
    assert held["hopper"]["beyond_15"] == 0


def test_the_held_out_runs_beyond_15_percent_are_the_known_ones():
    # Not hidden: the issue asks for every held-out row within 15%, and these are not. A new miss fails here.
    beyond = sorted(r.label for r in HELD_OUT if abs(throughput_error(r)) > 0.15)
    print("\n" + "\n".join(f"{label}: {100 * throughput_error(next(r for r in HELD_OUT if r.label == label)):+.1f}%"
                            for label in beyond))
    assert len(beyond) == 5 and all("A100" in label for label in beyond)


def test_fitted_runs_and_the_package_s_own():
    fitted = _printed("fitted", FITTED)
    assert all(s["mean"] <= 0.05 for s in fitted.values())
    # The package's own H100 runs (each: tests/jobs/test_planner_memory.py): their fit error on average.
    assert sum(abs(own_error(run)) for run in OWN_RUNS) / len(OWN_RUNS) <= 0.07


def test_every_published_row_names_its_commit_and_quotes_its_figure_and_each_table_alternates():
    # Provenance, checked rather than trusted: each source is pinned to a commit, each row names the commit its table
    # was read at and quotes the table's line, whose cells hold the figure the planner is checked against (a typo in
    # the measured value fails here); and the held-out half of each table is every second row by position (rows
    # alternate), not rows chosen by their error.
    import json
    import re

    doc = json.loads(calibration.PUBLISHED_RUNS.read_text())
    for source, entry in doc.items():
        assert re.search(r"/[0-9a-f]{40}", entry["url"]), source
        previous: dict[str, str] = {}
        for run in entry["rows"]:
            assert re.fullmatch(r"[0-9a-f]{40}", run["commit"]), run["row"]
            cells = {float(c) for c in run["row"].split("(column:")[0].split("|")
                     if re.fullmatch(r"\s*\d+(\.\d+)?\s*", c)}
            assert float(run.get("tokens_per_s_per_gpu", run.get("step_seconds"))) in cells, run["row"]
            if run["table"] in previous:
                assert run["set"] != previous[run["table"]], run["row"]
            previous[run["table"]] = run["set"]


MEGATRON_ROWS = [r for r in ROWS if r.source == DGXC]


def test_megatrons_h100_layouts_held_out_within_8_percent_and_only_with_its_own_synchronization():
    # NVIDIA's DGX Cloud recipes (GPT3 175B at TP 4 x PP 8 x VP 12, Nemotron4 340B at TP 8 x PP 8 x VP 12, Nemotron4 15B
    # at TP 4, 16 to 2,048 H100s): the planner's tensor, interleaved-pipeline and data-parallel time at up to 256
    # nodes. Held out (8 rows): mean 3.0%, largest 6.9% (measured 2026-11-29). Charged as the package synchronizes
    # (fp32 gradients in torch DDP's 25 MiB buckets, tensor parallelism's collectives between the matmuls) with the
    # same efficiencies, the same rows are 8-34% slow (mean 22%), more the more nodes: the stack's traits, not a
    # fitted factor, carry them.
    held = [r for r in MEGATRON_ROWS if r.held_out]
    assert len(held) == 8 and {r.layout.tensor for r in held} == {4, 8} and {r.layout.pipeline for r in held} == {1, 8}
    errors = [abs(throughput_error(r)) for r in held]
    assert max(errors) <= 0.08 and sum(errors) / len(errors) <= 0.05
    as_the_package = {"hopper": dataclasses.replace(timing.PACKAGE["hopper"], **{
        k: getattr(calibration.MEGATRON["hopper"], k) for k in ("matmul", "attention", "traffic")})}
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(calibration.STACKS, "plain", as_the_package)
        plain = [throughput_error(dataclasses.replace(r, stack="plain", tensor_overlap=False)) for r in held]
    assert all(e < 0 for e in plain) and sum(plain) / len(plain) < -0.15


def test_megatrons_step_time_grows_with_the_data_parallel_nodes_as_measured():
    # Weak scaling from each recipe's smallest cluster to 2,048 GPUs (256 nodes; the collectives' latency growth is
    # fitted to 32): the step time grows 2.2% (175B from 128 GPUs), 2.7% (15B from 16), 5.0% (340B from 128) measured;
    # predicted 2.8%, 0.4% (Megatron's buckets grow with the data-parallel size: 512M elements at 2,048 GPUs), 9.2%,
    # each within 5 points of the measured growth.
    for table in {r.extra["table"] for r in MEGATRON_ROWS}:
        rows = {r.layout.gpus: r for r in MEGATRON_ROWS if r.extra["table"] == table}
        first, last = rows[min(rows)], rows[2048]
        measured = last.measured / first.measured - 1
        predicted = predict(last) / predict(first) - 1
        assert predicted >= 0 and abs(predicted - measured) < 0.05, table


def test_megatrons_interleaving_is_charged_with_its_own_bubble():
    # 12 model chunks a rank (VP 12) over 8 stages and 16 micro-batches: (p - 1) / (v m + p - 1) = 7 / 199, where
    # the package's interleaving (2 chunks a rank) would idle 7 / 39.
    [row] = [r for r in MEGATRON_ROWS if r.layout.gpus == 128 and r.layout.tensor == 8]
    n = numerics({"precision": "bf16", **row.hyperparameters})
    step = timing.step_time(_facts(row), n, lookup(row.instance_type), row.layout, row.efficiency())
    assert step.bubble == pytest.approx(7 / 199)
    package = timing.step_time(_facts(row), n, lookup(row.instance_type), dataclasses.replace(row.layout, virtual=0),
                               row.efficiency())
    assert package.bubble == pytest.approx(7 / 39) and package.total > step.total


@pytest.mark.parametrize("row", HAND_ROWS, ids=lambda r: r.label)
def test_each_hand_written_row_is_predicted_within_10_percent(row):
    predicted = predict(row)
    print(f"\n{row.label}: predicted {predicted:.5g} {row.unit}, measured {row.measured:.5g} "
          f"({100 * (predicted / row.measured - 1):+.1f}%){'; expressed as ' + row.expressed if row.expressed else ''}")
    assert predicted == pytest.approx(row.measured, rel=0.10)


def test_the_constants_are_the_fit_s():
    # The code's constants are the fit's, rounded: data added without refitting fails here.
    from jobs.planning import timing
    from tools import fit_planner

    for name, value in fit_planner.fit_collectives().items():
        assert getattr(timing, name) == pytest.approx(value, rel=0.02), name
    current = {name: read() for name, read, _ in fit_planner._fields()}
    for name, value in fit_planner.fit().items():
        assert current[name] == pytest.approx(value, rel=0.02), name


def test_collectives_within_nccl_tests_on_aws_fitted_and_held_out():
    # 99 all_reduce sizes (64 KiB to 16 GiB; one p5, 2 to 32 p5s, two p4des), every second size of each table held
    # out. Fitted: mean |error| 14.0%, largest 34.8%; held out: mean 14.6%, largest 41.2% (two p5s at 32 MiB, where
    # NCCL switches protocols, which one knee does not follow). At 4 to 32 nodes, held out: largest 25.1%; the rule
    # before (a latency that did not grow with the node count) was up to 60% fast there.
    from jobs.planning.calibration import FITTED_COLLECTIVES, HELD_OUT_COLLECTIVES

    assert (len(FITTED_COLLECTIVES), len(HELD_OUT_COLLECTIVES)) == (53, 46)
    for rows, largest, mean in ((FITTED_COLLECTIVES, 0.35, 0.145), (HELD_OUT_COLLECTIVES, 0.42, 0.15)):
        errors = [calibration.collective_error(r) for r in rows]
        print(f"\n{len(errors)} sizes: mean |error| {100 * sum(map(abs, errors)) / len(errors):.1f}%, largest "
              f"{100 * max(map(abs, errors)):.1f}%")
        assert all(abs(e) <= largest for e in errors) and sum(map(abs, errors)) / len(errors) <= mean
    at_scale = [calibration.collective_error(r) for r in HELD_OUT_COLLECTIVES if r.nodes >= 4]
    assert len(at_scale) == 16 and max(map(abs, at_scale)) <= 0.26


def test_fsdp_pays_a_collective_latency_per_unit_which_grows_with_the_node_count():
    """FSDP gathers and reduce-scatters block by block: a small model over many nodes is bound by those collectives'
    latency (measured above to grow with the node count), not by their bytes. gpt 125m at micro-batch 4 on p5s: inside
    one node almost nothing is exposed; from 4 nodes on, the exposed time grows with every doubling, past the compute at 32,
    and is at least what the latency alone costs beyond what the compute hides."""
    import math

    from jobs.catalog import lookup
    from jobs.planning import timing
    from jobs.planning.layout import Layout, numerics
    from jobs.planning.shape import model_facts

    m, spec = model_facts("gpt", "125m"), lookup("ml.p5.48xlarge")
    n = numerics({"micro_batch_size": 4, "precision": "bf16"})
    steps = {nodes: timing.step_time(m, n, spec, Layout(nodes, 8, shard=8 * nodes)) for nodes in (1, 2, 4, 8, 16, 32)}
    exposed = [steps[nodes].exposed_comm for nodes in sorted(steps)]
    # Inside one node everything hides: what shows is the contention of hidden collectives alone.
    assert exposed[0] < 0.05 * steps[1].compute and all(a < b for a, b in zip(exposed[2:], exposed[3:], strict=False))
    assert steps[32].exposed_comm > steps[32].compute
    # Three collectives a unit (gather, gather again for backward, reduce-scatter), each hidden behind at most OVERLAP
    # of the forward or the backward it overlaps: together at most OVERLAP x (forward + 2 x backward) <= 2 x compute.
    assert n.reshard_after_forward
    latency = timing.NETWORK_LATENCY_S * (1 + timing.NETWORK_LATENCY_GROWTH * math.log2(32 / 2))
    assert steps[32].exposed_comm >= 3 * (m.layers + 1) * latency - timing.OVERLAP * 2 * steps[32].compute


def test_the_error_band_covers_every_held_out_error():
    for gpu in (GPUS["A100"], GPUS["H100"]):
        band, _ = calibration_of(gpu)
        gen = [r for r in HELD_OUT if r.gpu.generation == gpu.generation]
        assert band >= max(abs(throughput_error(r)) for r in gen)


def test_the_h100_is_no_longer_three_times_an_a100():
    # MPT-7B measured 10,643 / 4,641 = 2.29x (llm-foundry, 8 GPUs, micro 6); one efficiency for every GPU made it 2.9x.
    def mpt7b(instance_type: str) -> Row:
        return Row("MPT-7B", LLM_FOUNDRY, mpt_shape(32, 4096, 32), instance_type, Layout(1, 8, shard=8),
                   {"micro_batch_size": 6, "grad_accum": 1}, 0, "tokens/s/GPU")
    assert predict(mpt7b("ml.p5.48xlarge")) / predict(mpt7b("ml.p4de.24xlarge")) == pytest.approx(10643 / 4641, rel=0.10)


def test_the_issues_mpt_30b_on_h100_is_closer():
    # Not fitted to (it is the issue's example, not a calibration row): 2,002 tokens/s/GPU measured, 2,647 predicted
    # before (+32%).
    row = Row("MPT-30B, 8 x H100 80GB, FSDP, AC", "llm-foundry", {"layers": 48, "hidden": 7168, "heads": 56,
              "vocab_size": 50368, "seq_len": 2048}, "ml.p5.48xlarge", Layout(1, 8, shard=8),
              {"micro_batch_size": 3, "grad_accum": 1, "activation_checkpointing": True}, 2002, "tokens/s/GPU")
    assert abs(throughput_error(row)) < 0.15


def test_tensor_parallel_matmuls_cost_more_than_an_even_split():
    # Each GPU's 512-wide matmuls of gpt 7b under tensor 8 run at 85% of the rate of 4,096-wide ones (WIDTH_HALF; the
    # elementwise traffic and attention, split evenly, dilute it): 8 GPUs' shares of one micro-batch take longer than
    # the whole.
    m = model_facts("gpt", "7b")
    n = numerics({"micro_batch_size": 1, "precision": "bf16"})
    spec = lookup("ml.p4d.24xlarge")
    whole = micro_compute(m, n, spec, Layout(1, 1))
    share = micro_compute(m, n, spec, Layout(1, 8, tensor=8))
    assert 8 * share > 1.05 * whole


# The rows this test held before the dataset grew: MPT-7B and MPT-30B (AC) on 8 x A100 80GB, MPT-1B and MPT-7B on
# 8 x H100. (Of llm-foundry's 209 configurations, 30 would not fit the package as the planner sizes it: their stack keeps
# less (low-precision LayerNorm, a fused loss), a difference the memory model does not try to express.)
MEMORY_ROWS = (*HAND_ROWS, *(r for r in ROWS if r.layout.gpus == 8 and (r.instance_type, r.shape["hidden"],
                                                                          r.shape["seq_len"], r.hyperparameters["micro_batch_size"])
                              in {("ml.p4de.24xlarge", 4096, 2048, 6), ("ml.p4de.24xlarge", 7168, 2048, 3),
                                  ("ml.p5.48xlarge", 2048, 2048, 14), ("ml.p5.48xlarge", 4096, 2048, 6)}))


def test_the_memory_rows_are_the_four():
    assert len(MEMORY_ROWS) == len(HAND_ROWS) + 4


@pytest.mark.parametrize("row", MEMORY_ROWS, ids=lambda r: r.label)
def test_the_published_runs_fit_as_the_planner_sizes_them(row):
    # They ran, on a stack that keeps no more than the package does (fused losses, bf16 residuals): what the planner
    # says they allocate must fit. Before, MPT-7B at micro-batch 6 came out 84.7 GiB on an 80 GB A100. With the
    # allocator's slack and the context the planner adds on top, MPT-30B at 21 micro-batches of 3 (the table's
    # accumulation; this row said 1 before) needs 82.0 GiB of 80: within the 10% slack the planner keeps for
    # fragmentation.
    spec = lookup(row.instance_type)
    mem = memory_per_gpu(_facts(row), numerics({"precision": "bf16", **row.hyperparameters}), row.layout)
    print(f"\n{row.label}: {mem.allocated / GIB:.1f} GiB allocated, {mem.needed_gib:.1f} needed, of "
          f"{spec.accelerator_memory_gib}")
    assert mem.allocated / GIB <= spec.accelerator_memory_gib
    assert mem.needed_gib <= 1.03 * spec.accelerator_memory_gib


def test_fsdp_holds_one_gathered_block_in_the_compute_dtype():
    m = model_facts("gpt", "7b")
    n = numerics({"micro_batch_size": 1, "precision": "bf16", "grad_accum": 1})
    mem = memory_per_gpu(m, n, Layout(1, 8, shard=8))
    root = m.params - m.layers * m.block_params
    assert mem.extra == 2 * m.block_params + 2 * root
    # Accumulating with fsdp_accumulation unsharded: FSDP2 keeps the unsharded gradients in its fp32 reduce dtype;
    # sharded (the default): the fp32 shards, beside the later micro-steps' forward.
    acc = {mode: memory_per_gpu(m, numerics({"micro_batch_size": 1, "precision": "bf16", "grad_accum": 2,
                                             "fsdp_accumulation": mode}), Layout(1, 8, shard=8))
           for mode in ("unsharded", "sharded")}
    assert acc["unsharded"].extra - mem.extra == 4 * m.params
    assert acc["sharded"].extra - mem.extra == 4 * m.params / 8


@pytest.mark.parametrize(("hyperparameters", "per_vocab"), [({"loss_chunk_tokens": 0}, 12), ({}, 4)],
                         ids=["full", "chunked"])
def test_the_loss_is_charged_as_the_package_computes_it(hyperparameters, per_vocab):
    # The full loss (training.loss.full_cross_entropy) casts the logits to fp32 before the cross-entropy: at backward's
    # log-softmax 4 + 4 + 4 bytes per vocabulary entry per token. The chunked one (the default) keeps the bf16 logits and, in backward,
    # their gradient: 2 + 2; one chunk's fp32 temporaries are a fixed term, the same at one sample and two.
    m = model_facts("gpt", "125m", seq_len=2048)
    one, two = (memory_per_gpu(m, numerics({"micro_batch_size": b, "precision": "bf16", **hyperparameters}),
                               Layout(1, 1)) for b in (1, 2))
    per_sample = two.activations - one.activations
    assert per_sample == pytest.approx(2048 * (m.vocab * per_vocab + m.layers * 38 * m.hidden + 6 * m.hidden))


MPT_125M = mpt_shape(12, 768, 12)  # llm-foundry's MPT-125M: GPT-2's width and depth, its 50368-entry vocabulary


@pytest.mark.parametrize(("hyperparameters", "fits"), [({}, True), ({"loss_chunk_tokens": 0}, False)],
                         ids=["chunked", "full"])
def test_mpt_125m_at_micro_batch_26_fits_a_40gb_a100_with_the_chunked_loss(hyperparameters, fits):
    # llm-foundry trained MPT-125M at micro-batch 26 x 2048 with FSDP on 8 x A100 40GB (scripts/train/benchmarking;
    # its loss is fused). The package's chunked loss: 30.8 GiB needed (26.65 allocated, 26.26 of it activations, 9.99
    # of those the bf16 logits and their gradient, 0.58 one chunk's fp32 temporaries); the full fp32 loss: 52.2 GiB
    # (46.1 allocated: backward's log-softmax output, the NLL's gradient and the input's, fp32, 8 bytes a vocabulary
    # entry more than the logits and their gradient, 19.2 GiB more), which does not fit.
    spec = lookup("ml.p4d.24xlarge")
    row = Row("MPT-125M, 8 x A100 40GB, FSDP", LLM_FOUNDRY, MPT_125M, spec.instance_type,
              Layout(1, 8, shard=8), {"micro_batch_size": 26, "grad_accum": 1, **hyperparameters}, 0, "")
    mem = memory_per_gpu(_facts(row), numerics({"precision": "bf16", **row.hyperparameters}), row.layout)
    print(f"\nMPT-125M 26 x 2048, {'full' if hyperparameters else 'chunked'} loss: {mem.needed_gib:.1f} GiB needed "
          f"({mem.allocated / GIB:.1f} allocated) of {spec.accelerator_memory_gib}")
    assert (mem.needed_gib <= spec.accelerator_memory_gib) is fits
    assert mem.needed_gib == pytest.approx(30.8 if fits else 52.2, abs=0.1)


def test_candidates_carry_the_error_band_of_their_generation():
    band, rows = calibration_of(GPUS["H100"])
    worst = max(abs(throughput_error(r)) for r in HELD_OUT if r.gpu == GPUS["H100"])
    assert band == pytest.approx(worst, abs=0.01) and band >= worst
    assert rows == [f"{LLM_FOUNDRY}: 70 published runs (70 on H100; 35 held out to check the fit)",
                    f"{DGXC}: 18 published runs (18 on H100; 8 held out to check the fit)",
                    "the package's own runs on one H100: 6"]
    band, rows = calibration_of(GPUS["A10G"])  # another Ampere GPU: the A100 rows, said as such
    assert band is not None and any("on another ampere GPU" in r for r in rows)
    band, rows = calibration_of(GPUS["L40S"])  # Ada has no published row: it borrows Ampere's constant
    assert band is None and rows and all(r.startswith("none of its own: ada borrows ampere") for r in rows)
    from jobs.planning import plan_request
    from jobs.request.parse import parse_request
    doc = plan_request(parse_request({"name": "cal", "dataset": "s3://bucket/data/", "model": "gpt",
                                      "model_size": "350m", "instance": {"type": "ml.p5.48xlarge"}})).to_dict()
    for c in [doc["recommendation"], *doc["candidates"]]:
        assert "error_band" in c and isinstance(c["calibrated_from"], list)
    assert doc["recommendation"]["error_band"] == calibration_of(GPUS["H100"])[0]
