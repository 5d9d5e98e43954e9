"""A target constructed to copy its prompt: an induction-style llama, weights set by hand.

Random-weight models do not copy their prompt (they fall into loops of one or two tokens), so
they cannot show what prompt lookup gains on the work it is for. This model does, by
construction, the way trained models' induction heads do: at a token that occurred before, it
continues with the token that followed that earlier occurrence, and so it copies a span it has
seen, token after token.

It is mlx-lm's own ``llama`` class (``attention_bias`` on: each projection has a bias), with
every weight set here:

- Embeddings (tied with the head): token v is a random unit vector e_v in the first ``TOKEN``
  dimensions of the hidden state (zeros elsewhere).
- Layer 0, head 0, a previous-token head. Its query and key are constant (biases only, zero
  weights) and live in the rotary pairs of high frequency: per pair i, q_i = a (1, 0) and
  k_i = a (cos t_i, sin t_i), so after RoPE the score of key position j for query position p is
  a^2 sum_i cos(t_i (j - p + 1)): largest at j = p - 1 (the scale ``PREV_GAIN`` makes it nearly
  all the attention). Its value is the token part of the hidden state, which ``o_proj`` writes
  into the next ``TOKEN`` dimensions: each position now holds the token before it.
- Layer 1, head 0, the induction head. Its query is the token part (the current token), its key
  the previous-token part, both in the rotary pairs of lowest frequency (rope_theta 1e9: under
  0.12 radians of rotation across 1,000 positions), so the score is e_t . e_(j-1): largest at the
  positions j that follow an earlier occurrence of the current token. Its value is the token
  part there, written back into the token dimensions ``COPY_GAIN`` times over, so the head
  (the tied embeddings) ranks that next token first.
- Every other head, every MLP and every later layer compute with random weights but their
  output projections (``o_proj``, ``down_proj``) are zero: they add nothing, and cost what a
  model of this size costs per token.

Where the current token never occurred before, the model continues with no copy (the token
part of the residual dominates: it tends to repeat itself). Documents for it should not repeat
tokens carelessly: with one-token matching, a token that occurs twice sends the induction head
to both places.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten
from mlx_lm.utils import _get_classes

TOKEN = 64  # dimensions of the token part (and of the previous-token part)
HEAD_DIM = 128
ROPE_THETA = 1e9
HIGH_PAIRS = 12  # rotary pairs of the previous-token head (frequencies 1 down to 0.04)
LOW_START = 32  # the induction head's rotary pairs: from here on (frequency under 3e-5)
PREV_GAIN = 12.0  # score scale of the previous-token head
MATCH_GAIN = 60.0  # score scale of the induction head
COPY_GAIN = 4.0  # how many times over the copied token is written


def copying_config(layers: int, hidden: int, vocab: int) -> dict:
    return dict(
        model_type="llama",
        hidden_size=hidden,
        num_hidden_layers=layers,
        intermediate_size=3 * hidden,
        num_attention_heads=hidden // HEAD_DIM,
        num_key_value_heads=hidden // HEAD_DIM,
        head_dim=HEAD_DIM,
        vocab_size=vocab,
        rms_norm_eps=1e-6,
        max_position_embeddings=8192,
        rope_theta=ROPE_THETA,
        attention_bias=True,
        tie_word_embeddings=True,
    )


def copying_model(layers: int = 8, hidden: int = 512, vocab: int = 32000, seed: int = 0):
    """The constructed copier (float32), ``layers`` deep (2 copy, the rest add nothing)."""
    assert layers >= 2 and hidden >= 2 * TOKEN and hidden % HEAD_DIM == 0
    model_class, args_class = _get_classes(copying_config(layers, hidden, vocab))
    mx.random.seed(seed)
    model = model_class(args_class.from_dict(copying_config(layers, hidden, vocab)))
    model.set_dtype(mx.float32)
    rng = np.random.default_rng(seed)
    weights = {k: np.array(v) for k, v in tree_flatten(model.parameters())}
    for key in weights:  # nothing is added to the residual but what is set below
        if key.endswith(("o_proj.weight", "o_proj.bias", "down_proj.weight")):
            weights[key][:] = 0
        if key.endswith("norm.weight"):
            weights[key][:] = 1
    embed = np.zeros((vocab, hidden), np.float32)
    tokens = rng.standard_normal((vocab, TOKEN)).astype(np.float32)
    embed[:, :TOKEN] = tokens / np.linalg.norm(tokens, axis=1, keepdims=True)
    weights["model.embed_tokens.weight"] = embed
    _previous_token_head(weights, "model.layers.0.self_attn.", hidden)
    _induction_head(weights, "model.layers.1.self_attn.", hidden)
    model.update(tree_unflatten([(k, mx.array(v)) for k, v in weights.items()]))
    mx.eval(model.parameters())
    return model


def _frequencies() -> np.ndarray:
    """The rotary frequency of each pair (mlx's RoPE, not traditional: pair i is dimensions i
    and i + HEAD_DIM / 2)."""
    half = HEAD_DIM // 2
    return ROPE_THETA ** (-np.arange(half) / half)


def _head_zeros(w: dict, prefix: str) -> None:
    for name in ("q_proj", "k_proj", "v_proj"):
        w[prefix + name + ".weight"][:HEAD_DIM] = 0
        w[prefix + name + ".bias"][:HEAD_DIM] = 0


def _previous_token_head(w: dict, prefix: str, hidden: int) -> None:
    """Head 0 attends from each position to the one before it and copies its token part into
    dimensions TOKEN..2*TOKEN."""
    _head_zeros(w, prefix)
    half, theta = HEAD_DIM // 2, _frequencies()
    scale = np.sqrt(PREV_GAIN * np.sqrt(HEAD_DIM))  # the attention's own scale undone
    q, k = w[prefix + "q_proj.bias"], w[prefix + "k_proj.bias"]
    for i in range(HIGH_PAIRS):
        q[i], q[i + half] = scale, 0.0
        k[i], k[i + half] = scale * np.cos(theta[i]), scale * np.sin(theta[i])
    w[prefix + "v_proj.weight"][:TOKEN, :TOKEN] = np.eye(TOKEN)
    o = w[prefix + "o_proj.weight"]
    o[TOKEN : 2 * TOKEN, :TOKEN] = np.eye(TOKEN) * _rms_undo(hidden, 1.0)


def _induction_head(w: dict, prefix: str, hidden: int) -> None:
    """Head 0 matches the current token against each position's previous token and writes the
    token found there COPY_GAIN times over into the token part."""
    _head_zeros(w, prefix)
    half = HEAD_DIM // 2
    dims = [d for i in range(LOW_START, half) for d in (i, i + half)][:TOKEN]
    norm = _rms_undo(hidden, 2.0)  # the residual holds a token part and a previous-token part
    scale = np.sqrt(MATCH_GAIN * np.sqrt(HEAD_DIM)) * norm
    q, k = w[prefix + "q_proj.weight"], w[prefix + "k_proj.weight"]
    for j, d in enumerate(dims):
        q[d, j] = scale
        k[d, TOKEN + j] = scale
    w[prefix + "v_proj.weight"][:TOKEN, :TOKEN] = np.eye(TOKEN)
    w[prefix + "o_proj.weight"][:TOKEN, :TOKEN] = np.eye(TOKEN) * COPY_GAIN * norm


def _rms_undo(hidden: int, square_norm: float) -> float:
    """The factor RMSNorm divided a residual of that squared norm by (unit-norm parts)."""
    return float(np.sqrt(square_norm / hidden))


def documents(count: int, low: int, high: int, vocab: int, seed: int) -> list[list[int]]:
    """``count`` documents of ``low`` to ``high`` tokens, no token twice in one (the copier
    matches one token)."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(low, high + 1, size=count)
    return [[int(t) for t in rng.choice(vocab, size=int(n), replace=False)] for n in sizes]


