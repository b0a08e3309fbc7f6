#!/usr/bin/env python3
"""Regenerates the gRPC stubs of the Python client from the repository's proto.

    python clients/python/scripts/generate_stubs.py

writes `palisade_pb2.py`, `palisade_pb2.pyi` and `palisade_pb2_grpc.py` into
`clients/python/src/palisade/_proto/` from `crates/proto/proto/palisade.proto`. Run it (with the
test extras installed: `pip install './clients/python[test]'`, which pins grpcio-tools) whenever
the proto changes, and commit the result: `tests/test_stubs.py` fails while the committed stubs
differ from what this script produces.

The proto is mapped to the import path `palisade/_proto/palisade.proto`, so the generated
`palisade_pb2_grpc.py` imports `palisade._proto.palisade_pb2` and the package needs no path
tricks.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

PYTHON_CLIENT = pathlib.Path(__file__).resolve().parent.parent
REPO = PYTHON_CLIENT.parent.parent
PROTO_DIR = REPO / "crates" / "proto" / "proto"
PROTO_FILE = "palisade.proto"
# Where the generated modules live inside the package, as an import path.
PACKAGE_PATH = "palisade/_proto"
DEFAULT_OUT = PYTHON_CLIENT / "src"
GENERATED = ("palisade_pb2.py", "palisade_pb2.pyi", "palisade_pb2_grpc.py")


def generate(out: pathlib.Path, proto_dir: pathlib.Path = PROTO_DIR) -> list[pathlib.Path]:
    """Writes the stubs under `out` (the directory holding the `palisade` package); returns them."""
    try:
        from grpc_tools import protoc  # type: ignore[import-untyped]
    except ImportError:
        raise SystemExit(
            "generate_stubs: grpcio-tools is not installed; run "
            "`pip install './clients/python[test]'` (it pins the version the stubs were made with)"
        ) from None
    import grpc_tools

    source = proto_dir / PROTO_FILE
    if not source.is_file():
        raise SystemExit(f"generate_stubs: {source} does not exist")
    target = out / PACKAGE_PATH
    target.mkdir(parents=True, exist_ok=True)
    well_known = pathlib.Path(grpc_tools.__file__).parent / "_proto"
    args = [
        "grpc_tools.protoc",
        f"-I{PACKAGE_PATH}={proto_dir}",
        f"-I{well_known}",
        f"--python_out={out}",
        f"--pyi_out={out}",
        f"--grpc_python_out={out}",
        f"{PACKAGE_PATH}/{PROTO_FILE}",
    ]
    status = protoc.main(args)
    if status != 0:
        raise SystemExit(f"generate_stubs: protoc failed with status {status}")
    return [target / name for name in GENERATED]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out",
        type=pathlib.Path,
        default=DEFAULT_OUT,
        help="directory holding the palisade package (default: clients/python/src)",
    )
    parser.add_argument("--proto-dir", type=pathlib.Path, default=PROTO_DIR)
    options = parser.parse_args(argv)
    for path in generate(options.out, options.proto_dir):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
