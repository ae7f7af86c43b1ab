"""The batch a dynamic-batching server actually forms, and the latency its requests see.

The queue: requests arrive as a Poisson stream of ``rate`` per second at one worker (one
replica). When the worker is free and requests wait, it takes up to ``max_batch`` of them as one
batch as soon as either ``max_batch`` are waiting or the oldest has waited ``max_delay``
(Triton's ``max_queue_delay``, modelpress serve's ``--max-delay-ms``); a batch of ``b`` keeps the
worker busy for the deterministic service time ``S(b)``. A request's latency is its wait in the
queue plus the service of its batch.

Analysis (exact for this policy while ``max_batch`` does not bind, numerical where it says so):
the state seen at each dispatch is the size ``b`` of the batch just sent; everything that
arrives until the next dispatch forms the next batch. From ``b``:

- ``n`` requests arrive during the service, ``n ~ Poisson(rate · S(b))``, at independent uniform
  times in ``[0, S(b)]``;
- if ``n = 0`` the worker idles until the next arrival, which then waits ``max_delay`` for company
  (``m ~ Poisson(rate · max_delay)`` more join): the next batch is ``1 + m``;
- if ``n ≥ 1`` the oldest has waited ``a = S(b) - u₁`` (``u₁`` the first arrival, density
  ``n (1 - u/S)^(n-1) / S``); the worker waits ``w = max(0, max_delay - a)`` more, ``m ~
  Poisson(rate · w)`` join, and the next batch is ``n + m`` (``u₁`` integrated by Gauss-Legendre
  quadrature over ``v = (1 - u₁/S)^n``, which is uniform).

This gives the transition probabilities of a Markov chain on ``b``; its stationary distribution
``π`` solves ``π P = π`` on the states a power iteration from a batch of one finds. Every request of the next batch is accounted for with its own
latency: a request that arrived at ``t`` in the cycle waits ``T - t`` (``T`` the dispatch time)
then ``S(b')``; the latency distribution of all requests is a mixture of uniform pieces
(weights ``π_b`` × the probabilities above), and its quantiles are found by bisection.

``max_batch`` is applied by capping ``b'``; the requests a capped batch leaves behind are not
carried (that needs the age of every waiting request in the state), so the analysis reports the
probability that a dispatch leaves requests behind (``overflow``) and calls the queue
``saturated`` when it exceeds ``SATURATION``: a planner must then add replicas, not trust the
latency. The service planner (``service.py``) only recommends unsaturated settings and picks a
``max_batch`` the batch distribution rarely reaches.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np

from modelpress.errors import OptionError

SATURATION = 1e-3  # overflow probability above which the latency is not trusted
_NODES, _WEIGHTS = np.polynomial.legendre.leggauss(12)
_TAIL = 1e-12  # Poisson mass left out at either end
_MAX_STATES = 1 << 14
_MAX_ITERATIONS = 400


@dataclass(frozen=True)
class QueueStats:
    rate: float  # requests per second at this worker
    max_batch: int
    max_delay_ms: float
    mean_batch: float  # requests per dispatched batch
    batch_p50: int
    batch_p99: int
    batch_p999: int
    mean_ms: float  # latency: queueing + batching delay + service
    p50_ms: float
    p99_ms: float
    utilisation: float  # fraction of the time the worker is busy
    overflow: float  # probability that a dispatch leaves requests waiting (max_batch binds)
    saturated: bool

    def to_dict(self) -> dict:
        return asdict(self)


_LOG_FACTORIAL = np.zeros(1)


def _log_factorial(k: np.ndarray) -> np.ndarray:
    """log(k!) for integer arrays, from a table grown on demand (no scipy in the core)."""
    global _LOG_FACTORIAL
    top = int(k.max()) if k.size else 0
    if top >= len(_LOG_FACTORIAL):
        n = max(top + 1, 2 * len(_LOG_FACTORIAL))
        _LOG_FACTORIAL = np.concatenate(([0.0], np.cumsum(np.log(np.arange(1, n)))))
    return _LOG_FACTORIAL[k]


def _poisson(mu: float) -> tuple[np.ndarray, np.ndarray]:
    """Support and probabilities of Poisson(mu), the far tails (beyond 9 sigma) dropped."""
    if mu <= 0:
        return np.zeros(1, dtype=np.int64), np.ones(1)
    half = 9.0 * np.sqrt(mu) + 12.0
    k = np.arange(max(0, int(mu - half)), int(mu + half) + 1)
    pk = np.exp(k * np.log(mu) - mu - _log_factorial(k))
    return k, pk / pk.sum()


def _poisson_rows(mus: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One support ``k`` (0..max) and a row of Poisson probabilities per mean in ``mus``."""
    top = float(mus.max())
    k = np.arange(0, int(top + 9.0 * np.sqrt(top) + 12.0) + 1)
    logmu = np.log(np.where(mus > 0, mus, 1.0))[:, None]
    pk = np.where(mus[:, None] > 0, np.exp(k * logmu - mus[:, None] - _log_factorial(k)), 0.0)
    pk[mus <= 0, 0] = 1.0
    return k, pk / pk.sum(axis=1, keepdims=True)


