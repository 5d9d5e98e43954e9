"""The disk tier below the RAM prefix cache: prompt blocks are copied out of the pages and written
to disk off the engine thread, and a waiting request's blocks found on disk are read back before
it is scheduled (docs/engine.md, "The disk tier").

Writing: a full block the prefix cache names is worth keeping when it is part of a prompt (the
prompt's own computed blocks, and RAM-cached blocks a later prompt reuses: a conversation's
earlier replies become its next prompt); a reply's blocks no prompt reuses are never written. Its
rows are gathered into the step's own evaluation (``capture``: lazy gathers the runner launches
with the step, read on the host once the step's tokens are, ``flush``), and one writer thread
turns them into files. Nothing here blocks the step: when the writes queued exceed
``max_queued_bytes`` the newest are dropped (counted), and a full disk stops writing.

Reading: ``prefetch`` (when a request is queued) hands the digests past its RAM prefix that are
on disk to a reader thread; the scheduler passes over a request until they are in (``ready``),
and the KV manager then scatters them into fresh blocks (one op per page array) and names them.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Protocol

import mlx.core as mx
import numpy as np

from macbatch.engine.kv.disk.files import BlockFiles, DiskFull

log = logging.getLogger("macbatch.disk_cache")

READERS = 4


class BlockPages(Protocol):
    """What the tier reads and writes of the pages (``KVStore``)."""

    def block_slab_bytes(self) -> list[int]: ...

    def gather_blocks(self, blocks: Sequence[int]) -> list[mx.array]: ...

    def scatter_blocks(self, blocks: Sequence[int], slabs: Sequence[np.ndarray]) -> None: ...


class Names(Protocol):
    """The prefix cache's names (``BlockPool``)."""

    def lookup(self, digest: bytes) -> int | None: ...


@dataclass
class DiskCounts:
    """What the tier did since the engine started (``EngineStats``)."""

    bytes_written: int = 0
    blocks_written: int = 0
    bytes_read: int = 0
    blocks_read: int = 0
    writes_dropped: int = 0
    corrupt: int = 0
    blocks_on_disk: int = 0
    bytes_on_disk: int = 0


@dataclass
class _Capture:
    step: int
    digests: list[bytes]
    arrays: list[mx.array]


