"""The disk tier's reads (``tier.py``): a waiting request's prefix found on disk, read on reader
threads before it is scheduled, and put into the cache groups' memory when it is.

``prefetch`` (when a request is queued) finds the longest prefix of its chain that every group's
part can resume from memory or disk (``reach``: a prefix of n blocks needs each part's
``needs(n)``) and reads the parts of it not in memory, while the bytes read for waiting requests
stay under ``max_read_bytes`` (the oldest waiting request's reads always start, so none waits
forever); ``ready`` says when they are in, and plans again past a read that failed; ``restore``
puts them into each group's memory, named in the prefix cache, from where the KV manager takes
the prefix as from RAM. A request's reads go straight into arrays of its own (``_Waiting``), so
restoring hands them over with no copy. Runs on the engine thread; only ``_read`` runs on the
readers.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from itertools import accumulate

import numpy as np

from macbatch.engine.kv.disk.files import BlockFiles, file_key
from macbatch.engine.kv.group import DiskPart

READERS = 4

# a part of one block: its group's tag and the block's chain digest
Key = tuple[str, bytes]


@dataclass
class _Waiting:
    """A waiting request's reads: its chain, the parts it waits for, and how many of them
    (from the first) started and are in: cursors, so a job's hundred rows waiting on one
    prompt cost one look each per step. ``slabs[tag]``: where its reads of a part go,
    ``[parts wanted, slab]`` uint8 per array (made when its first read starts), the i-th of
    that tag's ``wants`` in row i, so ``restore`` hands them over with no copy."""

    chain: Sequence[bytes]
    wants: list[Key]
    started: int = 0
    done: int = 0
    checked: bool = False  # all in and whole
    slabs: dict[str, list[np.ndarray]] = field(default_factory=dict)
    rows: list[int] = field(default_factory=list)  # each want's row in its tag's slabs
    counts: Counter[str] = field(default_factory=Counter)  # wants per tag

    def __post_init__(self) -> None:
        for tag, _ in self.wants:
            self.rows.append(self.counts[tag])
            self.counts[tag] += 1


@dataclass
class _Read:
    """A part's read, into row ``row`` of ``slabs`` (the request's that started it)."""

    future: Future[bool]
    slabs: list[np.ndarray]
    row: int
    size: int  # its bytes


def reach(parts: dict[str, DiskPart], found: dict[str, list[bool]]) -> int:
    """The most leading blocks every part can resume after, where ``found[tag][i]``: the
    part of block i is there (in memory, on disk, or read)."""
    missing: dict[tuple[str, int, int], list[int]] = {}
    for count in range(len(next(iter(found.values()))), 0, -1):
        if all(
            _all_found(missing, found[tag], tag, part.needs(count)) for tag, part in parts.items()
        ):
            return count
    return 0


def _all_found(
    missing: dict[tuple[str, int, int], list[int]], flags: list[bool], tag: str, needed: range
) -> bool:
    """Whether every block in ``needed`` (a range, strided for a part whose blocks are every
    ``step``-th: compressed rows) has its part, in O(1): ``missing[(tag, step, offset)]``
    counts the blocks ``offset, offset + step, ...`` before each that lack it, made once."""
    if not needed:
        return True
    step = needed.step
    key = (tag, step, needed.start % step)
    if key not in missing:
        missing[key] = list(accumulate((not f for f in flags[key[2] :: step]), initial=0))
    first = needed.start // step
    return missing[key][first + len(needed)] == missing[key][first]