class _Cycle:
    """What follows the dispatch of a batch of ``b``: the distribution of the next batch and the
    latency pieces (weight, low, high: that many requests spread uniformly over [low, high]),
    for every number ``n`` of arrivals during the service at once."""

    def __init__(self, b: int, *, rate: float, s: np.ndarray, max_batch: int, delay: float):
        sb = float(s[b])
        self.next = np.zeros(max_batch + 1)
        self.overflow = 0.0  # probability that this cycle's arrivals exceed max_batch
        self.cycle_s = sb  # expected time to the next dispatch
        self._pieces: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        ns, pn = _poisson(rate * sb)
        if ns[0] == 0:
            self._idle(float(pn[0]), rate=rate, s=s, max_batch=max_batch, delay=delay)
        busy = ns > 0
        if busy.any():
            args = dict(rate=rate, s=s, max_batch=max_batch, delay=delay)
            if delay <= 0:
                self._busy_now(ns[busy], pn[busy], sb, **args)
            else:
                self._busy_wait(ns[busy], pn[busy], sb, **args)
        w, lo, hi = (
            np.concatenate([x.ravel() for x in part]) for part in zip(*self._pieces, strict=True)
        )
        keep = w > w.sum() * 1e-13
        self.pieces = (w[keep], lo[keep], hi[keep])

    def _add(self, size: np.ndarray, prob: np.ndarray, total: np.ndarray, max_batch: int) -> None:
        """Next-batch probabilities: ``prob`` of batches of ``min(total, max_batch)``."""
        np.add.at(self.next, np.broadcast_to(size, prob.shape).ravel(), prob.ravel())
        self.overflow += float(prob[np.broadcast_to(total > max_batch, prob.shape)].sum())

    def _idle(self, p, *, rate, s, max_batch, delay):
        # the worker idles 1/rate on average, then the first arrival waits ``delay``
        self.cycle_s += p * (1.0 / rate + delay)
        m, pm = _poisson(rate * delay)
        size = np.minimum(1 + m, max_batch)
        self._add(size, p * pm, 1 + m, max_batch)
        sv = s[size]
        self._pieces.append((p * pm, delay + sv, delay + sv))  # the first arrival
        self._pieces.append((p * pm * (size - 1), sv, delay + sv))  # those who joined

    def _busy_now(self, n, pn, sb, *, rate, s, max_batch, delay):
        # no wait: the n arrivals, spread uniformly over the service, form the next batch
        size = np.minimum(n, max_batch)
        self._add(size, pn, n, max_batch)
        self._pieces.append((pn * size, s[size], sb + s[size]))

    def _busy_wait(self, n, pn, sb, *, rate, s, max_batch, delay):
        # The first of the n arrivals comes at u1 with P(u1 > u) = (1 - u/sb)^n, so
        # v = (1 - u1/sb)^n is uniform on [0, 1]: integrate over v (no peaked density). The
        # oldest has waited sb - u1 at the end of the service; if that is less than ``delay``
        # (v below v_cut) the worker waits the rest, w, and m more join.
        nn = n[:, None].astype(float)
        v_cut = (1.0 - max(0.0, sb - delay) / sb) ** nn  # (N, 1)
        x = (_NODES + 1) / 2
        v = np.concatenate([v_cut + (1.0 - v_cut) * x, v_cut * x], axis=1)  # (N, nodes)
        wv = (
            np.concatenate([(1.0 - v_cut) * _WEIGHTS / 2, v_cut * _WEIGHTS / 2], axis=1)
            * pn[:, None]
        )
        u1 = sb * (1.0 - v ** (1.0 / nn))
        w = np.maximum(0.0, delay - (sb - u1))
        self.cycle_s += float((wv * w).sum())
        m, pm = _poisson_rows((rate * w).ravel())
        prob = wv[..., None] * pm.reshape(*w.shape, len(m))  # (N, nodes, joiners)
        total = n[:, None, None] + m[None, None, :]
        size = np.minimum(total, max_batch)
        self._add(size, prob, total, max_batch)
        sv = s[size]
        taken = np.minimum(size, n[:, None, None])  # of the n arrivals during the service, FIFO
        oldest = (sb - u1 + w)[..., None] + sv
        start = w[..., None] + sv
        self._pieces.append((prob, oldest, oldest))  # the oldest
        # the others of the n arrived uniformly in [u1, sb]; the joiners during the wait
        self._pieces.append((prob * (taken - 1), start, oldest))
        self._pieces.append((prob * (size - taken), np.broadcast_to(sv, prob.shape), start))


