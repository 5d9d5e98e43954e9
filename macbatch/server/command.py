"""``macbatch serve``: the typer command. Heavy imports (MLX, the engine, uvicorn) happen inside
the function so ``macbatch --help`` stays fast."""

from __future__ import annotations

import dataclasses
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from macbatch.commands import options as cli_options
from macbatch.commands.options import (
    draft_model_option,
    kv_bits_option,
    num_speculative_tokens_option,
    speculative_config,
    speculative_option,
)
from macbatch.config import DEFAULT_MODEL

if TYPE_CHECKING:
    from macbatch.engine import EngineConfig
    from macbatch.openai.image_parts import ImageAccess

_MODELS = typer.Option(
    None,
    "--model",
    "-m",
    help=f"Model to load at start (repeatable; default {DEFAULT_MODEL}): 'demo', a local MLX "
    "model directory, or a Hugging Face id (e.g. mlx-community/Qwen3-0.6B-4bit). Clients name "
    "it in the 'model' field; requests may also name any local model (macbatch models), "
    "which then loads on demand. The first one runs the Batch API.",
)
_MODELS_DIRS = typer.Option(
    None,
    "--models-dir",
    metavar="DIR",
    help="Also serve the model directories under DIR, by folder name (repeatable).",
)
_LOCAL_IMAGES = typer.Option(
    None,
    "--allow-local-images",
    metavar="DIR",
    help="Read file:// image URLs under DIR (repeatable); no file:// URL is read otherwise.",
)  # a list: a module-level default (ruff B008)


LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")


