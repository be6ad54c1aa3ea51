"""``python -m parallel_consumer.bench`` is ``pc-bench``."""

import sys

from parallel_consumer.bench.cli import main

sys.exit(main())
