"""Every file path the docs name exists: each ``tests/...py``, ``macbatch/...py`` and
``docs/...md`` in README.md and docs/*.md. A test file renamed or a module moved leaves its old
name in the prose (``tests/server/test_params.py`` outlived its rename to
``tests/openai/test_requests.py``); this keeps such a name from lasting past the commit."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# a path starting at the repository root, not inside a longer path or word; a pattern with a
# wildcard (tests/support/tiny_vlm*.py) names a family of files, and is checked to match one
PATH = re.compile(r"(?<![\w/.-])((?:tests|macbatch)/[\w/.*-]*\.py|docs/[\w/.*-]*\.md)(?!\w)")


def named_paths(text: str) -> list[str]:
    return PATH.findall(text)


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_every_path_the_docs_name_exists() -> None:
    missing = []
    for doc in doc_files():
        for number, line in enumerate(doc.read_text().splitlines(), 1):
            for path in named_paths(line):
                if not any(ROOT.glob(path)):
                    missing.append(f"{doc.relative_to(ROOT)}:{number}: {path}")
    assert not missing, "the docs name files that do not exist:\n" + "\n".join(missing)


def test_the_pattern_finds_paths_in_prose_and_only_paths() -> None:
    text = (
        "see `tests/server/test_params.py::test_x`, macbatch/engine/step.py and (docs/kernel.md);"
        " tests/support/tiny_vlm*.py; not src/tests/x.py, tests/msl/ nor mytests/a.py"
    )
    assert named_paths(text) == [
        "tests/server/test_params.py",
        "macbatch/engine/step.py",
        "docs/kernel.md",
        "tests/support/tiny_vlm*.py",
    ]
