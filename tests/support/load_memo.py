"""Tokenizers and processors read once, each caller given its own copy: the vision tests load
the same few tiny VLM folders dozens of times in-process (each family's engines and mlx-vlm
oracle), and reading their real vocabularies of 150K-260K tokens (tokenizer.json parsed several
times over by transformers, mlx-lm and mlx-vlm) takes ~3 s a load where unpickling the object
it built takes well under one.

The copy is a pickle round trip of what the loader returned, so no two callers share state (a
streaming detokenizer, a template set on one engine's tokenizer). The key is everything the
loader reads: the folder, the arguments, and each file's name, size and modification time, so
a test that rewrites a tokenizer or template file gets a fresh load. Failures are not cached."""

from __future__ import annotations

import contextlib
import functools
import pickle
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest


def _folder_state(model_path: Any) -> tuple | None:
    """What the loader will read from ``model_path``, or None where it is not a local folder
    (a hub id: never cached)."""
    path = Path(str(model_path))
    if not path.is_dir():
        return None
    files = sorted(p for p in path.iterdir() if p.is_file())
    return (str(path.resolve()), tuple((p.name, *_size_and_time(p)) for p in files))


def _size_and_time(path: Path) -> tuple[int, int]:
    stat = path.stat()
    return stat.st_size, stat.st_mtime_ns


def memoized(load: Callable[..., Any]) -> Callable[..., Any]:
    """``load`` with its results kept pickled by folder state and arguments (the first caller
    gets what ``load`` returned, every later one a copy)."""
    pickled: dict[tuple, bytes] = {}

    @functools.wraps(load)
    def cached(model_path: Any, *args: Any, **kwargs: Any) -> Any:
        folder = _folder_state(model_path)
        key = (folder, repr(args), repr(sorted(kwargs.items())))
        if key in pickled:
            return pickle.loads(pickled[key])
        result = load(model_path, *args, **kwargs)
        if folder is not None:
            # an object that does not pickle is loaded every time
            with contextlib.suppress(Exception):
                pickled[key] = pickle.dumps(result)
        return result

    return cached


@contextmanager
def loads_memoized() -> Iterator[None]:
    """mlx-lm's ``load_tokenizer`` and (with the vision extra) mlx-vlm's ``load_processor``
    memoized for the ``with`` block (every in-process loader, mlx-lm's and mlx-vlm's own
    ``load`` included, looks them up in their module at call time)."""
    import mlx_lm.utils

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(mlx_lm.utils, "load_tokenizer", memoized(mlx_lm.utils.load_tokenizer))
        try:
            import mlx_vlm.utils
        except ImportError:
            pass
        else:
            patch.setattr(mlx_vlm.utils, "load_processor", memoized(mlx_vlm.utils.load_processor))
        yield
