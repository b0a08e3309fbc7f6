"""The shared sequencer vectors (``spec/sequencer/v1`` and ``v2``): every case of every file,
verified as a resource verifies, with the result the file expects; v2's valid cases also read back
the access and the fence binding. The Rust crate and the Go client run the same files."""

from __future__ import annotations

import json
import pathlib
from typing import Any

import pytest

from palisade.sequencer import Access, Forged, KeySet, Malformed, verify

VECTORS = pathlib.Path(__file__).resolve().parents[3] / "spec" / "sequencer"


def _cases(version: str) -> list[Any]:
    cases = []
    for path in sorted((VECTORS / version).glob("*.json")):
        for case in json.loads(path.read_text())["cases"]:
            cases.append(pytest.param(version, case, id=f"{version}/{path.stem}: {case['description']}"))
    return cases


CASES_V1, CASES_V2 = _cases("v1"), _cases("v2")


def test_the_vectors_are_there() -> None:
    assert len(CASES_V1) >= 20, f"only {len(CASES_V1)} cases in {VECTORS / 'v1'}"
    assert len(CASES_V2) >= 40, f"only {len(CASES_V2)} cases in {VECTORS / 'v2'}"


@pytest.mark.parametrize(("version", "case"), CASES_V1 + CASES_V2)
def test_a_shared_vector_gives_its_expected_result(version: str, case: dict[str, Any]) -> None:
    expect = case["expect"]
    try:
        verified = verify(case["sequencer"], KeySet.parse(case["keys"]))
    except Malformed:
        assert expect["result"] == "malformed"
        return
    except Forged:
        assert expect["result"] == "forged"
        return
    assert expect["result"] == "valid"
    assert (verified.lock, verified.token, verified.session, verified.key_id) == (
        expect["lock"],
        expect["token"],
        expect.get("session", 0),
        expect["key_id"],
    )
    if version == "v1":
        assert verified.access == Access("exclusive")
    else:
        assert (verified.access.kind, verified.access.slot, verified.binding) == (
            expect["access"],
            expect["slot"],
            expect["binding"],
        )
