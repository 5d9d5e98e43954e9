"""The Batch API and the server's records against careless or hostile input and a damaged data
directory (issue 46): a bad field is a 400 naming it, never a 500 that wedges the API; one batch's
failure fails that batch and no other; a broken record on disk is skipped and logged, never the
server's end; no error a client sees holds the data directory's absolute path."""

from __future__ import annotations

import json
import logging
import shutil
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import openai
import pytest

from macbatch.engine import EngineThread
from macbatch.server.app import ServerOptions, stop_batches
from tests.support.batch_api import CHAT, DONE, batch_lines, jsonl, output_lines, wait_for
from tests.support.live_server import Served, serving

WINDOW = {"endpoint": CHAT, "completion_window": "24h"}


@contextmanager
def _server(thread: EngineThread, data_dir: Path) -> Iterator[tuple[Served, openai.OpenAI]]:
    with serving(thread, ServerOptions(data_dir=data_dir)) as served:
        client = openai.OpenAI(base_url=served.api, api_key="unused", max_retries=0, timeout=60)
        try:
            yield served, client
        finally:
            stop_batches(served.app)


def _upload(client: openai.OpenAI, data: bytes) -> str:
    return client.files.create(file=("in.jsonl", data), purpose="batch").id


def _refused(response: httpx.Response, param: str | None, *said: str) -> str:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param, error
    for text in said:
        assert text in error["message"], error
    return error["message"]


def _completes(client: openai.OpenAI) -> None:
    """A valid batch still runs to the end."""
    batch = client.batches.create(input_file_id=_upload(client, jsonl(batch_lines(2, 2))), **WINDOW)
    assert wait_for(client, batch.id, lambda b: b.status in DONE, 120).status == "completed"


def test_metadata_is_checked_as_openai_checks_it(engine_thread: EngineThread, tmp_path) -> None:
    """At most 16 pairs, keys up to 64 characters, string values up to 512, Unicode text: else a
    400 naming the field (a lone surrogate once made every later GET /v1/batches a 500 and
    killed the batch thread)."""
    with _server(engine_thread, tmp_path) as (served, client):
        http = httpx.Client(base_url=served.api, timeout=60)
        fields = {"input_file_id": _upload(client, jsonl(batch_lines(1, 2))), **WINDOW}

        def create(metadata: object) -> httpx.Response:
            return http.post("/batches", json={**fields, "metadata": metadata})

        surrogate = json.dumps({**fields, "metadata": {"k": "x"}}).replace('"x"', '"\\ud800"')
        response = http.post("/batches", content=surrogate)
        _refused(response, "metadata.k", "lone UTF-16 surrogate")
        key = json.dumps({**fields, "metadata": {"x": "v"}}).replace('"x"', '"\\udfff"')
        _refused(http.post("/batches", content=key), "metadata", "lone UTF-16 surrogate")
        assert http.get("/batches").status_code == 200
        _refused(create({f"k{i}": "v" for i in range(17)}), "metadata", "16")
        _refused(create({"k" * 65: "v"}), "metadata", "64 characters")
        _refused(create({"k": "v" * 513}), "metadata.k", "512 characters")
        _refused(create({"k": "v" * 3_000_000}), "metadata.k", "512 characters")
        _refused(create({"k": 1}), "metadata.k", "string")
        _refused(create(["k", "v"]), "metadata", "object")
        most = {f"{i:02d}" + "k" * 62: "v" * 512 for i in range(16)}
        created = create(most)
        assert created.status_code == 200, created.text
        assert client.batches.retrieve(created.json()["id"]).metadata == most
        assert http.get("/batches").status_code == 200
        _completes(client)


def test_lines_the_batch_cannot_read_are_refused_at_creation(
    engine_thread: EngineThread, tmp_path: Path
) -> None:
    """A line the job reader would find unreadable (a lone surrogate anywhere, nesting past
    100, bytes that are not UTF-8) is a 400 naming its line when the batch is created; a batch
    whose only line was one such got a 500 quoting the data directory's absolute path."""
    good = batch_lines(1, 2)[0]
    surrogate = json.dumps(good).replace("row 0", "\\ud800")
    custom_id = json.dumps({**good, "custom_id": "x"}).replace('"x"', '"\\ud800"')
    deep = json.dumps({**good, "body": {**good["body"], "user": "x"}})
    deep = deep.replace('"x"', "[" * 150 + "]" * 150)
    not_utf8 = json.dumps(good).encode().replace(b"row 0", b"\xff")
    with _server(engine_thread, tmp_path) as (served, client):
        http = httpx.Client(base_url=served.api, timeout=60)
        for line, said in [
            (surrogate.encode(), "body.messages[0].content holds a lone UTF-16 surrogate"),
            (custom_id.encode(), "custom_id holds a lone UTF-16 surrogate"),
            (deep.encode(), "more than 100 deep"),
            (not_utf8, "not UTF-8"),
        ]:
            file_id = _upload(client, line + b"\n")
            response = http.post("/batches", json={"input_file_id": file_id, **WINDOW})
            message = _refused(response, "input_file_id", "line 1: ", said)
            assert str(tmp_path) not in message and str(tmp_path.resolve()) not in message
        assert http.get("/batches").json()["data"] == []
        _completes(client)


