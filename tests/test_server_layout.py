"""lifecycle/server/: what ships besides Python; the compiled v2 messages match their source."""

from __future__ import annotations

import base64
import fnmatch
import re
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+
pytest.importorskip("grpc")  # the serve extra

from google.protobuf import descriptor_pb2  # noqa: E402

from lifecycle.server.kserve import _open_inference  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SERVER = ROOT / "lifecycle" / "server"


def package_data() -> dict[str, list[str]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return config["tool"]["setuptools"]["package-data"]


def test_every_file_of_the_server_that_is_not_python_ships_as_package_data():
    shipped = package_data()
    missing = []
    for path in sorted(SERVER.rglob("*")):
        if path.is_dir() or path.suffix in {".py", ".pyc"} or "__pycache__" in path.parts:
            continue
        package = ".".join(path.parent.relative_to(ROOT).parts)
        patterns = shipped.get(package, [])
        if not any(fnmatch.fnmatch(path.name, pattern) for pattern in patterns):
            missing.append(f"{path.relative_to(ROOT)} (package {package})")
    assert not missing, f"not in [tool.setuptools.package-data]: {missing}"


def test_the_compiled_v2_messages_come_from_the_proto_beside_them():
    compiled = descriptor_pb2.FileDescriptorSet.FromString(
        base64.b64decode(_open_inference._COMPILED)
    )
    (source,) = compiled.file
    proto = Path(_open_inference.__file__).with_name(source.name)
    assert proto.name == "open_inference.proto"
    text = proto.read_text()
    declared = re.findall(r"^\s*message (\w+)", text, flags=re.MULTILINE)
    compiled_names = [m.name for m in source.message_type]
    compiled_names += [n.name for m in source.message_type for n in m.nested_type]
    # Map entries are compiled into nested messages the .proto does not declare.
    compiled_names = [name for name in compiled_names if not name.endswith("Entry")]
    assert sorted(declared) == sorted(compiled_names), "regenerate _COMPILED (see its module)"
    (service,) = source.service
    assert f"service {service.name}" in text
    rpcs = re.findall(r"^\s*rpc (\w+)", text, flags=re.MULTILINE)
    assert rpcs == [method.name for method in service.method]
