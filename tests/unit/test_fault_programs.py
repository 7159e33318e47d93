"""The object faults and swap share (probes/faults.py FaultPrograms): unloaded once, by the
last member to leave, although the members leave on threads of their own."""

from __future__ import annotations

import contextlib
import threading
import time
from types import SimpleNamespace
from typing import Any

from gpujitter.probes.faults import FaultPrograms


class _MeetAfterPop(dict[str, Any]):
    """Members whose pop waits (up to 0.5 s) until the other member has popped too: the
    interleaving in which each leaver finds the set empty."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.meet = threading.Barrier(2)

    def pop(self, *args: Any) -> Any:
        out = super().pop(*args)
        # Broken when the other leaver waits for this one's lock: it pops afterwards.
        with contextlib.suppress(threading.BrokenBarrierError):
            self.meet.wait(timeout=0.5)
        return out


def test_the_last_member_unloads_the_object_once_when_both_leave_at_once() -> None:
    programs = FaultPrograms()
    cleanups: list[int] = []
    errors: list[BaseException] = []

    def cleanup() -> None:
        cleanups.append(1)
        time.sleep(0.1)  # bcc's cleanup detaches for a while before the object is let go

    def leave(member: Any) -> None:
        try:
            programs.leave(member)
        except Exception as err:  # the test reports it below
            errors.append(err)

    programs.bpf = SimpleNamespace(cleanup=cleanup)
    programs._set_modes = lambda: None  # type: ignore[method-assign]  # no kernel here
    members = {name: SimpleNamespace(name=name) for name in ("faults", "swap")}
    programs.members = _MeetAfterPop(members)
    leavers = [threading.Thread(target=leave, args=(m,)) for m in members.values()]
    for t in leavers:
        t.start()
    for t in leavers:
        t.join()
    assert not errors and cleanups == [1]
    assert programs.bpf is None and not programs.members
