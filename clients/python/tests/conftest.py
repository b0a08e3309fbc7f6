"""The test harness: a real `palisade serve` process and the real databases.

- The server binary is ``$PALISADE_BIN``, else ``$CARGO_TARGET_DIR/debug/palisade`` (or the
  repository's ``target/debug/palisade``), built with ``cargo build -p palisade-cli`` when missing.
- PostgreSQL is ``$PALISADE_TEST_POSTGRES`` (a libpq connection string), Redis
  ``$PALISADE_TEST_REDIS`` and NATS with JetStream ``$PALISADE_TEST_NATS`` (URLs); a test that
  needs one and finds its variable unset is skipped with a line saying so (pytest's ``-rs``, on
  by default here).
"""

from __future__ import annotations

import logging
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time
import uuid
from typing import Iterator, Optional

import pytest

import palisade

PYTHON_CLIENT = pathlib.Path(__file__).resolve().parent.parent
REPO = PYTHON_CLIENT.parent.parent
# A failed test shows the client's debug log (pyproject's log_level); grpc's own debug lines
# (one per call) would bury it.
logging.getLogger("grpc").setLevel(logging.INFO)

# The server's limit on keepalive streams (and watches, and waiting acquires) per connection:
# palisade-server's LONG_LIVED_CALLS_PER_CONNECTION_MAX.
KEEPALIVE_STREAMS_PER_CONNECTION_MAX = 1000

# How long a server gets to start answering.
SERVER_START_TIMEOUT_S = 20.0

# A bearer token in the environment would be sent by every client the tests make (and refused by
# servers without a token file): the tests that want one set it themselves.
os.environ.pop(palisade.AUTH_TOKEN_ENV, None)


def target_dir() -> pathlib.Path:
    return pathlib.Path(os.environ.get("CARGO_TARGET_DIR") or REPO / "target")


def cargo_binary(name: str, build_args: list[str], env_var: Optional[str] = None) -> pathlib.Path:
    """A binary of the workspace, built with ``cargo build build_args`` if it is missing."""
    if env_var and os.environ.get(env_var):
        path = pathlib.Path(os.environ[env_var])
        if not path.is_file():
            pytest.fail(f"{env_var}={path} does not exist")
        return path
    path = target_dir() / "debug" / name
    if not path.is_file():
        print(f"building {path} (cargo build {' '.join(build_args)})", file=sys.stderr)
        result = subprocess.run(["cargo", "build", *build_args], cwd=REPO)
        if result.returncode != 0 or not path.is_file():
            pytest.fail(f"cargo build {' '.join(build_args)} failed; cannot find {path}")
    return path


