"""``macbatch serve``: the typer command. Heavy imports (MLX, the engine, uvicorn) happen inside
the function so ``macbatch --help`` stays fast."""

from __future__ import annotations

import dataclasses
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from macbatch.commands.fields import Pick, option, takes
from macbatch.commands.options import (
    DISK_CACHE,
    SPECULATIVE,
    EngineKnobs,
    api_key_option,
    disk_cache_line,
    resolved_models,
)
from macbatch.config import DEFAULT_MODEL

if TYPE_CHECKING:
    from macbatch.engine import EngineConfig
    from macbatch.openai.image_parts import ImageAccess

LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")

# --help's groups of serve's own options (one line each there; docs/serve.md says the rest)
MODELS = "Models"
NETWORK = "Network and clients"
LIMITS = "Limits and timeouts"
IMAGES = "Images"
SERVICE = "Run at login"


def _directories(*, help: str, panel: str) -> Any:
    """A repeatable ``--name DIR`` option whose field holds the absolute directories."""
    return option(
        (),
        metavar="DIR",
        cli_type=list[Path] | None,
        convert=lambda given: tuple(str(d.expanduser().resolve()) for d in given or ()),
        help=help,
        rich_help_panel=panel,
    )


def adapter_pair(given: str) -> tuple[str, str]:
    """``NAME=PATH`` -> (name, absolute path); a bad one is refused naming the option."""
    name, sep, path = given.partition("=")
    if not sep or not name or not path or ":" in name:
        raise typer.BadParameter(
            f"{given!r}: give NAME=PATH (NAME without ':')", param_hint="--adapter"
        )
    return name, str(Path(path).expanduser().resolve())


@dataclass(frozen=True)
class ServeSettings:
    """The command's own options, each declared here once (the engine's are ``EngineKnobs``; the
    API key never goes on a command line): what the server runs with, and what a launchd plist
    repeats."""

    model: tuple[str, ...] = option(  # the first runs the Batch API
        (DEFAULT_MODEL,),
        "--model",
        "-m",
        cli_type=list[str] | None,
        convert=lambda given: resolved_models(given, DEFAULT_MODEL),
        help=f"Model to load at start: {DEFAULT_MODEL}, a short name, a preset's model, a "
        "directory or a hub id (repeatable).",
        rich_help_panel=MODELS,
    )
    models_dir: tuple[str, ...] = _directories(
        help="Also serve the model directories under DIR (repeatable).", panel=MODELS
    )
    adapter: tuple[str, ...] = option(  # NAME=PATH, the path absolute (a plist repeats it)
        (),
        metavar="NAME=PATH",
        cli_type=list[str] | None,
        convert=lambda given: tuple("=".join(adapter_pair(a)) for a in given or ()),
        help="A LoRA / DoRA adapter of the first --model (repeatable).",
        rich_help_panel=MODELS,
    )
    keep_alive: float = option(  # -1: never unload for idleness
        300.0,
        "--keep-alive",
        min=-1,
        help="Idle seconds before a model unloads; -1: never.",
        rich_help_panel=MODELS,
    )
    max_loaded_models: int | None = option(
        None,
        "--max-loaded-models",
        min=1,
        help="Models loaded at once (default: as memory allows).",
        rich_help_panel=MODELS,
    )
    host: str = option(
        "127.0.0.1",
        help="Address to listen on; not loopback: needs --api-key.",
        rich_help_panel=NETWORK,
    )
    port: int = option(8000, min=0, max=65535, help="TCP port.", rich_help_panel=NETWORK)
    insecure: bool = option(
        False,
        "--insecure",
        help="Allow a non-loopback --host without an API key.",
        rich_help_panel=NETWORK,
    )
    max_queue: int = option(
        256,
        min=0,
        help="Requests waiting beyond the batch; more get 429.",
        rich_help_panel=LIMITS,
    )
    log_level: str = option(
        "info",
        metavar="LEVEL",
        help=f"Server log level: {', '.join(LOG_LEVELS)}.",
        rich_help_panel=NETWORK,
    )
    max_body_mb: float = option(
        4.0, min=0.001, help="Largest request body in MiB (413).", rich_help_panel=LIMITS
    )
    max_file_mb: float = option(
        200.0, min=0.001, help="Largest /v1/files upload in MiB (413).", rich_help_panel=LIMITS
    )
    batch_max_in_flight: int | None = option(
        None,
        min=1,
        help="A /v1/batches batch's requests at once.",
        rich_help_panel=LIMITS,
    )
    shutdown_timeout: float = option(
        10.0, min=0, help="Seconds to finish requests on stop.", rich_help_panel=LIMITS
    )
    header_timeout: float = option(
        10.0, min=0.1, help="Seconds to send a request's headers.", rich_help_panel=LIMITS
    )
    body_timeout: float = option(
        60.0, min=0.1, help="Seconds to send a body after them.", rich_help_panel=LIMITS
    )
    write_timeout: float = option(
        60.0, min=0.1, help="Seconds to wait on a stalled client.", rich_help_panel=LIMITS
    )
    max_connections: int | None = option(
        None,
        min=1,
        help="Connections open at once; past it the oldest idle one makes room (default: up to "
        "1024).",
        rich_help_panel=LIMITS,
    )
    allowed_hosts: str | None = option(  # comma-separated, as given
        None,
        "--allowed-hosts",
        help="More Host names clients may use, comma-separated; '*': any.",
        rich_help_panel=NETWORK,
    )
    allowed_origins: str | None = option(
        None,
        "--allowed-origins",
        help="Web origins allowed to call it, comma-separated; '*': any.",
        rich_help_panel=NETWORK,
    )
    keep_volatile_prompt_lines: bool = option(
        False,
        "--keep-volatile-prompt-lines",
        help="Keep agents' per-request lines (Claude Code's billing line).",
        rich_help_panel=NETWORK,
    )
    allow_remote_images: bool | None = option(  # None: serve_command decides it from --host
        None,
        "--allow-remote-images/--no-remote-images",
        help="Fetch http(s) image URLs (default: on at loopback).",
        rich_help_panel=IMAGES,
    )
    allow_private_image_urls: bool = option(
        False,
        "--allow-private-image-urls",
        help="Let image URL fetches reach private addresses.",
        rich_help_panel=NETWORK,  # beside --no-remote-images its name would be cut at 80 columns
    )
    allow_local_images: tuple[str, ...] = _directories(
        help="Read file:// URLs under DIR.", panel=IMAGES
    )


