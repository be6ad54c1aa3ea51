"""``pc-bench``: the benchmark command line (coming)."""

from __future__ import annotations

import sys
from collections.abc import Sequence

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``pc-bench``; for now it only points at the benchmarks folder."""
    print(
        "pc-bench is coming. Until then, the workloads and peer harnesses live in benchmarks/ "
        "of the parallel_consumer repository (see benchmarks/README.md there).",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
