"""Train macbatch's embedded demo model on CPU and write it to macbatch/assets/demo/.

The model is a small llama (mlx-lm's own classes) over a byte-level tokenizer with no merges: every
byte is one token, so digits and letters are single tokens and addition, reversal, sorting and
letter counting are learnable by a few million parameters. The data are the synthetic chat
questions of `macbatch.demo.tasks` (training split only); the loss covers the reply tokens. Phase 1
trains on questions asked alone, phase 2 (in cycles) on conversations, every reply with the
earlier turns in context.

Deterministic given --seed (and --processes). The defaults are the recipe of the shipped weights
(docs/demo-model.md, "Retraining", says how they were made and what was verified): 24,000 steps
of phase 1 and two cycles of 14,000 conversation steps, about 50 minutes on the 2-core x86
machine it was measured on. By default two processes train together, one core each, each on its
rows of every step's batch with the gradients summed: the same steps as one process up to
float32 rounding, and steps 1.4x as fast. OpenBLAS preloaded (float32 matmuls are ~40x faster)
and held to one thread per process (phase 1's matmuls are too small for a second one: a step is
10% slower with two):

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 OPENBLAS_NUM_THREADS=1 \\
        python scripts/train_demo_model.py --out /tmp/demo/run

Without --out it overwrites the shipped model in macbatch/assets/demo/.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import nullcontext
from functools import partial
from itertools import accumulate
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
from mlx.utils import tree_flatten, tree_unflatten
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # its helper modules, when imported

from shared_memory_sum import (  # noqa: E402
    SHARED_FILE_VARIABLE,
    SharedMemorySum,
    create_shared_file,
)

from macbatch.demo import MODEL_DIR  # noqa: E402
from macbatch.demo.checker import accuracy_by_task  # noqa: E402
from macbatch.demo.conversation import chat_messages, draw_histories  # noqa: E402
from macbatch.demo.questions import held_out_examples  # noqa: E402
from macbatch.demo.tasks import TASKS, Example, sample  # noqa: E402

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# Base sampling weights: with a uniform mix reversal is learnt first, so it gets half the weight of
# the others. --mix-boost then shifts the mix toward whichever tasks lag at each evaluation.
TASK_WEIGHTS = "add=2,subtract=2,reverse=1,sort=2,count=2"
# In conversations counting is learnt last (the one-hour recipe's single-turn mix left it at 0.855
# at turn 5 when every other task was above 0.99), so it starts with twice the weight there.
CHAT_TASK_WEIGHTS = "add=2,subtract=2,reverse=1,sort=2,count=4"
# Replies of the evaluations: a JSON reply runs to about 90 tokens (a plain one to 30; a longer
# reply is wrong at any limit, so the limit changes no plain score). --eval-max-tokens lowers it
# for runs whose scores say nothing (a few steps, as tests/demo/test_training.py runs).
EVAL_MAX_TOKENS = 96
MODEL_CONFIG = {
    "model_type": "llama",
    "hidden_size": 128,
    "num_hidden_layers": 4,
    "intermediate_size": 384,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "rms_norm_eps": 1e-5,
    "max_position_embeddings": 512,
    "rope_theta": 10000.0,
    "tie_word_embeddings": True,
}


def build_tokenizer() -> Tokenizer:
    """Byte-level BPE with no merges: one token per byte, plus the ChatML special tokens."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS + alphabet)}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(SPECIAL_TOKENS)
    return tokenizer


def chat_text(question: str, answer: str | None = None) -> str:
    """The text CHAT_TEMPLATE renders for one user turn (and the reply, when given)."""
    text = f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"
    return text if answer is None else f"{text}{answer}<|im_end|>"


def conversation_pieces(turns: list[Example]) -> list[tuple[str, bool]]:
    """A conversation as CHAT_TEMPLATE renders it, cut into (text, is_reply) pieces.

    The replies (with their <|im_end|>) are what the loss covers: every turn is trained as
    the answer to the last question with all earlier turns in context.
    """
    pieces: list[tuple[str, bool]] = []
    for i, turn in enumerate(turns):
        separator = "\n" if i else ""
        pieces.append((f"{separator}{chat_text(turn.question)}", False))
        pieces.append((f"{turn.answer}<|im_end|>", True))
    return pieces


