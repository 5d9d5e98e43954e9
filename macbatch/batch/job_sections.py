"""The sections of one job in a job file, each checked where it sits: its input (a file, a
folder, inline prompts), sampling, scoring, reply format, images and embedding settings."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from macbatch.batch.pooled import TASKS
from macbatch.batch.yaml_checks import YamlChecker, dotted, suggest
from macbatch.batch.yamlfile import PathKey
from macbatch.engine import check_chat_template_kwargs
from macbatch.openai import (
    SAMPLING_FIELDS,
    Defaults,
    InvalidRequest,
    choice_params,
    sampling_params,
)
from macbatch.openai.embeddings import parse_embeddings
from macbatch.openai.messages import chat_messages
from macbatch.openai.options import structured_output

STRUCTURED_KEYS = ("response_format", "schema", "choices")
# a task: embed job's `embedding:` takes the OpenAI embeddings body's fields (bar the input)
VECTOR_FORMATS = (".npy", ".safetensors")
EMBEDDING_KEYS = (
    "dimensions",
    "normalize",
    "pooling",
    "truncate",
    "prompt_name",
    "encoding_format",
    "return_sparse",  # BGE-M3's sparse weights and ColBERT vectors, in the result lines
    "return_colbert_vecs",
)
INPUT_KEYS = ("path", "format", "id", "folder", "glob")
SCORE_KEYS = ("field", "group", "parsed")
INPUT_FORMATS = ("csv", "tsv", "jsonl", "openai")
SAMPLING_KEYS = SAMPLING_FIELDS  # a job's `sampling:` takes exactly SamplingParams' fields
# The job file's defaults table: what `sampling:` means when it leaves a key out (OpenAI-batch
# rows are API bodies and take the API's defaults instead, as serve does).
JOB_DEFAULTS = Defaults(temperature=0.7, max_tokens=512)
DEFAULT_GROUP_FIELD = "task"


@dataclass(frozen=True)
class InputSpec:
    """A file of rows: where it is, how to read it, and how to name each row."""

    path: Path
    format: str
    id: str | None
    glob: str = "*"  # format "folder": which files of the folder are rows


@dataclass(frozen=True)
class ScoreSpec:
    """Exact-match scoring of each reply (or of field `parsed` of its parsed JSON) against
    `field` of its row, grouped by `group`."""

    field: str
    group: str
    parsed: str | None = None


def message_problem(messages: Any) -> str | None:
    """Why ``messages`` is not a chat the request layer accepts (as serve would say), or None."""
    try:
        chat_messages(messages)
    except InvalidRequest as exc:
        return str(exc)
    return None


def job_images(check: YamlChecker, raw: Any, key: PathKey, chat: bool) -> tuple[str, ...]:
    """`images:`: one path template or a list of them (docs/vision.md)."""
    if not chat:
        raise check.fail(key, "images need the chat template; chat is false")
    listed = raw if isinstance(raw, list) else [raw]
    if not listed:
        raise check.fail(key, f"{dotted(key)} must be a path or a non-empty list of paths")
    return tuple(check.template(value, (*key, i)) for i, value in enumerate(listed))


def job_pooling(
    check: YamlChecker,
    job: dict[str, Any],
    key: PathKey,
    setting: Callable[[str], tuple[Any, PathKey] | None],
    base: Path,
) -> dict[str, Any]:
    """A job's task and its embedding settings, instruction and vectors file, checked."""
    task, embedding, instruction = "generate", None, None
    if (found := setting("task")) is not None:
        task = check.text(*found)
        if task not in TASKS:
            raise check.fail(found[1], f"task must be one of {', '.join(TASKS)}; got {task!r}")
    if (found := setting("embedding")) is not None:
        embedding = check.mapping(found[0], found[1], EMBEDDING_KEYS)
        try:
            parse_embeddings({**embedding, "input": "x"})
        except InvalidRequest as exc:
            raise check.fail(found[1], str(exc)) from None
    if (found := setting("instruction")) is not None:
        instruction = check.text(*found)
    vectors = None
    if "vectors" in job:
        where = (*key, "vectors")
        if task != "embed":
            raise check.fail(where, "'vectors' is the matrix of a task: embed job")
        vectors = base / check.text(job["vectors"], where)
        if vectors.suffix not in VECTOR_FORMATS:
            raise check.fail(
                where, f"'vectors' must name a .npy or .safetensors file, got {vectors.name}"
            )
    return {"task": task, "embedding": embedding, "instruction": instruction, "vectors": vectors}


