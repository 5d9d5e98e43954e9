"""``/v1/files`` and ``/v1/batches``: OpenAI's shapes over the file store, the batch records and
the batch thread. Every refusal is a 4xx in OpenAI's error shape, naming the field at fault."""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.datastructures import UploadFile
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.types import Message

from macbatch.openai.bodies import check_value
from macbatch.server.batchapi.files import too_large
from macbatch.server.batchapi.inputs import check_endpoint, count_requests
from macbatch.server.batchapi.records import ACTIVE, public
from macbatch.server.batchapi.service import BatchAPI
from macbatch.server.errors import APIError, invalid
from macbatch.server.serving import read_json, route_table, state_of

BATCH_FIELDS = ("input_file_id", "endpoint", "completion_window", "metadata")
MULTIPART_SLACK = 64 * 1024  # form fields and boundaries around the file itself
# OpenAI's bounds on a batch's metadata: pairs, a key's and a value's characters
MAX_METADATA, MAX_KEY, MAX_VALUE = 16, 64, 512


def _api(request: Request) -> BatchAPI:
    state = state_of(request)
    if state.batch_api is None:
        raise APIError(503, state.batch_api_off, code="batch_api_unavailable")
    return state.batch_api


async def upload_file(request: Request) -> Response:
    api = _api(request)
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > api.max_file_bytes + MULTIPART_SLACK:
        raise too_large(api.max_file_bytes)
    form = await _bounded(request, api.max_file_bytes).form(max_files=1, max_fields=8)
    try:
        purpose, upload = form.get("purpose"), form.get("file")
        if purpose != "batch":
            raise invalid("purpose must be 'batch' (the one purpose this server stores)", "purpose")
        if not isinstance(upload, UploadFile):
            raise invalid("send the file as multipart form field 'file'", "file")
        name = upload.filename or "upload.jsonl"
        save = api.files.save
        meta = await asyncio.to_thread(save, upload.file, name, purpose, api.max_file_bytes)
    finally:
        await form.close()
    return JSONResponse(meta)


def _bounded(request: Request, limit: int) -> Request:
    """The request with its body refused past ``limit`` (and the form's slack): a chunked upload
    declares no length, and Starlette's form parser would read it to its end (80 MiB against a
    16 MiB limit) before the file's size is checked. The 413 closes the connection, so what the
    client still sends is not read either."""
    received = 0

    async def receive() -> Message:
        nonlocal received
        message = await request.receive()
        received += len(message.get("body", b""))
        if received > limit + MULTIPART_SLACK:
            error = too_large(limit)
            error.headers["connection"] = "close"
            raise error
        return message

    return Request(request.scope, receive)


async def list_files(request: Request) -> Response:
    files = _api(request).files.all()
    purpose = request.query_params.get("purpose")
    if purpose is not None:
        files = [f for f in files if f["purpose"] == purpose]
    return JSONResponse(_page(request, files, 10_000, 10_000))


async def get_file(request: Request) -> Response:
    return JSONResponse(_api(request).files.get(request.path_params["file_id"]))


async def file_content(request: Request) -> Response:
    api, file_id = _api(request), request.path_params["file_id"]
    api.files.get(file_id)
    return FileResponse(api.files.content_path(file_id), media_type="application/octet-stream")


async def delete_file(request: Request) -> Response:
    api, file_id = _api(request), request.path_params["file_id"]
    api.files.get(file_id)
    batches = api.batches.all()
    if any(b["input_file_id"] == file_id and b["status"] in ACTIVE for b in batches):
        raise APIError(
            409,
            f"file {file_id} is the input of an unfinished batch; cancel it first",
            param="file_id",
            code="file_in_use",
        )
    api.files.delete(file_id)
    return JSONResponse({"id": file_id, "object": "file", "deleted": True})


