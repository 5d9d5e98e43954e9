"""From job rows to engine requests: prompt rendering, ids, sampling, and the resume key.

A request's key hashes everything that decides its result (model, job, id, rendered prompt,
sampling, sample index), so a rerun can tell "already done" from "changed since".
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from macbatch.batch.inputs import InputFile, Row, open_input
from macbatch.batch.job_sections import JOB_DEFAULTS
from macbatch.batch.pending import Request
from macbatch.batch.pooled import POOLED_URLS, PooledRow, body_row, embedding_row, rerank_row
from macbatch.batch.replies import ReplyShape
from macbatch.batch.spec import JobSpec
from macbatch.batch.templates import render, template_fields
from macbatch.batch.yaml_checks import suggest
from macbatch.batch.yamlfile import JobFileError
from macbatch.engine import ModelInfo, RequestOutput, Tokenizer
from macbatch.openai import (
    SAMPLING_FIELDS,
    Endpoint,
    Generation,
    ImageAccess,
    formatter_for,
    parse_body,
)
from macbatch.openai.bodies import check_value
from macbatch.openai.options import OPTION_FIELDS
from macbatch.openai.responses_api import ResponsesRequest, parse_responses
from macbatch.openai.responses_output import ResponsesRenderer
from macbatch.openai.sampling import ALIASES

Prompt = str | list[dict[str, Any]]
RESPONSES_URL = "/v1/responses"  # a Responses body: read as the chat body it means
OPENAI_URLS = tuple(e.value for e in Endpoint)
# a job file's rows are its author's: images from any local path, and fetched from public
# http(s) addresses (never this machine's or its network's: a row copied from a dataset could
# name one); the Batch API's rows come from clients and get the server's rules instead
RUN_IMAGES = ImageAccess(remote=True, local_dirs=None)


@dataclass(frozen=True)
class Planned:
    """One line to write: sample `sample` of row `custom_id`. Its engine requests are one per
    choice of its generation (an API body's own ``n``, a completions body's prompts) or per
    input of its pooled work; the line holds them all, as serve's answer would."""

    job: str
    custom_id: str
    sample: int
    line: int
    prompt: Prompt
    sampling: dict[str, Any]  # the sampling fields as given (part of the key)
    key: str
    scored: bool
    expected: str | None
    group: str | None
    generation: Generation | None  # the request, as the request layer read it
    pooled: PooledRow | None = None  # instead of ``generation``: an embedding or scoring row
    responses: ResponsesRequest | None = None  # a /v1/responses row: its reply is a response
    adapter: str | None = None  # its job's fine-tune (None: the base model)

    def bind(self, model: ModelInfo, tokenizer: Tokenizer) -> BoundItem:
        """The engine requests for this model, and how a generated reply is read back."""
        if self.pooled is not None:
            return BoundItem(self._adapted(self.pooled.bind(model.embedding, tokenizer)), None)
        assert self.generation is not None
        bound = self.generation.bind(model.tool_format, tokenizer)
        structured = bound.requests[0][1].structured  # the body's: one for every choice
        shape = ReplyShape(structured, bound.parse_with)
        return BoundItem(self._adapted(bound.requests), shape)

    def _adapted(self, requests: tuple[Request, ...]) -> tuple[Request, ...]:
        """The requests, each naming this line's adapter."""
        if self.adapter is None:
            return requests
        return tuple((dataclasses.replace(q, adapter=self.adapter), p) for q, p in requests)

    def reply_body(
        self, outs: list[RequestOutput], shape: ReplyShape | None, model: str, decoder: Tokenizer
    ) -> dict[str, Any]:
        """The response body serve would send for these outputs (its id from the key)."""
        if self.pooled is not None:
            return self.pooled.response(outs, model)
        assert shape is not None
        if self.responses is not None:
            renderer = ResponsesRenderer(
                self.responses, shape.tool_format, model, f"resp_{self.key}"
            )
            return renderer.response(outs)
        assert self.generation is not None
        formatter = formatter_for(self.generation, shape.tool_format, model, decoder, self.key)
        return formatter.response(outs)


