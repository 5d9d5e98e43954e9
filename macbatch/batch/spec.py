"""The job file: schema, validation and the resolved job descriptions the runner works from.

Everything a typo can break is checked here, before any input is read or any model is loaded, and
every message names the file, line and column, and suggests the key the user probably meant.
"""

from __future__ import annotations

import difflib
import json
import string
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from macbatch.batch.pooled import TASKS
from macbatch.batch.yamlfile import JobFileError, LoadedYaml, PathKey, load_yaml
from macbatch.engine import check_chat_template_kwargs
from macbatch.engine.config import check_speculative
from macbatch.metal.quant import check_kv_quantization
from macbatch.openai import SAMPLING_FIELDS, Defaults, InvalidRequest, sampling_params
from macbatch.openai.embeddings import parse_embeddings
from macbatch.openai.messages import chat_messages
from macbatch.openai.options import structured_output

TOP_KEYS = ("version", "model", "kv_bits", "speculative", "defaults", "output", "jobs")
SPECULATIVE_KEYS = ("method", "draft_model", "num_tokens")
STRUCTURED_KEYS = ("response_format", "schema", "choices")
SETTING_KEYS = (
    "system",
    "template",
    "sampling",
    "n",
    "chat",
    "score",
    "chat_template_kwargs",
    "task",
    "embedding",
    "instruction",
    "images",
    *STRUCTURED_KEYS,
)
JOB_KEYS = ("name", "input", "prompts", "vectors", *SETTING_KEYS)
# a task: embed job's `embedding:` takes the OpenAI embeddings body's fields (bar the input)
VECTOR_FORMATS = (".npy", ".safetensors")
EMBEDDING_KEYS = (
    "dimensions",
    "normalize",
    "pooling",
    "truncate",
    "prompt_name",
    "encoding_format",
)
INPUT_KEYS = ("path", "format", "id", "folder", "glob")
OUTPUT_KEYS = ("dir",)
SCORE_KEYS = ("field", "group", "parsed")
INPUT_FORMATS = ("csv", "tsv", "jsonl", "openai")
SAMPLING_KEYS = SAMPLING_FIELDS  # a job's `sampling:` takes exactly SamplingParams' fields
MAX_SAMPLES = 10_000  # a job's n: samples per row (n: 1e9 would plan for days before one ran)
# The job file's defaults table: what `sampling:` means when it leaves a key out (OpenAI-batch
# rows are API bodies and take the API's defaults instead, as serve does).
JOB_DEFAULTS = Defaults(temperature=0.7, max_tokens=512)
DEFAULT_SAMPLING: dict[str, Any] = {
    "temperature": JOB_DEFAULTS.temperature,
    "max_tokens": JOB_DEFAULTS.max_tokens,
}
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


@dataclass(frozen=True)
class JobSpec:
    """One job with the file's defaults already merged in."""

    name: str
    index: int
    input: InputSpec | None
    prompts: tuple[Any, ...] | None
    template: str | None
    system: str | None
    given_sampling: dict[str, Any]  # `sampling:` as written (defaults and job merged)
    n: int
    chat: bool
    score: ScoreSpec | None
    chat_template_kwargs: dict[str, Any] | None = None  # variables for the model's chat template
    options: dict[str, Any] | None = None  # the reply's constraint, as request fields
    task: str = "generate"  # or embed, rerank (docs/embeddings.md)
    embedding: dict[str, Any] | None = None  # a task: embed job's embeddings body fields
    instruction: str | None = None  # a task: rerank job's task line for the reranker
    vectors: Path | None = None  # a task: embed job's float32 matrix (.npy), input row order
    # Images shown before each row's text: path templates (`"{path}"`), relative to `image_dir`
    # (the job file's folder).
    images: tuple[str, ...] = ()
    image_dir: Path | None = None

    @property
    def sampling(self) -> dict[str, Any]:
        """The job's sampling with the job file's defaults under what it gives."""
        return {**DEFAULT_SAMPLING, **self.given_sampling}

    def settings(self, model: str) -> dict[str, Any]:
        """Everything that changes this job's results, as plain data (compared on resume)."""
        return (
            {
                "model": model,
                "input": None
                if self.input is None
                else {
                    "path": str(self.input.path.resolve()),
                    "format": self.input.format,
                    "id": self.input.id,
                    **({"glob": self.input.glob} if self.input.format == "folder" else {}),
                },
                "template": self.template,
                "system": self.system,
                "sampling": self.sampling,
                "n": self.n,
                "chat": self.chat,
                **(
                    {"chat_template_kwargs": self.chat_template_kwargs}
                    if self.chat_template_kwargs
                    else {}
                ),
            }
            | ({"options": self.options} if self.options else {})
            | self._pooling_settings()
            | ({"images": list(self.images)} if self.images else {})
        )

    def _pooling_settings(self) -> dict[str, Any]:
        if self.task == "generate":
            return {}
        return {"task": self.task, "embedding": self.embedding, "instruction": self.instruction}


