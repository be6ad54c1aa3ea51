"""The brokers' refusals in force (a failed login, a missing ACL), by what was refused: set when
they refuse, ended when the same thing succeeds; ``health()`` is unhealthy while one lasts.
Which client errors are refusals, and what to grant, is ``kafka/access.py``'s."""

from __future__ import annotations

__all__ = ["Refusals"]


class Refusals:
    """The refusals in force, by what was refused (a topic written to, the client's login, the
    group): set when the brokers refuse, ended when the same thing succeeds. Owned by one
    thread; other threads read :attr:`texts` (a tuple, replaced whole)."""

    def __init__(self) -> None:
        self._by_key: dict[object, str] = {}
        self.texts: tuple[str, ...] = ()

    def refused(self, key: object, text: str) -> bool:
        """Record a refusal (its latest text); True when none was in force for ``key``."""
        new = key not in self._by_key
        self._by_key[key] = text
        self.texts = tuple(self._by_key.values())
        return new

    def allowed(self, key: object) -> None:
        """``key`` succeeded: its refusal (if any) is over."""
        if self._by_key.pop(key, None) is not None:
            self.texts = tuple(self._by_key.values())

    def clear(self) -> None:
        if self._by_key:
            self._by_key.clear()
            self.texts = ()

    def __bool__(self) -> bool:
        return bool(self._by_key)
