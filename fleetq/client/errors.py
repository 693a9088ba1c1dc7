"""The failures the client library reports: each carries the one line a user reads (the
CLI prints it as is; a program can match on the class)."""

from __future__ import annotations


class ClientError(Exception):
    """A failure to report as one line (``message``), never as a traceback."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class NotFound(ClientError):
    """The object does not exist (never applied, or deleted): kubectl's NotFound line,
    e.g. ``pytorchjobs.kubeflow.org "x" not found``."""

    def __init__(self, resource: str, name: str) -> None:
        super().__init__(f'Error from server (NotFound): {resource} "{name}" not found')
        self.resource = resource
        self.name = name


class InvalidInput(ClientError):
    """Manifests that do not validate (one problem per line), or a request the fleet
    refuses as it stands (a job that has finished, a quota tree still in use)."""
