"""The fence rule with intent, pure (``palisade.fence.check``): a shared phase stores holder 0,
a reader never writes, a semaphore's permit binds its scope to its slot."""

from __future__ import annotations

import re

import pytest

from palisade import fence
from palisade.fence import FenceState, check

from .signing import ServiceKey

SERVICE = ServiceKey()


def test_readers_of_a_phase_share_its_token_and_a_writer_after_them_refuses_them() -> None:
    reader_1, reader_2 = SERVICE.grant("rw", 5, 1, "s"), SERVICE.grant("rw", 5, 2, "s")
    phase = check(None, None, reader_1, "read")
    assert phase == FenceState("rw", 5, 0)
    assert check(phase, None, reader_2, "read") == phase
    for accepted in (None, phase):
        with pytest.raises(fence.SharedWrite, match="acquire the lock exclusive") as refused:
            check(accepted, None, reader_1, "write")
        assert refused.value.kind == "shared_write" and refused.value.is_rejection and refused.value.is_final
    with pytest.raises(fence.TokenReissued, match="the readers of a shared phase"):
        check(phase, None, SERVICE.grant("rw", 5, 1), "write")
    writer = check(phase, None, SERVICE.grant("rw", 6, 3), "write")
    assert writer == FenceState("rw", 6, 3)
    with pytest.raises(fence.Stale):
        check(writer, None, reader_2, "read")
    with pytest.raises(fence.TokenReissued):
        check(writer, None, SERVICE.grant("rw", 6, 2, "s"), "read")
    with pytest.raises(fence.Stale, match="set by a shared phase's readers"):
        check(phase, None, SERVICE.grant("rw", 4, 2, "s"), "read")
    assert check(writer, None, SERVICE.grant("rw", 7, 4, "s"), "read") == FenceState("rw", 7, 0)


def test_a_permit_binds_its_scope_to_its_slot() -> None:
    permit = SERVICE.grant("shards", 4, 1, "p2")
    slot = check(None, "shards\x1f2", permit, "write")
    assert slot == FenceState("shards\x1f2", 4, 1)
    others = [SERVICE.grant("shards", 9, 1, "p1"), SERVICE.grant("shards", 9, 1), SERVICE.grant("shards", 9, 1, "s")]
    for other in others:
        with pytest.raises(fence.WrongLock, match=re.escape("'shards (slot 2)'")):
            check(slot, None, other, "read")
    with pytest.raises(fence.WrongLock):
        check(None, "shards", permit, "read")
    with pytest.raises(ValueError, match="an intent is"):
        check(None, None, permit, "append")  # type: ignore[arg-type]
