"""Eject after K hard failures, readmit after M successes, soft trouble only degrades."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as hs

from runtime.health.state import Health, Outcome, Reason, State, Transition, initial, is_ejection, step
from runtime.model_view import in_panic

OK = Outcome()
FAIL = Outcome(hard=Reason.TIMEOUT, detail="slow")
SOFT = Outcome(soft=Reason.METRICS_MALFORMED)


def run(outcomes, *, k=3, m=2, start: Health | None = None):
    h = start or initial(0)
    transitions: list[Transition] = []
    for i, o in enumerate(outcomes, start=1):
        h, t = step(h, o, float(i), eject_after=k, readmit_after=m)
        if t:
            transitions.append(t)
    return h, transitions


def test_new_replica_admitted_on_first_success_without_readmission_event():
    h, ts = run([OK])
    assert h.state is State.HEALTHY
    assert len(ts) == 1 and ts[0].first_admission


def test_new_replica_failing_stays_out_with_its_reason():
    h, ts = run([FAIL])
    assert h.state is State.EJECTED and h.reason is Reason.TIMEOUT and not ts


def test_eject_after_k_consecutive_failures_degraded_before():
    h, _ = run([OK, FAIL, FAIL])
    assert h.state is State.DEGRADED and h.reason is Reason.TIMEOUT
    h, ts = run([OK, FAIL, FAIL, FAIL])
    assert h.state is State.EJECTED and is_ejection(ts[-1])


def test_success_resets_the_failure_count():
    h, _ = run([OK, FAIL, FAIL, OK, FAIL, FAIL])
    assert h.state is State.DEGRADED


def test_readmit_only_after_m_consecutive_successes():
    ejected, _ = run([OK, FAIL, FAIL, FAIL])
    h, ts = run([OK], start=ejected)
    assert h.state is State.EJECTED and not ts
    h, ts = run([OK, OK], start=ejected)
    assert h.state is State.HEALTHY and ts[-1].before is State.EJECTED and not ts[-1].first_admission
    h, _ = run([OK, FAIL, OK], start=ejected)
    assert h.state is State.EJECTED


def test_soft_trouble_degrades_but_never_ejects():
    h, _ = run([OK, *([SOFT] * 20)])
    assert h.state is State.DEGRADED and h.reason is Reason.METRICS_MALFORMED
    h, _ = run([SOFT, OK])
    assert h.state is State.HEALTHY


def test_ejection_episode_start_is_kept_while_still_failing():
    h, _ = run([OK, FAIL, FAIL, FAIL, FAIL, FAIL])
    assert h.ejected_since_s == 4.0


@given(hs.lists(hs.booleans(), max_size=60), hs.integers(1, 5), hs.integers(1, 5))
def test_no_flapping(pattern, k, m):
    """Every ejection follows k failures in a row; every readmission follows m successes in a row."""
    h = initial(0)
    history: list[bool] = []
    for i, ok in enumerate(pattern, start=1):
        h, t = step(h, OK if ok else FAIL, float(i), eject_after=k, readmit_after=m)
        history.append(ok)
        if t and t.after is State.EJECTED:
            assert len(history) >= k and not any(history[-k:])
        if t and t.before is State.EJECTED and not t.first_admission:
            assert len(history) >= m and all(history[-m:])


@pytest.mark.parametrize(
    ("replicas", "ejected", "max_percent", "panic"),
    [
        (2, 1, 50, False),  # half out: ejections apply
        (3, 2, 50, True),  # most out: believe none of them
        (1, 1, 50, True),  # a lone replica is never taken out by the monitor alone
        (0, 0, 50, False),
        (4, 4, 100, False),  # 100: never panic
        (4, 1, 0, True),  # 0: never eject
    ],
)
def test_panic_past_the_threshold_of_ejected_replicas(
    replicas: int, ejected: int, max_percent: float, panic: bool
) -> None:
    assert in_panic(replicas, ejected, max_percent) is panic