@dataclass(frozen=True)
class JobFile:
    """A validated job file."""

    path: Path
    model: str
    output_dir: Path
    jobs: tuple[JobSpec, ...]
    kv_bits: int | None = None  # quantized KV pages (8 or 4), None: float
    # speculative decoding: EngineConfig's speculative fields (None: off; docs/speculative.md)
    speculative: dict[str, Any] | None = None


def dotted(key: PathKey) -> str:
    """`("jobs", 1, "sampling")` -> `jobs[1].sampling`."""
    text = ""
    for part in key:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else part)
    return text or "the top level"


def suggest(name: str, choices: tuple[str, ...], what: str = "keys") -> str:
    """`; did you mean 'x'?` when a close match exists, else the list of valid names."""
    close = difflib.get_close_matches(name, choices, n=1, cutoff=0.6)
    if close:
        return f"; did you mean '{close[0]}'?"
    return f" (valid {what}: {', '.join(choices)})"


def message_problem(messages: Any) -> str | None:
    """Why ``messages`` is not a chat the request layer accepts (as serve would say), or None."""
    try:
        chat_messages(messages)
    except InvalidRequest as exc:
        return str(exc)
    return None


class _Checker:
    """Validation helpers that know where each value sits in the YAML file."""

    def __init__(self, loaded: LoadedYaml) -> None:
        self.loaded = loaded

    def fail(self, key: PathKey, message: str) -> JobFileError:
        return JobFileError(f"{self.loaded.where(key)}: {message}")

    def mapping(self, value: Any, key: PathKey, allowed: tuple[str, ...]) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(key, f"{dotted(key)} must be a mapping of keys to values")
        for name in value:
            if str(name) not in allowed:
                raise self.fail(
                    (*key, str(name)),
                    f"unknown key '{name}' in {dotted(key)}{suggest(str(name), allowed)}",
                )
        return value

    def text(self, value: Any, key: PathKey, *, empty_ok: bool = False) -> str:
        if not isinstance(value, str) or (not empty_ok and not value.strip()):
            raise self.fail(key, f"{dotted(key)} must be a non-empty string, got {value!r}")
        return value

    def integer(
        self, value: Any, key: PathKey, minimum: int, maximum: int | None = None, why: str = ""
    ) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise self.fail(key, f"{dotted(key)} must be an integer >= {minimum}, got {value!r}")
        if maximum is not None and value > maximum:
            raise self.fail(key, f"{dotted(key)} must be at most {maximum:,}, got {value:,}{why}")
        return value

    def boolean(self, value: Any, key: PathKey) -> bool:
        if not isinstance(value, bool):
            raise self.fail(key, f"{dotted(key)} must be true or false, got {value!r}")
        return value

    def template(self, value: Any, key: PathKey) -> str:
        text = self.text(value, key)
        try:
            template_fields(text)
        except ValueError as exc:
            raise self.fail(key, f"{dotted(key)}: {exc}") from None
        return text


def template_fields(template: str) -> list[str]:
    """The row fields a template names, in order; ValueError for anything but plain `{name}`."""
    names = []
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:
        hint = "write a literal brace as {{ or }}"
        raise ValueError(f"bad template {template!r}: {exc} ({hint})") from None
    for _, name, spec, conversion in parsed:
        if name is None:
            continue
        if not name:
            raise ValueError("empty field {} in template; name a field of the input row: {text}")
        if spec or conversion or any(c in name for c in ".[]"):
            raise ValueError(f"template field {{{name}}} must be a plain field name like {{text}}")
        names.append(name)
    return names


def render(template: str, row: dict[str, Any]) -> str:
    """Fill `{name}` fields from `row` (KeyError for a missing field); lists and dicts as JSON."""
    parts = []
    for literal, name, _, _ in string.Formatter().parse(template):
        parts.append(literal)
        if name is not None:
            value = row[name]
            if isinstance(value, (dict, list)):
                value = json.dumps(value, ensure_ascii=False)
            parts.append("" if value is None else str(value))
    return "".join(parts)


