"""Regenerates the Python modules for ``proto/*.proto`` into ``proto/``.

Run ``python proto/generate.py`` after editing a .proto file; the test suite fails when the
committed modules are stale (``--check``). Generated modules import each other as
``kvpool.proto.*`` through protoc's virtual path mapping.
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


def generate(out_dir: Path) -> list[Path]:
    from grpc_tools import protoc

    protos = sorted(HERE.glob("*.proto"))
    with tempfile.TemporaryDirectory() as tmp:
        args = [
            "protoc",
            f"-Ikvpool/proto={HERE}",
            f"--python_out={tmp}",
            f"--pyi_out={tmp}",
            f"--grpc_python_out={tmp}",
            *(str(p) for p in protos),
        ]
        if protoc.main(args) != 0:
            raise SystemExit("protoc failed")
        produced = sorted((Path(tmp) / "kvpool" / "proto").glob("*"))
        written = []
        for path in produced:
            target = out_dir / path.name
            shutil.copyfile(path, target)
            written.append(target)
        return written


def check() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        fresh = generate(Path(tmp))
        stale = [p.name for p in fresh if not filecmp.cmp(p, HERE / p.name, shallow=False)]
    if stale:
        print(f"stale generated code: {stale}; run python proto/generate.py", file=sys.stderr)
        return 1
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if generated code is stale")
    args = parser.parse_args()
    if args.check:
        return check()
    for path in generate(HERE):
        print(f"wrote {path.relative_to(HERE.parent)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
