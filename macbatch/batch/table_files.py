"""Where a job's flat table is written, row by row: the CSV always, Parquet when the job file
asks (``output: {parquet: true}``).

Parquet needs pyarrow, an optional extra (``pip install 'macbatch[parquet]'``): the job file is
refused before the model loads when it asks for Parquet without it (`require_pyarrow`), rather
than after a run of hours. Rows go to the Parquet file in groups of `ROWS_PER_GROUP`, so neither
file holds a job's results in memory.
"""

from __future__ import annotations

import csv
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

PARQUET_EXTRA = "pip install 'macbatch[parquet]'"
ROWS_PER_GROUP = 1024


def require_pyarrow() -> None:
    """`ImportError` with what to install, unless pyarrow can be imported."""
    try:
        import pyarrow.parquet  # noqa: F401
    except ImportError as exc:
        raise ImportError(
            f"writing Parquet needs pyarrow, which is not installed ({exc}); install it with "
            f"{PARQUET_EXTRA}, or leave out output.parquet (the CSV table is always written)"
        ) from None


class TableFile(Protocol):
    """A table being written: the header first, then one row at a time."""

    def write(self, row: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


class CsvTable:
    """Rows as CSV; a value is a cell's text (the caller turns non-text values into JSON)."""

    def __init__(self, path: Path, columns: list[str]) -> None:
        self._file = path.open("w", newline="", encoding="utf-8")
        self._writer = csv.DictWriter(self._file, columns, extrasaction="ignore")
        self._writer.writeheader()

    def write(self, row: dict[str, Any]) -> None:
        self._writer.writerow(row)

    def close(self) -> None:
        self._file.close()


class ParquetTable:
    """The same rows as Parquet: ``sample`` an integer, every other column text (null where
    the CSV has an empty cell for a row without it)."""

    def __init__(self, path: Path, columns: list[str]) -> None:
        require_pyarrow()
        import pyarrow as pa
        import pyarrow.parquet as pq

        self._columns = columns
        fields = [pa.field(c, pa.int64() if c == "sample" else pa.string()) for c in columns]
        self._schema = pa.schema(fields)
        self._table = pa.Table
        self._writer = pq.ParquetWriter(path, self._schema)
        self._rows: list[dict[str, Any]] = []

    def write(self, row: dict[str, Any]) -> None:
        self._rows.append({c: row.get(c) for c in self._columns})
        if len(self._rows) >= ROWS_PER_GROUP:
            self._flush()

    def _flush(self) -> None:
        if self._rows:
            self._writer.write_table(self._table.from_pylist(self._rows, schema=self._schema))
            self._rows.clear()

    def close(self) -> None:
        self._flush()
        self._writer.close()


class TableFiles:
    """Every file of one table, each row written to all of them; closed together."""

    def __init__(self, files: list[TableFile]) -> None:
        self.files = files

    def write(self, row: dict[str, Any]) -> None:
        for file in self.files:
            file.write(row)

    def __enter__(self) -> TableFiles:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        for file in self.files:
            file.close()
