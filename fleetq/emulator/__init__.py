"""The member-cluster emulator: loopback Kubernetes API servers with simulated
controllers behind them (PyTorchJob operator, gang scheduler, reservations, pod
lifecycle), usable by the official ``kubernetes`` client and ``kubectl`` unchanged.

It is a product feature (``fleetq sim serve``, the embedded default of ``fleetq up``,
demos, benchmarks), not a test mock. Importing the package loads nothing: the servers
are in :mod:`fleetq.emulator.fleet` (``EmulatedFleet``, ``Emulator``) and the topology
they serve is the core's :mod:`fleetq.topology`.
"""
