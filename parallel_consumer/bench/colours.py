"""One colour per contestant, the same in every chart (``plot.py`` and the latency charts)."""

from __future__ import annotations

__all__ = ["COLOURS"]

COLOURS = {
    "pc": "#1f77b4",
    "java-pc": "#d62728",
    "Java published": "#ff9896",
    "ideal": "#7f7f7f",
    "serial": "#8c564b",
    "raw": "#2ca02c",
    "pyrallel": "#9467bd",
    "share": "#e377c2",
}