def serve_command(
    model: list[str] | None = _MODELS,
    models_dir: list[Path] | None = _MODELS_DIRS,
    keep_alive: float = typer.Option(
        300.0,
        "--keep-alive",
        min=-1,
        help="Seconds a model stays loaded with no request before it unloads; -1: never.",
    ),
    max_loaded_models: int | None = typer.Option(
        None,
        "--max-loaded-models",
        min=1,
        help="Models loaded at once (default: as many as memory allows); past it the least "
        "recently used idle model unloads.",
    ),
    host: str = typer.Option(
        "127.0.0.1",
        help="Address to listen on. Anything but loopback needs --api-key (or --insecure).",
    ),
    port: int = typer.Option(8000, min=0, max=65535, help="TCP port to listen on."),
    api_key: str | None = typer.Option(
        None,
        "--api-key",
        envvar="MACBATCH_API_KEY",
        show_envvar=True,
        help="Require 'Authorization: Bearer KEY' on every endpoint but /health.",
    ),
    insecure: bool = typer.Option(
        False,
        "--insecure",
        help="Allow a non-loopback --host without an API key (anyone on the network can use it).",
    ),
    max_num_seqs: int = typer.Option(
        64, min=1, help="Requests generating at once (the engine's running batch)."
    ),
    max_queue: int = typer.Option(
        256,
        min=0,
        help="Requests allowed to wait beyond the running batch; more get 429 with Retry-After.",
    ),
    log_level: str = typer.Option(
        "info", metavar=f"[{'|'.join(LOG_LEVELS)}]", help="Server log level."
    ),
    kv_blocks: int | None = typer.Option(
        None,
        min=1,
        help=(
            "KV cache blocks of 16 tokens, fixed (default: it grows with use, up to half the "
            "memory left after the weights)."
        ),
    ),
    max_body_mb: float = typer.Option(
        4.0, min=0.001, help="Largest request body in MiB; larger ones get 413."
    ),
    kv_bits: int | None = kv_bits_option(),
    max_file_mb: float = typer.Option(
        200.0, min=0.001, help="Largest /v1/files upload (a batch's input) in MiB; larger: 413."
    ),
    batch_max_in_flight: int | None = typer.Option(
        None,
        min=1,
        help="Requests of a /v1/batches batch in the engine at once (default: half of "
        "--max-num-seqs); live requests always come first.",
    ),
    speculative: str = speculative_option(),
    draft_model: str | None = draft_model_option(),
    num_speculative_tokens: int | None = num_speculative_tokens_option(),
    cache_dir: str | None = cli_options.cache_dir_option(),
    cache_disk_gb: float | None = cli_options.cache_disk_gb_option(),
    no_disk_cache: bool = cli_options.no_disk_cache_option(),
    shutdown_timeout: float = typer.Option(
        10.0,
        min=0,
        help="On SIGINT/SIGTERM, seconds to let in-flight requests finish before aborting them.",
    ),
    header_timeout: float = typer.Option(
        10.0,
        min=0.1,
        help="Seconds a connection may take to send a request's headers (from its opening, or "
        "its previous response's end); slower ones are closed.",
    ),
    body_timeout: float = typer.Option(
        60.0,
        min=0.1,
        help="Seconds a request's body may take to arrive after its headers; slower ones (a "
        "client that trickles it) are closed.",
    ),
    write_timeout: float = typer.Option(
        60.0,
        min=0.1,
        help="Seconds a response may wait on a client that stopped reading (its send buffer "
        "full); then the connection is closed and its request cancelled.",
    ),
    max_connections: int | None = typer.Option(
        None,
        min=1,
        help="Connections open at once; more are closed as they arrive (default: half the "
        "process's file descriptors, at most 1024).",
    ),
    allowed_hosts: str | None = typer.Option(
        None,
        "--allowed-hosts",
        help="More names clients may reach the server by (the Host header), comma-separated; "
        "'*': any. Loopback names, addresses and the bound host always work.",
    ),
    allowed_origins: str | None = typer.Option(
        None,
        "--allowed-origins",
        help="Web pages allowed to call the server (Origin, e.g. http://localhost:3000), "
        "comma-separated; '*': any. Others get 403.",
    ),
    keep_volatile_prompt_lines: bool = typer.Option(
        False,
        "--keep-volatile-prompt-lines",
        help="Leave in the prompt the lines agent clients change on every request (Claude "
        "Code's billing line), which are otherwise taken out so the prefix cache can serve "
        "the rest (docs/serve.md).",
    ),
    reranker: bool = typer.Option(
        False,
        "--reranker",
        help="The model is a yes/no cross-encoder reranker (as Qwen3-Reranker) whatever its "
        "name; a checkpoint named *rerank* is one already (docs/embeddings.md).",
    ),
    allow_remote_images: bool | None = typer.Option(
        None,
        "--allow-remote-images/--no-remote-images",
        help="Fetch http(s) image URLs in requests (default: yes with a loopback --host, no "
        "otherwise). Never from loopback, private or link-local addresses unless "
        "--allow-private-image-urls.",
    ),
    allow_private_image_urls: bool = typer.Option(
        False,
        "--allow-private-image-urls",
        help="Let fetched image URLs reach loopback, private and link-local addresses too "
        "(this machine and its network: only for clients you trust).",
    ),
    allow_local_images: list[Path] | None = _LOCAL_IMAGES,
    print_launchd_plist: bool = typer.Option(
        False,
        "--print-launchd-plist",
        help="Print a launchd plist that runs this same command at login, and exit. Save it as "
        "~/Library/LaunchAgents/com.macbatch.serve.plist, then "
        "`launchctl load` it.",
    ),
) -> None:
    """Serve the model over a local OpenAI-compatible HTTP API, with no UI.

    All clients share one engine, so concurrent requests are batched together.
    Point any OpenAI client at http://HOST:PORT/v1 (see docs/serve.md).
    """
    from macbatch.server.listen import is_loopback

    if log_level not in LOG_LEVELS:
        raise typer.BadParameter(
            f"must be one of {', '.join(LOG_LEVELS)}", param_hint="--log-level"
        )
    if not is_loopback(host) and not api_key and not insecure:
        raise typer.BadParameter(
            f"{host} is reachable from other machines; give --api-key (or set MACBATCH_API_KEY), "
            "or pass --insecure to serve without one",
            param_hint="--host",
        )
    models = tuple(model or [DEFAULT_MODEL])
    settings = ServeSettings(
        models, host, port, insecure, max_num_seqs, max_queue, kv_blocks, kv_bits, max_body_mb
    )
    spec = speculative_config(speculative, draft_model, num_speculative_tokens)
    settings = dataclasses.replace(
        settings,
        max_file_mb=max_file_mb,
        batch_max_in_flight=batch_max_in_flight,
        shutdown_timeout=shutdown_timeout,
        log_level=log_level,
        reranker=reranker,
        keep_volatile_prompt_lines=keep_volatile_prompt_lines,
        allow_remote_images=is_loopback(host)
        if allow_remote_images is None
        else allow_remote_images,
        allow_private_image_urls=allow_private_image_urls,
        allow_local_images=tuple(str(d.expanduser().resolve()) for d in allow_local_images or ()),
        speculative=spec["speculative"],
        draft_model=spec["draft_model"],
        num_speculative_tokens=num_speculative_tokens,
        cache_dir=cache_dir,
        cache_disk_gb=cache_disk_gb,
        no_disk_cache=no_disk_cache,
        header_timeout=header_timeout,
        body_timeout=body_timeout,
        write_timeout=write_timeout,
        max_connections=max_connections,
        allowed_hosts=allowed_hosts,
        allowed_origins=allowed_origins,
        models_dir=tuple(str(d.expanduser().resolve()) for d in models_dir or ()),
        keep_alive=keep_alive,
        max_loaded_models=max_loaded_models,
    )
    if print_launchd_plist:
        local = dataclasses.replace(
            settings,
            model=tuple(_absolute_if_local(m) for m in models),
            draft_model=settings.draft_model and _absolute_if_local(settings.draft_model),
        )
        typer.echo(_plist(_command_line(local), api_key), nl=False)
        return
    _serve(settings, api_key)


