"""Credit: the one owner of the bound on records held by the engine (pure, no threads).

Every record the poller hands to the controller takes one unit of credit; the controller gives
units back (``Release``) as records leave the engine: succeeded, skipped as already finished,
dropped as stale, or forgotten on a revoke. Held records therefore never exceed ``limit``, and
giving back more than was taken is a bug that is raised at once instead of silently inflating
the bound (the bug this type replaced: a release counted twice let the poller hold 20x its
limit while its own count went negative).
"""

from __future__ import annotations

__all__ = ["Credit", "CreditError", "credit_chunk"]


class CreditError(RuntimeError):
    """Credit was taken beyond the limit or given back beyond what was taken (an engine bug)."""


def credit_chunk(limit: int, fetch_batch: int) -> int:
    """The smallest amount of credit worth moving between the threads: the poller fetches only
    once it has this much, and the controller returns credit in chunks of it (or sooner when its
    backlog runs low). Smaller amounts would cost an event and a thread wake-up per handful."""
    return max(1, min(fetch_batch, limit // 4))


class Credit:
    """How many records are held against ``limit``. Owned by the poller thread."""

    __slots__ = ("chunk", "held", "limit")

    def __init__(self, limit: int, fetch_batch: int) -> None:
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        self.limit = limit
        #: The least credit worth a ``consume()`` call (see :func:`credit_chunk`).
        self.chunk = credit_chunk(limit, fetch_batch)
        self.held = 0

    @property
    def available(self) -> int:
        return self.limit - self.held

    def can_fetch(self) -> bool:
        """Enough credit for a worthwhile ``consume()``."""
        return self.limit - self.held >= self.chunk

    def take(self, count: int) -> None:
        """``count`` records were handed to the engine."""
        if count < 0 or self.held + count > self.limit:
            raise CreditError(f"taking {count} with {self.held}/{self.limit} held")
        self.held += count

    def give_back(self, count: int) -> None:
        """``count`` records left the engine."""
        if count < 0 or count > self.held:
            raise CreditError(f"giving back {count} with {self.held}/{self.limit} held")
        self.held -= count

    def __repr__(self) -> str:
        return f"<Credit {self.held}/{self.limit} chunk={self.chunk}>"
