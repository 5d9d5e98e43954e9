"""The flat table beside a job's JSONL (issue 50): `<job>.csv` in input order with the input's
columns, the reply, a column per field of a schema's JSON reply, the finish reason and the
error; checked against the JSONL and the input re-read from disk. And no "capped" flag for a
reply whose max_tokens nobody set."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema

from tests.support.job_files import read_jsonl, read_table, write_job, write_rows

SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12}, "n": {"type": "integer"}},
    "required": ["city", "n"],
    "additionalProperties": False,
}


def test_a_csv_job_gets_a_flat_table_in_input_order(
    tmp_path: Path, tiny_model_path: Path, macbatch_run
) -> None:
    rows = [{"id": f"q{i}", "city": city, "note": f"a, \"quoted\"\nnote {i}"}
            for i, city in enumerate(["Oslo", "Lima", "Pune", "Kyiv", "Baku", "Nuuk"])]  # fmt: skip
    rows[3]["city"] = ""  # an empty prompt: a reply or an error, the table says which
    write_rows(tmp_path / "cities.csv", rows)
    job_file = write_job(
        tmp_path,
        f"""
        model: {tiny_model_path}
        jobs:
          - name: free
            input: {{path: cities.csv, id: "{{id}}"}}
            template: "{{city}}"
            sampling: {{temperature: 0, max_tokens: 6}}
          - name: shaped
            input: {{path: cities.csv, id: "{{id}}"}}
            template: "Describe {{city}} as JSON"
            schema: {json.dumps(SCHEMA)}
            sampling: {{temperature: 0, max_tokens: 60}}
        """,
    )
    result = macbatch_run(job_file, "--max-in-flight", "3")  # lines finish out of order
    assert result.exit_code in (0, 3), result.output
    out = tmp_path / "out"
    for job in ("free", "shaped"):
        table = read_table(out / f"{job}.csv")
        lines = {x["custom_id"]: x for x in read_jsonl(out / f"{job}.jsonl")}
        errors = {}
        if (out / f"{job}.errors.jsonl").exists():
            errors = {x["custom_id"]: x for x in read_jsonl(out / f"{job}.errors.jsonl")}
        assert [r["custom_id"] for r in table] == [r["id"] for r in rows]
        for cells, row in zip(table, rows):
            assert (cells["city"], cells["note"]) == (row["city"], row["note"])
            if row["id"] in errors:
                assert cells["error"] == errors[row["id"]]["error"]["message"] != ""
                assert cells["reply"] == ""
                continue
            line = lines[row["id"]]
            assert cells["reply"] == line["response"]["body"]["choices"][0]["message"]["content"]
            assert cells["finish_reason"] == line["macbatch"]["finish_reason"]
            assert cells["error"] == ""
            if job == "shaped" and line["parsed"] is not None:
                jsonschema.validate(line["parsed"], SCHEMA)
                assert cells["reply.city"] == line["parsed"]["city"]
                assert json.loads(cells["reply.n"]) == line["parsed"]["n"]
        assert len(lines) + len(errors) == len(rows)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["jobs"]["free"]["table"] == str(out / "free.csv")
    assert "(table: " in result.output


def test_only_a_max_tokens_someone_set_is_flagged_capped(tmp_path: Path, macbatch_run) -> None:
    """The demo model's context (512) leaves less room than the default max_tokens (512): that
    is no surprise; a max_tokens written in the job file that did not fit is."""
    with (tmp_path / "rows.jsonl").open("w") as f:
        for i in range(3):
            f.write(json.dumps({"id": f"r{i}", "q": f"What is {i} plus {i}?"}) + "\n")
    job_file = write_job(
        tmp_path,
        """
        model: demo
        jobs:
          - name: unset
            input: rows.jsonl
            template: "{q}"
            sampling: {temperature: 0}
          - name: asked
            input: rows.jsonl
            template: "{q}"
            sampling: {temperature: 0, max_tokens: 510}
        """,
    )
    result = macbatch_run(job_file)
    assert result.exit_code == 0, result.output
    out = tmp_path / "out"
    unset = read_jsonl(out / "unset.jsonl")
    assert all("capped_max_tokens" in x["macbatch"] for x in unset)  # the fact stays recorded
    summary = json.loads((out / "summary.json").read_text())
    assert summary["jobs"]["unset"]["capped"] == 0
    assert summary["jobs"]["asked"]["capped"] == 3
    assert "3 replies capped" in result.output and result.output.count("replies capped") == 1
