"""macbatch serve against vllm-mlx serve, a real peer server, on the same machine in one run.

Both servers load the same model directory (the benchmarks' random Qwen3-shaped float32 model,
8 layers, hidden 512, saved in the Hugging Face layout with a word-level tokenizer over its whole
vocabulary, so a prompt of N words is N tokens on both) and get the same workload over HTTP with
the ``openai`` client: the throughput workload (32 requests, prompts of 32 to 512 tokens, 64
new tokens each at temperature 0, all sent at once, streamed). The servers run one at a time and
alternate over the repeats; each gets one warm-up request first. Printed: output tokens per
second, time to first token (median and p90), each server's CPU seconds (its process tree's),
the ratios, and whether the two servers' greedy texts agree.

The lead's shape, 48 streamed chats of a 4-bit model: ``--requests 48 --chat --quantize 4``
(``--chat``: three turns per prompt to /v1/chat/completions through ``CHAT_TEMPLATE``, saved with
the tokenizer; ``--quantize``: mlx-lm's ``quantize_model``, group 64). On a CPU-only machine,
MLX's 4-bit matmul runs at about 1 GFLOP/s, so the bench shape is compute-bound there for both
servers: ``--shape tiny`` (compute negligible) puts the servers' host work first, as a small
model on a Mac's GPU does. ``--tree DIR`` (repeatable) serves macbatch from a checkout, e.g. a
``git worktree`` of an older commit, beside the current one: the first tree is the one that the
others are compared against when there is no ``--peer``.

vllm-mlx is never a dependency of macbatch: install it into its own venv and pass its command,
e.g. ``python -m venv /tmp/vmx && /tmp/vmx/bin/pip install vllm-mlx 'mlx[cpu]'`` (on Linux its
``mlx`` needs the ``cpu`` extra), then

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 \\
        python -m benchmarks.peer_server --peer /tmp/vmx/bin/vllm-mlx [--repeats 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from benchmarks.common import BENCH_MODEL, TINY_MODEL, bench_tokenizer, build_bench_model
from macbatch.commands.workload import synthetic_prompts


@dataclass
class Served:
    """One server's run of the workload."""

    tokens: int
    seconds: float
    ttft: list[float]
    cpu_seconds: float
    texts: list[str]

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds


# The saved model's chat template, for ``--chat``: the bench tokenizer is word-level (no special
# tokens), so each role opens with a word of its own and every message ends with "w3"; a prompt
# of N words and 3 turns is N + 7 tokens on both servers.
CHAT_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'user' %}w1 {% else %}w2 {% endif %}"
    "{{ m['content'] }} w3 {% endfor %}{% if add_generation_prompt %}w2 {% endif %}"
)


# ``--shape``: the bench model, or one whose compute is negligible, so that the servers' host work
# (HTTP, scheduling, the step's bookkeeping, streaming) decides, as with a small model on a Mac.
SHAPES = {"bench": BENCH_MODEL, "tiny": dict(BENCH_MODEL, **TINY_MODEL)}


