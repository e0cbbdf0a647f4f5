"""The chunked cross-entropy (training.loss): the full loss's value and gradient, the same training, and the bytes it
saves, measured on CPU.

Memory is the loss's peak over forward and backward beside its input logits: torch.profiler's allocator events carry
the running total (as tests/training/models/test_selective_checkpointing.py reads them); the peak less the total before the
first event. Measured (torch 2.13 and 2.8.0 alike, CPU, 8192 tokens x a 50,368 vocabulary, bf16 logits, chunks of
1024 tokens; `python -m pytest -n 0 -q -s tests/training/test_chunked_loss.py` prints them, `python -m
bench.chunked_loss` adds fp32 and torch.compile):
    full     4,951.4 MB = 12 bytes a logit (the kept fp32 log-softmax, its gradient and the fp32 input's)
    chunked  1,650.5 MB =  4 bytes a logit (the logits' gradient, 2, filled chunk by chunk, then concatenated, 2)
At fp32 logits: full 12, chunked 8 bytes a logit (the gradient is 4 bytes). One chunk's fp32 temporaries at backward's
peak are 12 bytes a logit of the chunk (a single chunk of 1024 tokens: 12.00 exactly), below the concatenation's
peak here. jobs.planning.memory charges these (its docstring).
"""

from __future__ import annotations

import pytest
import torch

from bench.chunked_loss import peak_bytes
from contract.hyperparameters import LOSS_CHUNK_TOKENS
from training.loss import chunked_cross_entropy, full_cross_entropy, loss_function


