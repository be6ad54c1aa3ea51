"""``pc-bench``: the benchmark command line; it lives in :mod:`parallel_consumer.bench`."""

from __future__ import annotations

import sys

from parallel_consumer.bench.cli import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
