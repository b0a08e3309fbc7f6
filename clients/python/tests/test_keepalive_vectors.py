"""Runs every shared keepalive vector (``spec/keepalive/v2``, format in its README) against the
engine the blocking and asyncio sessions drive (:mod:`palisade._keepalive`). No server: the
engine does no I/O."""

from __future__ import annotations

import json
import pathlib
from typing import Any, Optional

import pytest

from palisade import _keepalive as ka

VECTORS = pathlib.Path(__file__).resolve().parents[3] / "spec" / "keepalive" / "v2"


def _fields(obj: dict[str, Any], required: set[str], optional: set[str], where: str) -> None:
    keys = {k for k in obj if not k.startswith("_")}
    missing = required - keys
    unknown = keys - required - optional
    assert not missing and not unknown, f"{where}: missing {sorted(missing)}, unknown {sorted(unknown)}"


def _event(raw: dict[str, Any], where: str) -> ka.Event:
    kind = raw.get("type")
    if kind == "start":
        _fields(raw, {"type"}, set(), where)
        return ka.Start()
    if kind == "tick":
        _fields(raw, {"type"}, set(), where)
        return ka.Tick()
    if kind == "stream_opened":
        _fields(raw, {"type"}, set(), where)
        return ka.StreamOpened()
    if kind == "ack":
        _fields(raw, {"type", "ttl_remaining_ms"}, set(), where)
        return ka.Ack(int(raw["ttl_remaining_ms"]))
    if kind == "stream_broken":
        _fields(raw, {"type"}, {"leader_named"}, where)
        return ka.StreamBroken(bool(raw.get("leader_named", False)))
    if kind == "stream_refused":
        _fields(raw, {"type"}, set(), where)
        return ka.StreamRefused()
    if kind == "session_gone":
        _fields(raw, {"type"}, set(), where)
        return ka.SessionGone()
    if kind == "renew_answered":
        _fields(raw, {"type", "ttl_remaining_ms"}, set(), where)
        return ka.RenewAnswered(int(raw["ttl_remaining_ms"]))
    if kind == "renew_failed":
        _fields(raw, {"type"}, set(), where)
        return ka.RenewFailed()
    raise AssertionError(f"{where}: unknown event type {kind!r}")


def _action_json(action: ka.Action) -> dict[str, Any]:
    if isinstance(action, ka.OpenStream):
        return {"type": "open_stream"}
    if isinstance(action, ka.SendPing):
        return {"type": "send_ping"}
    if isinstance(action, ka.CloseStream):
        return {"type": "close_stream", "reason": action.reason}
    if isinstance(action, ka.Renew):
        return {"type": "renew", "until": action.until}
    if isinstance(action, ka.CancelRenew):
        return {"type": "cancel_renew"}
    if isinstance(action, ka.Pause):
        return {"type": "pause", "until": action.until}
    if isinstance(action, ka.Lost):
        return {"type": "lost", "reason": action.reason}
    return {"type": "stop"}


def _engine(config: dict[str, Any], where: str) -> ka.Keepalive:
    _fields(config, {"ttl_ms", "opened_at_ms"}, {"interval_ms", "jitter_seed"}, where)
    return ka.Keepalive(
        config["ttl_ms"], config.get("interval_ms"), config["opened_at_ms"], config.get("jitter_seed")
    )


def run_vector(path: pathlib.Path, engine_class: Optional[type[ka.Keepalive]] = None) -> None:
    """Feeds every step of the vector at ``path``; fails at the first step that differs."""
    case = json.loads(path.read_text())
    _fields(case, {"description", "config", "steps"}, set(), path.name)
    engine = _engine(case["config"], f"{path.name} config")
    if engine_class is not None:
        engine.__class__ = engine_class
    last = None
    for index, step in enumerate(case["steps"]):
        where = f"{path.name} step {index} (at {step.get('at')})"
        _fields(step, {"at", "event", "actions"}, {"wake", "lease_deadline"}, where)
        assert last is None or step["at"] >= last, f"{where}: time goes back"
        last = step["at"]
        actions = [_action_json(a) for a in engine.on(_event(step["event"], where), step["at"])]
        assert actions == step["actions"], f"{where}: actions"
        if "wake" in step:
            assert engine.wake == step["wake"], f"{where}: wake"
        if "lease_deadline" in step:
            assert engine.lease_deadline == step["lease_deadline"], f"{where}: lease_deadline"


def test_there_are_vectors() -> None:
    assert len(list(VECTORS.glob("*.json"))) >= 20


@pytest.mark.parametrize("path", sorted(VECTORS.glob("*.json")), ids=lambda p: p.stem)
def test_vector(path: pathlib.Path) -> None:
    run_vector(path)


class _BeforeF655baa(ka.Keepalive):
    """The rule of the Python clients before commit f655baa, ported: a ``Renew`` for a refused
    stream took the client's own timeout and retries (no ``until``), and nothing watched the
    lease while it was in flight."""

    @property
    def wake(self) -> Optional[int]:
        if self._state == ka._RENEWING:
            return None
        return super().wake

    def on(self, event: ka.Event, now: int) -> list[ka.Action]:
        if self._state == ka._RENEWING and isinstance(event, ka.Tick):
            return []
        actions = super().on(event, now)
        return [ka.Renew(None) if isinstance(a, ka.Renew) else a for a in actions]


def test_the_renew_budget_vector_fails_against_the_rule_before_f655baa() -> None:
    with pytest.raises(AssertionError, match="step 5"):
        run_vector(VECTORS / "008-renew-bounded-by-lease.json", _BeforeF655baa)