# serve's engine knobs: all but the step's token budget, which serve leaves at the engine's
SERVE_KNOBS = Pick(
    EngineKnobs,
    (
        "max_num_seqs",
        "kv_blocks",
        "kv_bits",
        "indexer_keys",
        *SPECULATIVE,
        *DISK_CACHE,
        "reranker",
        "no_self_check",
    ),
)


@takes(settings=ServeSettings, knobs=SERVE_KNOBS)
def serve_command(
    settings: ServeSettings,
    knobs: EngineKnobs,
    api_key: str | None = api_key_option(
        "Require 'Authorization: Bearer KEY' (all but /health).",
        show_envvar=True,
        rich_help_panel=NETWORK,
    ),
    print_launchd_plist: bool = typer.Option(
        False,
        "--print-launchd-plist",
        help="Print a macOS launchd plist of this command, and exit.",
        rich_help_panel=SERVICE,
    ),
    print_systemd_unit: bool = typer.Option(
        False,
        "--print-systemd-unit",
        help="Print a systemd user unit of it, and exit.",
        rich_help_panel=SERVICE,
    ),
    install_service: bool = typer.Option(
        False,
        "--install-service",
        help="Write that unit to ~/.config/systemd/user/, and exit.",
        rich_help_panel=SERVICE,
    ),
) -> None:
    """Serve the model over a local OpenAI-compatible HTTP API, with no UI.

    All clients share one engine, so concurrent requests are batched together.
    Point any OpenAI client at http://HOST:PORT/v1 (see docs/serve.md).
    """
    from macbatch.server.listen import is_loopback

    host = settings.host
    if settings.log_level not in LOG_LEVELS:
        raise typer.BadParameter(
            f"must be one of {', '.join(LOG_LEVELS)}", param_hint="--log-level"
        )
    if not is_loopback(host) and not api_key and not settings.insecure:
        raise typer.BadParameter(
            f"{host} is reachable from other machines; give --api-key (or set MACBATCH_API_KEY), "
            "or pass --insecure to serve without one",
            param_hint="--host",
        )
    if settings.allow_remote_images is None:
        settings = dataclasses.replace(settings, allow_remote_images=is_loopback(host))
    # the speculative mode as the options settle it (off with --draft-model: draft): the plist
    # says so
    knobs = dataclasses.replace(knobs, speculative=knobs.speculative_fields()["speculative"])
    if print_launchd_plist or print_systemd_unit or install_service:
        local = dataclasses.replace(settings, model=tuple(map(_absolute_if_local, settings.model)))
        drafter = knobs.draft_model and _absolute_if_local(knobs.draft_model)
        argv = _command_line(local, dataclasses.replace(knobs, draft_model=drafter))
        if print_launchd_plist:
            typer.echo(_plist(argv, api_key), nl=False)
        else:
            _systemd(argv, api_key, install=install_service)
        return
    _serve(settings, knobs, api_key)