def logits_and_targets(shape: tuple[int, ...], vocab: int, dtype: torch.dtype, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    logits = (3 * torch.randn(*shape, vocab, generator=g)).to(dtype).requires_grad_()
    return logits, torch.randint(0, vocab, shape, generator=g)


def value_and_grad(loss_fn, logits: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    logits.grad = None
    loss = loss_fn(logits, y)
    loss.backward()
    return loss.detach(), logits.grad


# Measured (torch 2.13 and 2.8.0 alike, CPU, the shapes below, seeds 0-2): the loss values within 8.6e-8 relative
# (about one fp32 ulp: the chunks' sums add in another order), fp32 and bf16 logits alike; the gradients exactly
# equal (each logit's gradient, (softmax - one-hot) / count, is computed from its own row and the same count, whatever
# the chunk). Held at 1e-6 relative for the value (10x the measured) and exact equality for the gradient.
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("shape", [(3, 700), (2500,), (1, 5)], ids=["batch x seq", "tokens", "fewer than a chunk"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_chunked_loss_equals_the_full_one(dtype, shape, seed):
    logits, y = logits_and_targets(shape, 1000, dtype, seed)
    full, full_grad = value_and_grad(full_cross_entropy, logits, y)
    chunked, chunked_grad = value_and_grad(lambda a, b: chunked_cross_entropy(a, b, 1024), logits, y)
    assert chunked.dtype == full.dtype == torch.float32 and chunked_grad.dtype == dtype
    assert chunked.item() == pytest.approx(full.item(), rel=1e-6, abs=0)
    assert torch.equal(chunked_grad, full_grad)


def test_without_gradients_it_computes_the_same_value_and_records_nothing():
    # Evaluation runs under no_grad: the chunks are computed directly, no checkpoint.
    logits, y = logits_and_targets((2, 600), 300, torch.bfloat16)
    with torch.no_grad():
        chunked, full = chunked_cross_entropy(logits, y, 256), full_cross_entropy(logits, y)
    assert not chunked.requires_grad and chunked.item() == pytest.approx(full.item(), rel=1e-6)


def test_ignored_targets_count_as_in_the_full_loss():
    # F.cross_entropy's mean leaves targets equal to -100 out of the sum and the count; the chunked loss too
    # (the package's data has none).
    logits, y = logits_and_targets((2000,), 50, torch.float32)
    y[::3] = -100
    full, full_grad = value_and_grad(full_cross_entropy, logits, y)
    chunked, chunked_grad = value_and_grad(lambda a, b: chunked_cross_entropy(a, b, 300), logits, y)
    assert chunked.item() == pytest.approx(full.item(), rel=1e-6) and torch.equal(chunked_grad, full_grad)


def test_the_hyperparameter_chooses_the_form():
    from contract.errors import ConfigError
    from training.config import from_environment

    assert loss_function(0) is full_cross_entropy
    assert from_environment({}, {}).loss_chunk_tokens == LOSS_CHUNK_TOKENS == 1024
    assert from_environment({"loss_chunk_tokens": 0}, {}).loss_chunk_tokens == 0
    with pytest.raises(ConfigError, match="loss_chunk_tokens"):
        from_environment({"loss_chunk_tokens": -1}, {})


# The memory tests' size: 8192 tokens in chunks of LOSS_CHUNK_TOKENS scaled down 4 times (the bytes a logit depend on the
# number of chunks, not the size).
SCALED_TOKENS, SCALED_CHUNK = 8192 // 4, LOSS_CHUNK_TOKENS // 4


def test_the_chunked_loss_keeps_a_third_of_the_full_ones_bytes():
    """The module docstring's figures, a bytes-a-logit ratio: 8192 tokens x 50,368 bf16 logits (MPT's vocabulary, 4
    sequences of 2048) in chunks of 1024 tokens, measured here at a quarter of the size (2048 tokens in chunks of
    256: the same 8 chunks; 1.2 GB where the full size took 5 GB and 22 s of a 2-core CI machine)."""
    tokens, vocab = SCALED_TOKENS, 50368
    logits, y = logits_and_targets((tokens,), vocab, torch.bfloat16)
    full = peak_bytes(full_cross_entropy, logits, y)
    logits.grad = None
    chunked = peak_bytes(loss_function(SCALED_CHUNK), logits, y)
    per_logit = {"full": full / (tokens * vocab), "chunked": chunked / (tokens * vocab)}
    print(f"\nloss peak beside the bf16 logits, {tokens} x {vocab}: full {full / 1e6:,.1f} MB, chunked "
          f"{chunked / 1e6:,.1f} MB; bytes a logit {per_logit}")
    # Measured 12.00 and 4.00: the full loss's three fp32 tensors, the chunked loss's bf16 gradient twice over
    # (the chunks' gradients and their concatenation). One chunk's 12 bytes a logit of 1/8 of the tokens stay
    # below that.
    assert per_logit["full"] == pytest.approx(12, rel=0.02)
    assert per_logit["chunked"] == pytest.approx(4, rel=0.02)
    assert chunked < 0.35 * full


def train(loss_chunk_tokens: int, precision: str, steps: int = 4) -> dict[str, torch.Tensor]:
    from bench.step_overhead import fixed_batch, package_step
    from contract.hyperparameters import TrainConfig
    from training.precision import resolve_precision

    device = torch.device("cpu")
    cfg = TrainConfig(model="gpt", model_size="tiny", micro_batch_size=8, precision=precision, max_steps=10 ** 6,
                      warmup_steps=0, data="synthetic", loss_chunk_tokens=loss_chunk_tokens, lr=1e-2)
    step = package_step(cfg, device, resolve_precision(precision, device))
    assert (step.loss_fn is full_cross_entropy) is (loss_chunk_tokens == 0)
    x, y = fixed_batch(step.par.model, 8, device)
    for _ in range(steps):
        step([(x, y)])
    return {n: p.detach().clone() for n, p in step.par.model.named_parameters()}


# Measured (torch 2.13 and 2.8.0, CPU, gpt tiny, 8 x 32 tokens, chunks of 100 tokens: 3 chunks, the last short,
# 4 AdamW steps at lr 1e-2, the package's step): the weights exactly equal, fp32 and bf16 autocast: the logits'
# gradient is exactly the full loss's (above), and the loss's value, which differs in its last bit, enters no update.
# Held equal.
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_tiny_gpt_trains_to_the_same_weights_with_either_loss(precision):
    full, chunked = train(0, precision), train(100, precision)
    assert full.keys() == chunked.keys()
    worst = max((full[n] - chunked[n]).abs().max().item() for n in full)
    print(f"\n{precision}: largest weight difference after 4 steps {worst:.2e}")
    assert all(torch.equal(full[n], chunked[n]) for n in full)


def test_with_compile_the_step_compiles_the_whole_loss_and_trains_alike():
    """`compile` (outside a pipeline) compiles the whole loss, whatever loss_chunk_tokens says (training.step: fused,
    it keeps no fp32 copy; bench.chunked_loss measures it). Measured (torch 2.13 and 2.8.0, CPU, gpt tiny, fp32, 2
    steps): the weights equal to the eager whole loss's (0.0); held at 1e-6, room for fused kernels that round
    otherwise."""
    from bench.step_overhead import build, fixed_batch
    from contract.hyperparameters import TrainConfig
    from training.optim import build_optimizer, build_scheduler
    from training.parallel.process_group import Dist
    from training.parallel.strategies import apply_strategy
    from training.precision import grad_scaler, resolve_precision
    from training.step import TrainStep

    device, results = torch.device("cpu"), {}
    for compiled in (False, True):
        cfg = TrainConfig(model="gpt", model_size="tiny", micro_batch_size=8, precision="fp32", max_steps=10 ** 6,
                          warmup_steps=0, data="synthetic", lr=1e-2)
        precision = resolve_precision("fp32", device)
        par = apply_strategy(build(cfg, device), cfg, Dist(rank=0, world_size=1, local_rank=0, device=device), precision)
        optimizer = build_optimizer(par.model, cfg)
        step = TrainStep(par, optimizer, build_scheduler(optimizer, cfg), grad_scaler(precision, device), precision,
                         device, cfg.grad_clip, compile_loss=compiled, loss_chunk_tokens=0 if not compiled else 100)
        assert (step.loss_fn is not step.eager_loss) is compiled
        x, y = fixed_batch(par.model, 8, device)
        for _ in range(2):
            step([(x, y)])
        results[compiled] = {n: p.detach().clone() for n, p in par.model.named_parameters()}
    worst = max((results[True][n] - results[False][n]).abs().max().item() for n in results[False])
    print(f"\ncompiled against eager whole loss, largest weight difference after 2 steps: {worst:.2e}")
    assert worst <= 1e-6


def test_with_the_head_the_peak_is_what_the_planner_charges():
    """The logits made by a bf16 head (hidden 64, so its own tensors are small) inside the measured region: they are
    freed once the last chunk's backward has run, before the chunks' gradients are concatenated. Measured (torch 2.13
    and 2.8.0, CPU, 8192 tokens x 50,368): 2,166.2 MB = 5.25 bytes a logit = 2a.V a token + 10 bytes a logit of one
    chunk (the whole loss: 12.0 bytes a logit, where the planner charges it (a + 8).V = 10 as the H100 calibration
    rows were fitted). jobs.planning.memory.loss_bytes charges the chunked loss 2a.V a token + 12.V.c: +4.8%, held
    within 10% and never below."""
    from jobs.planning.layout import numerics
    from jobs.planning.memory import loss_bytes
    from jobs.planning.shape import ModelFacts

    tokens, vocab, hidden = SCALED_TOKENS, 50368, 64  # a quarter of the size, the same 8 chunks (above)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(tokens, hidden, generator=g).to(torch.bfloat16).requires_grad_()
    head = (torch.randn(vocab, hidden, generator=g) / 8).to(torch.bfloat16).requires_grad_()
    y = torch.randint(0, vocab, (tokens,), generator=g)
    measured = peak_bytes(lambda h, t: loss_function(SCALED_CHUNK)(h @ head.T, t), x, y)
    facts = ModelFacts(kind="decoder", params=0, param_tensors=0, flops_per_sample=0, vocab=vocab)
    charged = loss_bytes(facts, numerics({"precision": "bf16", "loss_chunk_tokens": SCALED_CHUNK}), tokens, "chunked")
    print(f"\nhead and chunked loss, {tokens} x {vocab}: measured {measured / 1e6:,.1f} MB "
          f"({measured / (tokens * vocab):.2f} bytes a logit), the planner charges {charged / 1e6:,.1f} MB")
    assert measured / (tokens * vocab) == pytest.approx(5.25, rel=0.02)
    assert charged == pytest.approx(measured, rel=0.10) and charged >= measured