def test_an_upload_name_that_is_not_utf8_is_kept_and_listed(
    engine_thread: EngineThread, tmp_path: Path
) -> None:
    """A multipart file name is header bytes, read as Latin-1: the bytes of a lone surrogate
    (or any that are not UTF-8) become ordinary characters, stored and listed like any name,
    and the file survives a restart."""
    name = b"rows-\xed\xa0\x80-\xff.jsonl"
    body = (
        b'--XX\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
        b'--XX\r\nContent-Disposition: form-data; name="file"; filename="' + name + b'"\r\n'
        b"\r\n" + jsonl(batch_lines(1, 2)) + b"\r\n--XX--\r\n"
    )
    headers = {"content-type": "multipart/form-data; boundary=XX"}
    with _server(engine_thread, tmp_path) as (served, client):
        response = httpx.post(served.api + "/files", content=body, headers=headers)
        assert response.status_code == 200, response.text
        file_id = response.json()["id"]
        assert response.json()["filename"] == name.decode("latin-1")
    with _server(engine_thread, tmp_path) as (served, client):
        assert [f.filename for f in client.files.list()] == [name.decode("latin-1")]
        assert client.files.content(file_id).content == jsonl(batch_lines(1, 2))


def test_the_batch_thread_survives_a_batch_that_fails(
    engine_thread: EngineThread, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch whose folder vanished before it ran (its ledger cannot open, nor its failure be
    saved) fails with an error saying why, without the data directory's path; a batch created
    after it runs to the end. The batch thread once died on it, leaving every later batch
    validating forever."""
    with _server(engine_thread, tmp_path) as (served, client):
        worker = served.app.state.macbatch.batch_api.worker
        wake = worker.wake
        monkeypatch.setattr(worker, "wake", lambda: None)  # the thread sleeps through this one
        doomed = client.batches.create(
            input_file_id=_upload(client, jsonl(batch_lines(2, 2))), **WINDOW
        )
        shutil.rmtree(tmp_path / "batches" / doomed.id)
        monkeypatch.setattr(worker, "wake", wake)
        _completes(client)
        failed = wait_for(client, doomed.id, lambda b: b.status in DONE, 60)
        assert failed.status == "failed" and failed.errors is not None
        [error] = failed.errors.data
        assert error.code == "batch_failed" and error.message
        assert str(tmp_path) not in error.message, error.message
        assert str(tmp_path.resolve()) not in error.message, error.message
        assert worker.running


def test_an_internal_error_never_shows_the_data_directory(
    engine_thread: EngineThread, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 500 says what went wrong, with paths inside the data directory relative to it."""
    from macbatch.server.batchapi.files import FileStore

    def full(self, *args: object) -> None:
        raise OSError(28, "No space left on device", str(tmp_path / "files" / "file-1.part"))

    monkeypatch.setattr(FileStore, "save", full)
    with _server(engine_thread, tmp_path) as (served, _):
        files = {"file": ("in.jsonl", b"{}\n")}
        response = httpx.post(served.api + "/files", data={"purpose": "batch"}, files=files)
    assert response.status_code == 500
    message = response.json()["error"]["message"]
    assert (
        message
        == "internal error: OSError: [Errno 28] No space left on device: 'files/file-1.part'"
    )


def test_a_stored_response_body_is_unicode_text(served: Served) -> None:
    """A Responses body is stored and echoed whole (its metadata too): a lone surrogate in any
    field is a 400 naming it, never a 500 when the reply or the stored record is written."""
    body = json.dumps({"input": "hi", "max_output_tokens": 2, "metadata": {"k": "x"}})
    response = httpx.post(served.api + "/responses", content=body.replace('"x"', '"\\ud800"'))
    _refused(response, "metadata.k", "lone UTF-16 surrogate")
    fine = httpx.post(served.api + "/responses", content=body)
    assert fine.status_code == 200, fine.text


def _damage(data_dir: Path, batch_id: str, file_id: str) -> dict[str, str]:
    """Break one record of each kind as a crash, a full disk or a hand edit would; returns
    each broken file (relative to the data directory) and what its log line says."""
    batch = data_dir / "batches" / batch_id / "batch.json"
    batch.write_bytes(batch.read_bytes()[:40])  # cut short
    meta = data_dir / "files" / f"{file_id}.json"
    meta.write_bytes(meta.read_bytes()[:25])
    stray = data_dir / "files" / ("file-" + "0" * 32 + ".json")
    stray.write_text(json.dumps(["not", "a", "file", "object"]))
    renamed = data_dir / "batches" / ("batch_" + "1" * 32)
    renamed.mkdir()
    (renamed / "batch.json").write_text(json.dumps({"id": "batch_" + "2" * 32}))
    odd = data_dir / "files" / ("file-" + "3" * 32 + ".json")
    odd.write_text('{"id": "file-' + "3" * 32 + '", "filename": "\\ud800"}')
    return {
        f"batches/{batch_id}/batch.json": "not valid JSON",
        f"files/{file_id}.json": "not valid JSON",
        f"files/{stray.name}": "not a JSON object",
        f"batches/{renamed.name}/batch.json": "missing",
        f"files/{odd.name}": "lone UTF-16 surrogate",
    }


def test_a_broken_record_is_skipped_and_reported(
    engine_thread: EngineThread, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A cut-short batch.json once made `macbatch serve` exit at start, and a cut-short file
    record made every GET /v1/files a 500. Now each broken record is one log line naming it
    (relative to the data directory) and why; every other batch and file is served."""
    with _server(engine_thread, tmp_path) as (served, client):
        kept = client.batches.create(
            input_file_id=_upload(client, jsonl(batch_lines(2, 2))), **WINDOW
        )
        kept = wait_for(client, kept.id, lambda b: b.status in DONE, 120)
        broken = client.batches.create(
            input_file_id=_upload(client, jsonl(batch_lines(1, 2))), **WINDOW
        )
        wait_for(client, broken.id, lambda b: b.status in DONE, 120)
        lost_file = _upload(client, b"{}\n")
    damaged = _damage(tmp_path, broken.id, lost_file)
    caplog.set_level(logging.WARNING, logger="macbatch.server")
    with _server(engine_thread, tmp_path) as (served, client):
        assert [b.id for b in client.batches.list()] == [kept.id]
        files = {f.id for f in client.files.list()}
        assert kept.output_file_id in files and lost_file not in files
        assert len(output_lines(client, kept.output_file_id)) == 2
        with pytest.raises(openai.NotFoundError):
            client.files.retrieve(lost_file)
        _completes(client)
    lines = [r.getMessage() for r in caplog.records if r.name == "macbatch.server"]
    for name, reason in damaged.items():
        said = [line for line in lines if name in line]
        assert len(said) == 1 and reason in said[0], (name, lines)
        assert str(tmp_path) not in said[0]


def test_a_broken_stored_response_is_a_404(
    engine_thread: EngineThread, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with _server(engine_thread, tmp_path) as (served, client):
        model = served.thread.info.model_name
        kept = client.responses.create(model=model, input="hi", max_output_tokens=2)
        lost = client.responses.create(model=model, input="ho", max_output_tokens=2)
    record = tmp_path / "responses" / f"{lost.id}.json"
    record.write_bytes(record.read_bytes()[:30])
    caplog.set_level(logging.WARNING, logger="macbatch.server")
    with _server(engine_thread, tmp_path) as (served, client):
        assert client.responses.retrieve(kept.id).id == kept.id
        for _ in range(2):
            with pytest.raises(openai.NotFoundError):
                client.responses.retrieve(lost.id)
    lines = [
        r.getMessage() for r in caplog.records if f"responses/{lost.id}.json" in r.getMessage()
    ]
    assert len(lines) == 1 and "not valid JSON" in lines[0], lines


def test_a_huge_line_holds_up_no_other(engine_thread: EngineThread, tmp_path, monkeypatch) -> None:
    """Lines are templated and tokenized off the batch thread: the batch's other lines are run
    and counted completed while a huge one is still being prepared, and it ends as its own
    error (too long for the context), not the batch's."""
    from macbatch.engine.inputs.processor import InputProcessor

    rows = batch_lines(12, 2)
    huge = "huge " * 20_000
    rows[3]["body"]["messages"][0]["content"] = huge
    created: list[str] = []
    seen: list[int] = []  # the batch's completed lines when the huge line's preparing went on
    process = InputProcessor.process

    with _server(engine_thread, tmp_path) as (served, client):

        def slow_for_the_huge_line(self, prompt, params, request_id=None):
            if huge in str(prompt.prompt):
                for _ in range(1200):  # until the others are done (or two minutes)
                    done = created and client.batches.retrieve(created[0]).request_counts
                    if done and done.completed >= len(rows) - 1:
                        break
                    threading.Event().wait(0.1)
                seen.append(client.batches.retrieve(created[0]).request_counts.completed)
            return process(self, prompt, params, request_id)

        monkeypatch.setattr(InputProcessor, "process", slow_for_the_huge_line)
        batch = client.batches.create(input_file_id=_upload(client, jsonl(rows)), **WINDOW)
        created.append(batch.id)
        batch = wait_for(client, batch.id, lambda b: b.status in DONE, 300)
        assert seen == [len(rows) - 1], "the other lines waited for the huge one"
        assert batch.status == "completed"
        written = {line["custom_id"] for line in output_lines(client, batch.output_file_id)}
        assert written == {f"r{i}" for i in range(len(rows)) if i != 3}
        errors = output_lines(client, batch.error_file_id)
        assert [e["custom_id"] for e in errors] == ["r3"]
