"""``python -m fleetq.cli``: the ``fleetq`` command."""

from fleetq.cli import main

main()