INSTRUCTION = [1, 2, 3, 4]  # "extract the field that starts at:" (no document holds them)


def extraction_job(
    count: int, low: int, high: int, vocab: int, seed: int
) -> tuple[list[list[int]], list[list[int]]]:
    """An "extract a field from each document" job: each prompt is a document, the
    instruction and a field's first token; the expected reply is the document from that field
    on. Returns the prompts and each one's document after its field's first token."""
    rng = np.random.default_rng(seed + 1)
    prompts, answers = [], []
    for doc in documents(count, low, high, vocab - len(INSTRUCTION), seed):
        doc = [t + len(INSTRUCTION) for t in doc]  # the instruction's ids stay out
        field = int(rng.integers(len(doc) // 4, len(doc) // 2))
        prompts.append(doc + INSTRUCTION + [doc[field]])
        answers.append(doc[field + 1 :])
    return prompts, answers


def copy_fidelity(model: nn.Module, document: list[int], start: int, tokens: int) -> float:
    """The share of ``tokens`` greedy tokens (mlx-lm's own generation) after the document and
    its token at ``start`` repeated that continue the document from there."""
    from mlx_lm.generate import generate_step

    prompt = document + [document[start]]
    out = []
    for token, _ in generate_step(mx.array(prompt), model, max_tokens=tokens):
        out.append(int(token))
    want = document[start + 1 : start + 1 + tokens]
    return sum(a == b for a, b in zip(out, want)) / len(want)