@dataclass(frozen=True)
class ServeSettings:
    """The command's options but the API key (which never goes on a command line): what the
    server runs with, and what a launchd plist repeats."""

    model: tuple[str, ...]  # the first runs the Batch API
    host: str
    port: int
    insecure: bool
    max_num_seqs: int
    max_queue: int
    kv_blocks: int | None
    kv_bits: int | None
    max_body_mb: float
    max_file_mb: float = 200.0
    batch_max_in_flight: int | None = None
    shutdown_timeout: float = 10.0
    log_level: str = "info"
    reranker: bool = False
    speculative: str = "off"
    draft_model: str | None = None
    num_speculative_tokens: int | None = None
    cache_dir: str | None = None
    cache_disk_gb: float | None = None
    no_disk_cache: bool = False
    keep_volatile_prompt_lines: bool = False
    allow_remote_images: bool = True  # decided from --host when not given
    allow_private_image_urls: bool = False
    allow_local_images: tuple[str, ...] = ()  # absolute directories
    header_timeout: float = 10.0
    body_timeout: float = 60.0
    write_timeout: float = 60.0
    max_connections: int | None = None
    allowed_hosts: str | None = None  # comma-separated, as given
    allowed_origins: str | None = None
    models_dir: tuple[str, ...] = ()  # absolute directories
    keep_alive: float = 300.0  # -1: never unload for idleness
    max_loaded_models: int | None = None


def image_access(settings: ServeSettings) -> ImageAccess:
    """Where this server's requests may take images from (docs/serve.md, "Images")."""
    from macbatch.openai.image_parts import ImageAccess

    return ImageAccess(
        remote=settings.allow_remote_images,
        private=settings.allow_private_image_urls,
        local_dirs=tuple(Path(d) for d in settings.allow_local_images),
    )


def _absolute_if_local(model: str) -> str:
    """launchd starts jobs in /: a relative model directory must become absolute there."""
    path = Path(model).expanduser()
    return str(path.resolve()) if model != "demo" and path.exists() else model


def _command_line(settings: ServeSettings) -> list[str]:
    """This command's argv for launchd: the installed ``macbatch`` script and every option."""
    program = shutil.which("macbatch") or str(Path(sys.argv[0]).resolve())
    argv = [program, "serve"]
    for field in dataclasses.fields(settings):
        flag, value = "--" + field.name.replace("_", "-"), getattr(settings, field.name)
        if field.name == "allow_remote_images":
            argv += [flag if value else "--no-remote-images"]
        elif isinstance(value, bool):
            argv += [flag] if value else []
        elif isinstance(value, tuple):
            argv += [part for item in value for part in (flag, str(item))]
        elif value is not None:
            argv += [flag, str(value)]
    return argv


