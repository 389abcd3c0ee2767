"""Properties of the guard's decisions over arbitrary temperature traces (hypothesis).

The pause mechanism is covered with real processes elsewhere; here a recording pauser
stands in so thousands of traces run in seconds, and the decisions are checked against
the rules: shed on the first poll at/above the threshold, resume only after a full
hold-off of cool polls, nothing else."""

from __future__ import annotations

from pathlib import Path

import pytest
from almaboard.paths import Paths
from almaguard.config import GuardConfig
from almaguard.guard import Guard
from almaguard.pause import PauseResult
from hypothesis import given, settings
from hypothesis import strategies as st
from support_guard import FakeBoard

SHED, RESUME, HOLDOFF = 89.0, 79.0, 5.0


class RecordingPauser:
    def __init__(self) -> None:
        self.method: str | None = None
        self.record_error = ""
        self.thaw_error = ""
        self.recorded_zones: dict[str, str] = {}
        self.calls: list[str] = []

    @property
    def paused(self) -> bool:
        return self.method is not None

    def pause(self) -> PauseResult:
        self.calls.append("pause")
        self.method = "freeze"
        return PauseResult("freeze", "recorded")

    def resume(self) -> PauseResult:
        self.calls.append("resume")
        self.method = None
        return PauseResult("freeze", "recorded")

    def retry_record(self) -> None:
        pass

    def remember_zones(self, zones: dict[str, str]) -> None:
        self.recorded_zones = dict(zones)

    def refresh(self) -> None:
        return None


# Readings anywhere, with the edges of both thresholds (and long cool or hot runs) likely.
reading = st.one_of(
    st.floats(min_value=60.0, max_value=100.0, allow_nan=False).map(lambda t: round(t, 1)),
    st.sampled_from([70.0, 78.9, 79.0, 79.1, 84.0, 88.9, 89.0, 89.1, 95.0]),
)
temps = st.lists(st.lists(reading, min_size=1, max_size=1).map(lambda r: r * 4) | st.lists(reading, max_size=3),
                 min_size=5, max_size=30).map(lambda runs: [t for run in runs for t in run])  # fmt: skip


@settings(max_examples=100, deadline=None)
@given(trace=temps)
def test_decisions_follow_the_rules(tmp_path_factory: pytest.TempPathFactory, trace: list[float]) -> None:
    root = Path(tmp_path_factory.mktemp("b"))
    board = FakeBoard(root)
    board.add_zone("tj-thermal", 50.0)
    pauser = RecordingPauser()
    guard = Guard(
        GuardConfig(holdoff_s=HOLDOFF, state_every_s=1e9),
        Paths(root),
        pauser=pauser,  # type: ignore[arg-type]
        wall=lambda: 1.78e9,
    )
    shedding = False
    last_shed: int | None = None
    for i, temp in enumerate(trace):
        board.set_temp("tj-thermal", temp)
        action = guard.step(float(i))
        if not shedding:
            # shed exactly on the first poll at or above the threshold, never otherwise
            assert action == ("shed" if temp >= SHED else None)
        elif action == "resume":
            window = trace[i - int(HOLDOFF) : i + 1]
            assert len(window) == HOLDOFF + 1 and all(t < RESUME for t in window)
            assert last_shed is not None and i - last_shed >= HOLDOFF
        else:
            assert action is None
            if i >= HOLDOFF and last_shed is not None and i - last_shed > HOLDOFF:
                # still shedding: some poll of the last hold-off window was not cool
                assert any(t >= RESUME for t in trace[i - int(HOLDOFF) : i + 1])
        if action == "shed":
            shedding, last_shed = True, i
        elif action == "resume":
            shedding = False
        assert guard.status.shedding == shedding == pauser.paused
    # pause and resume strictly alternate: never a double pause or a resume of nothing
    assert all(a != b for a, b in zip(pauser.calls, pauser.calls[1:], strict=False))
