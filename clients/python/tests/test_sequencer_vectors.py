"""The shared sequencer vectors (``spec/sequencer/v1``): every case of every file, verified as a
resource verifies, with the result the file expects. The Rust crate and the Go client run the
same files."""

from __future__ import annotations

import json
import pathlib
from typing import Any

import pytest

from palisade.sequencer import Forged, KeySet, Malformed, verify

VECTORS = pathlib.Path(__file__).resolve().parents[3] / "spec" / "sequencer" / "v1"


def _cases() -> list[Any]:
    cases = []
    for path in sorted(VECTORS.glob("*.json")):
        for case in json.loads(path.read_text())["cases"]:
            cases.append(pytest.param(case, id=f"{path.stem}: {case['description']}"))
    return cases


CASES = _cases()


def test_the_vectors_are_there() -> None:
    assert len(CASES) >= 20, f"only {len(CASES)} cases in {VECTORS}"


@pytest.mark.parametrize("case", CASES)
def test_a_shared_vector_gives_its_expected_result(case: dict[str, Any]) -> None:
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
