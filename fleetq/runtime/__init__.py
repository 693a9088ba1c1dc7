"""The processes fleetq runs on a machine: the embedded dev stack behind ``fleetq up`` and
``fleetq demo`` (``embedded``), the supervisor that starts and stops child processes
(``supervisor``) and the worker's health endpoints (``worker_health``)."""
