"""One huge row holds up no other (issue 46: a 50 MB CSV cell took 104 s to template and tokenize
while 20 other rows waited). Rows are prepared on worker threads: the other rows are run and
written while the huge one is still being prepared, and it ends as its own line (here an error:
it cannot fit the context)."""

from __future__ import annotations

import threading
from pathlib import Path

from macbatch.engine.inputs.processor import InputProcessor
from tests.support.job_files import read_jsonl, write_job

ROWS = 20
HUGE_ROW = 3
HUGE = "huge " * 20_000  # fits the character bound of a long context; too long for the tiny's


def _written(path: Path) -> set[str]:
    return {line["custom_id"] for line in read_jsonl(path)} if path.exists() else set()


def test_other_rows_are_written_while_a_huge_one_is_prepared(
    tmp_path: Path, tiny_model_path: Path, macbatch_run, monkeypatch
) -> None:
    cells = [HUGE if i == HUGE_ROW else f"row {i}" for i in range(ROWS)]
    (tmp_path / "rows.csv").write_text(
        "id,text\n" + "".join(f"r{i},{c}\n" for i, c in enumerate(cells))
    )
    write_job(
        tmp_path,
        f"""
        model: {tiny_model_path}
        defaults: {{sampling: {{temperature: 0, max_tokens: 3}}}}
        output: {{dir: out}}
        jobs:
          - name: rows
            input: {{path: rows.csv, id: "{{id}}"}}
            template: "{{text}}"
        """,
    )
    output = tmp_path / "out" / "rows.jsonl"
    others = {f"r{i}" for i in range(ROWS) if i != HUGE_ROW}
    seen: list[set[str]] = []  # what the output held when the huge row's preparing went on
    process = InputProcessor.process

    def slow_for_the_huge_row(self, prompt, params, request_id=None):
        if HUGE in str(prompt.prompt):
            done = threading.Event()
            # the huge row's templating takes until the others are written (or two minutes)
            for _ in range(1200):
                if _written(output) >= others:
                    break
                done.wait(0.1)
            seen.append(_written(output))
        return process(self, prompt, params, request_id)

    monkeypatch.setattr(InputProcessor, "process", slow_for_the_huge_row)
    result = macbatch_run(tmp_path / "jobs.yaml")
    assert seen == [others], "the other rows waited for the huge one"
    assert _written(output) == others
    errors = read_jsonl(tmp_path / "out" / "rows.errors.jsonl")
    assert [e["custom_id"] for e in errors] == [f"r{HUGE_ROW}"]
    assert result.exit_code == 3, result.output  # a row failed; the run did not