def _plist(arguments: list[str], api_key: str | None) -> str:
    from macbatch.config import data_dir
    from macbatch.server.launchd import launchd_plist

    log_dir = data_dir() / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    return launchd_plist(arguments, log_dir / "serve.log", api_key, working_dir=Path.cwd())


def _serve(settings: ServeSettings, api_key: str | None) -> None:
    from macbatch.config import data_dir
    from macbatch.models.pool import PoolLimits
    from macbatch.server.app import ServerOptions, create_pool_app, stop_batches, stop_generating
    from macbatch.server.listen import (
        ConnectionLimits,
        ListenError,
        bind,
        default_max_connections,
        run,
    )
    from macbatch.server.serve_models import model_pool

    host = settings.host
    try:
        sock = bind(host, settings.port)
    except ListenError as exc:
        typer.echo(f"macbatch serve: {exc}", err=True)
        raise typer.Exit(1) from None
    config = _engine_config(settings)
    loading = PoolLimits(
        keep_alive_s=None if settings.keep_alive < 0 else settings.keep_alive,
        max_loaded=settings.max_loaded_models,
        max_waiting=max(1, settings.max_queue),
        kv_start_mib=config.kv_start_mib,
    )
    dirs = tuple(Path(d) for d in settings.models_dir)
    pool = model_pool(settings.model, dirs, loading, config, image_access(settings))
    try:
        options = ServerOptions(
            api_key=api_key,
            max_body_bytes=int(settings.max_body_mb * 1024 * 1024),
            max_pending=settings.max_num_seqs + settings.max_queue,
            data_dir=data_dir() / "serve",
            max_file_bytes=int(settings.max_file_mb * 1024 * 1024),
            batch_max_in_flight=settings.batch_max_in_flight,
            keep_volatile_prompt_lines=settings.keep_volatile_prompt_lines,
            images=image_access(settings),
            bound_host=host,
            allowed_hosts=tuple((settings.allowed_hosts or "").split(",")),
            allowed_origins=tuple((settings.allowed_origins or "").split(",")),
        )
        app = create_pool_app(pool, options)
        bound_port = sock.getsockname()[1]
        limits = ConnectionLimits(
            settings.header_timeout,
            settings.max_connections or default_max_connections(),
            settings.body_timeout,
            settings.write_timeout,
        )
        typer.echo(
            f"macbatch serve: {', '.join(pool.loaded)} (and {len(pool.catalog) - len(pool.loaded)}"
            f" more on demand, GET /v1/models) at http://{host}:{bound_port}/v1 "
            f"({'API key required' if api_key else 'no API key'}; at most "
            f"{limits.max_connections} connections); Ctrl-C to stop",
            err=True,
        )
        stop = lambda: stop_generating(app)  # noqa: E731
        try:
            run(app, sock, settings.shutdown_timeout, settings.log_level, stop, limits)
        finally:
            stop_batches(app)
    finally:
        for loaded in list(pool.loaded.values()):
            loaded.thread.shutdown(timeout=settings.shutdown_timeout)
        sock.close()
    _exit_now()


def _engine_config(settings: ServeSettings) -> EngineConfig:
    """Every model's engine settings (each model sizes its own pool from them)."""
    from macbatch.engine import EngineConfig

    return EngineConfig(
        max_num_seqs=settings.max_num_seqs,
        num_blocks=settings.kv_blocks,
        kv_bits=settings.kv_bits,
        reranker=settings.reranker or None,  # None: recognised by its name
        speculative=settings.speculative,
        draft_model=settings.draft_model,
        num_speculative_tokens=settings.num_speculative_tokens,
        **cli_options.disk_cache_config(
            settings.cache_dir, settings.cache_disk_gb, settings.no_disk_cache
        ),
    )


def _exit_now() -> None:
    """Exit 0 without interpreter teardown. With MLX 0.32 (CPU), a process whose MLX-using
    thread has ended often dies in C++ static destructors ("terminate called without an active
    exception", SIGABRT), which would turn a clean stop into a crash for launchd and scripts.
    Everything is already shut down here; only the output buffers need flushing."""
    import logging
    import os

    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