def load_job_file(path: Path, model_override: str | None = None) -> JobFile:
    """Read and validate a job file; raises JobFileError with file:line:column on any problem."""
    loaded = load_yaml(path)
    check = _Checker(loaded)
    if loaded.data is None:
        raise JobFileError(f"{path}: the job file is empty; see docs/jobs.md for an example")
    top = check.mapping(loaded.data, (), TOP_KEYS)
    version = top.get("version", 1)
    if version != 1:
        raise check.fail(("version",), f"unsupported version {version!r}; this macbatch reads 1")
    base = path.parent
    if model_override:
        model = _resolve_model(model_override, Path.cwd())
    elif "model" in top:
        model = _resolve_model(check.text(top["model"], ("model",)), base)
    else:
        raise check.fail((), "missing 'model' (a Hugging Face id, a local path, or demo)")
    kv_bits = top.get("kv_bits")
    try:
        check_kv_quantization(kv_bits, None)
    except ValueError as exc:
        raise check.fail(("kv_bits",), str(exc)) from None
    speculative = _speculative(check, top["speculative"], base) if "speculative" in top else None
    output = check.mapping(top.get("output", {}), ("output",), OUTPUT_KEYS)
    output_dir = base / check.text(output.get("dir", "out"), ("output", "dir"))
    defaults = check.mapping(top.get("defaults", {}), ("defaults",), SETTING_KEYS)
    if "jobs" not in top:
        raise check.fail((), "missing 'jobs' (a list of jobs, each with a name)")
    jobs = top["jobs"]
    if not isinstance(jobs, list) or not jobs:
        raise check.fail(("jobs",), "'jobs' must be a non-empty list of jobs")
    specs: list[JobSpec] = []
    seen: dict[str, int] = {}
    for index, raw in enumerate(jobs):
        spec = _job(check, raw, index, defaults, base)
        if spec.name in seen:
            raise check.fail(
                ("jobs", index, "name"),
                f"duplicate job name '{spec.name}' (also jobs[{seen[spec.name]}]); "
                "job names must be unique because they name the output files",
            )
        seen[spec.name] = index
        specs.append(spec)
    return JobFile(
        path=path,
        model=model,
        output_dir=output_dir,
        jobs=tuple(specs),
        kv_bits=kv_bits,
        speculative=speculative,
    )


def _speculative(check: _Checker, raw: Any, base: Path) -> dict[str, Any]:
    """``speculative: {method, draft_model, num_tokens}`` as EngineConfig fields."""
    key: PathKey = ("speculative",)
    given = check.mapping(raw, key, SPECULATIVE_KEYS)
    method = given.get("method", "draft" if "draft_model" in given else "ngram")
    if method is False:  # YAML reads a bare off as false
        method = "off"
    num_tokens = given.get("num_tokens", 4)
    draft = given.get("draft_model")
    try:
        check_speculative(method, num_tokens)
    except ValueError as exc:
        raise check.fail(key, str(exc)) from None
    if (method == "draft") != (draft is not None):
        raise check.fail(key, "a draft_model goes with method draft, and method draft needs one")
    if draft is not None:
        draft = _resolve_model(check.text(draft, (*key, "draft_model")), base)
    return {"speculative": method, "draft_model": draft, "num_speculative_tokens": num_tokens}


def _resolve_model(model: str, base: Path) -> str:
    """A relative path in the job file is relative to the file; hub ids and 'demo' pass through."""
    if model == "demo":
        return model
    if model.startswith(("/", "./", "../", "~")):
        return str((base / Path(model).expanduser()).resolve())
    candidate = base / model
    return str(candidate.resolve()) if candidate.exists() else model


