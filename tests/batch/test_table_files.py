"""The flat table written row by row (issue 50), and as Parquet when the job file asks: re-read
from disk (CSV with the csv module, Parquet with pyarrow) and checked against the JSONL, the
input and each other; a job file asking for Parquet without pyarrow is refused before anything
runs, naming the extra to install."""

from __future__ import annotations

import json
import random
import sys
import tracemalloc
from pathlib import Path

import pytest

from macbatch.batch.inputs import open_input
from macbatch.batch.job_sections import InputSpec
from macbatch.batch.table import write_table
from tests.support.job_files import read_jsonl, read_table, write_job, write_rows

ROWS = [{"id": f"r{i}", "city": city} for i, city in enumerate(["Oslo", "Lima", "Pune", "Kyiv"])]


def job_text(model: Path, parquet: bool) -> str:
    return f"""
        model: {model}
        output: {{dir: out, parquet: {"true" if parquet else "false"}}}
        jobs:
          - name: cities
            input: {{path: cities.csv, id: "{{id}}"}}
            template: "{{city}}"
            sampling: {{temperature: 0, max_tokens: 5}}
        """


def test_parquet_holds_the_same_rows_as_the_csv(tmp_path, tiny_model_path, macbatch_run):
    pq = pytest.importorskip("pyarrow.parquet")
    write_rows(tmp_path / "cities.csv", ROWS)
    job_file = write_job(tmp_path, job_text(tiny_model_path, parquet=True))
    result = macbatch_run(job_file, "--max-in-flight", "3")
    assert result.exit_code == 0, result.output
    out = tmp_path / "out"
    table = read_table(out / "cities.csv")
    parquet = pq.read_table(out / "cities.parquet")
    assert parquet.column_names == list(table[0])
    assert str(parquet.schema.field("sample").type) == "int64"
    rows = parquet.to_pylist()
    assert [{**r, "sample": str(r["sample"])} for r in rows] == table
    lines = {x["custom_id"]: x for x in read_jsonl(out / "cities.jsonl")}
    assert [r["custom_id"] for r in rows] == [r["id"] for r in ROWS]
    for row in rows:
        body = lines[row["custom_id"]]["response"]["body"]
        assert row["reply"] == body["choices"][0]["message"]["content"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["jobs"]["cities"]["parquet"] == str(out / "cities.parquet")


def test_parquet_without_pyarrow_is_refused_before_the_run(
    tmp_path, tiny_model_path, macbatch_run, monkeypatch
):
    write_rows(tmp_path / "cities.csv", ROWS)
    job_file = write_job(tmp_path, job_text(tiny_model_path, parquet=True))
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # import pyarrow raises ImportError
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    result = macbatch_run(job_file)
    assert result.exit_code != 0
    output = " ".join(result.output.split())
    assert f"{job_file}:2:" in output and "output.parquet" in output.replace("leave out ", "")
    assert "pip install 'macbatch[parquet]'" in output
    assert not (tmp_path / "out").exists()  # nothing ran, nothing written


def test_the_table_is_written_without_holding_the_results(tmp_path, tiny_model_path, macbatch_run):
    """A job of 3,000 rows with replies of 4 KiB (15 MB of result lines, in completion order):
    the table is built reading one line at a time, so its peak memory is a small part of them.
    The lines are a real run's, copied with new ids, line numbers and replies."""
    write_rows(tmp_path / "cities.csv", ROWS)
    job_file = write_job(tmp_path, job_text(tiny_model_path, parquet=False))
    assert macbatch_run(job_file).exit_code == 0
    real = read_jsonl(tmp_path / "out" / "cities.jsonl")[0]

    count = 3000
    rows = [{"id": f"r{i}", "city": f"city {i}"} for i in range(count)]
    big = tmp_path / "big"
    big.mkdir()
    write_rows(big / "cities.csv", rows)
    order = list(range(count))
    random.Random(0).shuffle(order)
    replies = {}
    with (big / "cities.jsonl").open("w") as f:
        for i in order[: count - 5]:  # the last five rows never ran
            line = json.loads(json.dumps(real))
            replies[i] = f"{i} " + "x" * 4096
            line["custom_id"] = rows[i]["id"]
            line["macbatch"]["line"] = i + 2  # the header is line 1
            line["response"]["body"]["choices"][0]["message"]["content"] = replies[i]
            f.write(json.dumps(line) + "\n")
    results = big / "cities.jsonl"
    source = open_input(InputSpec(big / "cities.csv", "csv", "{id}"), "cities")
    tracemalloc.start()
    write_table([big / "cities.csv.out"], results, big / "none.jsonl", source)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < results.stat().st_size / 8, (peak, results.stat().st_size)

    table = read_table(big / "cities.csv.out")
    assert [r["city"] for r in table] == [r["city"] for r in rows]
    assert [r["reply"] for r in table] == [replies.get(i, "") for i in range(count)]
    assert [r["error"] != "" for r in table] == [i not in replies for i in range(count)]
