"""Output files: one JSON line per finished request, written whole, and crash recovery.

Every line goes out in one `write` on an unbuffered file, so a killed process leaves at most one
partial line at the end, which `recover` cuts off before the ledger catches up with what the file
holds.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from macbatch.batch.ledger import DoneRecord, Ledger
from macbatch.batch.paths import temporary
from macbatch.batch.plan import Planned, Rejected
from macbatch.batch.replies import ParsedReply
from macbatch.engine import RequestOutput


@dataclass(frozen=True)
class Recovery:
    """What `recover` found in one output file."""

    adopted: int
    truncated_bytes: int
    unreadable_lines: int
    rebuilt: bool


class JsonlAppender:
    """An append-only JSONL file whose lines are each written with a single `write`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file = path.open("ab", buffering=0)

    def append(self, obj: dict[str, Any]) -> int:
        """Write one line; returns the file size after it. Text that is not valid Unicode (an
        error line quoting a lone surrogate) is written as JSON escapes, so the line is UTF-8."""
        try:
            data = (json.dumps(obj, ensure_ascii=False) + "\n").encode("utf-8")
        except UnicodeEncodeError:
            data = (json.dumps(obj) + "\n").encode("ascii")
        view = memoryview(data)
        while view:
            view = view[self._file.write(view) :]
        return self._file.tell()

    def close(self) -> None:
        self._file.close()


def recover(path: Path, ledger: Ledger, job: str) -> Recovery:
    """Bring the ledger in line with the output file after a crash or a hand edit.

    Only bytes after the size the ledger last committed are read; a file shorter than that (cut
    or replaced by hand) is re-read in full and the ledger rebuilt from it.
    """
    size = path.stat().st_size if path.exists() else 0
    start = ledger.recorded_size(job)
    rebuilt = size < start
    if rebuilt:
        ledger.forget(job, settings=False)
        start = 0
    records, unreadable, end = [], 0, start
    if size > start:
        with path.open("rb") as f:
            f.seek(start)
            for raw in f:
                if not raw.endswith(b"\n"):
                    break
                end += len(raw)
                record = _done_record(raw, job)
                if record is None:
                    unreadable += 1
                else:
                    records.append(record)
    if end < size:
        with path.open("r+b") as f:
            f.truncate(end)
    adopted = ledger.adopt(job, records, end)
    return Recovery(adopted, size - end, unreadable, rebuilt)


def drop_results(path: Path, requests: set[tuple[str, int]]) -> int:
    """Rewrite ``path`` without the lines of ``requests`` ((custom_id, sample) pairs); returns
    how many lines went. Written beside it and renamed, so a crash leaves the old file or the
    new one, never a mix; the caller rebuilds the ledger from the file afterwards."""
    rewritten = temporary(path)
    dropped = 0
    with path.open("rb") as source, rewritten.open("wb") as target:
        for raw in source:
            record = _done_record(raw, "")
            if record is not None and (record.custom_id, record.sample) in requests:
                dropped += 1
            else:
                target.write(raw)
    os.replace(rewritten, path)
    return dropped


def _done_record(raw: bytes, job: str) -> DoneRecord | None:
    try:
        line = json.loads(raw)
        meta = line["macbatch"]
        return DoneRecord(
            key=meta["key"],
            job=job,
            custom_id=str(line["custom_id"]),
            sample=int(meta["sample"]),
            correct=meta.get("correct"),
            group=meta.get("group"),
            model=_answered_by(line),
        )
    except (ValueError, KeyError, TypeError):
        return None


def _answered_by(line: dict[str, Any]) -> str | None:
    """The model a result line's response names (every response body has its ``model``)."""
    body = (line.get("response") or {}).get("body")
    model = body.get("model") if isinstance(body, dict) else None
    return model if isinstance(model, str) else None


def result_line(
    request: Planned,
    outputs: list[RequestOutput],
    body: dict[str, Any],
    correct: bool | None,
    parsed: ParsedReply | None = None,
) -> dict[str, Any]:
    """The OpenAI batch output shape for one finished line: ``body`` is the response serve
    would have sent (``macbatch.openai``) for ``outputs`` (its engine requests': one per choice
    or input), plus macbatch's own metrics (token counts summed over them, timings the first's)
    and, for a constrained reply, its first choice's ``parsed`` value (null if it did not
    parse)."""
    first, metrics = outputs[0], outputs[0].metrics
    if request.pooled is not None:
        finish = "stop"
    elif "choices" not in body:  # a Responses body
        finish = str(first.finish_reason and first.finish_reason.value)
    else:
        finish = body["choices"][0]["finish_reason"]
    meta = {
        "job": request.job,
        "line": request.line,
        "sample": request.sample,
        "key": request.key,
        "finish_reason": finish,
        "prompt_tokens": sum(o.metrics.prompt_tokens for o in outputs),
        "generated_tokens": sum(o.metrics.generated_tokens for o in outputs),
        "cached_tokens": sum(o.metrics.cached_tokens for o in outputs),
        "disk_cached_tokens": sum(o.metrics.disk_cached_tokens for o in outputs),
        "queue_ms": _ms(metrics.queue_time_s),
        "ttft_ms": _ms(metrics.time_to_first_token_s),
        "tok_per_s": _round(metrics.decode_tokens_per_s),
    }
    caps = [o.capped_max_tokens for o in outputs if o.capped_max_tokens is not None]
    if caps:  # a prompt left less room than max_tokens asked
        meta["capped_max_tokens"] = min(caps)
    if request.scored:
        meta.update(expected=request.expected, correct=correct, group=request.group)
    line = {
        "id": f"batch_req_{request.key}",
        "custom_id": request.custom_id,
        "response": {"status_code": 200, "request_id": request.key, "body": body},
        "error": None,
        "macbatch": meta,
    }
    if parsed is not None:
        line["parsed"] = parsed.value
    return line


def write_result(
    appender: JsonlAppender,
    ledger: Ledger,
    item: Planned,
    outputs: list[RequestOutput],
    body: dict[str, Any],
    correct: bool | None = None,
    parsed: ParsedReply | None = None,
) -> None:
    """Write a finished line, then record it done (the order exactly-once needs)."""
    line = result_line(item, outputs, body, correct, parsed)
    size = appender.append(line)
    model = _answered_by(line)
    done = DoneRecord(item.key, item.job, item.custom_id, item.sample, correct, item.group, model)
    ledger.record(done, size)


def error_line(item: Planned | Rejected, reason: str, code: str) -> dict[str, Any]:
    """An errors-file line: which input line failed and why, in the OpenAI batch error shape."""
    meta: dict[str, Any] = {"job": item.job, "line": item.line}
    if isinstance(item, Planned):
        meta.update(sample=item.sample, key=item.key)
    return {
        "id": f"batch_req_{item.key}" if isinstance(item, Planned) else None,
        "custom_id": item.custom_id,
        "response": None,
        "error": {"code": code, "message": reason},
        "macbatch": meta,
    }


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)