def _job(check: _Checker, raw: Any, index: int, defaults: dict[str, Any], base: Path) -> JobSpec:
    key: PathKey = ("jobs", index)
    job = check.mapping(raw, key, JOB_KEYS)
    if "name" not in job:
        raise check.fail(key, f"jobs[{index}] has no 'name'")
    name = check.text(job["name"], (*key, "name"))
    if any(c in name for c in "/\\\0") or name.startswith("."):
        raise check.fail(
            (*key, "name"),
            f"job name '{name}' must work as a file name (<name>.jsonl): "
            "use letters, digits, - and _",
        )
    has_input, has_prompts = "input" in job, "prompts" in job
    if has_input == has_prompts:
        raise check.fail(key, f"job '{name}' needs exactly one of 'input' (a file) or 'prompts'")

    def setting(field: str) -> tuple[Any, PathKey] | None:
        if field in job:
            return job[field], (*key, field)
        if field in defaults:
            return defaults[field], ("defaults", field)
        return None

    given_sampling: dict[str, Any] = {}
    for source, where in (
        (defaults.get("sampling"), ("defaults", "sampling")),
        (job.get("sampling"), (*key, "sampling")),
    ):
        if source is not None:
            given_sampling.update(_sampling(check, source, where))
    template = system = score = None
    n, chat = 1, True
    if (found := setting("template")) is not None:
        template = check.template(*found)
    if (found := setting("system")) is not None:
        system = check.text(*found, empty_ok=True)
    if (found := setting("n")) is not None:
        n = check.integer(
            *found,
            minimum=1,
            maximum=MAX_SAMPLES,
            why=" (samples of each row; for more, repeat the rows or split the job)",
        )
    if (found := setting("chat")) is not None:
        chat = check.boolean(*found)
    if (found_score := setting("score")) is not None:
        score = _score(check, *found_score)
    template_kwargs = None
    if (found := setting("chat_template_kwargs")) is not None:
        template_kwargs = _template_kwargs(check, *found)
        if template_kwargs and not chat:
            raise check.fail(
                found[1], "chat_template_kwargs needs the chat template; chat is false"
            )
    options = _structured(check, job, key, defaults, base)
    images: tuple[str, ...] = ()
    if (found := setting("images")) is not None:
        images = _images(check, *found, chat)
    pooling = _pooling(check, job, key, setting, base)
    if pooling["task"] != "generate" and (score is not None or options or n != 1):
        raise check.fail(
            key, f"job '{name}' has task: {pooling['task']}; 'score', 'n' and reply formats are "
            "for generation"
        )  # fmt: skip
    spec_input = prompts = None
    if has_input:
        spec_input = _input(check, job["input"], (*key, "input"), base)
    else:
        prompts = _prompts(check, job["prompts"], (*key, "prompts"), score, chat)
        if "template" in job:
            raise check.fail(
                (*key, "template"),
                "'template' applies to rows of an input file; inline prompts are used as written",
            )
    # A JSON-lines file may be an OpenAI batch whose rows ask for JSON themselves.
    rows_may_ask = spec_input is not None and spec_input.format not in ("csv", "tsv", "folder")
    parsed_unreadable = not rows_may_ask and not _replies_are_json(options)
    if found_score is not None and score is not None and score.parsed and parsed_unreadable:
        at = (*found_score[1], "parsed")
        raise check.fail(
            at,
            f"{dotted(at)} scores a field of the reply's JSON, but nothing makes job '{name}' "
            "reply in JSON: give it a 'schema' (or 'response_format: {type: json_object}'), or "
            "drop 'parsed' to score the whole reply",
        )
    return JobSpec(
        name=name,
        index=index,
        input=spec_input,
        prompts=prompts,
        template=template if has_input else None,  # inline prompts are used as written
        system=system,
        given_sampling=given_sampling,
        n=n,
        chat=chat,
        score=score,
        chat_template_kwargs=template_kwargs,
        options=options,
        images=images,
        image_dir=base if images else None,
        **pooling,
    )


def _images(check: _Checker, raw: Any, key: PathKey, chat: bool) -> tuple[str, ...]:
    """`images:`: one path template or a list of them (docs/vision.md)."""
    if not chat:
        raise check.fail(key, "images need the chat template; chat is false")
    listed = raw if isinstance(raw, list) else [raw]
    if not listed:
        raise check.fail(key, f"{dotted(key)} must be a path or a non-empty list of paths")
    return tuple(check.template(value, (*key, i)) for i, value in enumerate(listed))


def _pooling(
    check: _Checker,
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


def _template_kwargs(check: _Checker, raw: Any, key: PathKey) -> dict[str, Any] | None:
    """Template variables, checked by the engine's own rule (a chat job's setting only)."""
    try:
        return check_chat_template_kwargs(raw) or None
    except ValueError as exc:
        raise check.fail(key, f"{dotted(key)}: {exc}") from None


def _structured(
    check: _Checker, job: dict[str, Any], key: PathKey, defaults: dict[str, Any], base: Path
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


def _replies_are_json(options: dict[str, Any] | None) -> bool:
    """Whether the job's constraint makes every reply a JSON value (the only replies whose
    fields ``score.parsed`` can read)."""
    structured = structured_output(options) if options else None
    return structured is not None and structured.schema is not None


def _schema_file(check: _Checker, path: Path, at: PathKey) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise check.fail(at, f"cannot read the schema file {path}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise check.fail(at, f"{path} is not valid JSON: {exc}") from None


def _sampling(check: _Checker, raw: Any, key: PathKey) -> dict[str, Any]:
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


def _score(check: _Checker, raw: Any, key: PathKey) -> ScoreSpec:
    score = check.mapping(raw, key, SCORE_KEYS)
    if "field" not in score:
        raise check.fail(key, f"{dotted(key)} needs 'field': the row field holding the answer")
    field = check.text(score["field"], (*key, "field"))
    group = check.text(score.get("group", DEFAULT_GROUP_FIELD), (*key, "group"))
    parsed = check.text(score["parsed"], (*key, "parsed")) if "parsed" in score else None
    return ScoreSpec(field=field, group=group, parsed=parsed)


def _input(check: _Checker, raw: Any, key: PathKey, base: Path) -> InputSpec:
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


def _folder(check: _Checker, spec: dict[str, Any], key: PathKey, base: Path) -> InputSpec:
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


def _prompts(
    check: _Checker, raw: Any, key: PathKey, score: ScoreSpec | None, chat: bool
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
