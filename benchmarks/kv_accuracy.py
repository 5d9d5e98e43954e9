"""Accuracy of quantized KV pages against float pages, same model, same prompts, same process.

Two workloads, each run with float32, 8-bit and 4-bit pages, greedy:

- the demo model's 300 held-out questions, each asked as the last turn of a long multi-turn
  conversation (earlier turns: other held-out questions with their expected replies, as many as
  fit in ``--context`` tokens of the model's 512; the model was trained on single-turn chats
  only): accuracy (exact reply), greedy agreement with
  float KV (identical replies), and the largest difference of the chosen tokens' logprobs while
  the replies still agree;
- random-weight models (Qwen3-shaped, head dim 64 and 128) with the real Qwen3 and Mistral v0.3
  tokenizers on multi-turn chats of real text (4 earlier exchanges of lines from docs/):
  agreement and logprob difference.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 \\
        python -u -m benchmarks.kv_accuracy [--context 150 440] [--chats 8]
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx

from benchmarks.common import build_bench_model, warn_without_openblas
from macbatch.demo.checker import is_correct
from macbatch.demo.questions import read_question_set
from macbatch.engine import Engine, EngineConfig, RequestOutput, SamplingParams

# the real tokenizers vendored for the tests (tests/support/tokenizers/SOURCE.txt)
TOKENIZERS = Path(__file__).resolve().parents[1] / "tests" / "support" / "tokenizers"
GREEDY = SamplingParams(temperature=0, max_tokens=32, logprobs=0)
FORMATS = {"float32": None, "8-bit": 8, "4-bit": 4}


@dataclass
class Comparison:
    agreement: float  # fraction of requests whose replies equal float KV's
    max_logprob_diff: float  # over the chosen tokens of the agreeing prefix


def compare(base: list[RequestOutput], other: list[RequestOutput]) -> Comparison:
    same = 0
    worst = 0.0
    for a, b in zip(base, other, strict=True):
        same += a.token_ids == b.token_ids
        for ta, tb, la, lb in zip(a.token_ids, b.token_ids, a.logprobs, b.logprobs, strict=False):
            if ta != tb:
                break
            worst = max(worst, abs(la - lb))
    return Comparison(same / len(base), worst)


def demo_conversations(
    encode: Callable[[list[dict]], list[int]], context: int, seed: int = 0
) -> tuple[list[list[dict]], list[str]]:
    """Every held-out question as the last turn, after as many earlier question/answer turns
    as fit in ``context`` tokens."""
    rng = random.Random(seed)
    questions = read_question_set()
    chats, expected = [], []
    for example in questions:
        last = [{"role": "user", "content": example.question}]
        messages: list[dict] = []
        while True:
            other = rng.choice([q for q in questions if q is not example])
            turn = [
                {"role": "user", "content": other.question},
                {"role": "assistant", "content": other.answer},
            ]
            if len(encode(messages + turn + last)) > context:
                break
            messages += turn
        chats.append(messages + last)
        expected.append(example.answer)
    return chats, expected


def run_demo(context: int) -> None:
    from macbatch.engine.loader import load_model

    model, tokenizer = load_model("demo")
    outputs = {}
    for name, bits in FORMATS.items():
        engine = Engine(model, tokenizer, EngineConfig(kv_bits=bits, num_blocks=4096))
        chats, expected = demo_conversations(engine.encode_prompt, context)
        lengths = [len(engine.encode_prompt(c)) for c in chats]
        outputs[name] = engine.generate(chats, GREEDY)
    turns = [len(c) // 2 for c in chats]
    print(
        f"demo model, {len(chats)} held-out questions as the last turn of a conversation "
        f"({min(turns)}-{max(turns)} earlier turns, {min(lengths)}-{max(lengths)} prompt tokens)"
    )
    print(f"{'KV':8} {'accuracy':>9} {'agreement':>10} {'max |dlogprob|':>15}")
    for name, outs in outputs.items():
        accuracy = sum(is_correct(o.text, e) for o, e in zip(outs, expected)) / len(outs)
        c = compare(outputs["float32"], outs)
        print(f"{name:8} {accuracy:9.2%} {c.agreement:10.2%} {c.max_logprob_diff:15.4f}")


def chat_prompts(n: int, turns: int, seed: int = 0) -> list[list[dict]]:
    """Multi-turn chats of real text (this repository's docs), ``turns`` exchanges each."""
    rng = random.Random(seed)
    docs = Path(__file__).resolve().parents[1] / "docs"
    lines = [
        line.strip()
        for path in sorted(docs.glob("*.md"))
        for line in path.read_text().splitlines()
        if len(line.strip()) > 40
    ]
    chats = []
    for _ in range(n):
        messages = []
        for _ in range(turns):
            messages += [
                {"role": "user", "content": rng.choice(lines)},
                {"role": "assistant", "content": rng.choice(lines)},
            ]
        chats.append(messages + [{"role": "user", "content": rng.choice(lines)}])
    return chats


def run_random_models(chats_per_model: int) -> None:
    from transformers import AutoTokenizer

    print("\nrandom-weight Qwen3-shaped models (8 layers, hidden 512) with real tokenizers")
    print(f"{'tokenizer':10} {'head dim':>8} {'KV':8} {'agreement':>10} {'max |dlogprob|':>15}")
    for tok_name in ("qwen3", "mistral"):
        tokenizer = AutoTokenizer.from_pretrained(str(TOKENIZERS / tok_name))
        chats = chat_prompts(chats_per_model, turns=4)
        for head_dim in (64, 128):
            model = build_bench_model(vocab_size=len(tokenizer), head_dim=head_dim)
            outputs = {}
            for name, bits in FORMATS.items():
                engine = Engine(model, tokenizer, EngineConfig(kv_bits=bits, num_blocks=2048))
                outputs[name] = engine.generate(chats, GREEDY)
            for name, outs in outputs.items():
                c = compare(outputs["float32"], outs)
                print(
                    f"{tok_name:10} {head_dim:8d} {name:8} {c.agreement:10.2%} "
                    f"{c.max_logprob_diff:15.4f}"
                )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--context", type=int, nargs="+", default=[150, 440], help="prompt tokens at most (of 512)"
    )
    parser.add_argument("--chats", type=int, default=8, help="chats per random model (0: none)")
    args = parser.parse_args()
    warn_without_openblas()
    mx.random.seed(0)
    for context in args.context:
        run_demo(context)
    if args.chats:
        run_random_models(args.chats)


if __name__ == "__main__":
    main()
