"""A job file of numbered greedy rows (`rows.jsonl`, one job named `rows`), for the runs that
split a job across ranks or replicas and for their benchmark."""

from __future__ import annotations

import json
from pathlib import Path


def write_rows_job(directory: Path, model: Path, rows: int, max_tokens: int) -> Path:
    """``directory/jobs.yaml``: ``rows`` rows (ids r0, r1, ...) answered greedily, each exactly
    ``max_tokens`` tokens long (ignore_eos), so every run does the same work."""
    with (directory / "rows.jsonl").open("w") as f:
        for i in range(rows):
            f.write(json.dumps({"id": f"r{i}", "text": f"row {i}: the quick brown fox"}) + "\n")
    job = directory / "jobs.yaml"
    job.write_text(
        f"model: {model}\n"
        "jobs:\n"
        "  - name: rows\n"
        "    input: rows.jsonl\n"
        '    template: "Summarize: {text}"\n'
        f"    sampling: {{temperature: 0, max_tokens: {max_tokens}, ignore_eos: true}}\n"
    )
    return job
