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

log = logging.getLogger("macbatch.disk_cache")

FORMAT_VERSION = 3  # 3: XXH3-64 instead of CRC-32
MAGIC = b"MBKV"
_HEADER = struct.Struct("<4sHH16sQQ24x")  # magic, version, reserved, key, length, XXH3-64
HEADER_BYTES = _HEADER.size
SUFFIX = ".kvb"
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
    namespace counted against the byte cap (the least recently used evicted first)."""

    def __init__(self, root: Path, namespace: str, cap_bytes: int) -> None:
        self.root = root
        self.directory = root / namespace
        self.cap_bytes = cap_bytes
        self._lock = threading.Lock()
        # every block file under the root, least recently used first
        self._lru: OrderedDict[Path, _Entry] = OrderedDict()
        self._mine: dict[bytes, Path] = {}  # this namespace's blocks
        self.total_bytes = 0
        self.bytes_written = 0
        self.blocks_written = 0
        self.blocks_evicted = 0
        self.corrupt = 0
        self._counter = 0

    def open(self) -> None:
        """Create the namespace directory and prove it writable (``OSError`` if not), then list
        every block file under the root (sizes and modification times: checksums are checked
        when a file is read, not here)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        probe = self.directory / f".probe.{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
        found: list[tuple[float, Path, int, bytes | None]] = []
        now = time.time()
        for namespace in _subdirs(self.root):
            mine = namespace == self.directory
            for shard in _subdirs(namespace):
                for entry in os.scandir(shard):
                    found.extend(_listed(entry, mine, now))
        found.sort(key=lambda item: item[0])
        for _, path, size, digest in found:
            self._add(path, size, digest)

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
            path.parent.mkdir(exist_ok=True)
            with open(temp, "wb") as f:
                f.write(encode(digest, payload))
            os.replace(temp, path)
        except OSError as error:
            _remove(temp)
            if error.errno in DiskFull.ERRNOS:
                raise DiskFull(error.errno, str(error)) from error
            raise
        with self._lock:
            self._add(path, size, digest)
            self.bytes_written += size
            self.blocks_written += 1
            victims = self._over_cap()
        for victim in victims:
            _remove(victim)
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
            with open(path, "rb", buffering=0) as f:
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
            _remove(path)
            return False
        with self._lock:
            if path in self._lru:
                self._lru.move_to_end(path)
        with contextlib.suppress(OSError):
            os.utime(path)
        return True


def _subdirs(path: Path) -> list[Path]:
    try:
        return [Path(e.path) for e in os.scandir(path) if e.is_dir(follow_symlinks=False)]
    except OSError:
        return []


def _listed(
    entry: os.DirEntry[str], mine: bool, now: float
) -> list[tuple[float, Path, int, bytes | None]]:
    """The index's record of one directory entry (none for what is not a block file; a crashed
    writer's stale temporary file is deleted)."""
    try:
        stat = entry.stat(follow_symlinks=False)
    except OSError:
        return []
    name = entry.name
    if name.endswith(".tmp"):
        if now - stat.st_mtime > _STALE_TEMP_S:
            _remove(Path(entry.path))
        return []
    if not name.endswith(SUFFIX):
        return []
    digest = None
    if mine:
        try:
            digest = bytes.fromhex(name[: -len(SUFFIX)])
        except ValueError:
            return []
    return [(stat.st_mtime, Path(entry.path), stat.st_size, digest)]


def _remove(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.unlink()
