"""Real Kubernetes control planes for member clusters, built from Go modules.

:mod:`fleetq.controlplane.build` compiles etcd, kube-apiserver, kube-scheduler and
kubectl from the pinned upstream Go modules (our wrapper modules live in ``controlplane/``
at the repository root) into a cache directory keyed by version, and takes the
PyTorchJob and Reservation CRDs from the training-operator and Koordinator modules.
:mod:`fleetq.controlplane.runner` starts one control plane per member on loopback (TLS,
bearer token), and :mod:`fleetq.controlplane.lifecycle` plays kubelet and the PyTorchJob
operator against it.
"""
