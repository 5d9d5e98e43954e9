"""The disk tier below the RAM prefix cache: prompt blocks are copied out of the cache groups'
memory and written to disk off the engine thread, and a waiting request's prefix found on disk
is read back before it is scheduled (docs/engine.md, "The disk tier").

It keeps, for each block of the prefix cache's chain, every cache group's part of it
(``group.DiskPart``: full attention's pages, a sliding window's, a recurrent state's
checkpoint, held library caches' checkpoint), one file per part, and loops over the parts: it
knows no kind (a part that is not ``sized`` has payloads of their own lengths).
A prefix is usable from disk only as far as every part it needs is there (in RAM or read), the
all-agree rule the KV manager applies to RAM.

Writing: a full block the prefix cache names is worth keeping when it is part of a prompt (the
prompt's own computed blocks, and RAM-cached blocks a later prompt reuses: a conversation's
earlier replies become its next prompt); a reply's blocks no prompt reuses are never written.
Each part's bytes are gathered into the step's own evaluation (``capture``: lazy gathers the
runner launches with the step, read on the host once the step's tokens are, ``flush``), and one
writer thread turns them into files. Nothing here blocks the step: when the writes queued exceed
``max_queued_bytes`` the newest are dropped (counted), and a full disk stops writing.

Reading: a waiting request's prefix on disk is read before it is scheduled and put into the
groups' memory when it is (``reads.py``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from itertools import accumulate

import mlx.core as mx
import numpy as np

from macbatch.engine.kv.disk.files import BlockFiles, DiskFull, file_key
from macbatch.engine.kv.disk.reads import Key, Reads
from macbatch.engine.kv.group import DiskPart

log = logging.getLogger("macbatch.disk_cache")


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
    own: bool  # the arrays are buffers of their own (``DiskPart.gathers_own_buffers``)
    sizes: list[int]  # each digest's payload bytes
    sized: bool  # ``DiskPart.sized``: a payload is row i of every array, else array i


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
        self._bytes = {part.tag: sum(part.slab_bytes()) for part in parts}  # sized parts'
        self.reads = Reads(files, self.parts, max_read_bytes)
        self.writing = True
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="macbatch-disk-write")
        self._lock = threading.Lock()
        self._named: list[Key] = []  # parts to capture
        self._queued: set[Key] = set()  # captured or to capture, not written yet
        self._queued_bytes = 0
        self._captures: list[_Capture] = []
        self._dropped = 0
        self._warned: set[str] = set()

    # -- writing -----------------------------------------------------------------------------

    def keep(self, digests: Sequence[bytes]) -> None:
        """Blocks worth keeping, named in the prefix cache under ``digests``: every part of
        them a group holds is written unless on disk already (copied with the next step).
        Called for every block of every prompt on the engine thread, so each lock is taken
        once per call, not per block."""
        if not self.writing or not digests:
            return
        keys = [(tag, digest) for tag in self.parts for digest in digests]
        with self._lock:  # queued first: a part written since is on disk by the time it is not
            keys = [key for key in dict.fromkeys(keys) if key not in self._queued]
        on_disk = self.files.present([file_key(*key) for key in keys])
        new = [key for key, there in zip(keys, on_disk) if not there]
        self._named += new
        with self._lock:
            self._queued.update(new)

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
            held = [p for p, _ in live]
            # a payload of its own length is gathered (lazily) to know it
            gathered = None if part.sized else part.gather(held)
            if gathered is None:
                sizes = [self._bytes[tag]] * len(live)
            else:
                sizes = [a.nbytes for a in gathered]
            count = self._within_queue(tag, mine, live, sizes)
            if count:
                gathered = part.gather(held[:count]) if gathered is None else gathered[:count]
                digests = [d for _, d in live[:count]]
                own = part.gathers_own_buffers
                capture = _Capture(step, tag, digests, gathered, own, sizes[:count], part.sized)
                self._captures.append(capture)
                arrays += gathered
        return arrays

    def _within_queue(
        self, tag: str, named: list[bytes], live: list[tuple[int, bytes]], sizes: list[int]
    ) -> int:
        """How many of ``live`` (from the first, ``sizes`` bytes each) the writer's queue has
        room for (the rest dropped, counted)."""
        with self._lock:
            kept = {d for _, d in live}
            for digest in named:
                if digest not in kept:
                    self._queued.discard((tag, digest))
            room = self.max_queued_bytes - self._queued_bytes
            fit = sum(1 for total in accumulate(sizes) if total <= room)
            if len(live) > fit:
                self._dropped += len(live) - fit
                for _, digest in live[fit:]:
                    self._queued.discard((tag, digest))
            self._queued_bytes += sum(sizes[:fit])
        return fit

    def flush(self, step: int) -> None:
        """Hand the captures evaluated with steps up to ``step`` to the writer (the step is
        done, so this does not wait): gathers that are arrays of their own (a block part's),
        which nothing writes, as zero-copy views that keep them alive, copied out block by
        block on the writer thread, not here (a step's prompt blocks of a real model are tens
        of MB); others (a checkpoint's row, a slice of the store) copied here."""
        ready = [c for c in self._captures if c.step <= step]
        if not ready:
            return
        self._captures = [c for c in self._captures if c.step > step]
        for capture in ready:
            slabs = [np.array(a, copy=not capture.own) for a in capture.arrays]
            self._writer.submit(self._write, capture, slabs)

    def capture_now(self) -> None:
        """Capture and flush at once (the engine is idle: nothing to ride along with)."""
        arrays = self.capture(-1)
        if arrays:
            mx.eval(arrays)
        self.flush(-1)

    def _write(self, capture: _Capture, slabs: list[np.ndarray]) -> None:
        tag = capture.tag
        for i, digest in enumerate(capture.digests):
            try:
                if self.writing:
                    rows = [s[i] for s in slabs] if capture.sized else [slabs[i]]
                    payload = b"".join(np.ascontiguousarray(row).tobytes() for row in rows)
                    self.files.write(file_key(tag, digest), payload)
                    self.reads.rewritten((tag, digest))
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
                    self._queued_bytes -= capture.sizes[i]

    def _warn_once(self, kind: str, message: str) -> None:
        if kind not in self._warned:
            self._warned.add(kind)
            log.warning(message)

    # -- reading (``reads.py``) ------------------------------------------------------------

    def prefetch(self, request_id: str, chain: Sequence[bytes]) -> None:
        self.reads.prefetch(request_id, chain)

    def ready(self, request_id: str) -> bool:
        return self.reads.ready(request_id)

    def wait(self, timeout: float) -> None:
        self.reads.wait(timeout)

    def restore(self, request_id: str, chain: Sequence[bytes]) -> None:
        self.reads.restore(request_id, chain)

    def forget(self, request_id: str) -> None:
        self.reads.forget(request_id)

    # -- the rest ----------------------------------------------------------------------------

    def counts(self) -> DiskCounts:
        """The counts now (safe from any thread: the server reads them while the engine idles),
        of what is on disk (a namespace cleared since is forgotten)."""
        files = self.files
        files.refresh()
        with self._lock:
            return DiskCounts(
                bytes_written=files.bytes_written,
                blocks_written=files.blocks_written,
                bytes_read=self.reads.bytes_read,
                blocks_read=self.reads.blocks_read,
                writes_dropped=self._dropped,
                corrupt=files.corrupt,
                blocks_on_disk=files.num_blocks,
                bytes_on_disk=files.total_bytes,
                bytes_read_ahead=self.reads.bytes_held,
            )

    def close(self) -> None:
        """Write what was captured (the engine stops stepping), and wait for the writer."""
        self.capture_now()
        self._writer.shutdown(wait=True)
        self.reads.close()
