"""``macbatch pull`` and ``macbatch rm``: models in the Hugging Face cache, fetched and removed with
huggingface-hub's own machinery (docs/models.md).

``pull`` checks the free disk first (what the repository holds and the cache lacks, against the
free space of the cache's disk), downloads with ``snapshot_download`` (it resumes a file left
half-downloaded by an interrupted pull, and retries a dropped connection from where it stopped),
shows one progress bar of bytes with speed and time left, then checks every large (LFS) file's
sha256 against the one the hub declares: huggingface-hub checks sizes only, and a damaged weight
file would load as garbage. A mismatched file is removed, so the next pull fetches it again.
"""

from __future__ import annotations

import hashlib
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from tqdm.auto import tqdm

from macbatch.models.memory import gib

_REACH_TIMEOUT_S = 20.0  # the first call to the hub: an unreachable one fails at once
_SHA256 = re.compile(r"[0-9a-f]{64}")
BYTES_BAR = (
    "{desc}: {percentage:3.0f}%|{bar}| {n_fmt}B/{total_fmt}B [{elapsed}<{remaining}, {rate_fmt}]"
)


class PullError(RuntimeError):
    """Why a pull or removal did not happen, and what to do."""


class ProgressBar(tqdm):
    """huggingface-hub's byte bars with their speed and time left (its own format shows bytes
    only), shown on a terminal or not: a pull in a log says how far it got."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if kwargs.get("unit") == "B":
            kwargs["bar_format"] = BYTES_BAR
        kwargs.pop("name", None)
        super().__init__(*args, **kwargs)


@dataclass(frozen=True)
class RepoFile:
    path: str
    size: int
    sha256: str | None  # LFS files: the hub's digest of the content


def pull(repo: str, revision: str = "main", say: Callable[[str], None] = print) -> Path:
    """Download ``repo`` into the hub cache; returns its snapshot folder."""
    from huggingface_hub import HfApi, snapshot_download
    from huggingface_hub.constants import ENDPOINT, HF_HUB_CACHE
    from huggingface_hub.errors import HfHubHTTPError

    _check_id(repo)
    api = HfApi()
    try:
        api.model_info(repo, revision=revision, timeout=_REACH_TIMEOUT_S)  # fails fast
        files = _files(api, repo, revision)
    except HfHubHTTPError as exc:
        raise PullError(f"cannot read {repo!r} on the hub: {exc}") from None
    except _network_errors() as exc:
        raise PullError(
            f"cannot reach the hub at {ENDPOINT} ({exc}); check the network connection (or "
            "HF_ENDPOINT, when a mirror is meant), then run the pull again"
        ) from None
    _check_disk(files, Path(HF_HUB_CACHE), repo)
    total = sum(f.size for f in files)
    say(f"pulling {repo} ({len(files)} files, {gib(total)})")
    folder = Path(snapshot_download(repo, revision=revision, tqdm_class=ProgressBar))
    _verify(folder, files, repo)
    return folder


def _check_id(repo: str) -> None:
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    shown = repr(repo if len(repo) <= 80 else repo[:80] + "...")
    try:
        if repo.count("/") != 1:
            raise HFValidationError(repo)
        validate_repo_id(repo)
    except HFValidationError:
        raise PullError(
            f"{shown} is not a Hugging Face model id: OWNER/NAME, each of letters, digits, "
            "'-', '_' and '.' (not first or last), at most 96 characters, e.g. "
            "mlx-community/Qwen3-0.6B-4bit"
        ) from None


def _network_errors() -> tuple[type[Exception], ...]:
    """What huggingface-hub's HTTP client raises when the hub cannot be reached."""
    import importlib.util

    # huggingface-hub 2's own fork of httpx, else httpx itself
    name = "httpx2" if importlib.util.find_spec("httpx2") else "httpx"
    return (importlib.import_module(name).TransportError, OSError)


