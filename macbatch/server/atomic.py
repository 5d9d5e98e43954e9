"""What the server keeps on disk (stored responses, batch files, batch objects) is written
beside its place and renamed over it, so a crash or ``kill -9`` leaves the old file or the new
one, never half of one."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def write_json(path: Path, data: Any) -> None:
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(data, ensure_ascii=False))
    os.replace(temporary, path)
