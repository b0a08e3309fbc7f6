"""Operators' files checked against a real server: the Grafana dashboard's metrics exist."""

from __future__ import annotations

import json
import pathlib
import re
import subprocess
import time
import urllib.request

import palisade

from .conftest import Server, free_port

REPO = pathlib.Path(__file__).resolve().parents[3]
DASHBOARD = REPO / "docs" / "grafana" / "palisade.json"


def dashboard_metrics() -> set[str]:
    text = json.dumps(json.loads(DASHBOARD.read_text()))
    exprs = re.findall(r'"expr": "((?:[^"\\]|\\.)*)"', text)
    assert exprs, "the dashboard has no queries"
    return {name for expr in exprs for name in re.findall(r"\b(palisade_[a-z_]+)\b", expr)}


def test_every_metric_the_dashboard_queries_is_exported_by_a_real_server(
    palisade_bin: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    metrics_port = free_port()
    server = Server(palisade_bin, tmp_path / "data", "--metrics-listen", f"127.0.0.1:{metrics_port}")
    try:
        with palisade.Client([server.endpoint]) as client:
            with client.lock("ops/a", ttl=5) as grant:
                # A waiting acquire, and a session that expires with its lock.
                with client.session(5) as waiter:
                    try:
                        waiter.acquire("ops/a", wait=0.2)
                    except palisade.WaitEnded:
                        pass
            expiring, _ = client.open_session_without_keepalive(1)
            client.acquire(expiring, "ops/b", wait=0)
            assert grant.token > 0
            deadline = time.monotonic() + 10
            while True:
                exported = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read().decode()
                series = {line.split("{")[0].split(" ")[0] for line in exported.splitlines() if line and not line.startswith("#")}
                if "palisade_session_expiries_total" in series or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
    finally:
        server.stop()
    queried = dashboard_metrics()
    missing = sorted(queried - series)
    assert not missing, f"the dashboard queries {missing}, which the server does not export: {sorted(series)}"
    # And the dashboard shows every metric the server defines.
    defined = set(re.findall(r'"(palisade_[a-z_]+)"', (REPO / "crates/server/src/metrics.rs").read_text()))
    shown = {re.sub(r"_(bucket|sum|count)$", "", name) for name in queried}
    assert defined <= shown, f"metrics without a panel: {sorted(defined - shown)}"


SYSTEMD = REPO / "packaging" / "systemd"


def unit_exec_start(unit: str) -> list[str]:
    import shlex

    lines = [line for line in (SYSTEMD / unit).read_text().splitlines() if line.startswith("ExecStart=")]
    assert len(lines) == 1, lines
    return shlex.split(lines[0][len("ExecStart=") :])


def env_file(name: str) -> dict[str, str]:
    values = {}
    for line in (SYSTEMD / name).read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            values[key] = value
    return values


def start_as_unit(
    binary: pathlib.Path, unit: str, env_name: str, overrides: dict[str, str]
) -> subprocess.Popen[bytes]:
    """Runs the unit's ExecStart with its environment file, paths and ports moved by `overrides`
    (each of which the file must set: a misspelt variable would leave the default in force)."""
    import os

    argv = unit_exec_start(unit)
    assert argv[0] == "/usr/local/bin/palisade"
    values = env_file(env_name)
    assert set(overrides) <= set(values), f"{env_name} does not set {sorted(set(overrides) - set(values))}"
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **values, **overrides}
    return subprocess.Popen([str(binary), *argv[1:]], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def wait_http(url: str, process: subprocess.Popen[bytes]) -> int:
    assert process.stderr is not None, "the process needs stderr=PIPE"
    deadline = time.monotonic() + 20
    while True:
        try:
            status: int = urllib.request.urlopen(url, timeout=2).status
            return status
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"{url} never answered: {process.stderr.read().decode() if process.poll() is not None else 'still running'}")
            time.sleep(0.1)


def test_the_systemd_units_start_the_lock_service_and_the_store_from_their_example_files(
    palisade_bin: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    listen, metrics, store_listen = free_port(), free_port(), free_port()
    serve = start_as_unit(
        palisade_bin,
        "palisade.service",
        "palisade.env",
        {
            "PALISADE_DATA_DIR": str(tmp_path / "lock-data"),
            "PALISADE_LISTEN": f"127.0.0.1:{listen}",
            "PALISADE_METRICS_LISTEN": f"127.0.0.1:{metrics}",
        },
    )
    store = None
    try:
        assert wait_http(f"http://127.0.0.1:{metrics}/metrics", serve) == 200
        with palisade.Client([f"127.0.0.1:{listen}"]) as client:
            with client.lock("ops/unit", ttl=5) as grant:
                assert grant.token > 0
            (tmp_path / "public-keys").write_text(f"# the lock service's keys\n{client.public_keys()}\n")
        store = start_as_unit(
            palisade_bin,
            "palisade-store.service",
            "palisade-store.env",
            {
                "PALISADE_STORE_DATA_DIR": str(tmp_path / "store-data"),
                "PALISADE_STORE_LISTEN": f"127.0.0.1:{store_listen}",
                "PALISADE_PUBLIC_KEY_FILE": str(tmp_path / "public-keys"),
            },
        )
        assert wait_http(f"http://127.0.0.1:{store_listen}/healthz", store) == 200
    finally:
        for process in (serve, store):
            if process is not None:
                process.terminate()
                process.wait(10)
    assert (tmp_path / "lock-data").is_dir() and (tmp_path / "store-data").is_dir()


def test_the_systemd_units_verify(palisade_bin: pathlib.Path, tmp_path: pathlib.Path) -> None:
    import shutil

    import pytest

    if shutil.which("systemd-analyze") is None:
        pytest.skip("skipping: systemd-analyze is not installed, the units are not verified")
    for unit, env_name in (("palisade.service", "palisade.env"), ("palisade-store.service", "palisade-store.env")):
        text = (SYSTEMD / unit).read_text()
        text = text.replace("/usr/local/bin/palisade", str(palisade_bin))
        text = text.replace(f"/etc/palisade/{env_name}", str(SYSTEMD / env_name))
        (tmp_path / unit).write_text(text)
        result = subprocess.run(["systemd-analyze", "verify", str(tmp_path / unit)], capture_output=True, text=True, timeout=60)
        assert result.returncode == 0 and not result.stdout.strip() and not result.stderr.strip(), (unit, result.stdout, result.stderr)