def _files(api: Any, repo: str, revision: str) -> list[RepoFile]:
    from huggingface_hub.hf_api import RepoFile as HubFile

    tree = api.list_repo_tree(repo, revision=revision, recursive=True)
    files = [
        RepoFile(f.path, f.size, f.lfs.sha256 if f.lfs else None)
        for f in tree
        if isinstance(f, HubFile)
    ]
    for entry in files:
        parts = PurePosixPath(entry.path).parts
        if entry.path.startswith("/") or not parts or ".." in parts or "\\" in entry.path:
            raise PullError(
                f"the hub's file list of {repo} names {entry.path!r}, a path outside the "
                "model's folder; nothing was downloaded (is HF_ENDPOINT a hub you trust?)"
            )
        if entry.sha256 is not None and not _SHA256.fullmatch(entry.sha256):
            raise PullError(
                f"the hub's file list of {repo} gives {entry.path} the digest "
                f"{entry.sha256!r}, not a sha256; nothing was downloaded"
            )
    return files


def _check_disk(files: list[RepoFile], cache: Path, repo: str) -> None:
    """Refuse before downloading what the cache's disk cannot hold (files cached already, by
    their blob's name, the LFS digest, count as there)."""
    blobs = cache / f"models--{repo.replace('/', '--')}" / "blobs"
    missing = sum(f.size for f in files if not (f.sha256 and (blobs / f.sha256).exists()))
    where = cache
    while not where.exists():
        where = where.parent
    free = shutil.disk_usage(where).free
    if missing > free:
        raise PullError(
            f"{repo} needs {gib(missing)} more on disk but {where} has {gib(free)} free; free "
            "some space (`macbatch rm` a model you no longer use) or point HF_HOME at a larger "
            "disk"
        )


def _verify(folder: Path, files: list[RepoFile], repo: str) -> None:
    """Check each LFS file's sha256; a damaged one is removed (its snapshot link and its blob,
    both inside the repository's cache folder; nothing a link points at elsewhere)."""
    home = folder.parent.parent  # models--OWNER--NAME: snapshots/COMMIT -> here
    for entry in files:
        if entry.sha256 is None:
            continue
        path = folder / entry.path
        target = path.resolve()
        if not target.is_relative_to(home.resolve()) or not target.is_file():
            raise PullError(
                f"{entry.path} of {repo} is in the hub's file list but not in {folder}; "
                f"run `macbatch pull {repo}` again"
            )
        got = _sha256(target)
        if got != entry.sha256:
            _remove_download(path, home)
            raise PullError(
                f"{entry.path} of {repo} arrived damaged (sha256 {got}, the hub declares "
                f"{entry.sha256}); it was removed: run `macbatch pull {repo}` again"
            )


def _remove_download(path: Path, home: Path) -> None:
    """Remove a file ``snapshot_download`` made: the snapshot's link and the blob it names
    (huggingface-hub's layout), or the file itself where the cache holds copies."""
    if path.is_symlink():
        blob = path.resolve()
        if blob.parent == (home / "blobs").resolve():
            blob.unlink(missing_ok=True)
    path.unlink(missing_ok=True)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def usage(repo: str) -> str:
    """What to do with a model once it is here."""
    return (
        f"use it: macbatch chat --model {repo} | macbatch run JOB.yaml (model: {repo}) | "
        f"macbatch serve --model {repo} (a running serve loads it when a request names it)"
    )


@dataclass(frozen=True)
class Cached:
    repo: str
    size: int
    remove: Callable[[], None]


def cached(repo: str) -> Cached:
    """A model in the hub cache and how to remove it (huggingface-hub's own deletion)."""
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.constants import HF_HUB_CACHE

    if repo == "demo":
        raise PullError("the demo model is part of macbatch (no download): nothing to remove")
    if not Path(HF_HUB_CACHE).is_dir():  # scanning would fail with advice for its API's callers
        raise PullError(f"{repo!r} is not downloaded: no Hugging Face cache at {HF_HUB_CACHE} yet")
    try:
        cache = scan_cache_dir()
    except Exception as exc:  # no cache yet, or unreadable
        raise PullError(f"no Hugging Face cache to remove {repo!r} from: {exc}") from None
    for found in cache.repos:
        if found.repo_id == repo and found.repo_type == "model":
            hashes = [revision.commit_hash for revision in found.revisions]
            strategy = cache.delete_revisions(*hashes)
            return Cached(repo, found.size_on_disk, strategy.execute)
    raise PullError(
        f"{repo!r} is not in the Hugging Face cache; `macbatch models` lists the local models "
        "(the demo model and --models-dir folders are not removed by rm)"
    )
