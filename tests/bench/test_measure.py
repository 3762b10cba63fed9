"""bench/measure.py's settled_times, with time_in_turns scripted (no GPU)."""
import pytest

from bench import measure


@pytest.mark.parametrize("runs,want", [
    # slow first runs, then two that agree: the last of those
    ([{"a": 2.0, "b": 1.0}, {"a": 1.3, "b": 1.0}, {"a": 1.0, "b": 1.0}, {"a": 1.01, "b": 0.99}],
     {"a": 1.01, "b": 0.99}),
    # agree at once: the second run
    ([{"a": 1.0}, {"a": 1.02}], {"a": 1.02}),
    # never agree: the last of SETTLE_ATTEMPTS runs
    ([{"a": 1.0}, {"a": 2.0}, {"a": 1.0}, {"a": 2.0}, {"a": 1.0}], {"a": 2.0}),
])
def test_settled_times_repeats_turns_until_two_runs_agree(monkeypatch, runs, want):
    calls = iter(runs)
    monkeypatch.setattr(measure, "time_in_turns", lambda fns, turns: next(calls))
    assert measure.settled_times({name: None for name in want}, turns=5) == want
    assert measure.SETTLE_ATTEMPTS == 4  # the third case's run count
