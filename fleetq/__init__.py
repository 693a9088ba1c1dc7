"""fleetq: multi-cluster gang scheduling of PyTorchJobs with elastic quota queues, on Temporal."""

__version__ = "0.1.0"
