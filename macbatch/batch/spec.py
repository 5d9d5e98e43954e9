"""The job file: schema, validation and the resolved job descriptions the runner works from.

Everything a typo can break is checked here, before any input is read or any model is loaded, and
every message names the file, line and column, and suggests the key the user probably meant.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from macbatch.batch.job_sections import (
    JOB_DEFAULTS,
    STRUCTURED_KEYS,
    InputSpec,
    ScoreSpec,
    job_images,
    job_input,
    job_pooling,
    job_prompts,
    job_sampling,
    job_score,
    job_seeds,
    job_structured,
    job_template_kwargs,
    replies_are_json,
)
from macbatch.batch.table_files import require_pyarrow
from macbatch.batch.yaml_checks import YamlChecker, dotted
from macbatch.batch.yamlfile import JobFileError, LoadedYaml, PathKey, load_yaml
from macbatch.engine import check_indexer_keys, check_speculative
from macbatch.metal.quant import check_kv_quantization
from macbatch.models.names import UnknownModel, resolve
from macbatch.models.presets import Preset, PresetError, read_presets

TOP_KEYS = (
    "version",
    "model",
    "kv_bits",
    "indexer_keys",
    "speculative",
    "defaults",
    "output",
    "jobs",
)
SPECULATIVE_KEYS = ("method", "draft_model", "num_tokens")
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
JOB_KEYS = ("name", "model", "adapter", "input", "prompts", "vectors", *SETTING_KEYS)
OUTPUT_KEYS = ("dir", "parquet")
MAX_SAMPLES = 10_000  # a job's n: samples per row (n: 1e9 would plan for days before one ran)
DEFAULT_SAMPLING: dict[str, Any] = {
    "temperature": JOB_DEFAULTS.temperature,
    "max_tokens": JOB_DEFAULTS.max_tokens,
}


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
    # the model that runs it: its own `model:`, else the file's (the Batch API's: the server's)
    model: str = ""
    # its fine-tune: an adapter directory (mlx-lm's or PEFT's), None: the base model; the jobs of
    # one model run in the same batches whichever adapter each names (docs/jobs.md)
    adapter: str | None = None

    @property
    def sampling(self) -> dict[str, Any]:
        """The job's sampling with the job file's defaults under what it gives."""
        return {**DEFAULT_SAMPLING, **self.given_sampling}

    def settings(self) -> dict[str, Any]:
        """Everything that changes this job's results, as plain data (compared on resume)."""
        return (
            {
                "model": self.model,
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
            | ({"adapter": self.adapter} if self.adapter else {})
        )

    def _pooling_settings(self) -> dict[str, Any]:
        if self.task == "generate":
            return {}
        return {"task": self.task, "embedding": self.embedding, "instruction": self.instruction}


@dataclass(frozen=True)
class JobFile:
    """A validated job file."""

    path: Path
    model: str  # the file's `model:` (or --model), else its first job's
    output_dir: Path
    jobs: tuple[JobSpec, ...]
    yaml: LoadedYaml  # where each value sits, for refusals found after loading
    kv_bits: int | None = None  # quantized KV pages (8 or 4), None: float
    indexer_keys: str | None = None  # a sparse model's indexer keys: "fp8", None: as the latent
    # speculative decoding: EngineConfig's speculative fields (None: off; docs/speculative.md)
    speculative: dict[str, Any] | None = None
    parquet: bool = False  # each generating job's table as <job>.parquet too (needs pyarrow)

    def by_model(self) -> dict[str, tuple[JobSpec, ...]]:
        """The jobs grouped by the model that runs them, models in the order jobs name them:
        each model loads once."""
        groups: dict[str, list[JobSpec]] = {}
        for job in self.jobs:
            groups.setdefault(job.model, []).append(job)
        return {model: tuple(jobs) for model, jobs in groups.items()}


def load_job_file(path: Path, model_override: str | None = None) -> JobFile:
    """Read and validate a job file; raises JobFileError with file:line:column on any problem."""
    loaded = load_yaml(path)
    check = YamlChecker(loaded)
    if loaded.data is None:
        raise JobFileError(f"{path}: the job file is empty; see docs/jobs.md for an example")
    top = check.mapping(loaded.data, (), TOP_KEYS)
    version = top.get("version", 1)
    if version != 1:
        raise check.fail(("version",), f"unsupported version {version!r}; this macbatch reads 1")
    base = path.parent
    presets = _presets()
    model: str | None = None
    file_preset: Preset | None = None
    if model_override:
        model, file_preset = _resolve_model(model_override, Path.cwd(), presets)
    elif "model" in top:
        model, file_preset = _resolve_model(check.text(top["model"], ("model",)), base, presets)
    kv_bits = top.get("kv_bits")
    try:
        check_kv_quantization(kv_bits, None)
    except ValueError as exc:
        raise check.fail(("kv_bits",), str(exc)) from None
    indexer_keys = top.get("indexer_keys")
    try:
        check_indexer_keys(indexer_keys)
    except ValueError as exc:
        raise check.fail(("indexer_keys",), str(exc)) from None
    speculative = _speculative(check, top["speculative"], base) if "speculative" in top else None
    output = check.mapping(top.get("output", {}), ("output",), OUTPUT_KEYS)
    output_dir = base / check.text(output.get("dir", "out"), ("output", "dir"))
    parquet = check.boolean(output.get("parquet", False), ("output", "parquet"))
    if parquet:
        try:
            require_pyarrow()
        except ImportError as exc:
            raise check.fail(("output", "parquet"), str(exc)) from None
    defaults = check.mapping(top.get("defaults", {}), ("defaults",), SETTING_KEYS)
    if "jobs" not in top:
        raise check.fail((), "missing 'jobs' (a list of jobs, each with a name)")
    jobs = top["jobs"]
    if not isinstance(jobs, list) or not jobs:
        raise check.fail(("jobs",), "'jobs' must be a non-empty list of jobs")
    specs: list[JobSpec] = []
    seen: dict[str, int] = {}
    for index, raw in enumerate(jobs):
        spec = _job(check, raw, index, defaults, base, (model, file_preset), presets)
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
        model=model or specs[0].model,
        output_dir=output_dir,
        jobs=tuple(specs),
        yaml=loaded,
        kv_bits=kv_bits,
        indexer_keys=indexer_keys,
        speculative=speculative,
        parquet=parquet,
    )