def parse_weights(text: str) -> dict[str, float]:
    """Task weights from "add=3,subtract=3,..."; every task must be given."""
    try:
        weights = {k.strip(): float(v) for k, v in (item.split("=") for item in text.split(","))}
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected task=weight,... got {text!r}") from None
    if set(weights) != set(TASKS):
        raise argparse.ArgumentTypeError(f"give a weight to each of {', '.join(TASKS)}")
    if min(weights.values()) < 0 or not sum(weights.values()):
        raise argparse.ArgumentTypeError(f"weights are 0 or more, not all 0 (got {text!r})")
    return weights


def parse_cycles(kind: type) -> Callable[[str], list]:
    """A parser of comma-separated values, one per phase-2 cycle ("4000,5000")."""

    def parse(text: str) -> list:
        try:
            return [kind(item) for item in text.split(",") if item.strip()]
        except ValueError:
            message = f"expected {kind.__name__}s like 1,2 got {text!r}"
            raise argparse.ArgumentTypeError(message) from None

    return parse


def draw_examples(rng: random.Random, count: int, weights: dict[str, float]) -> list[Example]:
    """`count` training examples, tasks drawn by `weights`."""
    tasks = rng.choices(list(weights), weights=list(weights.values()), k=count)
    return [sample(task, rng, held_out=False) for task in tasks]


def draw_conversations(
    rng: random.Random, count: int, weights: dict[str, float], max_turns: int, json_share: float
) -> list[list[Example]]:
    """`count` conversations of 1..`max_turns` turns (equally likely), tasks drawn by `weights`,
    each turn asked for JSON with probability `json_share` (0 draws no extra random numbers, so
    the cycles before JSON was taught draw what they always drew)."""
    lengths = [rng.randint(1, max_turns) for _ in range(count)]
    tasks = rng.choices(list(weights), weights=list(weights.values()), k=sum(lengths))
    examples = [sample(task, rng, held_out=False) for task in tasks]
    if json_share:
        examples = [e.as_json() if rng.random() < json_share else e for e in examples]
    turns = iter(examples)
    return [[next(turns) for _ in range(length)] for length in lengths]


def boosted_weights(
    base: dict[str, float], accuracy: dict[str, float], boost: float
) -> dict[str, float]:
    """The task mix after an evaluation: a task's weight grows with its held-out error rate.

    Tasks are learnt at different speeds; feeding the laggards more keeps the last one from
    setting the length of the whole run. Mastered tasks keep their base weight, so they are
    still rehearsed.
    """
    return {task: weight * (1 + boost * (1 - accuracy[task])) for task, weight in base.items()}


def padded_batches(
    rows: list[tuple[list[int], list[float]]], batch_size: int, multiple: int, rng: random.Random
) -> list[tuple[mx.array, mx.array, mx.array]]:
    """Rows (token ids, loss mask per token) as batches (inputs, targets, loss mask) of rows of
    similar length, in random order.

    Sorting a group of rows by length keeps padding near zero; lengths are rounded up to a
    multiple of `multiple` so the compiled step sees few distinct shapes.
    """
    rows = sorted(rows, key=lambda row: len(row[0]))
    batches = []
    for start in range(0, len(rows), batch_size):
        chunk = rows[start : start + batch_size]
        width = multiple * math.ceil((max(len(ids) for ids, _ in chunk) - 1) / multiple)
        inputs, targets, mask = [], [], []
        for ids, loss_mask in chunk:
            pad = width - (len(ids) - 1)
            inputs.append(ids[:-1] + [0] * pad)
            targets.append(ids[1:] + [0] * pad)
            mask.append(loss_mask[1:] + [0.0] * pad)
        batches.append((mx.array(inputs), mx.array(targets), mx.array(mask)))
    rng.shuffle(batches)
    return batches


def make_single_turn_batches(
    tokenizer: Tokenizer,
    rng: random.Random,
    batch_size: int,
    group: int,
    weights: dict[str, float],
) -> list[tuple[mx.array, mx.array, mx.array]]:
    """Phase 1: `group` batches of one-turn examples; the loss covers the reply and its
    <|im_end|>."""
    examples = draw_examples(rng, batch_size * group, weights)
    prompts = tokenizer.encode_batch([chat_text(e.question) for e in examples])
    fulls = tokenizer.encode_batch([chat_text(e.question, e.answer) for e in examples])
    rows = [
        (f.ids, [0.0] * len(p.ids) + [1.0] * (len(f.ids) - len(p.ids)))
        for f, p in zip(fulls, prompts)
    ]
    return padded_batches(rows, batch_size, 8, rng)