def save_model(directory: Path, shape: dict, bits: int | None = None) -> Path:
    """The benchmarks' random model and word-level tokenizer (with ``CHAT_TEMPLATE``) in the
    Hugging Face layout; ``bits``: its weights quantized as mlx-lm's convert does (group 64),
    the ``quantization`` entry in config.json that both servers' loaders read."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.utils import quantize_model

    directory.mkdir(parents=True, exist_ok=True)
    model, config = build_bench_model(**shape), dict(shape)
    if bits is not None:
        model, config = quantize_model(model, config, group_size=64, bits=bits)
    weights = dict(tree_flatten(model.parameters()))
    mx.save_safetensors(str(directory / "model.safetensors"), weights)
    (directory / "config.json").write_text(json.dumps(config))
    tokenizer = bench_tokenizer(shape["vocab_size"])._tokenizer
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(str(directory))
    return directory


def start(arm: Arm, port: int, log: Path) -> subprocess.Popen:
    """A server process, once its /v1/models answers. macbatch's data directory (its disk tier
    of the prefix cache, on by default) is a new one beside ``log``: each run starts with an
    empty tier and pays for writing it, as a fresh server does for new prompts."""
    command = arm.command
    home = log.with_suffix(".home")
    process = subprocess.Popen(
        command,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env=dict(arm.env or os.environ, MACBATCH_HOME=str(home)),
        cwd=arm.cwd,
    )
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{command[0]} exited with {process.returncode}; see {log}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2):
                return process
        except OSError:
            time.sleep(1)
    process.kill()
    raise RuntimeError(f"{command[0]} did not answer within 600 s; see {log}")


def tree_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and its descendants so far (Linux /proc)."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    pending = [pid]
    while pending:
        current = pending.pop()
        try:
            fields = Path(f"/proc/{current}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / ticks
            children = Path(f"/proc/{current}/task/{current}/children").read_text().split()
        except OSError:
            continue
        pending += [int(c) for c in children]
    return total


Prompt = str | list[dict[str, str]]  # a completion's text, or a chat's messages


def chat_of(words: list[str]) -> list[dict[str, str]]:
    """A prompt's words as three turns (user, assistant, user), the last one the longest."""
    a, b = len(words) // 4, len(words) // 2
    turns = [words[:a], words[a:b], words[b:]]
    roles = ["user", "assistant", "user"]
    return [{"role": r, "content": " ".join(t)} for r, t in zip(roles, turns)]


def chunk_text(chunk) -> str:
    """The text a streamed chunk adds: a completion's ``text``, a chat's ``delta.content``."""
    if not chunk.choices:
        return ""
    choice = chunk.choices[0]
    delta = getattr(choice, "delta", None)
    return (choice.text if delta is None else delta.content) or ""


async def one_request(client, model: str, prompt: Prompt, max_tokens: int) -> tuple[float, str]:
    """Time to first token and the text of one streamed greedy completion (a chat completion
    when ``prompt`` is messages)."""
    sent = time.perf_counter()
    first = None
    parts = []
    common = dict(model=model, max_tokens=max_tokens, temperature=0, stream=True)
    if isinstance(prompt, str):
        stream = await client.completions.create(prompt=prompt, **common)
    else:
        stream = await client.chat.completions.create(messages=prompt, **common)
    async for chunk in stream:
        if text := chunk_text(chunk):
            first = first or time.perf_counter() - sent
            parts.append(text)
    return first or float("nan"), "".join(parts)


async def workload(port: int, model: str, prompts: list[Prompt], max_tokens: int) -> Served:
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", timeout=3600)
    await one_request(client, model, prompts[0], 4)  # warm-up
    started = time.perf_counter()
    done = await asyncio.gather(*(one_request(client, model, p, max_tokens) for p in prompts))
    seconds = time.perf_counter() - started
    texts = [text for _, text in done]
    tokens = sum(len(text.split()) for text in texts)
    await client.close()
    return Served(tokens, seconds, [t for t, _ in done], 0.0, texts)


def serve_once(arm: Arm, port: int, model: str, prompts, max_tokens, log) -> Served:
    process = start(arm, port, log)
    try:
        before = tree_cpu_seconds(process.pid)
        result = asyncio.run(workload(port, model, prompts, max_tokens))
        result.cpu_seconds = tree_cpu_seconds(process.pid) - before
        return result
    finally:
        os.killpg(process.pid, 15)
        process.wait(timeout=60)


@dataclass
class Arm:
    """One server to run: its command, and for a macbatch checkout its directory (the server
    runs that checkout's code: ``python -m macbatch`` there with it first on the path)."""

    name: str
    command: list[str]
    cwd: str | None = None
    env: dict[str, str] | None = None


def macbatch_arm(name: str, tree: str | None, model: str, port: int) -> Arm:
    """``macbatch serve`` of the installed macbatch, or of the checkout at ``tree``."""
    serve = ["serve", "--model", model, "--port", str(port)]
    if tree is None:
        return Arm(name, [shutil.which("macbatch") or "macbatch", *serve])
    env = dict(os.environ, PYTHONPATH=os.path.abspath(tree))
    return Arm(name, [sys.executable, "-m", "macbatch", *serve], os.path.abspath(tree), env)


