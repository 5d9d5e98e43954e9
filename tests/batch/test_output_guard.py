"""A job's outputs never overwrite its inputs (issue 46): every file a run writes (results,
errors, vectors and their ids, the summary, the ledger, the lock, the temporary files they are
written through) is checked against every input before anything is read or written, resolved
(``./a`` is ``a``), and the refusal says where the input sits in the job file. Each test
re-reads the inputs afterwards: byte for byte what they were."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from macbatch.batch.paths import LEDGER_NAME, SUMMARY_NAME, written_files
from macbatch.batch.run_guard import refuse_inputs_among_outputs
from macbatch.batch.spec import load_job_file
from tests.support.job_files import write_job

ROWS = "".join(json.dumps({"id": f"r{i}", "text": f"row {i}"}) + "\n" for i in range(3))


def _refused(macbatch_run, job_file: Path, inputs: list[Path], line: int, *said: str) -> None:
    before = {path: path.read_bytes() for path in inputs}
    result = macbatch_run(job_file)
    assert result.exit_code == 1, result.output
    assert "Loading model" not in result.output
    assert result.stderr.startswith(f"error: {job_file}:{line}:"), result.stderr
    for text in said:
        assert text in result.stderr, result.stderr
    for path, data in before.items():
        assert path.read_bytes() == data, f"{path} was changed"


@pytest.mark.parametrize(
    ("source", "input_line", "vectors"),
    [
        ("v.npy", "input: {path: v.npy, format: jsonl}", "v.npy"),
        ("v.npy", "input: {path: ./sub/../v.npy, format: jsonl}", "./v.npy"),  # resolved
        ("rows.ids.json", "input: rows.ids.json", "rows.npy"),  # the ids file beside them
        ("v.npy.tmp", "input: {path: v.npy.tmp, format: jsonl}", "v.npy"),  # written through
    ],
)
def test_an_embed_job_never_writes_its_vectors_over_its_input(
    tmp_path: Path,
    tiny_model_path: Path,
    macbatch_run,
    source: str,
    input_line: str,
    vectors: str,
) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / source).write_text(ROWS)
    job_file = write_job(
        tmp_path,
        f"""
        model: {tiny_model_path}
        jobs:
          - name: e
            task: embed
            {input_line}
            template: "{{text}}"
            vectors: {vectors}
        """,
    )
    _refused(macbatch_run, job_file, [tmp_path / source], 5, "job 'e' reads", "job 'e''s vector")


@pytest.mark.parametrize(
    ("reads", "what"),
    [
        ("out/a.jsonl", "job 'a''s results"),
        ("out/summary.json", "the run's summary"),
        (f"{{path: out/{LEDGER_NAME}-wal, format: jsonl}}", "the resume ledger"),
        ("{path: out/a.jsonl.tmp, format: jsonl}", "job 'a''s results"),
    ],
)
def test_no_job_reads_what_another_job_or_the_run_writes(
    tmp_path: Path, tiny_model_path: Path, macbatch_run, reads: str, what: str
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    for name in ("a.jsonl", SUMMARY_NAME, LEDGER_NAME + "-wal", "a.jsonl.tmp"):
        (out / name).write_text(ROWS)
    job_file = write_job(
        tmp_path,
        f"""
        model: {tiny_model_path}
        jobs:
          - {{name: a, prompts: [hi]}}
          - name: b
            input: {reads}
            template: "{{text}}"
        """,
    )
    _refused(macbatch_run, job_file, list(out.iterdir()), 5, "job 'b' reads", what)


@pytest.mark.parametrize(
    ("out", "glob", "what"),
    [("pics", "pics/*", "the resume ledger"), (".", "**/*.jsonl", "job 'tags''s errors")],
)
def test_a_folder_input_never_lists_a_file_the_run_writes(
    tmp_path: Path, tiny_model_path: Path, macbatch_run, out: str, glob: str, what: str
) -> None:
    """A folder's rows are the files its glob lists: results written where it lists them
    would be read back as rows on the next run."""
    (tmp_path / "pics").mkdir()
    (tmp_path / "pics" / "a.png").write_bytes(b"an image")
    job_file = write_job(
        tmp_path,
        f"""
        model: {tiny_model_path}
        output: {{dir: {out}}}
        jobs:
          - name: tags
            input: {{folder: ., glob: "{glob}"}}
            template: "tag {{file}}"
        """,
    )
    _refused(macbatch_run, job_file, [], 5, "job 'tags' reads the files", what)


def test_a_folder_whose_glob_cannot_list_the_outputs_is_fine(tmp_path: Path) -> None:
    """The usual layout: the job file beside its images, out/ inside the folder read."""
    (tmp_path / "a.png").write_bytes(b"an image")
    job_file = write_job(
        tmp_path,
        'model: demo\njobs: [{name: t, input: {folder: ., glob: "*.png"}, template: "{file}"}]\n',
    )
    refuse_inputs_among_outputs(load_job_file(job_file))


def test_two_outputs_on_one_path_are_refused(tmp_path: Path, macbatch_run) -> None:
    """a.npy and a.safetensors would share a.ids.json; a job named 'a.errors' writes the
    errors file of job 'a'."""
    (tmp_path / "d.jsonl").write_text(ROWS)
    job_file = write_job(
        tmp_path,
        """
        model: demo
        jobs:
          - {name: x, task: embed, input: d.jsonl, template: "{text}", vectors: a.npy}
          - {name: y, task: embed, input: d.jsonl, template: "{text}", vectors: a.safetensors}
        """,
    )
    _refused(macbatch_run, job_file, [], 4, "a.ids.json", "job 'x''s vector ids")
    job_file = write_job(
        tmp_path,
        "model: demo\njobs:\n  - {name: a, prompts: [x]}\n  - {name: a.errors, prompts: [y]}\n",
    )
    _refused(macbatch_run, job_file, [], 4, "a.errors.jsonl", "job 'a''s errors")


def test_written_files_names_every_file_a_run_writes(
    tmp_path: Path, tiny_model_path: Path, macbatch_run
) -> None:
    """The oracle is the disk: after a real run (a failed row, so an errors file; an embed job,
    so vectors and ids), every file in the output directory and beside the vectors is one
    ``written_files`` names."""
    (tmp_path / "docs.jsonl").write_text(ROWS)
    job_file = write_job(
        tmp_path,
        f"""
        model: {tiny_model_path}
        jobs:
          - {{name: gen, prompts: [hi, "bad \\ud800"], sampling: {{max_tokens: 2}}}}
          - name: e
            task: embed
            input: docs.jsonl
            template: "{{text}}"
            vectors: vec/docs.npy
        """,
    )
    result = macbatch_run(job_file)
    assert result.exit_code == 3, result.output  # the bad prompt failed: an errors file too
    spec = load_job_file(job_file)
    named = {w.path.resolve() for w in written_files(spec.output_dir, spec.jobs)}
    on_disk = {p.resolve() for d in (tmp_path / "out", tmp_path / "vec") for p in d.iterdir()}
    assert len(on_disk) >= 7 and on_disk <= named, on_disk - named
