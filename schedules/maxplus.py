"""Max-plus algebra on numpy arrays: the steady-state period of a step repeated back to back.

Steps run one after another without a barrier form a max-plus linear system
x(k+1) = A (x) x(k): x_i(k+1) = max_j (A[i, j] + x_j(k)), where x(k) holds when each
resource (a rank, a link) is free after step k and A[i, j] is the longest path within
one step from resource j's start to resource i's end (-inf where there is none). Its
growth per step, the period, is the maximum cycle mean of the graph with an edge j -> i
of weight A[i, j] (Cuninghame-Green 1979; Baccelli, Cohen, Olsder and Quadrat,
"Synchronization and Linearity", 1992): the heaviest cycle of dependencies between
steps, per step it spans. The one definition of the period: `schedules.steady` builds A
with free transfers (what builders rank orders by), `simulator.steps` under a cost model
(`simulator.period` re-exports this module). Seconds in, seconds out.
"""
from __future__ import annotations

import numpy as np

MAX_CRITICAL_NODES = 1024  # critical_nodes is O(n^3)


def _matrix(a) -> np.ndarray:
    a = np.asarray(a, dtype=float)
    if a.ndim != 2 or a.shape[0] != a.shape[1] or a.shape[0] == 0:
        raise ValueError(f"need a non-empty square matrix, got shape {a.shape}")
    if np.isnan(a).any() or np.isposinf(a).any():
        raise ValueError("the matrix holds nan or +inf; entries are seconds, or -inf for no edge")
    return a


def max_cycle_mean(a) -> float:
    """The maximum cycle mean of the graph with an edge j -> i of weight a[i, j] (-inf:
    no edge), by Karp's algorithm (1978), O(n^3) here: with D_0 = 0 and
    D_k = a (x) D_(k-1) (the heaviest walk of k edges ending at each node),
    lambda = max over v of min over k < n of (D_n(v) - D_k(v)) / (n - k). -inf when the
    graph has no cycle. ValueError for a matrix that is not square, empty, or holds nan
    or +inf."""
    a = _matrix(a)
    n = a.shape[0]
    d = np.empty((n + 1, n))
    d[0] = 0.0
    for k in range(n):
        d[k + 1] = (a + d[k][None, :]).max(axis=1)
    best = -np.inf
    with np.errstate(invalid="ignore"):
        for v in np.flatnonzero(np.isfinite(d[n])):
            finite = np.isfinite(d[:n, v])
            ks = np.flatnonzero(finite)
            best = max(best, float(((d[n, v] - d[ks, v]) / (n - ks)).min()))
    return best


def critical_nodes(a, mean: float | None = None, rel: float = 1e-9) -> list[int]:
    """The nodes on a cycle of maximum mean (`mean`: max_cycle_mean(a), computed when
    None), to `rel` of the largest path weight: those whose heaviest cycle in a - mean
    weighs 0. Empty without a cycle or for more than MAX_CRITICAL_NODES nodes."""
    a = _matrix(a)
    mean = max_cycle_mean(a) if mean is None else mean
    n = a.shape[0]
    if not np.isfinite(mean) or n > MAX_CRITICAL_NODES:
        return []
    b = a - mean  # no cycle of b weighs more than 0: its closure is finite
    for k in range(n):  # Floyd-Warshall in max-plus: heaviest paths of any length
        b = np.maximum(b, b[:, k, None] + b[None, k, :])
    scale = float(np.abs(a[np.isfinite(a)]).max(initial=0.0)) * n
    return [int(v) for v in np.flatnonzero(np.diag(b) >= -rel * max(1.0, scale))]


def apply(a, x) -> np.ndarray:
    """a (x) x: x_i -> max_j (a[i, j] + x_j), one step of the system."""
    return (np.asarray(a, dtype=float) + np.asarray(x, dtype=float)[None, :]).max(axis=1)