def job_template_kwargs(check: YamlChecker, raw: Any, key: PathKey) -> dict[str, Any] | None:
    """Template variables, checked by the engine's own rule (a chat job's setting only)."""
    try:
        return check_chat_template_kwargs(raw) or None
    except ValueError as exc:
        raise check.fail(key, f"{dotted(key)}: {exc}") from None


def job_structured(
    check: YamlChecker, job: dict[str, Any], key: PathKey, defaults: dict[str, Any], base: Path
) -> dict[str, Any] | None:
    """The job's reply constraint (or the defaults'), as the request fields it stands for:
    ``schema`` (inline, or a .json file) -> guided_json, ``choices`` -> guided_choice."""

    source, where = (
        (job, key) if any(k in job for k in STRUCTURED_KEYS) else (defaults, ("defaults",))
    )
    given = [k for k in STRUCTURED_KEYS if k in source]
    if not given:
        return None
    if len(given) > 1:
        raise check.fail((*where, given[1]), f"use one of {', '.join(given)}, not both")
    name = given[0]
    value, at = source[name], (*where, name)
    if name == "schema":
        if isinstance(value, str):
            value = _schema_file(check, base / Path(value).expanduser(), at)
        if not isinstance(value, dict):
            raise check.fail(at, f"{dotted(at)} must be a JSON schema mapping or a .json file")
        options: dict[str, Any] = {"guided_json": value}
    elif name == "choices":
        if not isinstance(value, list) or not all(isinstance(c, str) and c for c in value):
            raise check.fail(at, f"{dotted(at)} must be a list of non-empty strings")
        options = {"guided_choice": value}
    else:
        options = {"response_format": value}
    try:
        structured_output(options)
    except InvalidRequest as exc:
        raise check.fail(at, f"{dotted(at)}: {exc}") from None
    return options


def replies_are_json(options: dict[str, Any] | None) -> bool:
    """Whether the job's constraint makes every reply a JSON value (the only replies whose
    fields ``score.parsed`` can read)."""
    structured = structured_output(options) if options else None
    return structured is not None and structured.schema is not None


