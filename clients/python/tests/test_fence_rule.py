"""The fence rule with intent, pure (``palisade.fence.check``): a shared phase stores holder 0,
a reader never writes, a semaphore's permit binds its scope to its slot; and every case of the
shared rule vectors (``spec/fence/v1``)."""

from __future__ import annotations

import dataclasses
import json
import pathlib
import re
from typing import Any, Optional

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


# The shared rule vectors (spec/fence/v1), which the Rust crate and the Go fence run too.
RULE_VECTORS = pathlib.Path(__file__).resolve().parents[3] / "spec" / "fence" / "v1"


def _rule_cases() -> list[Any]:
    cases = []
    for path in sorted(RULE_VECTORS.glob("*.json")):
        for case in json.loads(path.read_text())["cases"]:
            cases.append(pytest.param(case, id=f"{path.stem}: {case['description']}"))
    return cases


RULE_CASES = _rule_cases()


def _state(value: Optional[dict[str, Any]]) -> Optional[FenceState]:
    return None if value is None else FenceState(value["lock"], value["token_max"], value["holder_session"])


def test_the_rule_vectors_are_there() -> None:
    assert len(RULE_CASES) >= 40, f"only {len(RULE_CASES)} cases in {RULE_VECTORS}"


@pytest.mark.parametrize("case", RULE_CASES)
def test_a_shared_rule_vector_gives_its_expected_result(case: dict[str, Any]) -> None:
    presented = case["presented"]
    access = {"exclusive": "", "shared": "s", "slot": f"p{presented.get('slot')}"}[presented["access"]]
    sequencer = SERVICE.grant(presented["lock"], presented["token"], presented["session"], access)
    expect = case["expect"]
    try:
        state = check(_state(case["accepted"]), case["expected_binding"], sequencer, case["intent"])
    except fence.FenceError as refusal:
        assert expect == {"result": "refused", "kind": refusal.kind}, refusal
        assert refusal.is_rejection and refusal.is_final
        return
    assert expect == {"result": "accepted", "state": dataclasses.asdict(state)}
