"""From job rows to engine requests: prompt rendering, ids, sampling, and the resume key.

A request's key hashes everything that decides its result (model, job, id, rendered prompt,
sampling, sample index), so a rerun can tell "already done" from "changed since".
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from macbatch.batch.inputs import InputFile, Row, open_input
from macbatch.batch.spec import (
    SAMPLING_KEYS,
    JobSpec,
    message_problem,
    render,
    suggest,
    template_fields,
)
from macbatch.batch.yamlfile import JobFileError
from macbatch.engine import SamplingParams
from macbatch.engine.request_options import OPTION_FIELDS, structured_output
from macbatch.engine.tool_calls import check_tools

Prompt = str | list[dict[str, str]]
OPENAI_URLS = ("/v1/chat/completions", "/v1/completions")


@dataclass(frozen=True)
class Planned:
    """One request to run: sample `sample` of row `custom_id`."""

    job: str
    custom_id: str
    sample: int
    line: int
    prompt: Prompt
    sampling: dict[str, Any]
    key: str
    scored: bool
    expected: str | None
    group: str | None
    chat_template_kwargs: dict[str, Any] | None = None
    options: dict[str, Any] | None = None  # constraint and tools, as request fields


@dataclass(frozen=True)
class Rejected:
    """A row that cannot become a request, and why (written to the job's errors file)."""

    job: str
    line: int
    custom_id: str | None
    reason: str


def prepare(job: JobSpec) -> InputFile | None:
    """Open the job's input and check its header against the template, id and score fields."""
    if job.input is None:
        return None
    source = open_input(job.input, job.name)
    header = source.header
    where = f"job '{job.name}': {source.path.name}"
    needed: list[tuple[str, str]] = []
    if source.format == "openai":
        if job.template is not None:
            raise JobFileError(f"{where} holds OpenAI batch requests; remove 'template'")
    elif job.template is not None:
        needed += [(name, "template") for name in template_fields(job.template)]
    elif "prompt" not in header and "messages" not in header:
        raise JobFileError(
            f"{where} has no 'prompt' or 'messages' field and the job has no template; "
            f"add template: naming fields of the rows (they have: {', '.join(header)})"
        )
    if job.input.id is not None:
        needed += [(name, "input.id") for name in template_fields(job.input.id)]
    if job.score is not None:
        needed.append((job.score.field, "score.field"))
    for name, used_by in needed:
        if name not in header:
            hint = suggest(name, header, "fields")
            raise JobFileError(f"{where}: {used_by} names field '{name}', which rows lack{hint}")
    return source


def plan_job(job: JobSpec, model: str, source: InputFile | None) -> Iterator[Planned | Rejected]:
    """Every request of `job` in input order (n per row), and every row that cannot run."""
    for line, row in _rows(job, source):
        if row.problem is not None or row.fields is None:
            yield Rejected(job.name, line, None, row.problem or "unreadable row")
            continue
        try:
            custom_id = _custom_id(job, source, line, row.fields)
        except (KeyError, ValueError) as exc:
            yield Rejected(job.name, line, None, _reason(exc, "id"))
            continue
        try:
            prompt, sampling = _prompt_and_sampling(job, source, row.fields)
            options = _options(job, source, row.fields)
        except (KeyError, ValueError, TypeError) as exc:
            yield Rejected(job.name, line, custom_id, _reason(exc, "template"))
            continue
        expected = group = None
        if job.score is not None:
            expected = _text(row.fields.get(job.score.field))
            group = _text(row.fields.get(job.score.group))
        for sample in range(job.n):
            params = dict(sampling)
            if params.get("seed") is not None:
                params["seed"] += sample
            yield Planned(
                job=job.name,
                custom_id=custom_id,
                sample=sample,
                line=line,
                prompt=prompt,
                sampling=params,
                key=request_key(model, job, custom_id, sample, prompt, params, options),
                scored=job.score is not None,
                expected=expected,
                group=group,
                chat_template_kwargs=job.chat_template_kwargs,
                options=options,
            )


def request_key(
    model: str,
    job: JobSpec,
    custom_id: str,
    sample: int,
    prompt: Prompt,
    sampling: dict,
    options: dict[str, Any] | None = None,
) -> str:
    """A stable hash of everything that decides this request's output (template variables and
    reply constraints only when set, so keys written before they existed still match)."""
    parts = [model, job.name, custom_id, sample, job.chat, prompt, sampling]
    if job.chat_template_kwargs:
        parts.append(job.chat_template_kwargs)
    if options:
        parts.append(options)
    blob = json.dumps(
        parts,
        sort_keys=True,
        ensure_ascii=False,
    )
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:32]


