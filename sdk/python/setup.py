"""Build hook: generates the gRPC stubs (package ``idemraft.v1``) from Idemraft's .proto.

The stubs are never committed: the .proto file is the one source of truth, so every build
regenerates them with grpcio-tools. The .proto is looked for, in order, at ``$IDEMRAFT_PROTO``,
in ``proto/`` beside this file (where source distributions carry a copy), and in the
repository (``../../proto/proto``), which is what ``pip install ./sdk/python`` uses.

The runtime floors of grpcio and protobuf are those of the grpcio-tools that generated the
code: generated modules refuse to load on an older runtime.
"""

import os
import shutil
from importlib import metadata
from pathlib import Path

from setuptools import setup
from setuptools.command.sdist import sdist

HERE = Path(__file__).resolve().parent
PROTO_REL = Path("idemraft") / "v1" / "idemraft.proto"
OUT = HERE / "src"


def proto_root() -> Path:
    candidates = []
    if os.environ.get("IDEMRAFT_PROTO"):
        given = Path(os.environ["IDEMRAFT_PROTO"]).resolve()
        # Either the file itself or the include root holding idemraft/v1/idemraft.proto.
        candidates.append(given.parents[2] if given.is_file() else given)
    candidates += [HERE / "proto", HERE.parent.parent / "proto" / "proto"]
    for root in candidates:
        if (root / PROTO_REL).is_file():
            return root
    raise SystemExit(
        "idemraft.proto not found (looked in: %s); build from the Idemraft repository "
        "(pip install ./sdk/python) or set IDEMRAFT_PROTO" % ", ".join(str(c) for c in candidates)
    )


def generate() -> None:
    from grpc_tools import protoc  # a build requirement (pyproject.toml)
    import grpc_tools

    root = proto_root()
    target = OUT / "idemraft" / "v1"
    target.mkdir(parents=True, exist_ok=True)
    include = Path(grpc_tools.__file__).parent / "_proto"
    args = [
        "grpc_tools.protoc",
        "-I%s" % root,
        "-I%s" % include,
        "--python_out=%s" % OUT,
        "--pyi_out=%s" % OUT,
        "--grpc_python_out=%s" % OUT,
        str(root / PROTO_REL),
    ]
    if protoc.main(args) != 0:
        raise SystemExit("grpc_tools.protoc failed on %s" % (root / PROTO_REL))
    (target / "__init__.py").write_text(
        '"""Generated from idemraft/v1/idemraft.proto by setup.py; do not edit."""\n'
    )


class SDist(sdist):
    """Source distributions carry the .proto, so they build away from the repository."""

    def run(self):
        root = proto_root()
        local = HERE / "proto"
        if root != local:
            (local / PROTO_REL).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(root / PROTO_REL, local / PROTO_REL)
        super().run()

    def make_release_tree(self, base_dir, files):
        super().make_release_tree(base_dir, files)
        dest = Path(base_dir) / "proto" / PROTO_REL
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(HERE / "proto" / PROTO_REL, dest)


def runtime_requirements():
    tools = metadata.version("grpcio-tools")
    from google.protobuf import __version__ as pb_version

    major = int(pb_version.split(".")[0])
    return ["grpcio>=%s" % tools, "protobuf>=%s,<%d" % (pb_version, major + 1)]


# Generated before setup() runs: every command (egg_info and dist_info included, which pip
# runs before any build) checks that the package directories exist.
generate()
setup(cmdclass={"sdist": SDist}, install_requires=runtime_requirements())