def _schema_file(check: YamlChecker, path: Path, at: PathKey) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise check.fail(at, f"cannot read the schema file {path}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise check.fail(at, f"{path} is not valid JSON: {exc}") from None


def job_sampling(check: YamlChecker, raw: Any, key: PathKey) -> dict[str, Any]:
    """Sampling keys checked by name here and by value through the engine's SamplingParams."""
    values = dict(check.mapping(raw, key, SAMPLING_KEYS))
    for name in ("stop", "stop_token_ids"):
        if isinstance(values.get(name), str):
            values[name] = [values[name]]
        if name in values and not isinstance(values[name], list):
            raise check.fail((*key, name), f"{dotted((*key, name))} must be a list")
    try:
        sampling_params(values, JOB_DEFAULTS)
    except InvalidRequest as exc:
        bad = exc.param if exc.param in values else None
        raise check.fail((*key, bad) if bad else key, f"{dotted(key)}: {exc}") from None
    return values


def job_seeds(check: YamlChecker, sampling: dict[str, Any], at: PathKey, n: int) -> None:
    """Refuse a seed whose ``n`` samples' seeds (seed + i) pass the seeds' range when the file
    loads, not on the first row after the model loaded (``at``: where the seed is written)."""
    try:
        choice_params(sampling_params(sampling, JOB_DEFAULTS), n)
    except InvalidRequest as exc:
        raise check.fail(at, f"{dotted(at)} with n: {n}: {exc}") from None


def job_score(check: YamlChecker, raw: Any, key: PathKey) -> ScoreSpec:
    score = check.mapping(raw, key, SCORE_KEYS)
    if "field" not in score:
        raise check.fail(key, f"{dotted(key)} needs 'field': the row field holding the answer")
    field = check.text(score["field"], (*key, "field"))
    group = check.text(score.get("group", DEFAULT_GROUP_FIELD), (*key, "group"))
    parsed = check.text(score["parsed"], (*key, "parsed")) if "parsed" in score else None
    return ScoreSpec(field=field, group=group, parsed=parsed)


def job_input(check: YamlChecker, raw: Any, key: PathKey, base: Path) -> InputSpec:
    if isinstance(raw, str):
        raw = {"path": raw}
    spec = check.mapping(raw, key, INPUT_KEYS)
    if "folder" in spec:
        return _folder(check, spec, key, base)
    if "path" not in spec:
        raise check.fail(key, f"{dotted(key)} needs 'path': the csv or jsonl file to read")
    path = base / Path(check.text(spec["path"], (*key, "path"))).expanduser()
    if "format" in spec:
        fmt = check.text(spec["format"], (*key, "format"))
        if fmt not in INPUT_FORMATS:
            raise check.fail(
                (*key, "format"),
                f"unknown input format '{fmt}'{suggest(fmt, INPUT_FORMATS, 'formats')}",
            )
    else:
        guessed = _guess_format(path)
        if guessed is None:
            raise check.fail(
                (*key, "path"),
                f"cannot tell the format of '{path.name}' from its extension; "
                f"add format: (one of {', '.join(INPUT_FORMATS)})",
            )
        fmt = guessed
    if not path.is_file():
        raise check.fail((*key, "path"), f"input file not found: {path}")
    id_pattern = None
    if "id" in spec:
        id_pattern = check.template(spec["id"], (*key, "id"))
    return InputSpec(path=path, format=fmt, id=id_pattern)


def _folder(check: YamlChecker, spec: dict[str, Any], key: PathKey, base: Path) -> InputSpec:
    """`input: {folder, glob}`: one row per matching file (docs/vision.md)."""
    extra = sorted(set(spec) - {"folder", "glob", "id"})
    if extra:
        raise check.fail((*key, extra[0]), f"{dotted(key)}: a folder input takes folder, glob, id")
    folder = base / Path(check.text(spec["folder"], (*key, "folder"))).expanduser()
    if not folder.is_dir():
        raise check.fail((*key, "folder"), f"input folder not found: {folder}")
    glob = check.text(spec.get("glob", "*"), (*key, "glob"))
    id_pattern = check.template(spec["id"], (*key, "id")) if "id" in spec else None
    return InputSpec(path=folder, format="folder", id=id_pattern, glob=glob)


def _guess_format(path: Path) -> str | None:
    suffix = path.suffix.lower()
    if suffix == ".csv":
        return "csv"
    if suffix == ".tsv":
        return "tsv"
    if suffix in (".jsonl", ".ndjson", ".json"):
        return "jsonl"  # refined to "openai" from the first row by the input reader
    return None


def job_prompts(
    check: YamlChecker, raw: Any, key: PathKey, score: ScoreSpec | None, chat: bool
) -> tuple[Any, ...]:
    """Inline prompts: strings, or mappings with id and prompt or messages (+ scoring fields)."""
    if not isinstance(raw, list):
        raise check.fail(key, f"{dotted(key)} must be a list of prompts")
    if not raw:
        raise check.fail(key, f"{dotted(key)} is empty: this job has nothing to run")
    allowed = ("id", "prompt", "messages") + ((score.field, score.group) if score else ())
    items: list[str | dict[str, Any]] = []
    for i, item in enumerate(raw):
        where = (*key, i)
        if isinstance(item, str):
            items.append(check.text(item, where))
            continue
        entry = check.mapping(item, where, allowed)
        if ("prompt" in entry) == ("messages" in entry):
            raise check.fail(where, f"{dotted(where)} needs exactly one of 'prompt' or 'messages'")
        if "id" in entry and not isinstance(entry["id"], (str, int)):
            raise check.fail((*where, "id"), f"{dotted((*where, 'id'))} must be a string")
        if "prompt" in entry:
            check.text(entry["prompt"], (*where, "prompt"))
        elif not chat:
            raise check.fail((*where, "messages"), "messages need the chat template; chat is false")
        elif problem := message_problem(entry["messages"]):
            raise check.fail((*where, "messages"), f"{dotted(where)}: {problem}")
        items.append(entry)
    return tuple(items)