def _speculative(check: YamlChecker, raw: Any, base: Path) -> dict[str, Any]:
    """``speculative: {method, draft_model, num_tokens}`` as EngineConfig fields."""
    key: PathKey = ("speculative",)
    given = check.mapping(raw, key, SPECULATIVE_KEYS)
    method = given.get("method", "draft" if "draft_model" in given else "ngram")
    if method is False:  # YAML reads a bare off as false
        method = "off"
    num_tokens = given.get("num_tokens")  # None: the method's default
    draft = given.get("draft_model")
    try:
        check_speculative(method, num_tokens)
    except ValueError as exc:
        raise check.fail(key, str(exc)) from None
    if (method == "draft") != (draft is not None):
        raise check.fail(key, "a draft_model goes with method draft, and method draft needs one")
    if draft is not None:
        draft = _resolve_model(check.text(draft, (*key, "draft_model")), base, {})[0]
    return {"speculative": method, "draft_model": draft, "num_speculative_tokens": num_tokens}


def _presets() -> dict[str, Preset]:
    """The user's presets (``model: PRESET`` in a job file, docs/jobs.md)."""
    try:
        return read_presets()
    except PresetError as error:
        raise JobFileError(str(error)) from None


def _resolve_model(model: str, base: Path, presets: dict[str, Preset]) -> tuple[str, Preset | None]:
    """A relative path in the job file is relative to the file; hub ids and 'demo' pass
    through; a preset or a short name is the model it names (``models/names.py``; a name
    that is none of these is left for the model check to refuse), with the preset."""
    if model == "demo":
        return model, None
    if model.startswith(("/", "./", "../", "~")):
        return str((base / Path(model).expanduser()).resolve()), None
    candidate = base / model
    if candidate.exists():
        return str(candidate.resolve()), None
    try:
        resolved = resolve(model, presets)
    except UnknownModel:
        return model, None
    return resolved.model, resolved.preset