class Reads:
    def __init__(self, files: BlockFiles, parts: dict[str, DiskPart], max_read_bytes: int) -> None:
        self.files = files
        self.parts = parts
        self.max_read_bytes = max_read_bytes
        self._slabs = {tag: part.slab_bytes() for tag, part in parts.items()}
        self._bytes = {tag: sum(slabs) for tag, slabs in self._slabs.items()}  # sized parts'
        # reads overlap (the checksum releases the GIL): an SSD serves several at once
        self._reader = ThreadPoolExecutor(READERS, thread_name_prefix="macbatch-disk-read")
        self._lock = threading.Lock()  # the counts, changed by the readers
        self._reads: dict[Key, _Read] = {}
        self._waiting: dict[str, _Waiting] = {}  # oldest first
        self._wanted: Counter[Key] = Counter()  # how many waiting requests want each part
        self._failed: set[Key] = set()  # parts whose read failed (their files are gone)
        # set when a read finishes: ``wait`` sleeps on it (waiting on every pending future
        # costs a lock per future per wake, quadratic in a long prompt's blocks)
        self._finished_one = threading.Event()
        self.bytes_held = 0  # of the reads started and not dropped yet
        self.bytes_read = 0
        self.blocks_read = 0

    def _held(self, chain: Sequence[bytes]) -> dict[str, list[bool]]:
        return {
            tag: [part.lookup(d) is not None for d in chain] for tag, part in self.parts.items()
        }

    def prefetch(self, request_id: str, chain: Sequence[bytes]) -> None:
        """Start reading the parts of the longest prefix of ``chain`` (a waiting request's
        blocks) that are on disk and not in memory. Runs for every prompt queued, on the
        engine thread: a prompt none of whose parts is on disk (most new prompts) costs one
        look per part, and no memory lookups."""
        on_disk = {tag: self._on_disk(tag, chain) for tag in self.parts}
        if not any(any(flags) for flags in on_disk.values()):
            return  # nothing of it on disk: nothing to read
        held = self._held(chain)
        found = {tag: [h or d for h, d in zip(held[tag], on_disk[tag])] for tag in self.parts}
        count = reach(self.parts, found)
        wants = [
            (tag, chain[i])
            for tag, part in self.parts.items()
            for i in part.needs(count)
            if not held[tag][i]
        ]
        if wants:
            self._waiting[request_id] = _Waiting(chain, wants)
            self._wanted.update(wants)
            self._start()

    def _on_disk(self, tag: str, chain: Sequence[bytes]) -> list[bool]:
        """Whether each block's part ``tag`` is on disk and readable (one look for them all)."""
        there = self.files.present([file_key(tag, digest) for digest in chain])
        failed = self._failed
        if failed:
            there = [t and (tag, d) not in failed for t, d in zip(there, chain)]
        return there

    def rewritten(self, key: Key) -> None:
        """The part was written again (whole): it may be read again."""
        self._failed.discard(key)

    def _start(self) -> None:
        """Start the waiting requests' reads, oldest first, while the bytes read ahead stay
        under ``max_read_bytes`` (the oldest request's always start)."""
        for i, waiting in enumerate(self._waiting.values()):
            for key, row in zip(waiting.wants[waiting.started :], waiting.rows[waiting.started :]):
                if key not in self._reads:
                    size = self._size(key)
                    if i and self.bytes_held + size > self.max_read_bytes:
                        return
                    self.bytes_held += size
                    if self.parts[key[0]].sized:
                        slabs = self._slabs_for(waiting, key[0])
                    else:  # a payload of its own length: a buffer of its own
                        slabs, row = [np.empty((1, size), np.uint8)], 0
                    future = self._reader.submit(self._read, key, [s[row] for s in slabs], size)
                    future.add_done_callback(self._signal)
                    self._reads[key] = _Read(future, slabs, row, size)
                waiting.started += 1

    def _size(self, key: Key) -> int:
        """The bytes of a part's read: its part's slabs, or its file's payload (a part that
        is not sized; 0 when the file is gone, and its read fails)."""
        if self.parts[key[0]].sized:
            return self._bytes[key[0]]
        return self.files.payload_bytes(file_key(*key)) or 0

    def _slabs_for(self, waiting: _Waiting, tag: str) -> list[np.ndarray]:
        """Where ``waiting``'s reads of the part ``tag`` go (not zeroed: a row is used only
        once it is read into)."""
        if tag not in waiting.slabs:
            rows = waiting.counts[tag]
            waiting.slabs[tag] = [np.empty((rows, n), np.uint8) for n in self._slabs[tag]]
        return waiting.slabs[tag]

    def _read(self, key: Key, rows: list[np.ndarray], size: int) -> bool:
        """Read the part into ``rows`` (one per array) and check it (on a reader thread)."""
        whole = self.files.read_into(file_key(*key), [row.data for row in rows])
        if whole:
            with self._lock:
                self.bytes_read += size
                self.blocks_read += 1
        return whole

    def ready(self, request_id: str) -> bool:
        """Whether the request's reads are all in. When one failed (a corrupt file, or one
        another process evicted), the reads of the longest prefix still on disk start instead
        (a checkpoint further back), and it waits for those."""
        waiting = self._waiting.get(request_id)
        if waiting is None or waiting.checked:
            return True
        wants = waiting.wants
        while waiting.done < len(wants) and self._finished(wants[waiting.done]):
            waiting.done += 1
        if waiting.done < len(wants):
            return False
        failed = [k for k in wants if not self._read_whole(k)]
        if not failed:
            waiting.checked = True
            return True
        self._failed.update(failed)  # never planned again in this process, unless rewritten
        self._unwant(request_id)
        self.prefetch(request_id, waiting.chain)
        self._drop(wants)
        return self.ready(request_id)

    def _finished(self, key: Key) -> bool:
        read = self._reads.get(key)
        return read is not None and read.future.done()

    def _signal(self, _: Future[bool]) -> None:
        self._finished_one.set()

    def wait(self, timeout: float) -> None:
        """Block until a read finishes, or ``timeout`` (the engine has nothing else to do);
        at once if one finished since the last call."""
        if self._finished_one.wait(timeout):
            self._finished_one.clear()

    def _read_whole(self, key: Key) -> bool:
        """Whether the part was read, and whole."""
        read = self._reads.get(key)
        if read is None or not read.future.done() or read.future.cancelled():
            return False
        return read.future.result()

    def restore(self, request_id: str, chain: Sequence[bytes]) -> None:
        """Put the request's parts read from disk into their groups' memory, named in the
        prefix cache (idle there: the KV manager takes the prefix next), as far as every part
        agrees: the longest prefix of ``chain`` each part has in memory or read."""
        if request_id not in self._waiting:
            return
        held = self._held(chain)
        found = {
            tag: [h or self._read_whole((tag, d)) for h, d in zip(held[tag], chain)]
            for tag in self.parts
        }
        count = reach(self.parts, found)
        keep = chain[:count]
        for tag, part in self.parts.items():
            digests = [chain[i] for i in part.needs(count) if not held[tag][i]]
            if digests:
                part.restore(digests, self._slabs_of(tag, digests), keep)

    def _slabs_of(self, tag: str, digests: Sequence[bytes]) -> list[np.ndarray]:
        """The parts read for ``digests``, ``[len(digests), slab]`` uint8 per array, each
        contiguous (MLX copies a strided array element by element: 40 times slower): the rows
        they were read into, as they are when those are consecutive rows of one request's
        arrays (a prefix read for its request, or the rest of it past what another request
        put in memory), else copied together. A part that is not sized: each digest's payload,
        in order."""
        reads = [self._reads[(tag, digest)] for digest in digests]
        if not self.parts[tag].sized:  # one payload per digest
            return [read.slabs[0][read.row] for read in reads]
        first, start = reads[0].slabs, reads[0].row
        if all(read.slabs is first and read.row == start + i for i, read in enumerate(reads)):
            return [slab[start : start + len(reads)] for slab in first]
        return [np.stack([read.slabs[a][read.row] for read in reads]) for a in range(len(first))]

    def forget(self, request_id: str) -> None:
        """The request no longer waits for its reads (admitted, or gone); reads nobody else
        wants are dropped, and the reads their bytes made wait start."""
        wants = self._unwant(request_id)
        if wants:
            self._drop(wants)

    def _unwant(self, request_id: str) -> list[Key]:
        """Forget what the request waits for (its reads stay, for ``_drop``); what it was."""
        waiting = self._waiting.pop(request_id, None)
        if waiting is None:
            return []
        self._wanted.subtract(waiting.wants)
        return waiting.wants

    def _drop(self, keys: Sequence[Key]) -> None:
        """Drop the reads of ``keys`` no waiting request wants, and start those they made
        wait."""
        for key in keys:
            if self._wanted[key] <= 0:
                del self._wanted[key]
                read = self._reads.pop(key, None)
                if read is not None:
                    read.future.cancel()
                    self.bytes_held -= read.size
        self._start()

    def close(self) -> None:
        self._reader.shutdown(wait=False, cancel_futures=True)
