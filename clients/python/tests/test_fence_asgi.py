"""The ASGI fence middleware under a real server (uvicorn) on loopback, driven by a real HTTP
client (http.client): every case of ``crates/fence/tests/http_fence_cases.json``, which the Rust
tower layer runs too, so both answer each request with the same status and body."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from typing import Any, Iterator, Optional

import pytest

from palisade import fence
from palisade.fence.asgi import (
    SEQUENCER_HEADER,
    FenceBackend,
    FenceMiddleware,
    MemoryFence,
    PostgresFence,
    Receive,
    Scope,
    Send,
)
from palisade.fence.stats import UNVERIFIED

from .conftest import REPO
from .signing import ServiceKey

uvicorn = pytest.importorskip("uvicorn")

CASES: list[dict[str, Any]] = json.loads((REPO / "crates/fence/tests/http_fence_cases.json").read_text())["cases"]


async def served(scope: Scope, receive: Receive, send: Send) -> None:
    """The protected application: answers ``{"served": path}``."""
    body = json.dumps({"served": scope["path"]}).encode()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": body})


class Uvicorn:
    """``app`` served by uvicorn on a loopback port, in a thread of this process."""

    def __init__(self, app: Any) -> None:
        self.socket = socket.socket()
        self.socket.bind(("127.0.0.1", 0))
        self.port: int = self.socket.getsockname()[1]
        config = uvicorn.Config(app, log_level="warning", lifespan="off")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.socket]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.01)

    def post(self, path: str, values: list[str]) -> tuple[int, Any]:
        return self.request("POST", path, values)

    def request(self, method: str, path: str, values: list[str]) -> tuple[int, Any]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=20)
        try:
            conn.putrequest(method, path)
            for value in values:
                conn.putheader("Palisade-Sequencer", value)
            conn.putheader("Content-Length", "0")
            conn.endheaders()
            response = conn.getresponse()
            return response.status, json.loads(response.read())
        finally:
            conn.close()

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=20)
        self.socket.close()


def serve(app: Any) -> Iterator[Uvicorn]:
    server = Uvicorn(app)
    try:
        yield server
    finally:
        server.stop()


class Keys:
    def __init__(self) -> None:
        self.service = ServiceKey()
        self.attacker = ServiceKey()
        self.verifier = fence.Verifier(self.service.public)

    def values(self, present: Optional[dict[str, Any]]) -> list[str]:
        """The Palisade-Sequencer header values a case's ``present`` stands for."""
        if present is None:
            return []
        if "forged" in present:
            return [str(grant(self.attacker, present["forged"]))]
        if "text" in present:
            return [present["text"]]
        if "twice" in present:
            text = str(grant(self.service, present["twice"]))
            return [text, text]
        return [str(grant(self.service, present))]


def grant(key: ServiceKey, fields: dict[str, Any]) -> Any:
    return key.grant(fields["lock"], fields["token"], fields["session"])


def lock_and_path(request: Scope, sequencer: Any) -> str:
    return f"{sequencer.lock}:{request['path']}"


def run_case(case: dict[str, Any]) -> FenceMiddleware:
    keys = Keys()
    scope = lock_and_path if case["scope"] == "lock_and_path" else None
    app = FenceMiddleware(served, keys.verifier, MemoryFence(), scope=scope)
    for server in serve(app):
        for index, step in enumerate(case["steps"]):
            status, body = server.post(step["path"], keys.values(step["present"]))
            context = f"case {case['name']!r}, step {index}: {status} {body}"
            assert status == step["status"], context
            for field, expected in step["body"].items():
                assert body.get(field) == expected, f"field {field}: {context}"
            if status != 200:
                detail = "detail" in body
                assert len(body) == len(step["body"]) + 1 + detail, context
            for piece in step.get("message_contains", []):
                assert piece in body["message"], context
    return app


@pytest.mark.parametrize("case", CASES, ids=[case["name"] for case in CASES])
def test_shared_case_under_uvicorn(case: dict[str, Any]) -> None:
    run_case(case)


def test_the_middleware_counts_what_it_accepted_and_refused_per_lock() -> None:
    app = run_case(CASES[0])
    jobs = app.stats.get("jobs")
    assert jobs is not None
    assert (jobs.accepted, jobs.refused) == (3, 1)
    assert isinstance(jobs.last_refusal, fence.Stale)
    assert (jobs.last_refusal.presented, jobs.last_refusal.accepted) == (5, 7)
    forged = next(case for case in CASES if case["name"].startswith("a forged"))
    unverified = run_case(forged).stats.get(UNVERIFIED)
    assert unverified is not None and (unverified.accepted, unverified.refused) == (0, 1)


def test_replicas_sharing_a_postgres_fence_refuse_a_holder_superseded_elsewhere(postgres_dsn: str, unique: str) -> None:
    psycopg = pytest.importorskip("psycopg")
    keys = Keys()
    backends: list[FenceBackend] = [PostgresFence(psycopg.connect(postgres_dsn)) for _ in range(2)]
    replicas = [Uvicorn(FenceMiddleware(served, keys.verifier, backend)) for backend in backends]
    try:
        older = str(keys.service.grant(unique, 10, 1))
        newer = str(keys.service.grant(unique, 11, 2))
        assert replicas[0].post("/charge", [older])[0] == 200
        assert replicas[1].post("/charge", [newer])[0] == 200
        status, body = replicas[0].post("/charge", [older])
        assert status == 409, body
        assert (body["kind"], body["lock"], body["presented"], body["accepted"]) == ("stale", unique, 10, 11)
    finally:
        for replica in replicas:
            replica.stop()



def test_readers_get_never_post_and_each_slot_is_a_scope_of_its_own() -> None:
    keys = Keys()
    backend = MemoryFence()
    for server in serve(FenceMiddleware(served, keys.verifier, backend)):
        reader_1, reader_2 = keys.service.grant("rw", 5, 1, "s"), keys.service.grant("rw", 5, 2, "s")
        assert server.request("GET", "/doc", [str(reader_1)]) == (200, {"served": "/doc"})
        assert server.request("GET", "/doc", [str(reader_2)])[0] == 200
        status, body = server.post("/doc", [str(reader_1)])
        assert (status, body["kind"], body["lock"], body["token"]) == (403, "shared_write", "rw", 5), body
        assert "acquire the lock exclusive" in body["message"]
        assert server.post("/doc", [str(keys.service.grant("rw", 6, 3))])[0] == 200
        status, body = server.request("GET", "/doc", [str(reader_2)])
        assert (status, body["kind"], body["holder_session"]) == (409, "stale", 3), body
        assert server.post("/shard", [str(keys.service.grant("shards", 9, 1, "p0"))])[0] == 200
        assert server.post("/shard", [str(keys.service.grant("shards", 2, 2, "p1"))])[0] == 200
        status, body = server.post("/shard", [str(keys.service.grant("shards", 8, 3, "p0"))])
        assert (status, body["kind"], body["lock"]) == (409, "stale", "shards (slot 0)"), body
    assert backend.fence_state("rw") == fence.FenceState("rw", 6, 3)
    assert backend.fence_state("shards\x1f1") == fence.FenceState("shards\x1f1", 2, 2)
