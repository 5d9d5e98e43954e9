"""The bottom line: the open chat's model, sessions running / waiting, the KV pool (blocks in use
of how many, how many tokens it holds, its memory now and how much of it requests and the prefix
cache use), work in the last step, how fast replies generate, how much of the last reply's prompt
the prefix cache held, and every loaded model with its memory."""

from __future__ import annotations

from typing import TYPE_CHECKING

from textual.widgets import Static

if TYPE_CHECKING:
    from macbatch.engine import EngineStats
    from macbatch.tui.chats import EngineStatus
    from macbatch.tui.store import ReplyMetrics


def status_text(
    model: str,
    stats: EngineStats | None,
    problem: str | None,
    block_size: int = 0,
    last_reply: ReplyMetrics | None = None,
    tokens_per_s: float | None = None,
    replies: int = 0,
) -> str:
    """Plain text for the bar; `problem` (loading, failed, stopped) replaces the engine numbers.
    `block_size` (tokens per KV block) turns the pool's blocks into the tokens it holds;
    `last_reply` adds its prompt tokens the prefix cache held (the rest were computed);
    `tokens_per_s`, the replies' speed (live while they stream). `replies` in flight count as
    running before the engine's last step has seen them: the bar said "0 running" for up to
    half a second after a reply started."""
    if problem is not None or stats is None:
        return f"{model} · {problem or 'starting'}"
    pool_tokens = stats.kv_blocks_total * block_size
    # the speed early, where a narrow terminal still shows it
    speed = "" if tokens_per_s is None else f"{tokens_per_s:.1f} tok/s · "
    # short enough for an 80-column terminal to show the step numbers too
    running = max(stats.running, replies - stats.waiting)
    text = (
        f"{model} · {running} running · {stats.waiting} waiting · {speed}"
        f"KV {stats.kv_blocks_used}/{stats.kv_blocks_total} ({pool_tokens:,} tok) "
        f"{stats.kv_bytes_used / 2**20:,.1f}/{stats.kv_cache_bytes / 2**20:,.1f} MiB · "
        f"{stats.tokens_last_step} tok/step · prefix hits {stats.prefix_cache_hit_rate:.0%}"
    )
    if last_reply is not None and last_reply.prompt_tokens:
        cached, prompt = last_reply.cached_tokens or 0, last_reply.prompt_tokens
        text += f" · last prompt {cached:,}/{prompt:,} tok cached"
        if last_reply.disk_cached_tokens:
            text += f" ({last_reply.disk_cached_tokens:,} from disk)"
    return text


class StatusBar(Static):
    """Shows `status_text`; the app refreshes it on a timer."""

    def show(self, model: str, status: EngineStatus, loaded: str | None = None) -> None:
        """``loaded``: the models loaded and their memory, last (the first to be cut off)."""
        text = status_text(model, *status)
        self.update(text if loaded is None else f"{text} · {loaded}")
        self.set_class(status.problem is not None, "-problem")