@pytest.fixture(scope="session")
def palisade_bin() -> pathlib.Path:
    return cargo_binary("palisade", ["-p", "palisade-cli"], "PALISADE_BIN")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Server:
    """One `palisade serve` process on a free loopback port, with its own data directory."""

    def __init__(
        self,
        binary: pathlib.Path,
        data_dir: pathlib.Path,
        *extra: str,
        port: Optional[int] = None,
        ready: bool = True,
        token: Optional[str] = None,
        tls: Optional[palisade.Tls] = None,
    ) -> None:
        """``token``: the bearer token to ask whether it is ready with (a server with a policy
        answers no one without); ``tls``: the client TLS settings to ask with (a TLS server)."""
        self.binary = binary
        self._token = token
        self._tls = tls
        self.data_dir = data_dir
        self.port = port or free_port()
        self.endpoint = f"127.0.0.1:{self.port}"
        self.log_path = data_dir.parent / f"serve-{self.port}.log"
        self._log = open(self.log_path, "wb")
        self.process = subprocess.Popen(
            [str(binary), "serve", "--data-dir", str(data_dir), "--listen", self.endpoint, *extra],
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        if ready:
            self._wait_ready()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + SERVER_START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"palisade serve exited with {self.process.returncode}:\n{self.log()}")
            try:
                with palisade.Client([self.endpoint], token=self._token, tls=self._tls, connect_timeout=0.5) as client:
                    client.public_keys()
                    return
            except palisade.PalisadeError:
                time.sleep(0.05)
        raise RuntimeError(f"palisade serve did not answer within {SERVER_START_TIMEOUT_S} s:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def kill(self) -> None:
        """``kill -9``."""
        self.process.kill()
        self.process.wait()

    def pause(self) -> None:
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.process.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.resume()
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()


def start_cluster(binary: pathlib.Path, directory: pathlib.Path, *extra: str) -> list[Server]:
    """Three `palisade serve` members of a new cluster on free loopback ports, each with
    ``extra`` flags; not waited for (see :func:`wait_for_leader`)."""
    ports = [free_port() for _ in range(3)]
    members = ",".join(f"{i + 1}=127.0.0.1:{port}" for i, port in enumerate(ports))
    return [
        Server(
            binary,
            directory / f"node{i + 1}",
            *extra,
            "--node-id",
            str(i + 1),
            "--initial-cluster",
            members,
            port=port,
            ready=False,
        )
        for i, port in enumerate(ports)
    ]


def wait_for_leader(endpoints: list[str], tls: Optional[palisade.Tls] = None) -> str:
    """The endpoint of the leader the cluster at ``endpoints`` elects (within 30 s)."""
    deadline = time.monotonic() + 30
    while True:
        try:
            with palisade.Client(endpoints, tls=tls, connect_timeout=1) as probe:
                probe.public_keys()
                return probe.endpoint
        except palisade.PalisadeError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


@pytest.fixture(scope="session")
def server(palisade_bin: pathlib.Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A server shared by the tests that do not stop or pause it."""
    srv = Server(palisade_bin, tmp_path_factory.mktemp("shared") / "data")
    yield srv
    srv.stop()


@pytest.fixture
def own_server(palisade_bin: pathlib.Path, tmp_path: pathlib.Path) -> Iterator[Server]:
    """A server of the test's own, which it may pause or stop."""
    srv = Server(palisade_bin, tmp_path / "data")
    yield srv
    srv.stop()


@pytest.fixture
def client(server: Server) -> Iterator[palisade.Client]:
    with palisade.Client([server.endpoint]) as c:
        yield c


@pytest.fixture
def unique(request: pytest.FixtureRequest) -> str:
    """A lock or scope name no other test (or earlier run) uses."""
    return f"test/{request.node.name}/{os.getpid()}-{time.time_ns()}"


def _require(variable: str, what: str) -> str:
    value = os.environ.get(variable)
    if not value:
        pytest.skip(f"skipping: {variable} is not set, so the {what} tests cannot run (.ci/run sets it)")
    return value


@pytest.fixture
def postgres_dsn() -> str:
    return _require("PALISADE_TEST_POSTGRES", "PostgreSQL")


@pytest.fixture
def redis_url() -> str:
    return _require("PALISADE_TEST_REDIS", "Redis")


@pytest.fixture
def nats_url() -> str:
    return _require("PALISADE_TEST_NATS", "NATS JetStream")


@pytest.fixture
def s3_endpoint() -> str:
    """``endpoint bucket access-key secret-key`` of an S3-compatible server (versitygw)."""
    return _require("PALISADE_TEST_S3", "S3")


@pytest.fixture
def schema_dsn(postgres_dsn: str) -> Iterator[str]:
    """A connection string whose search_path is a fresh schema, dropped afterwards: the fence
    table and the reports table of one test, shared by every process the test starts."""
    psycopg = pytest.importorskip("psycopg")
    schema = f"pytest_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres_dsn, autocommit=True) as admin:
        admin.execute(f"CREATE SCHEMA {schema}")
    try:
        yield f"{postgres_dsn} options='-c search_path={schema}'"
    finally:
        with psycopg.connect(postgres_dsn, autocommit=True) as admin:
            admin.execute(f"DROP SCHEMA {schema} CASCADE")
