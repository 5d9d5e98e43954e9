"""Run by a Python that has torch and transformers (``encoder_classifiers.py`` starts it; the
test environment has neither): for each job entry, transformers' own
``*ForSequenceClassification`` class built from its config with random weights (LayerNorm
scales near 1, every bias nonzero), saved by ``save_pretrained`` in the Hugging Face layout,
and its float64 logits on each tokenized pair, one unpadded forward per pair: the oracle for
macbatch's classification heads. Imports nothing of macbatch or the tests.

    python transformers_classifier_logits.py JOB.json OUT.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import transformers


def build(entry: dict) -> list[list[float]]:
    torch.manual_seed(entry["seed"])
    config = getattr(transformers, entry["config_class"])(**entry["config"])
    model = getattr(transformers, entry["class"])(config).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            noise = torch.randn_like(parameter) * 0.1
            scale = parameter.ndim == 1 and bool((parameter == 1).all())  # a LayerNorm's weight
            parameter.copy_(1 + noise if scale else noise)
    model.save_pretrained(entry["dir"])
    model = model.double()
    logits = []
    with torch.no_grad():
        for ids, types in entry["inputs"]:
            given = {"input_ids": torch.tensor([ids])}
            if entry["types"]:
                given["token_type_ids"] = torch.tensor([types])
            logits.append(model(**given).logits[0].tolist())
    return logits


def main() -> None:
    job = json.loads(Path(sys.argv[1]).read_text())
    Path(sys.argv[2]).write_text(json.dumps({entry["name"]: build(entry) for entry in job}))


if __name__ == "__main__":
    main()
