"""Where a pipeline cuts a model: contiguous blocks per stage, the heaviest stage as light as possible.

Pure Python, so that the training package (training.parallel.pipeline_parallel, which weighs blocks by their training FLOPs)
and the planner (jobs.planning.timing, which weighs them from the model's shape) cut alike.
"""

from __future__ import annotations

from contract.errors import ConfigError


def balance(weights: list[float], n_stages: int, first: float = 0, last: float = 0) -> list[range]:
    """Contiguous block ranges, one per stage, minimizing the heaviest stage (`first`/`last`: the edges'
    weight on the first and last stage). Exact: dynamic programming over (blocks, stages)."""
    n = len(weights)
    if n < n_stages:
        raise ConfigError(f"the model has {n} blocks, fewer than the {n_stages} pipeline stages "
                          "(pp_degree x stages per rank): lower pp_degree or pp_stages_per_rank, or use the 1f1b schedule")
    prefix = [0]
    for w in weights:
        prefix.append(prefix[-1] + w)

    def cost(stage: int, i: int, j: int) -> float:
        return prefix[j] - prefix[i] + (first if stage == 0 else 0) + (last if stage == n_stages - 1 else 0)

    inf = float("inf")
    best = [[inf] * (n + 1) for _ in range(n_stages + 1)]  # best[s][j]: first j blocks in s stages
    cut = [[0] * (n + 1) for _ in range(n_stages + 1)]
    best[0][0] = 0
    for s in range(1, n_stages + 1):
        for j in range(s, n - (n_stages - s) + 1):
            for i in range(s - 1, j):
                c = max(best[s - 1][i], cost(s - 1, i, j))
                if c < best[s][j]:
                    best[s][j], cut[s][j] = c, i
    ranges, j = [], n
    for s in range(n_stages, 0, -1):
        ranges.append(range(cut[s][j], j))
        j = cut[s][j]
    return ranges[::-1]


def stage_loads(ranges: list[range], weights: list[float], first: float = 0, last: float = 0) -> list[float]:
    """Each stage's weight: its blocks, plus the edges on the first and last stage."""
    return [sum(weights[i] for i in r) + (first if s == 0 else 0) + (last if s == len(ranges) - 1 else 0)
            for s, r in enumerate(ranges)]


def bottleneck_ratio(weights: list[float], n_stages: int, first: float = 0, last: float = 0) -> float:
    """The heaviest stage of the best cut over an even share of the whole (1.0: a perfect cut). A pipeline runs
    at its slowest stage's pace, so this is what an even split of the work leaves out."""
    loads = stage_loads(balance(weights, n_stages, first, last), weights, first, last)
    return max(loads) / (sum(loads) / n_stages)
