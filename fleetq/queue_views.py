"""Markdown views of the admission core for the Web UI: the quota workflow's per-queue
table (its Temporal "current details"), kept apart from :mod:`fleetq.admission`, which
decides, so the presentation can change without touching the admission rules.
"""

from __future__ import annotations

from fleetq import resources as R
from fleetq.admission import Admission, QueueInfo, markdown_header, markdown_row


class QueueTable:
    """The quota workflow's per-queue table (its Temporal "current details"), one
    Markdown row per quota node in tree pre-order, redrawn only for the rows whose node
    changed (:meth:`Admission.changed_queues`): a workflow task of a 1,000-leaf tree
    formats the handful of rows a release and its grants touched, not 1,000 (issue 19).
    Columns are spaced for the Web UI (:func:`markdown_row`), counts right-aligned.
    """

    HEADER = markdown_header(("queue", "waiting", "admitted", "usage / max"), "lrrl")

    def __init__(self) -> None:
        self._rows: dict[str, str] = {}

    @staticmethod
    def row(q: QueueInfo) -> str:
        usage = ", ".join(
            f"{k} {R.format_quantity(k, q.usage.get(k, 0))}/{R.format_quantity(k, v)}"
            for k, v in sorted(q.max.items())
        )
        return markdown_row((q.name, q.length, q.admitted, usage or "-"))

    def update(self, admission: Admission) -> dict[str, int]:
        """Redraw the rows that changed; returns the waiting count of each queue whose
        row was redrawn, by queue name (every queue after a rebuild)."""
        changed = admission.changed_queues()
        if changed is None:
            self._rows = {}
            changed = [n.name for n in admission.quota]
        lengths: dict[str, int] = {}
        for node in changed:
            if node not in admission.quota.nodes:
                continue
            q = admission.queue_info(node)
            self._rows[node] = self.row(q)
            lengths[q.name] = q.length
        return lengths

    def lines(self) -> list[str]:
        """The header and every row, tree pre-order."""
        return [*self.HEADER, *self._rows.values()]