def encode_conversation(
    tokenizer: Tokenizer, turns: list[Example], max_len: int
) -> tuple[list[int], list[float]]:
    """Token ids and loss mask of a conversation cut to `max_len` tokens at a turn's edge: the
    replies kept are whole; a last question whose reply does not fit stays, untrained on."""
    pieces = conversation_pieces(turns)
    encoded = tokenizer.encode_batch([text for text, _ in pieces])
    ids: list[int] = []
    mask: list[float] = []
    for (_, is_reply), piece in zip(pieces, encoded):
        if is_reply and len(ids) + len(piece.ids) > max_len:
            break
        if not is_reply and len(ids) + len(piece.ids) >= max_len:
            break
        ids += piece.ids
        mask += [float(is_reply)] * len(piece.ids)
    return ids, mask


def make_conversation_batches(
    tokenizer: Tokenizer,
    rng: random.Random,
    batch_size: int,
    group: int,
    weights: dict[str, float],
    max_turns: int,
    max_len: int,
    json_share: float,
) -> list[tuple[mx.array, mx.array, mx.array]]:
    """Phase 2: `group` batches of conversations; the loss covers every reply."""
    conversations = draw_conversations(rng, batch_size * group, weights, max_turns, json_share)
    rows = [encode_conversation(tokenizer, turns, max_len + 1) for turns in conversations]
    return padded_batches(rows, batch_size, 16, rng)


def loss_fn(
    model: nn.Module,
    inputs: mx.array,
    targets: mx.array,
    mask: mx.array,
    tokens: mx.array,
    per_token: Callable[[mx.array, mx.array], mx.array] = nn.losses.cross_entropy,
) -> mx.array:
    """This process's share of the mean cross-entropy over the whole step's `tokens` reply
    tokens: the shares of all processes sum to the step's mean, and so do their gradients."""
    losses = per_token(model(inputs), targets)
    return (losses * mask).sum() / tokens


def evaluate_first_turns(
    model, tokenizer_wrapper, examples: list[Example], max_tokens: int
) -> dict[str, float]:
    """Phase 1: greedy accuracy per task of questions asked alone (mlx-lm's batch_generate)."""
    from mlx_lm.generate import batch_generate

    prompts = [tokenizer_wrapper.encode(chat_text(e.question)) for e in examples]
    replies = batch_generate(model, tokenizer_wrapper, prompts, max_tokens=max_tokens).texts
    return accuracy_by_task(examples, replies)


def evaluate_conversations(
    model,
    tokenizer_wrapper,
    examples: list[Example],
    histories: list[list[Example]],
    with_json: bool,
    max_tokens: int,
) -> dict[str, float]:
    """Phase 2: greedy accuracy per task through mlx-lm's batch_generate, each task's worst of
    asked as the first turn and asked after its history (and, `with_json`, the same two asked
    for JSON)."""
    from mlx_lm.generate import batch_generate

    variants = {"": examples}
    if with_json:
        variants["JSON, "] = [e.as_json() for e in examples]
    asked: list[tuple[str, list[Example], list[list[dict[str, str]]]]] = []
    for label, questions in variants.items():
        alone = [chat_messages([], e.question) for e in questions]
        later = [chat_messages(h, e.question) for e, h in zip(questions, histories)]
        asked += [(f"{label}turn 1", questions, alone), (f"{label}turn 5", questions, later)]
    prompts = [
        tokenizer_wrapper.apply_chat_template(chat, add_generation_prompt=True)
        for _, _, chats in asked
        for chat in chats
    ]
    replies = iter(batch_generate(model, tokenizer_wrapper, prompts, max_tokens=max_tokens).texts)
    worst: dict[str, float] = {}
    for label, questions, chats in asked:
        accuracy = accuracy_by_task(questions, [next(replies) for _ in chats])
        print(f"  {label}: " + " ".join(f"{t} {a:.3f}" for t, a in accuracy.items()), flush=True)
        worst = {task: min(worst.get(task, 1.0), a) for task, a in accuracy.items()}
    return worst


