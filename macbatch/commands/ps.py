"""``macbatch ps``: the models a running ``macbatch serve`` holds, read from its
``/macbatch/ps`` (``server/ps.py``): each one's memory, idle time and requests answered, as
``ollama ps`` shows them. No MLX, no engine: one HTTP GET."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import typer

from macbatch.commands.columns import echo_columns
from macbatch.commands.options import api_key_option

DEFAULT_URL = "http://127.0.0.1:8000"  # serve's default --host and --port
TIMEOUT_S = 10


def ps_command(
    url: str = typer.Option(DEFAULT_URL, "--url", help="The serve to ask (its address)."),
    api_key: str | None = api_key_option("The serve's API key, if it has one."),
    as_json: bool = typer.Option(False, "--json", help="The serve's JSON, as it answered."),
) -> None:
    """List the models a running serve has loaded: memory, idle time, requests."""
    rows = fetch(url, api_key)
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        typer.echo(f"no model loaded in the serve at {url}")
        return
    lines = [("MODEL", "MEMORY", "KV", "ACTIVE", "REQUESTS", "IDLE", "UNLOADS IN")]
    for r in rows:
        lines.append(
            (
                r["model"],
                f"{r['weights_bytes'] / 2**20:,.1f} MiB",
                f"{r['kv_cache_bytes'] / 2**20:,.1f} MiB",
                str(r["active_requests"]),
                f"{r['requests']:,}",
                "busy" if r["idle_s"] is None else f"{r['idle_s']:,.0f} s",
                "never" if r["unloads_in_s"] is None else f"{r['unloads_in_s']:,.0f} s",
            )
        )
    echo_columns(lines)


def fetch(url: str, api_key: str | None) -> list[dict[str, Any]]:
    """The serve's rows; a serve not there (or refusing) ends the command, saying why."""
    request = urllib.request.Request(url.rstrip("/") + "/macbatch/ps")
    if api_key:
        request.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
            rows: list[dict[str, Any]] = json.load(response)["data"]
            return rows
    except urllib.error.HTTPError as error:
        why = f"it answered {error.code}" + (" (give --api-key)" if error.code == 401 else "")
    except (urllib.error.URLError, OSError, ValueError, KeyError) as error:
        why = f"no serve answered ({getattr(error, 'reason', error)}); start one: macbatch serve"
    typer.echo(f"macbatch ps: {url}: {why}", err=True)
    raise typer.Exit(1)