@dataclass(frozen=True)
class BoundItem:
    requests: tuple[Request, ...]
    shape: ReplyShape | None  # None: a pooled row (its reply is no text)


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
    elif job.task == "rerank":
        needed += [("query", "task: rerank"), ("document", "task: rerank")]
    elif job.template is not None:
        needed += [(name, "template") for name in template_fields(job.template)]
    elif "prompt" not in header and "messages" not in header:
        raise JobFileError(
            f"{where} has no 'prompt' or 'messages' field and the job has no template; "
            f"add template: naming fields of the rows (they have: {', '.join(header)})"
        )
    needed += [(name, "images") for image in job.images for name in template_fields(image)]
    if job.input.id is not None:
        needed += [(name, "input.id") for name in template_fields(job.input.id)]
    if job.score is not None:
        needed.append((job.score.field, "score.field"))
    for name, used_by in needed:
        if name not in header:
            hint = suggest(name, header, "fields")
            raise JobFileError(f"{where}: {used_by} names field '{name}', which rows lack{hint}")
    return source


def plan_job(
    job: JobSpec, model: str, source: InputFile | None, images: ImageAccess = RUN_IMAGES
) -> Iterator[Planned | Rejected]:
    """Every request of `job` in input order (n per row), and every row that cannot run.
    ``images``: where rows' image parts may come from (a job file's own: any local path and
    public http(s) URLs; the Batch API passes its server's rules instead)."""
    for line, row in _rows(job, source):
        try:
            items = _plan_row(job, model, source, line, row, images)
        except Exception as exc:  # whatever one row causes is that row's error, not the run's
            items = [Rejected(job.name, line, None, f"{type(exc).__name__}: {exc}")]
        yield from items


def _plan_row(
    job: JobSpec, model: str, source: InputFile | None, line: int, row: Row, images: ImageAccess
) -> list[Planned | Rejected]:
    if row.problem is not None or row.fields is None:
        return [Rejected(job.name, line, None, row.problem or "unreadable row")]
    try:
        custom_id = _custom_id(job, source, line, row.fields)
    except (KeyError, ValueError) as exc:
        return [Rejected(job.name, line, None, _reason(exc, "id"))]
    try:
        pooled = _pooled_request(job, source, row.fields)
        if pooled is not None:
            prompt, settings, work = pooled
            key = request_key(model, job, custom_id, 0, prompt, settings)
            return [Planned(job.name, custom_id, 0, line, prompt, settings, key, False, None,
                            None, None, work, adapter=job.adapter)]  # fmt: skip
        request = _request(job, source, row.fields, images)
    except (KeyError, ValueError, TypeError) as exc:
        return [Rejected(job.name, line, custom_id, _reason(exc, "template"))]
    expected = group = None
    if job.score is not None:
        expected = _text(row.fields.get(job.score.field))
        group = _text(row.fields.get(job.score.group))
    items: list[Planned | Rejected] = []
    for sample, generation, sampling in _samples(request):
        key = request_key(model, job, custom_id, sample, request.prompt, sampling, request.options)
        items.append(
            Planned(
                job=job.name,
                custom_id=custom_id,
                sample=sample,
                line=line,
                prompt=request.prompt,
                sampling=sampling,
                key=key,
                scored=job.score is not None,
                expected=expected,
                group=group,
                generation=generation,
                responses=request.responses,
                adapter=job.adapter,
            )
        )
    return items


