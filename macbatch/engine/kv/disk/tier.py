"""The disk tier below the RAM prefix cache: prompt blocks are copied out of the cache groups'
memory and written to disk off the engine thread, and a waiting request's prefix found on disk
is read back before it is scheduled (docs/engine.md, "The disk tier").

It keeps, for each block of the prefix cache's chain, every cache group's part of it
(``group.DiskPart``: full attention's pages, a sliding window's, a recurrent state's
checkpoint), one file per part, and loops over the parts: it knows no kind.
A prefix is usable from disk only as far as every part it needs is there (in RAM or read), the
all-agree rule the KV manager applies to RAM.

Writing: a full block the prefix cache names is worth keeping when it is part of a prompt (the
prompt's own computed blocks, and RAM-cached blocks a later prompt reuses: a conversation's
earlier replies become its next prompt); a reply's blocks no prompt reuses are never written.
Each part's bytes are gathered into the step's own evaluation (``capture``: lazy gathers the
runner launches with the step, read on the host once the step's tokens are, ``flush``), and one
writer thread turns them into files. Nothing here blocks the step: when the writes queued exceed
``max_queued_bytes`` the newest are dropped (counted), and a full disk stops writing.

Reading: ``prefetch`` (when a request is queued) hands the parts of its longest prefix on disk
to reader threads, while the bytes read for waiting requests stay under ``max_read_bytes`` (the
oldest waiting request's reads always start, so none waits forever); the scheduler passes over
a request until they are in (``ready``), and ``restore`` then puts them into each group's memory,
named in the prefix cache, from where the KV manager takes the prefix as from RAM.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from macbatch.engine.kv.disk.files import BlockFiles, DiskFull, file_key
from macbatch.engine.kv.group import DiskPart

log = logging.getLogger("macbatch.disk_cache")

READERS = 4

# a part of one block: its group's tag and the block's chain digest
Key = tuple[str, bytes]


@dataclass
class DiskCounts:
    """What the tier did since the engine started (``EngineStats``)."""

    # blocks: files, each one cache group's part of one block (a plain model's: its blocks)
    bytes_written: int = 0
    blocks_written: int = 0
    bytes_read: int = 0
    blocks_read: int = 0
    writes_dropped: int = 0
    corrupt: int = 0
    blocks_on_disk: int = 0
    bytes_on_disk: int = 0
    bytes_read_ahead: int = 0  # now: read (or being read) for requests not scheduled yet


@dataclass
class _Capture:
    step: int
    tag: str
    digests: list[bytes]
    arrays: list[mx.array]


class DiskTier:
    def __init__(
        self,
        files: BlockFiles,
        parts: Sequence[DiskPart],
        max_queued_bytes: int,
        max_read_bytes: int,
    ) -> None:
        """``parts``: every cache group's (the full group's first); ``max_read_bytes``: the
        most bytes read ahead for requests not scheduled yet."""
        self.files = files
        self.parts = {part.tag: part for part in parts}
        self.max_queued_bytes = max_queued_bytes
        self.max_read_bytes = max_read_bytes
        self._slabs = {part.tag: part.slab_bytes() for part in parts}
        self._bytes = {tag: sum(slabs) for tag, slabs in self._slabs.items()}
        self.writing = True
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="macbatch-disk-write")
        # reads overlap (the checksum releases the GIL): an SSD serves several at once
        self._reader = ThreadPoolExecutor(READERS, thread_name_prefix="macbatch-disk-read")
        self._lock = threading.Lock()
        self._named: list[Key] = []  # parts to capture
        self._queued: set[Key] = set()  # captured or to capture, not written yet
        self._queued_bytes = 0
        self._captures: list[_Capture] = []
        self._reads: dict[Key, Future[memoryview | None]] = {}
        self._wants: dict[str, list[Key]] = {}  # request id -> the parts it waits for
        self._chains: dict[str, Sequence[bytes]] = {}  # request id -> its prefix's digests
        self._wanted: Counter[Key] = Counter()  # how many waiting requests want each part
        self._started: dict[str, int] = {}  # request id -> how many of its reads started
        self._done: dict[str, int] = {}  # request id -> how many of its reads are in
        self._checked: set[str] = set()  # requests whose reads are all in and whole
        self._failed: set[Key] = set()  # parts whose read failed (their files are gone)
        self._read_bytes = 0  # of the reads started and not dropped yet
        self._bytes_read = 0
        self._blocks_read = 0
        self._dropped = 0
        self._warned: set[str] = set()

    def _on_disk(self, tag: str, digest: bytes) -> bool:
        return (tag, digest) not in self._failed and file_key(tag, digest) in self.files

    # -- writing -----------------------------------------------------------------------------

    def keep(self, digests: Sequence[bytes]) -> None:
        """Blocks worth keeping, named in the prefix cache under ``digests``: every part of
        them a group holds is written unless on disk already (copied with the next step)."""
        if not self.writing:
            return
        for tag in self.parts:
            for digest in digests:
                key = (tag, digest)
                with self._lock:
                    if key in self._queued:
                        continue
                if not self._on_disk(tag, digest):
                    self._named.append(key)
                    with self._lock:
                        self._queued.add(key)

    def capture(self, step: int) -> list[mx.array]:
        """Gathers of the parts named since the last capture that their groups still hold
        (a block evicted since may hold another request's rows), to evaluate with step
        ``step``."""
        named, self._named = self._named, []
        arrays: list[mx.array] = []
        for tag, part in self.parts.items():
            mine = [d for t, d in named if t == tag]
            places = [part.lookup(d) for d in mine]
            live = [(p, d) for p, d in zip(places, mine) if p is not None]
            live = self._within_queue(tag, mine, live)
            if live:
                gathered = part.gather([p for p, _ in live])
                self._captures.append(_Capture(step, tag, [d for _, d in live], gathered))
                arrays += gathered
        return arrays

    def _within_queue(
        self, tag: str, named: list[bytes], live: list[tuple[int, bytes]]
    ) -> list[tuple[int, bytes]]:
        """Of ``live``, those the writer's queue has room for (the rest dropped, counted)."""
        size = self._bytes[tag]
        with self._lock:
            kept = {d for _, d in live}
            for digest in named:
                if digest not in kept:
                    self._queued.discard((tag, digest))
            room = max(0, self.max_queued_bytes - self._queued_bytes) // max(1, size)
            if len(live) > room:
                self._dropped += len(live) - room
                for _, digest in live[room:]:
                    self._queued.discard((tag, digest))
                live = live[:room]
            self._queued_bytes += len(live) * size
        return live

    def flush(self, step: int) -> None:
        """Hand the captures evaluated with steps up to ``step`` to the writer (their bytes
        copied to the host here: the step is done, so this does not wait)."""
        ready = [c for c in self._captures if c.step <= step]
        if not ready:
            return
        self._captures = [c for c in self._captures if c.step > step]
        for capture in ready:
            slabs = [np.array(a) for a in capture.arrays]
            self._writer.submit(self._write, capture.tag, capture.digests, slabs)

    def capture_now(self) -> None:
        """Capture and flush at once (the engine is idle: nothing to ride along with)."""
        arrays = self.capture(-1)
        if arrays:
            mx.eval(arrays)
        self.flush(-1)

    def _write(self, tag: str, digests: list[bytes], slabs: list[np.ndarray]) -> None:
        for i, digest in enumerate(digests):
            try:
                if self.writing:
                    payload = b"".join(np.ascontiguousarray(s[i]).tobytes() for s in slabs)
                    self.files.write(file_key(tag, digest), payload)
                    self._failed.discard((tag, digest))  # whole again
            except OSError as error:
                if isinstance(error, DiskFull) or error.errno in DiskFull.ERRNOS:
                    if self.writing:
                        self.writing = False
                        log.warning("disk KV cache: the disk is full (%s); writing stops", error)
                else:
                    self._warn_once("write", f"disk KV cache: a block write failed ({error})")
            finally:
                with self._lock:
                    self._queued.discard((tag, digest))
                    self._queued_bytes -= self._bytes[tag]

    def _warn_once(self, kind: str, message: str) -> None:
        if kind not in self._warned:
            self._warned.add(kind)
            log.warning(message)

    # -- reading -----------------------------------------------------------------------------

    def _reach(self, chain: Sequence[bytes], found: dict[str, list[bool]]) -> int:
        """The most leading blocks of ``chain`` every part can resume after, where
        ``found[tag][i]``: the part of block i is there (in memory, or on disk, or read)."""
        missing = {}  # per part, how many blocks before i lack it (a range's check is O(1))
        for tag, flags in found.items():
            counts = np.concatenate([[0], np.cumsum(~np.asarray(flags, dtype=bool))])
            missing[tag] = counts
        for count in range(len(chain), 0, -1):
            if all(
                missing[tag][r.stop] == missing[tag][r.start]
                for tag, part in self.parts.items()
                for r in (part.needs(count),)
            ):
                return count
        return 0

    def _held(self, chain: Sequence[bytes]) -> dict[str, list[bool]]:
        return {
            tag: [part.lookup(d) is not None for d in chain] for tag, part in self.parts.items()
        }

    def prefetch(self, request_id: str, chain: Sequence[bytes]) -> None:
        """Start reading the parts of the longest prefix of ``chain`` (a waiting request's
        blocks) that are on disk and not in memory."""
        self._chains[request_id] = chain
        held = self._held(chain)
        found = {
            tag: [h or self._on_disk(tag, d) for h, d in zip(held[tag], chain)]
            for tag in self.parts
        }
        count = self._reach(chain, found)
        wants = [
            (tag, chain[i])
            for tag, part in self.parts.items()
            for i in part.needs(count)
            if not held[tag][i]
        ]
        if wants:
            self._wants[request_id] = wants
            self._wanted.update(wants)
            self._start_reads()

    def _start_reads(self) -> None:
        """Start the waiting requests' reads, oldest first, while the bytes read ahead stay
        under ``max_read_bytes`` (the oldest request's always start). Each request's reads
        start in order, so a cursor says how many have (a job's hundred rows waiting on one
        prompt cost one look each)."""
        for i, (request_id, wants) in enumerate(self._wants.items()):
            started = self._started.get(request_id, 0)
            for key in wants[started:]:
                if key not in self._reads:
                    size = self._bytes[key[0]]
                    if i and self._read_bytes + size > self.max_read_bytes:
                        self._started[request_id] = started
                        return
                    self._read_bytes += size
                    self._reads[key] = self._reader.submit(self._read, key)
                started += 1
            self._started[request_id] = started

    def _read(self, key: Key) -> memoryview | None:
        tag, digest = key
        payload = self.files.read(file_key(tag, digest))
        if payload is not None and len(payload) != self._bytes[tag]:
            payload = None  # cannot happen within a namespace; never scatter a wrong size
        if payload is not None:
            with self._lock:
                self._bytes_read += len(payload)
                self._blocks_read += 1
        return payload

    def ready(self, request_id: str) -> bool:
        """Whether the request's reads are all in. When one failed (a corrupt file, or one
        another process evicted), the reads of the longest prefix still on disk start instead
        (a checkpoint further back), and it waits for those."""
        wants = self._wants.get(request_id)
        if wants is None or request_id in self._checked:
            return True
        done = self._done.get(request_id, 0)  # its reads in, from the first (a cursor)
        while done < len(wants) and self._finished(wants[done]):
            done += 1
        self._done[request_id] = done
        if done < len(wants):
            return False
        failed = [k for k in wants if self._payload(k) is None]
        if not failed:
            self._checked.add(request_id)
            return True
        self._failed.update(failed)  # never planned again in this process, unless rewritten
        self._unwant(request_id)
        self.prefetch(request_id, self._chains[request_id])
        self._drop(wants)
        return self.ready(request_id)

    def _finished(self, key: Key) -> bool:
        future = self._reads.get(key)
        return future is not None and future.done()

    def wait(self, timeout: float) -> None:
        """Block until a read finishes (the engine has nothing else to do)."""
        pending = [f for f in self._reads.values() if not f.done()]
        if pending:
            wait(pending, timeout=timeout, return_when="FIRST_COMPLETED")

    def _payload(self, key: Key) -> memoryview | None:
        future = self._reads.get(key)
        if future is None or not future.done() or future.cancelled():
            return None
        return future.result()

    def restore(self, request_id: str, chain: Sequence[bytes]) -> None:
        """Put the request's parts read from disk into their groups' memory, named in the
        prefix cache (idle there: the KV manager takes the prefix next), as far as every part
        agrees: the longest prefix of ``chain`` each part has in memory or read."""
        if request_id not in self._wants:
            return
        held = self._held(chain)
        found = {
            tag: [h or self._payload((tag, d)) is not None for h, d in zip(held[tag], chain)]
            for tag in self.parts
        }
        count = self._reach(chain, found)
        keep = chain[:count]
        for tag, part in self.parts.items():
            digests = [chain[i] for i in part.needs(count) if not held[tag][i]]
            if digests:
                part.restore(digests, self._slabs_of(tag, digests), keep)

    def _slabs_of(self, tag: str, digests: Sequence[bytes]) -> list[np.ndarray]:
        """The parts read for ``digests``, ``[len(digests), slab]`` uint8 per array, each
        contiguous (MLX copies a strided array element by element: 40 times slower)."""
        sizes = self._slabs[tag]
        slabs = [np.empty((len(digests), size), dtype=np.uint8) for size in sizes]
        for i, digest in enumerate(digests):
            payload = self._payload((tag, digest))
            assert payload is not None, "a part not read is never restored"
            data = np.frombuffer(payload, dtype=np.uint8)
            start = 0
            for slab, size in zip(slabs, sizes):
                slab[i] = data[start : start + size]
                start += size
        return slabs

    def forget(self, request_id: str) -> None:
        """The request no longer waits for its reads (admitted, or gone); reads nobody else
        wants are dropped, and the reads their bytes made wait start."""
        self._chains.pop(request_id, None)
        wants = self._unwant(request_id)
        if wants:
            self._drop(wants)

    def _unwant(self, request_id: str) -> list[Key]:
        """Forget what the request waits for (its reads stay, for ``_drop``); what it was."""
        wants = self._wants.pop(request_id, [])
        self._wanted.subtract(wants)
        self._started.pop(request_id, None)
        self._done.pop(request_id, None)
        self._checked.discard(request_id)
        return wants

    def _drop(self, keys: Sequence[Key]) -> None:
        """Drop the reads of ``keys`` no waiting request wants, and start those they made
        wait."""
        for key in keys:
            if self._wanted[key] <= 0:
                del self._wanted[key]
                future = self._reads.pop(key, None)
                if future is not None:
                    future.cancel()
                    self._read_bytes -= self._bytes[key[0]]
        self._start_reads()

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
                bytes_read_ahead=self._read_bytes,
            )

    def close(self) -> None:
        """Write what was captured (the engine stops stepping), and wait for the writer."""
        self.capture_now()
        self._writer.shutdown(wait=True)
        self._reader.shutdown(wait=False, cancel_futures=True)
