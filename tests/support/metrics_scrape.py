"""A served /metrics page read back as numbers, parsed here independently of the server's own
renderer, so a test of the metrics does not trust the code it checks."""

from __future__ import annotations

from tests.support.live_server import Served


def scrape(served: Served, headers: dict[str, str] | None = None) -> dict[str, float]:
    """/metrics as {'name{labels}': value}, parsed independently of the server's renderer."""
    import httpx

    response = httpx.get(served.url + "/metrics", headers=headers)
    response.raise_for_status()
    samples = {}
    for line in response.text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    return samples
