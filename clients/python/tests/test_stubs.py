"""The committed gRPC stubs are what scripts/generate_stubs.py makes from the current proto."""

import pathlib
import subprocess
import sys

PYTHON_CLIENT = pathlib.Path(__file__).resolve().parent.parent
SCRIPT = PYTHON_CLIENT / "scripts" / "generate_stubs.py"
COMMITTED = PYTHON_CLIENT / "src" / "palisade" / "_proto"


def test_the_committed_stubs_match_the_proto(tmp_path: pathlib.Path) -> None:
    result = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    generated = tmp_path / "palisade" / "_proto"
    names = sorted(p.name for p in generated.iterdir() if p.is_file())
    assert names == ["palisade_pb2.py", "palisade_pb2.pyi", "palisade_pb2_grpc.py"]
    stale = [name for name in names if (generated / name).read_bytes() != (COMMITTED / name).read_bytes()]
    assert not stale, (
        f"{', '.join(stale)} differ from what crates/proto/proto/palisade.proto generates: run "
        "`python clients/python/scripts/generate_stubs.py` (in clients/python/.venv) and commit the result"
    )


def test_a_changed_proto_is_noticed(tmp_path: pathlib.Path) -> None:
    """The check above can fail: a proto with one more field generates different stubs."""
    proto_dir = tmp_path / "proto"
    proto_dir.mkdir()
    source = (PYTHON_CLIENT.parent.parent / "crates/proto/proto/palisade.proto").read_text()
    changed = source.replace("message WatchRequest {\n  string lock = 1;\n}", "message WatchRequest {\n  string lock = 1;\n  bool extra = 2;\n}")
    assert changed != source
    (proto_dir / "palisade.proto").write_text(changed)
    out = tmp_path / "out"
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(out), "--proto-dir", str(proto_dir)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    assert (out / "palisade/_proto/palisade_pb2.py").read_bytes() != (COMMITTED / "palisade_pb2.py").read_bytes()