def _samples(request: _RowRequest) -> list[tuple[int, Generation, dict[str, Any]]]:
    """The row's lines: (sample, its generation, its sampling as keyed). A body's own ``n`` is
    one line holding its n choices, as serve answers the body (n joins the key when it is not
    1); the job's ``n`` is that many samples, each its own line (seeds seed, seed + 1 ...)."""
    generation, sampling = request.generation, request.sampling
    if request.own_n:
        return [(0, generation, sampling | ({"n": generation.n} if generation.n != 1 else {}))]
    samples = []
    for sample, params in enumerate(generation.choice_params()):
        seeded = dict(sampling)
        if seeded.get("seed") is not None:
            seeded["seed"] += sample
        samples.append((sample, dataclasses.replace(generation, n=1, params=params), seeded))
    return samples


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
    if job.adapter:
        parts.append({"adapter": job.adapter})
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
        return _checked_id(str(value))
    if job.input is not None and job.input.id is not None:
        return _checked_id(render(job.input.id, fields))
    value = fields.get("id")
    return str(line) if value is None or value == "" else _checked_id(str(value))


def _checked_id(value: str) -> str:
    check_value(value, "the row's id")  # it goes into the key, the ledger and the output
    return value


@dataclass(frozen=True)
class _RowRequest:
    """A row read as a request body, and the parts of it that go into its key."""

    prompt: Prompt
    sampling: dict[str, Any]
    options: dict[str, Any] | None
    generation: Generation  # n choices: the body's own (``own_n``), else the row's samples
    responses: ResponsesRequest | None = None  # a /v1/responses row, as read
    own_n: bool = False  # an API body that says its ``n``


def _request(
    job: JobSpec, source: InputFile | None, fields: dict, images: ImageAccess
) -> _RowRequest:
    """The row as an OpenAI body, read by the one request layer. An OpenAI-batch row is an API
    body (the API's defaults, with the job's written `sampling:` under it, and the job's
    constraint if it has none of its own); other rows become bodies with the job's settings."""
    if source is not None and source.format == "openai" and fields.get("url") == RESPONSES_URL:
        return _responses_request(job, fields.get("body"), images)
    if source is not None and source.format == "openai":
        endpoint, body = _openai_body(fields)
        sampling = {**job.given_sampling, **_sampling_fields(body)}
        own = {k: v for k, v in body.items() if k in OPTION_FIELDS and v is not None}
        options = own or job.options or None
        merged = {**body, **sampling, **(options or {})}
        merged.setdefault("chat_template_kwargs", job.chat_template_kwargs)
        generation = parse_body(endpoint, merged, images=images)
        if "n" not in body:  # the job's n: samples, not bounded by a body's choice limit
            generation = dataclasses.replace(generation, n=job.n)
        if generation.prompts and isinstance(generation.prompts[0], list) and not job.chat:
            raise ValueError("the row has chat messages but the job sets chat: false")
        prompt = _body_prompt(endpoint, body)
        return _RowRequest(prompt, sampling, options, generation, own_n="n" in body)
    if job.template is not None:
        prompt = _chat(job, render(job.template, fields), fields)
    elif "messages" in fields:
        if not job.chat:
            raise ValueError("the row has chat messages but the job sets chat: false")
        prompt = fields["messages"]
    else:
        prompt = _chat(job, _text(fields["prompt"]) or "", fields)
    endpoint = Endpoint.CHAT if isinstance(prompt, list) else Endpoint.COMPLETION
    built: dict[str, Any] = {**job.sampling, **(job.options or {})}
    if endpoint is Endpoint.CHAT:
        built.update(messages=prompt, chat_template_kwargs=job.chat_template_kwargs)
    else:
        built["prompt"] = prompt
    generation = parse_body(endpoint, built, JOB_DEFAULTS, images=images)
    generation = dataclasses.replace(generation, n=job.n)
    return _RowRequest(prompt, dict(job.sampling), job.options, generation)