def save(model: nn.Module, tokenizer: Tokenizer, config: dict, out: Path) -> None:
    """Write the model in Hugging Face layout (what mlx_lm.load reads)."""
    out.mkdir(parents=True, exist_ok=True)
    eos = tokenizer.token_to_id("<|im_end|>")
    full_config = dict(config, eos_token_id=eos, torch_dtype="float32")
    (out / "config.json").write_text(json.dumps(full_config, indent=2) + "\n")
    weights = dict(tree_flatten(model.parameters()))
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    tokenizer.save(str(out / "tokenizer.json"))
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "chat_template": CHAT_TEMPLATE,
        "model_max_length": config["max_position_embeddings"],
        "clean_up_tokenization_spaces": False,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n")


def make_train_step(
    model: nn.Module, lr: float, steps: int, group: mx.distributed.Group, fast_ops: bool
):
    """A compiled AdamW step (linear warmup, cosine decay to 5%, gradient clipping at 1.0) on
    this process's rows of the step's batch; with more than one process the gradients are
    summed over them first (scripts/shared_memory_sum.py). With `fast_ops` the forward pass
    uses the stand-ins of scripts/fast_training_ops.py."""
    # imported here: it imports mlx-lm (and transformers, seconds of CPU), which the process that
    # only starts the training processes never needs
    from fast_training_ops import fast_cross_entropy, fast_training_ops

    warmup = max(1, min(200, steps // 10))
    schedule = optim.join_schedules(
        [
            optim.linear_schedule(1e-6, lr, warmup),
            optim.cosine_decay(lr, steps - warmup, lr * 0.05),
        ],
        [warmup],
    )
    optimizer = optim.AdamW(learning_rate=schedule, weight_decay=0.01)
    per_token = fast_cross_entropy if fast_ops else nn.losses.cross_entropy
    loss_and_grad = nn.value_and_grad(model, partial(loss_fn, per_token=per_token))
    state = [model.state, optimizer.state]
    ops = fast_training_ops if fast_ops else nullcontext

    def update(grads) -> None:
        grads, _ = optim.clip_grad_norm(grads, 1.0)
        optimizer.update(model, grads)

    if group.size() == 1:

        @partial(mx.compile, inputs=state, outputs=state)
        def train_step(*batch: mx.array) -> mx.array:
            loss, grads = loss_and_grad(model, *batch)
            update(grads)
            return loss

    else:
        # The sum runs on the host between two compiled halves: gradients and loss as one
        # vector, then the update from the summed vector.
        shapes = [(key, value.shape) for key, value in tree_flatten(model.trainable_parameters())]
        ends = list(accumulate(math.prod(shape) for _, shape in shapes))
        shared_sum = SharedMemorySum(Path(os.environ[SHARED_FILE_VARIABLE]), group, ends[-1] + 1)

        # outputs=state: value_and_grad leaves the traced weights in the model.
        @partial(mx.compile, inputs=state, outputs=state)
        def local_gradients(*batch: mx.array) -> mx.array:
            loss, grads = loss_and_grad(model, *batch)
            flat = [value.reshape(-1) for _, value in tree_flatten(grads)]
            return mx.concatenate([*flat, loss.reshape(1)])

        @partial(mx.compile, inputs=state, outputs=state)
        def update_from(summed: mx.array) -> None:
            parts = mx.split(summed[:-1], ends[:-1])
            update(tree_unflatten([(k, p.reshape(s)) for (k, s), p in zip(shapes, parts)]))

        def train_step(*batch: mx.array) -> mx.array:
            summed = shared_sum(local_gradients(*batch))
            update_from(summed)
            return summed[-1]

    def run_step(*batch: mx.array) -> mx.array:
        with ops():  # a new shape traces the step again, so the ops stay in place for every call
            return train_step(*batch)

    return run_step, state, optimizer


def check_in_step(model: nn.Module, group: mx.distributed.Group) -> None:
    """Fail loudly if the processes' weights differ: each draws the step's batch itself and
    follows its own evaluations, which only agree while the weights do."""
    checksum = mx.stack([value.sum() for _, value in tree_flatten(model.parameters())])
    low, high = (
        reduce(checksum, group=group) for reduce in (mx.distributed.all_min, mx.distributed.all_max)
    )
    if not mx.array_equal(low, high).item():
        raise RuntimeError("the training processes' weights differ: their steps are out of step")


def train_phase(
    name: str,
    model: nn.Module,
    group: mx.distributed.Group,
    args: argparse.Namespace,
    steps: int,
    lr: float,
    eval_every: int,
    base_weights: dict[str, float],
    next_batches: Callable[[dict[str, float]], list],
    evaluate: Callable[[], dict[str, float]],
    save_model: Callable[[], None],
) -> None:
    """`steps` optimizer steps on `next_batches(task weights)`, starting from `base_weights`;
    every `eval_every` steps (and at the end) evaluate, shift the mix toward the laggards and
    save."""
    train_step, state, optimizer = make_train_step(model, lr, steps, group, args.fast_ops)
    start = time.time()
    batches: list = []
    weights = base_weights
    running = 0.0
    for step in range(1, steps + 1):
        if not batches:
            batches = next_batches(weights)
        inputs, targets, mask = batches.pop()
        rows = slice(group.rank(), None, group.size())  # rows of similar length: even shares
        tokens = mask.sum()
        loss = train_step(inputs[rows], targets[rows], mask[rows], tokens)
        mx.eval(state, loss)
        running = 0.98 * running + 0.02 * loss.item() if step > 1 else loss.item()
        minutes = (time.time() - start) / 60
        stop = bool(args.minutes and minutes >= args.minutes) or step == args.stop_at
        if args.minutes and group.size() > 1:  # every process stops at the same step
            stop = bool(mx.distributed.all_max(mx.array(int(stop)), group=group).item())
        if step % 50 == 0:
            lr_now = optimizer.learning_rate.item()
            print(f"{name} step {step} loss {running:.4f} lr {lr_now:.2e} {minutes:.2f} min")
        if step % eval_every == 0 or step == steps or stop:
            accuracy = evaluate()
            shown = " ".join(f"{task} {acc:.3f}" for task, acc in accuracy.items())
            print(f"{name} step {step} held-out accuracy: {shown}", flush=True)
            weights = boosted_weights(base_weights, accuracy, args.mix_boost)
            total = sum(weights.values())
            mix = " ".join(f"{task} {weight / total:.0%}" for task, weight in weights.items())
            print(f"{name} step {step} mix from here: {mix}", flush=True)
            check_in_step(model, group)
            if group.rank() == 0:
                save_model()
        if stop:
            print(f"{name}: stopping early after {minutes:.1f} minutes at step {step}", flush=True)
            break


def free_ports(count: int) -> list[int]:
    """`count` loopback ports free now (the ring backend's listening addresses)."""
    probes = [socket.socket() for _ in range(count)]
    for probe in probes:
        probe.bind(("127.0.0.1", 0))
    ports = [probe.getsockname()[1] for probe in probes]
    for probe in probes:
        probe.close()
    return ports


def run_processes(count: int) -> int:
    """Run this command once per process, joined by MLX's ring backend on 127.0.0.1 (what
    `mlx.launch -n COUNT` would start); if one fails the others are stopped, not left waiting on
    it. Returns the worst exit status."""
    with tempfile.TemporaryDirectory() as tmp:
        hostfile = Path(tmp) / "ring-hosts.json"
        hostfile.write_text(json.dumps([[f"127.0.0.1:{port}"] for port in free_ports(count)]))
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1", MLX_HOSTFILE=str(hostfile))
        env[SHARED_FILE_VARIABLE] = str(create_shared_file(Path(tmp)))
        command = [sys.executable, *sys.argv]
        processes = [
            subprocess.Popen(command, env=dict(env, MLX_RANK=str(rank))) for rank in range(count)
        ]
        try:
            while all(process.poll() in (None, 0) for process in processes):
                if all(process.poll() == 0 for process in processes):
                    return 0
                time.sleep(0.5)
        finally:
            for process in processes:
                if process.poll() is None:
                    process.terminate()
            statuses = [process.wait() for process in processes]
        return max(abs(status) for status in statuses)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    # Small batches and a low peak rate: after the same 32K examples, batch 8 at 5e-4 has a third
    # of the loss of batch 32 at 3e-3; higher rates stall (docs/demo-model.md, "Retraining").
    phase1 = parser.add_argument_group("phase 1: questions asked alone")
    phase1.add_argument("--steps", type=int, default=24000, help="optimizer steps (lr schedule)")
    phase1.add_argument("--batch-size", type=int, default=8, help="questions per step")
    phase1.add_argument("--lr", type=float, default=4e-4, help="peak learning rate")
    phase1.add_argument("--eval-every", type=int, default=2000)
    phase2 = parser.add_argument_group("phase 2: conversations")
    phase2.add_argument(
        "--chat-steps",
        type=parse_cycles(int),
        default="14000,14000",
        help="optimizer steps of each cycle (a fresh warmup and cosine decay each)",
    )
    phase2.add_argument(
        "--chat-lr",
        type=parse_cycles(float),
        default="4e-4,2e-4",
        help="each cycle's peak rate",
    )
    phase2.add_argument(
        "--chat-json",
        type=parse_cycles(float),
        default="0,0",
        help="each cycle's share of turns asked for JSON ('In JSON: ' before the question)",
    )
    phase2.add_argument(
        "--chat-weights",
        type=parse_weights,
        default=CHAT_TASK_WEIGHTS,
        help="the task mix of conversation turns",
    )
    phase2.add_argument("--chat-batch-size", type=int, default=2, help="conversations per step")
    phase2.add_argument("--chat-eval-every", type=int, default=2800)
    phase2.add_argument(
        "--max-turns",
        type=int,
        default=8,
        help="turns per conversation: 1 to this, fewer if they overflow the context",
    )
    parser.add_argument("--eval-per-task", type=int, default=30)
    parser.add_argument(
        "--eval-max-tokens",
        type=int,
        default=EVAL_MAX_TOKENS,
        help="reply tokens of each evaluation question (fewer: faster evaluations of runs whose"
        " scores do not matter, cut replies count as wrong)",
    )
    parser.add_argument("--minutes", type=float, default=0, help="end a phase after this long")
    parser.add_argument("--stop-at", type=int, default=0, help="end a phase at this step")
    parser.add_argument(
        "--out", type=Path, default=MODEL_DIR, help="default: the shipped model's directory"
    )
    parser.add_argument(
        "--weights", type=parse_weights, default=TASK_WEIGHTS, help="task mix (phase 1)"
    )
    parser.add_argument(
        "--mix-boost",
        type=float,
        default=10.0,
        help="after each evaluation a task's weight becomes its base weight (--weights, or"
        " --chat-weights in phase 2) times (1 + this x its held-out error rate), so lagging tasks"
        " get more examples (0: fixed mix)",
    )
    parser.add_argument(
        "--init", type=Path, help="start from this saved demo model (train it further)"
    )
    parser.add_argument(
        "--processes",
        type=int,
        default=2,
        help="data-parallel training processes, one core each, as MLX's CPU backend computes on"
        " one: each takes its share of every step's rows and the gradients are summed (default"
        " 2, the shipped weights' arithmetic)",
    )
    parser.add_argument(
        "--fast-ops",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="train with scripts/fast_training_ops.py's exp and blocked causal attention, the"
        " same functions to float32 rounding and faster steps on the CPU (--no-fast-ops: MLX's"
        " own ops)",
    )
    args = parser.parse_args()
    if args.init and not all(
        (args.init / f).is_file() for f in ("config.json", "model.safetensors")
    ):
        parser.error(f"--init {args.init}: no config.json and model.safetensors there")
    if not 1 <= args.processes <= min(args.batch_size, args.chat_batch_size):
        parser.error(
            f"--processes must be 1 to the smaller batch size (got {args.processes}): each"
            " process takes at least one row of every step"
        )
    if args.mix_boost < 0:
        parser.error(f"--mix-boost must be 0 or more (got {args.mix_boost}): it scales a weight")
    if not len(args.chat_steps) == len(args.chat_lr) == len(args.chat_json):
        parser.error("give --chat-steps, --chat-lr and --chat-json one value per cycle each")
    if args.processes > 1 and "MLX_RANK" not in os.environ:  # every usage error is said above
        sys.exit(run_processes(args.processes))

    from mlx_lm.models.llama import Model, ModelArgs
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    mx.set_default_device(mx.cpu)
    # Under run_processes (or mlx.launch) the ring backend joins the processes; alone, a group of 1.
    group = mx.distributed.init(
        strict="MLX_RANK" in os.environ, backend="ring" if "MLX_RANK" in os.environ else "any"
    )
    if group.size() > 1 and SHARED_FILE_VARIABLE not in os.environ:
        sys.exit("start the processes with --processes N: they sum through a file it makes")
    if group.rank() != 0:
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - the same lines as rank 0's
    mx.random.seed(args.seed)
    rng = random.Random(args.seed)
    tokenizer = build_tokenizer()
    config = dict(MODEL_CONFIG, vocab_size=tokenizer.get_vocab_size())
    max_len = config["max_position_embeddings"]
    model = Model(ModelArgs.from_dict(config))
    model.set_dtype(mx.float32)
    if args.init:
        saved = json.loads((args.init / "config.json").read_text())
        if any(saved.get(k) != v for k, v in config.items()):
            sys.exit(f"--init {args.init}: its config.json differs from MODEL_CONFIG")
        model.load_weights(str(args.init / "model.safetensors"))
    mx.eval(model.parameters())
    n_params = sum(v.size for _, v in tree_flatten(model.parameters()))
    print(f"parameters: {n_params / 1e6:.2f}M, vocab {config['vocab_size']}", flush=True)

    # The tokenizer as mlx-lm will load it, for evaluation through its own generation code.
    with tempfile.TemporaryDirectory() as tmp:
        save(model, tokenizer, config, Path(tmp))
        wrapper = load_tokenizer(Path(tmp), eos_token_ids=[tokenizer.token_to_id("<|im_end|>")])
        rendered = wrapper.apply_chat_template(
            [{"role": "user", "content": "What is 1 + 2?"}],
            add_generation_prompt=True,
            tokenize=False,
        )
        assert rendered == chat_text("What is 1 + 2?"), "chat_text disagrees with CHAT_TEMPLATE"
        turns = held_out_examples(random.Random(args.seed), 1)
        templated = wrapper.apply_chat_template(chat_messages(turns[:-1], turns[-1].question))
        ids, _ = encode_conversation(tokenizer, turns, max_len)
        assert ids[: len(templated)] == templated, "conversation_pieces disagrees with the template"

    def save_model() -> None:
        save(model, tokenizer, config, args.out)

    if args.steps:
        eval_set = held_out_examples(random.Random(args.seed + 1), args.eval_per_task)
        train_phase(
            "phase 1",
            model,
            group,
            args,
            args.steps,
            args.lr,
            args.eval_every,
            args.weights,
            lambda weights: make_single_turn_batches(tokenizer, rng, args.batch_size, 8, weights),
            lambda: evaluate_first_turns(model, wrapper, eval_set, args.eval_max_tokens),
            save_model,
        )
    for cycle, (steps, lr, json_share) in enumerate(
        zip(args.chat_steps, args.chat_lr, args.chat_json)
    ):
        # Each cycle has its own generators, seeded from --seed and the cycle: a cycle draws the
        # same data whether it follows the previous one here or continues a saved model
        # (--init MODEL --steps 0 --seed SEED+CYCLE --chat-steps STEPS --chat-lr LR
        # --chat-json SHARE).
        chat_rng, eval_rng = random.Random(args.seed + cycle), random.Random(args.seed + cycle + 1)
        chat_eval = held_out_examples(eval_rng, args.eval_per_task)
        histories = draw_histories(chat_eval, eval_rng)
        train_phase(
            f"phase 2.{cycle + 1}",
            model,
            group,
            args,
            steps,
            lr,
            args.chat_eval_every,
            args.chat_weights,
            lambda weights, rng=chat_rng, share=json_share: make_conversation_batches(
                tokenizer, rng, args.chat_batch_size, 8, weights, args.max_turns, max_len, share
            ),
            lambda eval_set=chat_eval, histories=histories, share=json_share: (
                evaluate_conversations(
                    model, wrapper, eval_set, histories, share > 0, args.eval_max_tokens
                )
            ),
            save_model,
        )
    print(f"saved to {args.out}", flush=True)


if __name__ == "__main__":
    main()
