"""Images in a job's OpenAI-batch rows (issue 46): run reads local files wherever they point (the
user wrote the job) and fetches public URLs, never this machine's or its network's; the Batch
API plans the same rows with serve's rules, which read no file it was not given."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from macbatch.batch.plan import Planned, Rejected, plan_job, prepare
from macbatch.batch.spec import load_job_file
from macbatch.openai import ImageAccess
from tests.support.image_site import site
from tests.support.job_files import write_job

pytest.importorskip("PIL.Image")  # load_image decodes with Pillow (the vision extra)

from tests.support.tiny_vlm import png_bytes  # noqa: E402


def _rows(tmp_path: Path, urls: list[str], images: ImageAccess | None) -> list:
    lines = [
        {
            "custom_id": f"r{i}",
            "url": "/v1/chat/completions",
            "body": {
                "messages": [
                    {"role": "user", "content": [{"type": "image_url", "image_url": {"url": u}}]}
                ]
            },
        }
        for i, u in enumerate(urls)
    ]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    spec = load_job_file(
        write_job(tmp_path, "model: demo\njobs:\n  - {name: a, input: rows.jsonl}\n")
    )
    job = spec.jobs[0]
    if images is None:
        return list(plan_job(job, spec.model, prepare(job)))
    return list(plan_job(job, spec.model, prepare(job), images))


def test_run_reads_files_anywhere_and_fetches_no_loopback_url(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "a.png").write_bytes(png_bytes(8, 8, 1))
    with site({"/a.png": (200, {}, png_bytes(8, 8, 2))}) as served:
        url = served.base + "/a.png"
        local, remote = _rows(tmp_path, [(elsewhere / "a.png").as_uri(), url], None)
        assert served.hits == 0
    assert isinstance(local, Planned)
    assert isinstance(remote, Rejected)
    assert remote.reason.endswith(f"could not fetch the image at {url}")


def test_the_batch_api_rules_read_no_file(tmp_path: Path) -> None:
    [row] = _rows(tmp_path, ["file:///etc/passwd"], ImageAccess())
    assert isinstance(row, Rejected)
    assert "--allow-local-images" in row.reason