def _responses_request(job: JobSpec, body: Any, images: ImageAccess) -> _RowRequest:
    """A /v1/responses row: the Responses body read as the chat body it means, over the job's
    written sampling (its ``max_tokens`` as ``max_output_tokens``). A batch stores no response,
    so a row cannot continue one (``previous_response_id``) and its response says ``store:
    false``; the job's constraint and template variables are the body's own business."""
    if not isinstance(body, dict):
        raise ValueError("'body' must be a JSON object")
    if body.get("previous_response_id") is not None:
        raise ValueError(
            "previous_response_id is not supported in a batch (it stores no responses); send "
            "the whole conversation as 'input'"
        )
    if not job.chat:
        raise ValueError("a /v1/responses row is a chat request but the job sets chat: false")
    given = {
        ("max_output_tokens" if k == "max_tokens" else k): v for k, v in job.given_sampling.items()
    }
    merged = {**given, **body, "store": False}
    request = parse_responses(merged, images=images)
    generation = dataclasses.replace(request.generation, n=job.n)
    sampling = {k: v for k, v in merged.items() if k in (*SAMPLING_FIELDS, "max_output_tokens")}
    options = {k: v for k, v in merged.items() if k not in (*sampling, "input", "model")}
    return _RowRequest(request.conversation, sampling, options, generation, request)


def _pooled_request(
    job: JobSpec, source: InputFile | None, fields: dict
) -> tuple[Any, dict[str, Any], PooledRow] | None:
    """A row that pools (its task, or an OpenAI-batch row's URL): the prompt and settings that
    go into its key, and its work; None for a generation row."""
    if source is not None and source.format == "openai":
        url, body = fields.get("url"), fields.get("body")
        if url not in POOLED_URLS:
            if job.task != "generate":
                raise ValueError(
                    f"a task: {job.task} job takes rows for {' or '.join(POOLED_URLS)}"
                )
            return None
        if not isinstance(body, dict):
            raise ValueError("'body' must be a JSON object")
        settings = {k: v for k, v in body.items() if k not in ("input", "model")}
        return body.get("input", body), {"url": url, **settings}, body_row(url, body)
    if job.task == "rerank":
        query, document = _text(fields["query"]), _text(fields["document"])
        return [query, document], {"task": "rerank"}, rerank_row(query, document, job.instruction)
    if job.task == "embed":
        text = render(job.template, fields) if job.template is not None else fields["prompt"]
        settings = {"task": "embed", **(job.embedding or {})}
        return text, settings, embedding_row(text, job.embedding)
    return None


def _sampling_fields(body: dict[str, Any]) -> dict[str, Any]:
    """The sampling fields a body sets, under SamplingParams' names (for the key)."""
    given = {k: v for k, v in body.items() if k in SAMPLING_FIELDS}
    for alias, name in ALIASES.items():
        if alias in body:
            given[name] = body[alias]
    if isinstance(given.get("stop"), str):
        given["stop"] = [given["stop"]]
    return given


def _openai_body(fields: dict) -> tuple[Endpoint, dict[str, Any]]:
    body, url = fields.get("body"), fields.get("url", OPENAI_URLS[0])
    if not isinstance(body, dict):
        raise ValueError("'body' must be a JSON object")
    if url not in OPENAI_URLS:
        urls = ", ".join((*OPENAI_URLS, RESPONSES_URL, *POOLED_URLS))
        raise ValueError(f"unsupported url {url!r}; use {urls}")
    return Endpoint(url), body


def _body_prompt(endpoint: Endpoint, body: dict[str, Any]) -> Prompt:
    """The prompt as the row wrote it (for its key and its result line)."""
    return body.get("messages" if endpoint is Endpoint.CHAT else "prompt")  # type: ignore[return-value]


def _chat(job: JobSpec, text: str, fields: dict[str, Any]) -> Prompt:
    """A user message (after the job's system message; the job's images before its text) or,
    with chat: false, the raw text."""
    if not job.chat:
        return text
    messages = [{"role": "system", "content": job.system}] if job.system else []
    content: str | list[dict[str, Any]] = text
    if job.images:
        assert job.image_dir is not None
        urls = [(job.image_dir / render(image, fields)).resolve().as_uri() for image in job.images]
        parts = [{"type": "image_url", "image_url": {"url": url}} for url in urls]
        content = [*parts, {"type": "text", "text": text}]
    return [*messages, {"role": "user", "content": content}]


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _reason(exc: Exception, used_by: str) -> str:
    if isinstance(exc, KeyError):
        return f"row has no field {exc.args[0]!r} (named by the {used_by})"
    return str(exc)
