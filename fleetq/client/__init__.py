"""fleetq's client library: everything that talks to a running fleet through Temporal.

The CLI, ``bench/`` and the tests use it to connect (``connection``), apply manifests and
start jobs (``apply``), read, delete, suspend and resume jobs (``jobs``), read the
registry and the quota tree (``registry``) and read what the member clusters hold
(``members``). It returns values and raises :class:`~fleetq.client.errors.ClientError`;
turning those into text is the CLI's job.
"""