class DiskTier:
    def __init__(
        self, files: BlockFiles, pages: BlockPages, names: Names, max_queued_bytes: int
    ) -> None:
        self.files = files
        self.pages = pages
        self.names = names
        self.max_queued_bytes = max_queued_bytes
        self.block_bytes = sum(pages.block_slab_bytes())
        self.writing = True
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="macbatch-disk-write")
        # reads overlap (the checksum releases the GIL): an SSD serves several at once
        self._reader = ThreadPoolExecutor(READERS, thread_name_prefix="macbatch-disk-read")
        self._lock = threading.Lock()
        self._named: list[tuple[int, bytes]] = []  # (block, digest) to capture
        self._queued: set[bytes] = set()  # digests captured, not written yet
        self._queued_bytes = 0
        self._captures: list[_Capture] = []
        self._reads: dict[bytes, Future[bytes | None]] = {}
        self._wants: dict[str, list[bytes]] = {}  # request id -> its digests being read
        self._bytes_read = 0
        self._blocks_read = 0
        self._dropped = 0
        self._warned: set[str] = set()

    # -- writing -----------------------------------------------------------------------------

    def keep(self, blocks: Sequence[int], digests: Sequence[bytes]) -> None:
        """Blocks worth keeping, named in the prefix cache under ``digests``: written unless on
        disk already (their pages are copied with the next step)."""
        if not self.writing:
            return
        for block, digest in zip(blocks, digests):
            with self._lock:
                if digest in self._queued:
                    continue
            if digest not in self.files:
                self._named.append((block, digest))
                with self._lock:
                    self._queued.add(digest)

    def capture(self, step: int) -> list[mx.array]:
        """Gathers of the blocks named since the last capture, to evaluate with step ``step``
        (still named: a block evicted since may hold another request's rows now)."""
        named, self._named = self._named, []
        live = [(b, d) for b, d in named if self.names.lookup(d) == b]
        with self._lock:
            kept = {d for _, d in live}
            for _, digest in named:
                if digest not in kept:
                    self._queued.discard(digest)
            room = max(0, self.max_queued_bytes - self._queued_bytes) // self.block_bytes
            if len(live) > room:
                self._dropped += len(live) - room
                for _, digest in live[room:]:
                    self._queued.discard(digest)
                live = live[:room]
            self._queued_bytes += len(live) * self.block_bytes
        if not live:
            return []
        arrays = self.pages.gather_blocks([b for b, _ in live])
        self._captures.append(_Capture(step, [d for _, d in live], arrays))
        return arrays

    def flush(self, step: int) -> None:
        """Hand the captures evaluated with steps up to ``step`` to the writer (their bytes
        copied to the host here: the step is done, so this does not wait)."""
        ready = [c for c in self._captures if c.step <= step]
        if not ready:
            return
        self._captures = [c for c in self._captures if c.step > step]
        for capture in ready:
            slabs = [np.array(a) for a in capture.arrays]
            self._writer.submit(self._write, capture.digests, slabs)

    def capture_now(self) -> None:
        """Capture and flush at once (the engine is idle: nothing to ride along with)."""
        arrays = self.capture(-1)
        if arrays:
            mx.eval(arrays)
        self.flush(-1)

    def _write(self, digests: list[bytes], slabs: list[np.ndarray]) -> None:
        for i, digest in enumerate(digests):
            try:
                if self.writing:
                    payload = b"".join(np.ascontiguousarray(s[i]).tobytes() for s in slabs)
                    self.files.write(digest, payload)
            except OSError as error:
                if isinstance(error, DiskFull) or error.errno in DiskFull.ERRNOS:
                    if self.writing:
                        self.writing = False
                        log.warning("disk KV cache: the disk is full (%s); writing stops", error)
                else:
                    self._warn_once("write", f"disk KV cache: a block write failed ({error})")
            finally:
                with self._lock:
                    self._queued.discard(digest)
                    self._queued_bytes -= self.block_bytes

    def _warn_once(self, kind: str, message: str) -> None:
        if kind not in self._warned:
            self._warned.add(kind)
            log.warning(message)

    # -- reading -----------------------------------------------------------------------------

    def prefetch(self, request_id: str, digests: Sequence[bytes]) -> None:
        """Start reading the leading ``digests`` that are on disk (a waiting request's blocks
        past its RAM prefix)."""
        wanted = []
        for digest in digests:
            if digest not in self._reads:
                if digest not in self.files:
                    break
                self._reads[digest] = self._reader.submit(self._read, digest)
            wanted.append(digest)
        if wanted:
            self._wants[request_id] = wanted

    def _read(self, digest: bytes) -> bytes | None:
        payload = self.files.read(digest)
        if payload is not None and len(payload) != self.block_bytes:
            payload = None  # cannot happen within a namespace; never scatter a wrong size
        if payload is not None:
            with self._lock:
                self._bytes_read += len(payload)
                self._blocks_read += 1
        return payload

    def ready(self, request_id: str) -> bool:
        """Whether the request's blocks being read are all in (or failed)."""
        wants = self._wants.get(request_id)
        return wants is None or all(self._reads[d].done() for d in wants if d in self._reads)

    def wait(self, timeout: float) -> None:
        """Block until a read finishes (the engine has nothing else to do)."""
        pending = [f for f in self._reads.values() if not f.done()]
        if pending:
            wait(pending, timeout=timeout, return_when="FIRST_COMPLETED")

    def loaded(self, digests: Sequence[bytes]) -> int:
        """How many of the leading ``digests`` were read and checked."""
        count = 0
        for digest in digests:
            future = self._reads.get(digest)
            if future is None or not future.done() or future.result() is None:
                break
            count += 1
        return count

    def load(self, blocks: Sequence[int], digests: Sequence[bytes]) -> None:
        """Write the read blocks ``digests`` into the pages of ``blocks`` (the KV manager
        allocated them and names them)."""
        payloads = [self._reads.pop(d).result() for d in digests]
        # ``loaded`` counted only checked reads: a missing one would shift every block after it
        assert all(p is not None for p in payloads), "a block not read is never loaded"
        slabs = self.pages.block_slab_bytes()
        data = np.frombuffer(b"".join(p for p in payloads if p is not None), dtype=np.uint8)
        per_block = data.reshape(len(blocks), -1)
        parts, start = [], 0
        for slab in slabs:
            parts.append(np.ascontiguousarray(per_block[:, start : start + slab]))
            start += slab
        self.pages.scatter_blocks(blocks, parts)

    def forget(self, request_id: str) -> None:
        """The request no longer waits for its reads (admitted, or gone); reads nobody else
        wants are dropped."""
        wants = self._wants.pop(request_id, None)
        if not wants:
            return
        still = {d for w in self._wants.values() for d in w}
        for digest in wants:
            if digest not in still:
                future = self._reads.pop(digest, None)
                if future is not None:
                    future.cancel()

    # -- the rest ----------------------------------------------------------------------------

    def counts(self) -> DiskCounts:
        files = self.files
        with self._lock:
            return DiskCounts(
                bytes_written=files.bytes_written,
                blocks_written=files.blocks_written,
                bytes_read=self._bytes_read,
                blocks_read=self._blocks_read,
                writes_dropped=self._dropped,
                corrupt=files.corrupt,
                blocks_on_disk=files.num_blocks,
                bytes_on_disk=files.total_bytes,
            )

    def close(self) -> None:
        """Write what was captured (the engine stops stepping), and wait for the writer."""
        self.capture_now()
        self._writer.shutdown(wait=True)
        self._reader.shutdown(wait=False, cancel_futures=True)
