"""fleetq's test library: the harness the tests and the benches share — the crash-matrix
rig and its kill points (:mod:`fleetq.testing.chaos`), the job-shaped quota holder
(:mod:`fleetq.testing.holder`) and the history readers (:mod:`fleetq.testing.history`).

It sits below ``bench/``: benches import it, it imports no bench (an import-linter contract
in pyproject.toml), and no product code imports it.
"""
