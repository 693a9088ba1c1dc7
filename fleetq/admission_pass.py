"""One scheduling pass of a quota tree: in which order it plans preemptions and grants.

The quota workflow (``workflows/quota_tree.py``) and the simulator
(``fleetq/simulator/engine.py``) both run :func:`run_pass`, so the order lives here once:
plans first, against the jobs admitted before the pass, so no victim is a job the pass
admits; then grants, with every waiting preemptor's quota held; then, if anything was
granted, plans for the jobs that fitted before but were outranked, sparing this pass's
grants. Kueue's scheduling cycle does the same (``run_pass`` says where). Pure: no
Temporal, no clock.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field

from fleetq.admission import Admission, Grant, PendingPlan
from fleetq.preemption import PreemptionPlan, plan_preemptions


@dataclass
class PassOutcome:
    """What one pass decided: the grants to start, the new plans (their victims are told
    to stop: made before the grants, then after them), the plans dropped on expiry, and
    why planning failed if it did (the grants stand: a planning error never stops
    admission)."""

    grants: list[Grant] = field(default_factory=list)
    plans_before_grants: list[PreemptionPlan] = field(default_factory=list)
    plans_after_grants: list[PreemptionPlan] = field(default_factory=list)
    expired: list[PendingPlan] = field(default_factory=list)
    plan_error: str | None = None

    @property
    def plans(self) -> list[PreemptionPlan]:
        return self.plans_before_grants + self.plans_after_grants


def run_pass(
    admission: Admission, now: float, *, preempt: bool, granted: Collection[str] = ()
) -> PassOutcome:
    """One pass over ``admission`` at ``now``:

    1. drop the preemption plans whose victims did not release in time;
    2. with ``preempt``, plan for the waiting jobs that do not fit (``plan_preemptions``);
    3. grant every waiting job that fits (``Admission.schedule``: the quota of each
       preemptor still waiting for its victims is held);
    4. with ``preempt`` and any grant, plan again, sparing this pass's grants.

    ``granted``: jobs the caller admitted since the last pass (``Admission.enqueue``
    admits at once), spared as this pass's own grants are.

    Kueue (``pkg/scheduler/scheduler.go``, v0.17.0) nominates every head of a cycle, with
    its preemption targets, against the snapshot taken when the cycle starts, so a
    target was admitted before the cycle; a preemptor's usage is then charged to the
    cycle and a head after it that "no longer fits" waits for the next one. Step 2 before
    step 3 is sound: a grant only consumes quota, so a job that does not fit before the
    grants does not fit after them."""
    out = PassOutcome(expired=admission.expire_plans(now))
    if preempt:
        out.plans_before_grants = _plan(admission, now, granted, out)
    out.grants = admission.schedule(now)
    if preempt and out.grants and out.plan_error is None:
        spare = {*granted, *(g.job_id for g in out.grants)}
        out.plans_after_grants = _plan(admission, now, spare, out)
    return out


def _plan(
    admission: Admission, now: float, spare: Collection[str], out: PassOutcome
) -> list[PreemptionPlan]:
    try:
        return plan_preemptions(admission, now, spare=spare)
    except Exception as exc:  # a planning error must not take the semaphore down
        out.plan_error = f"preemption planning failed: {exc}"
        return []
