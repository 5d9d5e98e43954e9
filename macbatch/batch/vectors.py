"""A ``task: embed`` job's ``vectors:`` file: one float32 matrix, rows in input order (``.npy``,
or ``.safetensors`` holding it as ``vectors``).

It is assembled from the job's result lines when a run ends (each line holds its row's vectors
exactly: JSON floats and base64 both round-trip float32), never appended to as rows finish, so a
run killed any number of times and resumed writes the same file as one that never stopped: the
result lines are exactly-once (outputs.py, the ledger), and their order is restored from each
line's input line number. Beside it, ``<name>.ids.json`` names each matrix row (custom id, and
the index of the input within its row's body), so rows that failed leave no silent gap.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from macbatch.batch.paths import ids_path, output_path, temporary
from macbatch.batch.spec import JobFile


def write_job_vectors(
    job_file: JobFile, outputs: dict[str, dict[str, Any]], note: Callable[[str], None]
) -> None:
    """Each ``task: embed`` job's matrix from its result lines; its path and row count go into
    the job's entry of ``outputs`` (the summary's), a problem into ``note``."""
    for job in job_file.jobs:
        if job.vectors is None:
            continue
        try:
            rows = write_vectors(output_path(job_file.output_dir, job.name), job.vectors)
        except ValueError as exc:
            note(f"{job.name}: no vectors file: {exc}")
            continue
        outputs[job.name].update(vectors=str(job.vectors), vectors_rows=rows)


def write_vectors(results: Path, target: Path) -> int:
    """Write ``target`` (.npy) and its ids file from the result lines in ``results``; returns
    the matrix's row count. ``ValueError`` if the rows' vectors differ in length."""
    rows: list[tuple[int, str, list[np.ndarray]]] = []
    if results.exists():
        with results.open("rb") as lines:
            for raw in lines:
                line = json.loads(raw)
                data = line["response"]["body"]["data"]
                vectors = [_decoded(item["embedding"]) for item in data]
                rows.append((int(line["macbatch"]["line"]), str(line["custom_id"]), vectors))
    rows.sort(key=lambda row: row[0])
    vectors = [v for _, _, row in rows for v in row]
    widths = {len(v) for v in vectors}
    if len(widths) > 1:
        raise ValueError(
            f"{results.name}: vectors of {sorted(widths)} dimensions cannot form one matrix; give "
            "every row the same 'dimensions'"
        )
    width = widths.pop() if widths else 0
    matrix = np.stack(vectors) if vectors else np.zeros((0, width), dtype=np.float32)
    ids = [[custom_id, i] for _, custom_id, row in rows for i in range(len(row))]
    target.parent.mkdir(parents=True, exist_ok=True)
    _replace(target, lambda f: _save(f, target.suffix, matrix.astype(np.float32, copy=False)))
    _replace(ids_path(target), lambda f: f.write(json.dumps(ids).encode("utf-8")))
    return len(vectors)


def _save(file: Any, suffix: str, matrix: np.ndarray) -> None:
    """``.npy``, or ``.safetensors`` with the matrix under the name ``vectors``."""
    if suffix == ".safetensors":
        import mlx.core as mx

        mx.save_safetensors(file, {"vectors": mx.array(matrix)})
    else:
        np.save(file, matrix)


def _decoded(value: Any) -> np.ndarray:
    if isinstance(value, str):
        return np.frombuffer(base64.b64decode(value), dtype="<f4").astype(np.float32)
    return np.asarray(value, dtype=np.float32)


def _replace(path: Path, write: Any) -> None:
    """Write beside ``path`` and rename: a crash leaves the old file or the new one."""
    with temporary(path).open("wb") as f:
        write(f)
    os.replace(temporary(path), path)
