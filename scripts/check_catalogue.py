"""Check the short-name catalogue (macbatch/models/shortnames.csv) against the hub: for each
entry, fetch its repo's config.json (only that file) and say whether the repo exists, its
model_type is one macbatch serves, and its quantization's bits are the catalogue's. The
catalogue was written without the hub in reach; run this where it is:

    python scripts/check_catalogue.py            # exit status 1 if any entry is wrong

Prints one line per entry: ok, or what is wrong.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from macbatch.engine import unsupported_reason  # noqa: E402
from macbatch.models.names import Known, catalogue  # noqa: E402


def problem(known: Known) -> str | None:
    """What is wrong with one entry (None: nothing)."""
    from huggingface_hub import hf_hub_download

    try:
        config = json.loads(Path(hf_hub_download(known.repo, "config.json")).read_text())
    except Exception as error:  # a missing repo, no network: said as it is
        return f"cannot read config.json: {type(error).__name__}: {error}"
    model_type = config.get("model_type", "?")
    if (why := unsupported_reason(model_type)) is not None:
        return f"{model_type} is not served: {why}"
    quant = config.get("quantization") or config.get("quantization_config") or {}
    if quant.get("bits") != known.bits:
        return f"quantization {quant.get('bits')!r} bits, the catalogue says {known.bits}"
    return None


def main() -> int:
    wrong = 0
    for known in catalogue():
        found = problem(known)
        wrong += found is not None
        print(f"{known.name:24} {known.repo:56} {found or 'ok'}")
    print(f"{wrong} of {len(catalogue())} entries wrong")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
