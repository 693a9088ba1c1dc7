"""A production-shaped Temporal for fleetq: the server built from its Go module, on
PostgreSQL, with every service its own process.

:mod:`fleetq.temporal_cluster.build` compiles ``temporal-server``, ``temporal-sql-tool``
and ``tdbg`` from the pinned ``go.temporal.io/server`` module into
``~/.cache/fleetq/temporal-cluster/<version>/`` and finds Debian's PostgreSQL server;
:mod:`fleetq.temporal_cluster.config` writes each process's config;
:mod:`fleetq.temporal_cluster.runner` starts PostgreSQL, loads the schema and runs
frontend, matching, worker and several history processes on loopback.
"""