def _quantile(weights: np.ndarray, lo: np.ndarray, hi: np.ndarray, q: float) -> float:
    """The ``q`` quantile of a mixture of uniform pieces (point masses where lo == hi)."""
    total = weights.sum()
    span = np.maximum(hi - lo, 1e-300)

    def cdf(x: float) -> float:
        return float((weights * np.clip((x - lo) / span, 0.0, 1.0)).sum()) / total

    a, b = float(lo.min()), float(hi.max())
    for _ in range(48):
        mid = (a + b) / 2
        if cdf(mid) < q:
            a = mid
        else:
            b = mid
    return b


def analyse(
    rate: float,
    service_s: Callable[[np.ndarray], np.ndarray],
    *,
    max_batch: int,
    max_delay_s: float = 0.0,
) -> QueueStats:
    """Batch sizes and latency of the queue of the module docstring at ``rate`` requests/s.

    ``service_s`` maps an array of batch sizes to their service times in seconds (non-decreasing).
    """
    if rate <= 0:
        raise OptionError("the request rate must be positive")
    if max_batch < 1 or max_batch > _MAX_STATES:
        raise OptionError(f"max batch must be between 1 and {_MAX_STATES}")
    if max_delay_s < 0:
        raise OptionError("`max_delay_s` must be 0 or more")
    sizes = np.arange(max_batch + 1)
    s = np.asarray(service_s(np.maximum(sizes, 1)), dtype=float)
    cycles: dict[int, _Cycle] = {}

    def cycle(b: int) -> _Cycle:
        if b not in cycles:
            cycles[b] = _Cycle(b, rate=rate, s=s, max_batch=max_batch, delay=max_delay_s)
        return cycles[b]

    # The stationary distribution: power iteration from a batch of one finds the states that
    # matter (those whose probability stays above 1e-14; no row is built for the others), then
    # pi P = pi is solved exactly on them (the mass leaving them, below 1e-14, is dropped).
    pi = np.zeros(max_batch + 1)
    pi[1] = 1.0
    states = np.array([1])
    rows = np.stack([cycle(1).next])
    steady = 0
    for _ in range(_MAX_ITERATIONS):
        new = pi[states] @ rows
        new[new < 1e-14] = 0.0
        new /= new.sum()
        found = np.nonzero(new)[0]
        steady = steady + 1 if np.array_equal(found, states) else 0
        change = float(np.abs(new - pi).sum())
        pi = new
        if not np.array_equal(found, states):
            states = found
            rows = np.stack([cycle(b).next for b in states.tolist()])
        if change < 1e-12 or steady >= 20:
            break
    sub = rows[:, states]
    sub /= sub.sum(axis=1, keepdims=True)
    A = (sub - np.eye(len(states))).T
    A[-1, :] = 1.0
    rhs = np.zeros(len(states))
    rhs[-1] = 1.0
    pi = np.zeros(max_batch + 1)
    pi[states] = np.clip(np.linalg.solve(A, rhs), 0.0, None)
    pi /= pi.sum()
    live = np.nonzero(pi > 1e-15)[0].tolist()
    weights, lo, hi = (
        np.concatenate([pi[b] * cycle(b).pieces[0] for b in live]),
        np.concatenate([cycle(b).pieces[1] for b in live]),
        np.concatenate([cycle(b).pieces[2] for b in live]),
    )
    keep = weights > weights.sum() * 1e-14
    weights, lo, hi = weights[keep], lo[keep], hi[keep]
    mean_s = float((weights * (lo + hi) / 2).sum() / weights.sum())
    busy = float(sum(pi[b] * s[b] for b in live))
    elapsed = float(sum(pi[b] * cycle(b).cycle_s for b in live))
    overflow = float(sum(pi[b] * cycle(b).overflow for b in live))
    cum = np.cumsum(pi)
    batch_q = [int(np.searchsorted(cum, q - 1e-12)) for q in (0.5, 0.99, 0.999)]
    return QueueStats(
        rate=rate,
        max_batch=max_batch,
        max_delay_ms=max_delay_s * 1e3,
        mean_batch=float((pi * sizes).sum()),
        batch_p50=batch_q[0],
        batch_p99=batch_q[1],
        batch_p999=batch_q[2],
        mean_ms=mean_s * 1e3,
        p50_ms=_quantile(weights, lo, hi, 0.5) * 1e3,
        p99_ms=_quantile(weights, lo, hi, 0.99) * 1e3,
        utilisation=busy / elapsed,
        overflow=overflow,
        saturated=overflow > SATURATION,
    )


__all__ = ["SATURATION", "QueueStats", "analyse"]