def _job(
    check: YamlChecker,
    raw: Any,
    index: int,
    defaults: dict[str, Any],
    base: Path,
    file_model: tuple[str | None, Preset | None],
    presets: dict[str, Preset],
) -> JobSpec:
    key: PathKey = ("jobs", index)
    job = check.mapping(raw, key, JOB_KEYS)
    if "name" not in job:
        raise check.fail(key, f"jobs[{index}] has no 'name'")
    name = check.text(job["name"], (*key, "name"))
    model, preset = _job_model(check, job, key, base, file_model, presets)
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

    # a preset's settings sit under the file's defaults and the job's own
    given_sampling: dict[str, Any] = {} if preset is None else preset.sampling()
    seed_at: PathKey = ()  # where the seed the job samples with is written
    for source, where in (
        (defaults.get("sampling"), ("defaults", "sampling")),
        (job.get("sampling"), (*key, "sampling")),
    ):
        if source is not None:
            given_sampling.update(job_sampling(check, source, where))
            if isinstance(source, dict) and "seed" in source:
                seed_at = (*where, "seed")
    template = system = score = None
    n, chat = 1, True
    if (found := setting("template")) is not None:
        template = check.template(*found)
    if (found := setting("system")) is not None:
        system = check.text(*found, empty_ok=True)
    elif preset is not None:
        system = preset.system
    if (found := setting("n")) is not None:
        n = check.integer(
            *found,
            minimum=1,
            maximum=MAX_SAMPLES,
            why=" (samples of each row; for more, repeat the rows or split the job)",
        )
    if n > 1 and seed_at:
        job_seeds(check, given_sampling, seed_at, n)
    if (found := setting("chat")) is not None:
        chat = check.boolean(*found)
    if (found_score := setting("score")) is not None:
        score = job_score(check, *found_score)
    template_kwargs = None
    if (found := setting("chat_template_kwargs")) is not None:
        template_kwargs = job_template_kwargs(check, *found)
        if template_kwargs and not chat:
            raise check.fail(
                found[1], "chat_template_kwargs needs the chat template; chat is false"
            )
    options = job_structured(check, job, key, defaults, base)
    images: tuple[str, ...] = ()
    if (found := setting("images")) is not None:
        images = job_images(check, *found, chat)
    pooling = job_pooling(check, job, key, setting, base)
    if pooling["task"] != "generate" and (score is not None or options or n != 1):
        raise check.fail(
            key, f"job '{name}' has task: {pooling['task']}; 'score', 'n' and reply formats are "
            "for generation"
        )  # fmt: skip
    spec_input = prompts = None
    if has_input:
        spec_input = job_input(check, job["input"], (*key, "input"), base)
    else:
        prompts = job_prompts(check, job["prompts"], (*key, "prompts"), score, chat)
        if "template" in job:
            raise check.fail(
                (*key, "template"),
                "'template' applies to rows of an input file; inline prompts are used as written",
            )
    # A JSON-lines file may be an OpenAI batch whose rows ask for JSON themselves.
    rows_may_ask = spec_input is not None and spec_input.format not in ("csv", "tsv", "folder")
    parsed_unreadable = not rows_may_ask and not replies_are_json(options)
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
        model=model,
        adapter=_job_adapter(check, job, key, base),
        **pooling,
    )


def _job_adapter(check: YamlChecker, job: dict[str, Any], key: PathKey, base: Path) -> str | None:
    """The job's ``adapter:`` directory, relative to the job file, checked to exist now."""
    if "adapter" not in job:
        return None
    given = check.text(job["adapter"], (*key, "adapter"))
    path = (base / Path(given).expanduser()).resolve()
    if not (path / "adapter_config.json").is_file():
        raise check.fail(
            (*key, "adapter"),
            f"adapter {given!r} is not an adapter directory (no adapter_config.json in {path})",
        )
    return str(path)


def _job_model(
    check: YamlChecker,
    job: dict[str, Any],
    key: PathKey,
    base: Path,
    file_model: tuple[str | None, Preset | None],
    presets: dict[str, Preset],
) -> tuple[str, Preset | None]:
    """The job's own ``model:`` (resolved like the file's), else the file's; with its preset."""
    if "model" in job:
        return _resolve_model(check.text(job["model"], (*key, "model")), base, presets)
    if file_model[0] is None:
        raise check.fail(
            key,
            f"missing 'model': job '{job['name']}' names none and neither does the file; give "
            "the file a 'model:' (a Hugging Face id, a local path, or demo) for every job, or "
            "this job its own",
        )
    return file_model[0], file_model[1]
