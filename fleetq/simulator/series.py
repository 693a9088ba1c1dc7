"""Step functions of virtual time, and the numbers a report takes of them.

A simulation records every quantity it reports (queue lengths, quota usage, allocated
capacity) as a :class:`StepSeries`: change points only, integrated exactly for
time-weighted averages and sampled for the timeline.
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Any

import numpy as np

from fleetq import resources as R

__all__ = ["StepSeries", "resource_order", "rounded", "scaled", "stats", "units"]


class StepSeries:
    """A piecewise-constant function of time, recorded as change points."""

    __slots__ = ("times", "values")

    def __init__(self, t0: float, v0: float = 0.0) -> None:
        self.times: list[float] = [t0]
        self.values: list[float] = [v0]

    def set(self, t: float, v: float) -> None:
        if v == self.values[-1]:
            return
        if t == self.times[-1]:
            self.values[-1] = v
            if len(self.values) > 1 and self.values[-2] == v:
                self.times.pop()
                self.values.pop()
        else:
            self.times.append(t)
            self.values.append(v)

    def integral(self, end: float) -> float:
        """Integral from the first change point to ``end``."""
        t = np.asarray(self.times + [max(end, self.times[-1])], dtype=float)
        v = np.asarray(self.values, dtype=float)
        return float(np.dot(v, np.diff(t)))

    def average(self, end: float) -> float:
        span = end - self.times[0]
        if span <= 0:
            return float(self.values[-1])
        return self.integral(end) / span

    def peak(self) -> float:
        return float(max(self.values))

    def sample(self, times: np.ndarray[Any, Any]) -> list[float]:
        idx = np.searchsorted(np.asarray(self.times), times, side="right") - 1
        vals = np.asarray(self.values, dtype=float)
        return [float(x) for x in vals[np.clip(idx, 0, len(vals) - 1)]]

    def at(self, t: float) -> float:
        i = bisect_right(self.times, t) - 1
        return float(self.values[max(i, 0)])


def stats(values: list[float]) -> dict[str, float | int | None]:
    """Count, mean and percentiles (p50/p90/p99) of ``values``, ``None`` when empty."""
    if not values:
        return {"count": 0, "mean": None, "p50": None, "p90": None, "p99": None, "max": None}
    arr = np.asarray(values, dtype=float)
    p50, p90, p99 = (float(x) for x in np.percentile(arr, [50, 90, 99]))
    return {
        "count": len(values),
        "mean": rounded(float(arr.mean())),
        "p50": rounded(p50),
        "p90": rounded(p90),
        "p99": rounded(p99),
        "max": rounded(float(arr.max())),
    }


def rounded(x: float, digits: int = 6) -> float:
    return round(x, digits)


def units(name: str, milli: float) -> float:
    """Milli-units to the unit users write (cores, bytes, GPUs, jobs, pods)."""
    return rounded(milli / R.MILLI, 3)


def resource_order(name: str) -> tuple[int, str]:
    """Sort key: cpu, memory, GPUs, max-jobs, pods, then the rest by name."""
    order = {R.CPU: 0, R.MEMORY: 1, R.GPU: 2, R.MAX_JOBS: 3, R.PODS: 4}
    return (order.get(name, 5), name)


def scaled(s: StepSeries, factor: float) -> StepSeries:
    """``s`` with every value multiplied by ``factor``."""
    out = StepSeries(s.times[0], s.values[0] * factor)
    out.times = list(s.times)
    out.values = [v * factor for v in s.values]
    return out
