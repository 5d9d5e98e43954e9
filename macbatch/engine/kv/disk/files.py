"""The disk tier's files: one file per KV block, named by its prefix-cache chain digest, in a
directory per model identity (``namespace.py``), written atomically, checked when read, and kept
under a byte cap by evicting the least recently used.

A file is a 64-byte header and one cache group's part of a block (``kv/disk/parts.py``): magic
``MBKV``, the format version, the file's 16-byte key (the block's chain digest for the full
group's pages, a hash of the group's tag and the digest for another part: ``file_key``), the
payload's length and its XXH3-64 (``xxhash``: 7 to 12 GB/s on one core of a 2-core machine,
five to eight times zlib's CRC-32 and faster than copying the bytes, so checking a file read
from the page cache costs less than reading it; a torn tail, a truncation or flipped bits pass
it with odds of 2^-64). It is written under a temporary name unique to the writing process and
renamed into place (``os.replace``: atomic), so a reader, another process included, sees a
whole file or none; it is read by one ``readv`` straight into its arrays' rows (``read_into``)
and checked there. A torn, truncated or corrupt one (a crash mid-write on a file system that
reorders, a bad sector, an edit) fails its checksum, is logged once and deleted, and the block
is computed instead. Nothing of another format version is read: the version is in the header
and in the namespace's name.

No lock is needed for two processes on one directory (``serve`` and ``run`` at once): each writes
only its own temporary files and renames are atomic; a file another process evicted is a miss.
Each process keeps the byte cap over what it found at start plus what it wrote since.

Threads: the index is read on the engine thread and changed by the writer and reader threads, so
every access holds ``_lock``; file IO itself runs outside it.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import struct
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import xxhash

from macbatch.engine.kv.disk.owned import (
    MAGIC,
    NAMESPACE_FILE,
    SUFFIX,
    block_entries,
    is_real_dir,
    is_temp_name,
    namespace_record,
    remove_owned,
    shards,
    subfolders,
)

log = logging.getLogger("macbatch.disk_cache")

FORMAT_VERSION = 3  # 3: XXH3-64 instead of CRC-32
_HEADER = struct.Struct("<4sHH16sQQ24x")  # magic, version, reserved, key, length, XXH3-64
HEADER_BYTES = _HEADER.size
# new files: never through a link, never over a file already there
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
# buffers per ``readv`` (POSIX guarantees at least 16; Linux and macOS take 1,024)
_IOV_MAX = 512
# a temporary file this old is a crashed writer's, whichever process it was
_STALE_TEMP_S = 3600.0


class DiskFull(OSError):
    """The file system has no room (or the user's quota is spent)."""

    ERRNOS = (errno.ENOSPC, errno.EDQUOT)


def file_key(tag: str, digest: bytes) -> bytes:
    """The key (and file name) of a cache group's part of the block ``digest``: the digest
    itself for the full group's pages (tag ""), else a hash of the tag and the digest."""
    if not tag:
        return digest
    return hashlib.blake2b(tag.encode() + digest, digest_size=16).digest()


def encode(key: bytes, payload: bytes | memoryview) -> bytes:
    check = xxhash.xxh3_64_intdigest(payload)
    header = _HEADER.pack(MAGIC, FORMAT_VERSION, 0, key, len(payload), check)
    return header + bytes(payload)


def decode(key: bytes, data: bytes | memoryview) -> memoryview | None:
    """The payload of a block file's bytes (a view of them), or None when anything is wrong
    with them (``encode``'s inverse)."""
    view = memoryview(data)
    payload = view[HEADER_BYTES:]
    whole = len(view) >= HEADER_BYTES and _checked(key, view[:HEADER_BYTES], [payload])
    return payload if whole else None


def _checked(
    key: bytes, header: bytes | bytearray | memoryview, parts: Sequence[memoryview]
) -> bool:
    """Whether a block file's header and payload (read into ``parts``, in order) are whole."""
    magic, version, _, stored, length, check = _HEADER.unpack_from(header)
    if magic != MAGIC or version != FORMAT_VERSION or stored != key:
        return False
    if length != sum(part.nbytes for part in parts):
        return False
    digest = xxhash.xxh3_64()
    for part in parts:  # the hash of the whole payload, part after part
        digest.update(part)
    return digest.intdigest() == check


def _read_all(fd: int, buffers: list[memoryview]) -> int:
    """Fill ``buffers`` from ``fd`` (``readv``, again after a short read, a bounded number of
    buffers at a time); the bytes read (fewer: the file ended)."""
    total = 0
    while buffers:
        count = os.readv(fd, buffers[:_IOV_MAX])
        total += count
        if count == 0:
            break
        while buffers and count >= buffers[0].nbytes:
            count -= buffers[0].nbytes
            buffers = buffers[1:]
        if buffers and count:
            buffers = [buffers[0][count:], *buffers[1:]]
    return total


@dataclass
class _Entry:
    path: Path
    size: int
    digest: bytes | None  # None: another namespace's file (counted and evicted, never read)


class BlockFiles:
    """The files under one cache directory: this model's namespace to read and write, every
    namespace counted against the byte cap (the least recently used evicted first).
    ``description``: the namespace's ``namespace.json`` fields (written when missing, again
    after a ``macbatch cache clear`` removed it)."""

    def __init__(
        self,
        root: Path,
        namespace: str,
        cap_bytes: int,
        description: dict[str, object] | None = None,
    ) -> None:
        self.root = root.resolve()
        self.directory = self.root / namespace
        self.cap_bytes = cap_bytes
        self.description = description
        self._lock = threading.Lock()
        # every block file under the root, least recently used first
        self._lru: OrderedDict[Path, _Entry] = OrderedDict()
        self._mine: dict[bytes, Path] = {}  # this namespace's blocks
        # each namespace's mark as listed (its namespace.json's inode): a clear changes it
        self._marks: dict[Path, _Mark | None] = {}
        self.total_bytes = 0
        self.bytes_written = 0
        self.blocks_written = 0
        self.blocks_evicted = 0
        self.corrupt = 0
        self._counter = 0

    def open(self) -> None:
        """Create the namespace directory and prove it writable (``OSError`` if not), then list
        every block file of every namespace under the root (sizes and modification times:
        checksums are checked when a file is read, not here)."""
        self._ensure_namespace()
        probe = self.directory / f".probe.{os.getpid()}"
        os.close(os.open(probe, _CREATE))
        probe.unlink()
        found: list[tuple[float, Path, int, bytes | None]] = []
        now = time.time()
        for namespace in subfolders(self.root):
            mine = namespace == self.directory
            if not mine and namespace_record(namespace) is None:
                continue  # not a cache's folder: left alone
            self._marks[namespace] = _mark(namespace)
            _remove_stale_temps(namespace, now)
            for path, found_stat in block_entries(namespace):
                found.append(_listed(path, found_stat, mine))
        found.sort(key=lambda item: item[0])
        for _, path, size, digest in found:
            self._add(path, size, digest)

    def _ensure_namespace(self) -> None:
        """The namespace folder and its ``namespace.json``, made again when a clear removed
        them (its blocks then forgotten); ``OSError`` when it is a link or not a folder."""
        mark = _mark(self.directory)
        described = mark is not None and (self.description is None or mark[1] is not None)
        if described and mark == self._marks.get(self.directory):
            return
        with self._lock:
            self._forget_namespace(self.directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        if not is_real_dir(self.directory):
            raise OSError(errno.ENOTDIR, f"{self.directory} is a link or not a folder")
        if self.description is not None and not os.path.lexists(self.directory / NAMESPACE_FILE):
            text = json.dumps(self.description, indent=1).encode()
            temp = self.directory / f"{NAMESPACE_FILE}.{os.getpid()}.{id(self)}.tmp"
            _create(temp, text)
            os.replace(temp, self.directory / NAMESPACE_FILE)
        self._marks[self.directory] = _mark(self.directory)

    def refresh(self) -> None:
        """Forget the blocks of every namespace a ``macbatch cache clear`` removed since it was
        listed (a few ``lstat``: the byte counts follow what is on disk)."""
        for namespace, mark in list(self._marks.items()):
            if _mark(namespace) != mark:
                with self._lock:
                    self._forget_namespace(namespace)
                if namespace != self.directory:
                    self._marks.pop(namespace, None)

    def _forget_namespace(self, namespace: Path) -> None:
        for path in [p for p in self._lru if p.parent.parent == namespace]:
            self._forget(path)

    def _add(self, path: Path, size: int, digest: bytes | None) -> None:
        old = self._lru.pop(path, None)
        if old is not None:
            self.total_bytes -= old.size
        self._lru[path] = _Entry(path, size, digest)
        self.total_bytes += size
        if digest is not None:
            self._mine[digest] = path

    def _forget(self, path: Path) -> _Entry | None:
        entry = self._lru.pop(path, None)
        if entry is not None:
            self.total_bytes -= entry.size
            if entry.digest is not None:
                self._mine.pop(entry.digest, None)
        return entry

    def path_of(self, digest: bytes) -> Path:
        name = digest.hex()
        return self.directory / name[:2] / f"{name}{SUFFIX}"

    def __contains__(self, digest: bytes) -> bool:
        with self._lock:
            return digest in self._mine

    def present(self, digests: Sequence[bytes]) -> list[bool]:
        """Whether each of ``digests`` is on disk (one lock for them all: the engine thread asks
        this of every block of a prompt)."""
        with self._lock:
            mine = self._mine
            return [digest in mine for digest in digests]

    def payload_bytes(self, digest: bytes) -> int | None:
        """The payload's length of block ``digest``'s file as listed or written (None: not on
        disk), for a part whose payloads have lengths of their own."""
        with self._lock:
            path = self._mine.get(digest)
            entry = None if path is None else self._lru.get(path)
            return None if entry is None else entry.size - HEADER_BYTES

    @property
    def num_blocks(self) -> int:
        with self._lock:
            return len(self._mine)

    def write(self, digest: bytes, payload: bytes | memoryview) -> bool:
        """Write one block (atomically), then evict the least recently used files until the
        cap holds. False when it is on disk already or larger than the cap; ``DiskFull`` when
        the file system has no room (nothing is left behind)."""
        size = HEADER_BYTES + len(payload)
        if digest in self or size > self.cap_bytes:
            return False
        path = self.path_of(digest)
        with self._lock:
            self._counter += 1
            temp = path.with_name(f"{path.name}.{os.getpid()}.{self._counter}.tmp")
        try:
            self._ensure_namespace()
            _real_folder(path.parent)
            _create(temp, encode(digest, payload))
            os.replace(temp, path)
        except OSError as error:
            remove_owned(temp, temporary=True)
            if error.errno in DiskFull.ERRNOS:
                raise DiskFull(error.errno, str(error)) from error
            raise
        with self._lock:
            self._add(path, size, digest)
            self.bytes_written += size
            self.blocks_written += 1
            victims = self._over_cap()
        for victim in victims:
            remove_owned(victim)
        return True

    def _over_cap(self) -> list[Path]:
        victims = []
        while self.total_bytes > self.cap_bytes and self._lru:
            path = next(iter(self._lru))
            self._forget(path)
            victims.append(path)
            self.blocks_evicted += 1
        return victims

    def read(self, digest: bytes) -> memoryview | None:
        """A block's payload, checked (``read_into`` one buffer of the file's size)."""
        with self._lock:
            path = self._mine.get(digest)
        try:
            size = 0 if path is None else path.stat().st_size - HEADER_BYTES
        except OSError:
            size = 0
        data = np.empty(max(size, 0), dtype=np.uint8)  # not zeroed: the read fills it
        return memoryview(data.data) if self.read_into(digest, [memoryview(data.data)]) else None

    def read_into(self, digest: bytes, parts: Sequence[memoryview]) -> bool:
        """Read a block's payload straight into ``parts`` (its arrays' bytes, in order, each
        filled exactly: one ``readv``, no copy), and check it. False: not on disk, or deleted
        by another process, or torn or corrupt (then logged once and deleted; ``parts`` hold
        garbage). Marks the file most recently used, here and on disk (its modification time
        orders the LRU after a restart)."""
        with self._lock:
            path = self._mine.get(digest)
        if path is None:
            return False
        header = bytearray(HEADER_BYTES)
        expected = HEADER_BYTES + sum(part.nbytes for part in parts)
        try:
            with open(os.open(path, os.O_RDONLY | os.O_NOFOLLOW), "rb", buffering=0) as f:
                size = os.fstat(f.fileno()).st_size
                buffers = [memoryview(header), *parts]
                got = _read_all(f.fileno(), buffers) if size == expected else -1
        except OSError:
            with self._lock:
                self._forget(path)
            return False
        if got != expected or not _checked(digest, header, parts):
            log.warning(
                "disk KV cache: %s is torn or corrupt (%d bytes); deleted, its tokens are "
                "computed instead",
                path,
                size,
            )
            with self._lock:
                self._forget(path)
                self.corrupt += 1
            remove_owned(path)
            return False
        with self._lock:
            if path in self._lru:
                self._lru.move_to_end(path)
        with contextlib.suppress(OSError, NotImplementedError):
            os.utime(path, follow_symlinks=False)
        return True


_Mark = tuple[int, tuple[int, int] | None]


def _mark(namespace: Path) -> _Mark | None:
    """What changes when a namespace is cleared: its folder's inode and its
    ``namespace.json``'s inode and time (None: no folder; None in it: no ``namespace.json``)."""
    try:
        folder = os.lstat(namespace).st_ino
    except OSError:
        return None
    try:
        described = os.lstat(namespace / NAMESPACE_FILE)
    except OSError:
        return (folder, None)
    return (folder, (described.st_ino, described.st_mtime_ns))


def _real_folder(path: Path) -> None:
    """Make the shard folder ``path``; ``OSError`` when it is a link or not a folder (a block
    is never written through a link out of the cache directory)."""
    with contextlib.suppress(FileExistsError):
        path.mkdir()
    if not is_real_dir(path):
        raise OSError(errno.ENOTDIR, f"{path} is a link or not a folder the cache made")


def _create(path: Path, data: bytes) -> None:
    """Write a new file (never through a link, never over another)."""
    fd = os.open(path, _CREATE, 0o644)
    with open(fd, "wb") as f:
        f.write(data)


def _remove_stale_temps(namespace: Path, now: float) -> None:
    """Delete a crashed writer's temporary files (its own names, older than an hour)."""
    for folder in [namespace, *shards(namespace)]:
        try:
            entries = [e for e in os.scandir(folder) if is_temp_name(e.name)]
        except OSError:
            continue
        for entry in entries:
            with contextlib.suppress(OSError):
                if now - entry.stat(follow_symlinks=False).st_mtime > _STALE_TEMP_S:
                    remove_owned(Path(entry.path), temporary=True)


def _listed(path: Path, found: os.stat_result, mine: bool) -> tuple[float, Path, int, bytes | None]:
    """The index's record of one block file (its digest when it is this namespace's)."""
    digest = bytes.fromhex(path.name[: -len(SUFFIX)]) if mine else None
    return (found.st_mtime, path, found.st_size, digest)
