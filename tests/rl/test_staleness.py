"""The staleness rule, including across a restart, under random completion orders (hypothesis)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from asearch.rl.staleness import StalenessManager


def test_capacity_formula_by_hand():
    m = StalenessManager(batch_size=4, max_staleness=1, max_concurrent=6)
    assert m.capacity == 6  # min(6 - 0, (1 + 0 + 1) * 4 - 0) = min(6, 8)
    for _ in range(6):
        assert m.try_admit()
    assert m.capacity == 0 and not m.try_admit()
    for _ in range(4):
        m.finish(accepted=True)
    assert m.capacity == 2  # min(6 - 2, 8 - (4 + 2))
    m.finish(accepted=False)  # a rejected group frees capacity
    assert m.capacity == 3  # min(6 - 1, 8 - (4 + 1))
    m.set_version(1)
    assert m.capacity == 5  # min(6 - 1, 12 - 5)


def test_eta_zero_is_synchronous():
    m = StalenessManager(batch_size=3, max_staleness=0, max_concurrent=100)
    assert sum(m.try_admit() for _ in range(10)) == 3  # one batch, then generation waits for training
    for _ in range(3):
        m.finish(True)
    assert not m.try_admit()
    m.set_version(1)
    assert m.try_admit()


def test_restore_uses_consumed_batches_not_zero():
    m = StalenessManager(batch_size=4, max_staleness=2, max_concurrent=64, version=5, accepted=23, rejected=3)
    r = StalenessManager.from_state_dict(m.state_dict(), unconsumed=2)
    assert r.accepted == 5 * 4 + 2 and r.running == 0 and r.version == 5
    assert r.capacity == min(64, (2 + 5 + 1) * 4 - 22)


@settings(max_examples=200, deadline=None)
@given(batch=st.integers(1, 4), eta=st.integers(0, 3), conc=st.integers(1, 12), data=st.data())
def test_manager_invariants_under_random_events(batch, eta, conc, data):
    """Whatever the order of admissions, completions and version bumps (and restarts), kept + running
    groups never exceed (eta + v + 1) * B and running never exceeds max_concurrent."""
    m = StalenessManager(batch_size=batch, max_staleness=eta, max_concurrent=conc)
    consumed = 0
    for _ in range(60):
        event = data.draw(st.sampled_from(["admit", "finish", "train", "restart"]))
        if event == "admit":
            m.try_admit()
        elif event == "finish" and m.running:
            m.finish(data.draw(st.booleans()))
        elif event == "train" and m.accepted - consumed >= batch:
            consumed += batch
            m.set_version(m.version + 1)
        elif event == "restart":
            m = StalenessManager.from_state_dict(m.state_dict(), unconsumed=m.accepted - consumed)
            consumed = m.version * batch
        assert m.accepted + m.running <= (eta + m.version + 1) * batch
        assert 0 <= m.running <= conc