def _rows(job: JobSpec, source: InputFile | None) -> Iterator[tuple[int, Row]]:
    if source is not None:
        for row in source.rows():
            yield row.line, row
        return
    for i, item in enumerate(job.prompts or ()):
        fields = {"prompt": item} if isinstance(item, str) else dict(item)
        yield i + 1, Row(i + 1, fields)


def _custom_id(job: JobSpec, source: InputFile | None, line: int, fields: dict) -> str:
    if source is not None and source.format == "openai":
        value = fields.get("custom_id")
        if not isinstance(value, (str, int)) or isinstance(value, bool) or value == "":
            raise ValueError("custom_id must be a non-empty string")
        return str(value)
    if job.input is not None and job.input.id is not None:
        return render(job.input.id, fields)
    value = fields.get("id")
    return str(line) if value is None or value == "" else str(value)


def _prompt_and_sampling(
    job: JobSpec, source: InputFile | None, fields: dict
) -> tuple[Prompt, dict[str, Any]]:
    sampling = dict(job.sampling)
    if source is not None and source.format == "openai":
        prompt = _openai_prompt(fields)
        body = fields["body"]
        overrides = {k: v for k, v in body.items() if k in SAMPLING_KEYS}
        if "max_completion_tokens" in body:
            overrides["max_tokens"] = body["max_completion_tokens"]
        if isinstance(overrides.get("stop"), str):
            overrides["stop"] = [overrides["stop"]]
        sampling.update(overrides)
    elif job.template is not None:
        prompt = _chat(job, render(job.template, fields))
    elif "messages" in fields:
        prompt = fields["messages"]
    else:
        prompt = _chat(job, _text(fields["prompt"]) or "")
    if isinstance(prompt, list):
        if not job.chat:
            raise ValueError("the row has chat messages but the job sets chat: false")
        if problem := message_problem(prompt):
            raise ValueError(problem)
    SamplingParams(**sampling)  # ValueError names the bad parameter
    return prompt, sampling


def _options(job: JobSpec, source: InputFile | None, fields: dict) -> dict[str, Any] | None:
    """The job's constraint, or an OpenAI-batch row's own response_format / guided_* / tools
    (checked here as far as they can be without the model); a row with none of its own gets the
    job's."""
    if source is None or source.format != "openai":
        return job.options
    options = {k: v for k, v in fields["body"].items() if k in OPTION_FIELDS and v is not None}
    structured_output(options)
    if options.get("tools"):
        check_tools(options["tools"])
    return options or job.options


def _openai_prompt(fields: dict) -> Prompt:
    body, url = fields.get("body"), fields.get("url", OPENAI_URLS[0])
    if not isinstance(body, dict):
        raise ValueError("'body' must be a JSON object")
    if url not in OPENAI_URLS:
        raise ValueError(f"unsupported url {url!r}; use {' or '.join(OPENAI_URLS)}")
    if url == "/v1/completions":
        if not isinstance(body.get("prompt"), str):
            raise ValueError("a /v1/completions body needs a string 'prompt'")
        return body["prompt"]
    if "messages" not in body:
        raise ValueError("a /v1/chat/completions body needs 'messages'")
    return body["messages"]


def _chat(job: JobSpec, text: str) -> Prompt:
    """A user message (after the job's system message) or, with chat: false, the raw text."""
    if not job.chat:
        return text
    messages = [{"role": "system", "content": job.system}] if job.system else []
    return [*messages, {"role": "user", "content": text}]


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _reason(exc: Exception, used_by: str) -> str:
    if isinstance(exc, KeyError):
        return f"row has no field {exc.args[0]!r} (named by the {used_by})"
    return str(exc)