def arms_of(args: argparse.Namespace, model: str) -> list[Arm]:
    """The installed macbatch (or ``--tree``'s first), the other trees, then the peer."""
    trees = args.tree or [None]
    arms = [
        macbatch_arm(
            "macbatch" if i == 0 else f"macbatch@{Path(t or '').name}", t, model, args.port
        )
        for i, t in enumerate(trees)
    ]
    if args.peer:
        serve = [args.peer, "serve", model, "--port", str(args.port), "--continuous-batching"]
        arms.append(Arm("vllm-mlx", serve))
    return arms


def workload_prompts(args: argparse.Namespace) -> list[Prompt]:
    """``--requests`` prompts of 32 to 512 words (tokens), as texts or as 3-turn chats."""
    vocab = SHAPES[args.shape]["vocab_size"]
    ids = synthetic_prompts(args.requests, args.min_prompt, args.max_prompt, vocab, seed=0)
    words = [[f"w{i}" for i in p] for p in ids]
    return [chat_of(w) if args.chat else " ".join(w) for w in words]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peer", help="the vllm-mlx command (its own venv's); none: macbatch only")
    parser.add_argument(
        "--tree", action="append",
        help="a macbatch checkout to serve from (repeat to compare checkouts, e.g. a git "
        "worktree of an older commit; the first is the one the others are held against); "
        "default: the installed macbatch",
    )  # fmt: skip
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--min-prompt", type=int, default=32, help="prompt tokens, at least")
    parser.add_argument("--max-prompt", type=int, default=512, help="prompt tokens, at most")
    parser.add_argument("--shape", choices=tuple(SHAPES), default="bench")
    parser.add_argument("--port", type=int, default=8311)
    parser.add_argument("--chat", action="store_true", help="3-turn chats to /v1/chat/completions")
    parser.add_argument("--quantize", type=int, choices=(4, 8), help="quantize the model's weights")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="peer-server-"))
    model = str(save_model(workdir / "model", SHAPES[args.shape], args.quantize))
    prompts = workload_prompts(args)
    arms = arms_of(args, model)
    runs: dict[str, list[Served]] = {arm.name: [] for arm in arms}
    for repeat in range(args.repeats):
        for arm in arms:
            log = workdir / f"{arm.name}-{repeat}.log"
            runs[arm.name].append(serve_once(arm, args.port, model, prompts, args.max_tokens, log))
            last = runs[arm.name][-1]
            print(
                f"{arm.name:9s} run {repeat + 1}: {last.tokens_per_s:7.1f} tok/s, "
                f"TTFT median {statistics.median(last.ttft):.2f} s, "
                f"CPU {last.cpu_seconds:.1f} s, load {os.getloadavg()[0]:.1f}",
                flush=True,
            )
    report(args, {name: max(r, key=lambda s: s.tokens_per_s) for name, r in runs.items()})
    shutil.rmtree(workdir, ignore_errors=True)


def report(args: argparse.Namespace, best: dict[str, Served]) -> None:
    """Each arm's best run, and its ratios against the peer (or the first macbatch)."""
    kind = "chats" if args.chat else "completions"
    quantized = f", {args.quantize}-bit" if args.quantize else ""
    print(
        f"\nbest of {args.repeats}, {args.requests} {kind} x {args.max_tokens} tokens{quantized}:"
    )
    for name, served in best.items():
        ttft = sorted(served.ttft)
        p90 = ttft[int(0.9 * (len(ttft) - 1))]
        print(
            f"  {name:9s} {served.tokens_per_s:7.1f} tok/s  TTFT median "
            f"{statistics.median(ttft):.2f} s, p90 {p90:.2f} s  CPU {served.cpu_seconds:.1f} s"
        )
    names = list(best)
    against = "vllm-mlx" if "vllm-mlx" in best else names[0]
    peer = best[against]
    for name in (n for n in names if n != against):
        ours = best[name]
        same = sum(a == b for a, b in zip(ours.texts, peer.texts))
        print(
            f"  {name} against {against}: throughput x{ours.tokens_per_s / peer.tokens_per_s:.2f}, "
            f"CPU seconds x{peer.cpu_seconds / ours.cpu_seconds:.2f} fewer, median TTFT "
            f"x{statistics.median(peer.ttft) / statistics.median(ours.ttft):.2f} lower; "
            f"greedy texts equal: {same} of {len(peer.texts)}"
        )


if __name__ == "__main__":
    main()