async def create_batch(request: Request) -> Response:
    state = state_of(request)
    api = _api(request)
    body = await read_json(request, state.options.max_body_bytes)
    check_value(body)  # kept and served back: only Unicode text, nested no deeper than bodies
    unknown = sorted(set(body) - set(BATCH_FIELDS))
    if unknown:
        raise invalid(
            f"unknown field {unknown[0]!r}; a batch takes {', '.join(BATCH_FIELDS)}", unknown[0]
        )
    file_id = body.get("input_file_id")
    if not isinstance(file_id, str):
        raise invalid(
            "input_file_id must be the id of a file uploaded with purpose 'batch'", "input_file_id"
        )
    endpoint = check_endpoint(body.get("endpoint"))
    if body.get("completion_window") != "24h":
        raise invalid("completion_window must be '24h'", "completion_window")
    metadata = _metadata(body.get("metadata"))
    if api.files.get(file_id)["purpose"] != "batch":
        raise invalid(f"file {file_id} is not a batch input (purpose 'batch')", "input_file_id")
    path = api.files.content_path(file_id)
    first = state.first  # the Batch API's model
    total = await asyncio.to_thread(count_requests, path, endpoint, first.model_id, first.images)
    fields = {"endpoint": endpoint, "input_file_id": file_id, "completion_window": "24h"}
    batch = api.batches.create({**fields, "metadata": metadata}, total)
    api.worker.wake()
    return JSONResponse(public(batch))


async def get_batch(request: Request) -> Response:
    return JSONResponse(public(_api(request).batches.get(request.path_params["batch_id"])))


async def list_batches(request: Request) -> Response:
    batches = [public(b) for b in _api(request).batches.all()]
    return JSONResponse(_page(request, batches, 100, 20))


async def cancel_batch(request: Request) -> Response:
    api, batch_id = _api(request), request.path_params["batch_id"]
    batch = api.batches.get(batch_id)
    if batch["status"] not in ("validating", "in_progress", "cancelling"):
        raise APIError(
            409,
            f"batch {batch_id} is {batch['status']}; only an unfinished batch can be cancelled",
            param="batch_id",
            code="batch_not_cancellable",
        )
    batch = api.batches.set_status(batch_id, "cancelling", when=("validating", "in_progress"))
    api.worker.cancel(batch_id)
    return JSONResponse(public(batch))


def _metadata(value: Any) -> dict[str, str] | None:
    """OpenAI's rules: up to 16 pairs, keys up to 64 characters, string values up to 512."""
    if value is None:
        return None
    if not isinstance(value, dict) or len(value) > MAX_METADATA:
        raise invalid(f"metadata must be an object of up to {MAX_METADATA} pairs", "metadata")
    for key, text in value.items():
        if len(key) > MAX_KEY:
            raise invalid(f"a metadata key is at most {MAX_KEY} characters", "metadata")
        if not isinstance(text, str) or len(text) > MAX_VALUE:
            raise invalid(
                f"metadata[{key!r}] must be a string of at most {MAX_VALUE} characters",
                f"metadata.{key}",
            )
    return value


def _page(request: Request, items: list[dict[str, Any]], most: int, default: int) -> dict[str, Any]:
    """OpenAI's cursor page: ``limit`` items after the one named ``after`` (newest first);
    without a limit, files list all (up to ``most``) and batches 20, as OpenAI's do."""
    query = request.query_params
    raw = query.get("limit", str(default))
    # ASCII digits, few: int() refuses "²" and 5,000 digits with a ValueError (once a 500)
    digits = len(str(most))
    if not (raw.isascii() and raw.isdigit() and len(raw) <= digits) or not 1 <= int(raw) <= most:
        raise invalid(f"limit must be a whole number from 1 to {most}", "limit")
    after = query.get("after")
    if after is not None:
        ids = [item["id"] for item in items]
        if after not in ids:
            raise invalid(f"after names no item of this list: {after!r}", "after")
        items = items[ids.index(after) + 1 :]
    page = items[: int(raw)]
    return {
        "object": "list",
        "data": page,
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None,
        "has_more": len(items) > len(page),
    }


ROUTES = route_table(
    ("POST", "/v1/files", upload_file),
    ("GET", "/v1/files", list_files),
    ("GET", "/v1/files/{file_id}", get_file),
    ("GET", "/v1/files/{file_id}/content", file_content),
    ("DELETE", "/v1/files/{file_id}", delete_file),
    ("POST", "/v1/batches", create_batch),
    ("GET", "/v1/batches", list_batches),
    ("GET", "/v1/batches/{batch_id}", get_batch),
    ("POST", "/v1/batches/{batch_id}/cancel", cancel_batch),
)
