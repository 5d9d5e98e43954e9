"""The bottom line: model, sessions running / waiting, KV cache use, work in the last step."""

from __future__ import annotations

from typing import TYPE_CHECKING

from textual.widgets import Static

if TYPE_CHECKING:
    from macbatch.engine import EngineStats


def status_text(model: str, stats: EngineStats | None, problem: str | None) -> str:
    """Plain text for the bar; `problem` (loading, failed, stopped) replaces the engine numbers."""
    if problem is not None or stats is None:
        return f"{model} · {problem or 'starting'}"
    return (
        f"{model} · {stats.running} running · {stats.waiting} waiting · "
        f"KV {stats.kv_usage:.0%} of {stats.kv_blocks_total} blocks · "
        f"{stats.tokens_last_step} tok/step · prefix hits {stats.prefix_cache_hit_rate:.0%}"
    )


class StatusBar(Static):
    """Shows `status_text`; the app refreshes it on a timer."""

    def show(self, model: str, stats: EngineStats | None, problem: str | None = None) -> None:
        self.update(status_text(model, stats, problem))
        self.set_class(problem is not None, "-problem")