def image_access(settings: ServeSettings) -> ImageAccess:
    """Where this server's requests may take images from (docs/serve.md, "Images")."""
    from macbatch.openai.image_parts import ImageAccess

    return ImageAccess(
        remote=bool(settings.allow_remote_images),  # decided by serve_command
        private=settings.allow_private_image_urls,
        local_dirs=tuple(Path(d) for d in settings.allow_local_images),
    )


def _absolute_if_local(model: str) -> str:
    """launchd starts jobs in /: a relative model directory must become absolute there."""
    path = Path(model).expanduser()
    return str(path.resolve()) if model != "demo" and path.exists() else model


def _command_line(settings: ServeSettings, knobs: EngineKnobs) -> list[str]:
    """This command's argv for launchd: the installed ``macbatch`` script and every option."""
    program = shutil.which("macbatch") or str(Path(sys.argv[0]).resolve())
    return [program, "serve", *Pick(ServeSettings).argv(settings), *SERVE_KNOBS.argv(knobs)]


def _plist(arguments: list[str], api_key: str | None) -> str:
    from macbatch.config import data_dir, data_dir_environment
    from macbatch.server.launchd import launchd_plist

    log_dir = data_dir().resolve() / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    environment = data_dir_environment()
    if api_key:
        environment["MACBATCH_API_KEY"] = api_key
    return launchd_plist(arguments, log_dir / "serve.log", environment, working_dir=Path.cwd())


def _systemd(arguments: list[str], api_key: str | None, *, install: bool) -> None:
    """Print the systemd user unit, or install it (docs/serve.md, "Run at login")."""
    import os

    from macbatch.server.systemd import install_unit, systemd_unit, unit_path

    names = [("MACBATCH_HOME", os.environ.get("MACBATCH_HOME")), ("MACBATCH_API_KEY", api_key)]
    text = systemd_unit(arguments, Path.cwd(), {k: v for k, v in names if v})
    if not install:
        typer.echo(text, nl=False)
        return
    path = unit_path()
    try:
        install_unit(text, path)
    except FileExistsError as error:
        typer.echo(f"macbatch serve: {error}", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"wrote {path}; start it with: systemctl --user enable --now {path.name}")


def _serve(settings: ServeSettings, knobs: EngineKnobs, api_key: str | None) -> None:
    from macbatch.config import data_dir
    from macbatch.models.pool import PoolLimits
    from macbatch.server.app import ServerOptions, create_pool_app, stop_batches, stop_generating
    from macbatch.server.listen import (
        ConnectionLimits,
        ListenError,
        bind_socket,
        connection_cap,
        run,
    )
    from macbatch.server.serve_models import model_pool

    host = settings.host
    try:
        sock = bind_socket(host, settings.port)
    except ListenError as exc:
        typer.echo(f"macbatch serve: {exc}", err=True)
        raise typer.Exit(1) from None
    config = _engine_config(knobs, settings.model)
    loading = PoolLimits(
        keep_alive_s=None if settings.keep_alive < 0 else settings.keep_alive,
        max_loaded=settings.max_loaded_models,
        max_waiting=max(1, settings.max_queue),
        kv_start_mib=config.kv_start_mib,
    )
    dirs = tuple(Path(d) for d in settings.models_dir)
    adapters = tuple(adapter_pair(a) for a in settings.adapter)
    pool = model_pool(settings.model, dirs, loading, config, image_access(settings), adapters)
    try:
        options = ServerOptions(
            api_key=api_key,
            max_body_bytes=int(settings.max_body_mb * 1024 * 1024),
            max_pending=knobs.max_num_seqs + settings.max_queue,
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
            connection_cap(settings.max_connections),
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


def _engine_config(knobs: EngineKnobs, models: tuple[str, ...]) -> EngineConfig:
    """Every model's engine settings (each model sizes its own pool from them; the disk cap
    follows the largest of those served from the start), its disk cache said on stderr."""
    from macbatch.engine import EngineConfig

    fields = knobs.engine_fields(models)
    typer.echo(f"macbatch serve: {disk_cache_line(fields)}", err=True)
    return EngineConfig(**fields)


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
