"""Which tier of the suite is running (README "Tests"). The quick tier, for the edit loop,
runs the longest property tests on a third of their examples; the full suite, which CI
runs, on all of them. ``tests/conftest.py`` sets ``QUICK`` before any test module is
imported, so ``examples`` is read when a test's settings are built."""

from __future__ import annotations

QUICK = False


def examples(full: int) -> int:
    """Hypothesis examples for a test that runs ``full`` in the full suite."""
    return max(20, full // 3) if QUICK else full
