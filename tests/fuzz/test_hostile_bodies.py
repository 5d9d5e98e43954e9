"""Property-based fuzzing (Hypothesis) of what users send (issue 32): generated bodies at the
request layer and at the whole app, generated rows at the job runner's input reader. Never a 5xx,
never an exception escaping as anything but a 4xx or an error line, the admission count always
back to zero. Bounded (examples, no shrinking database, derandomized) to run in CI in well under
a minute."""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from starlette.applications import Starlette
from starlette.testclient import TestClient

from macbatch.batch.plan import Planned, Rejected, plan_job, prepare
from macbatch.batch.spec import load_job_file
from macbatch.batch.yamlfile import JobFileError
from macbatch.openai import Endpoint, InvalidRequest, parse_body
from tests.support.hostile_strategies import JSON, bodies, jsonl_lines, raw_bodies


def bounded(examples: int) -> settings:
    return settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


@bounded(300)
@given(chat=st.booleans(), data=st.data())
def test_the_request_layer_raises_only_invalid_request(chat: bool, data: st.DataObject) -> None:
    body = data.draw(st.one_of(bodies(chat), JSON.filter(lambda v: isinstance(v, dict))))
    endpoint = Endpoint.CHAT if chat else Endpoint.COMPLETION
    try:
        generation = parse_body(endpoint, body)
    except InvalidRequest:
        return
    assert generation.n >= 1


@bounded(80)
@given(chat=st.booleans(), data=st.data())
def test_the_app_never_answers_5xx_and_gives_every_slot_back(
    fuzz_client: TestClient, fuzz_app: Starlette, chat: bool, data: st.DataObject
) -> None:
    content = data.draw(raw_bodies(chat))
    path = "/v1/chat/completions" if chat else "/v1/completions"
    with fuzz_client.stream("POST", path, content=content) as response:
        text = "".join(response.iter_text())
    event(f"status {response.status_code}")  # --hypothesis-show-statistics: the mix reached
    assert response.status_code < 500, (response.status_code, text[:500], content[:300])
    if response.status_code >= 400:
        assert json.loads(text)["error"]["message"]
    assert fuzz_app.state.macbatch.admission.pending == 0
    assert fuzz_client.get("/health").status_code == 200


@bounded(40)
@given(lines=st.lists(jsonl_lines(), min_size=1, max_size=6))
def test_every_jsonl_line_is_a_request_or_an_error_line(
    tmp_path_factory, lines: list[bytes]
) -> None:
    directory: Path = tmp_path_factory.mktemp("rows")
    (directory / "rows.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    (directory / "jobs.yaml").write_text(
        "model: demo\njobs: [{name: a, input: rows.jsonl, sampling: {max_tokens: 2}}]\n"
    )
    spec = load_job_file(directory / "jobs.yaml")
    job = spec.jobs[0]
    try:
        source = prepare(job)  # the first valid row decides the format; none: refused whole
    except JobFileError as refused:
        assert str(refused)
        return
    items = list(plan_job(job, spec.model, source))
    assert all(isinstance(item, (Planned, Rejected)) for item in items)
    lines_seen = [item.line for item in items]
    assert lines_seen == sorted(lines_seen)
    written = [n for n, line in enumerate(lines, 1) if line.strip()]
    assert set(lines_seen) <= set(written)
    for item in items:
        if isinstance(item, Rejected):
            assert item.reason
        else:  # a planned request's key and prompt are writable as UTF-8 JSON
            json.dumps([item.custom_id, item.prompt], ensure_ascii=False).encode("utf-8")
