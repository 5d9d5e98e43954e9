"""The pipelined step: step N+1 is dispatched before step N's tokens are read. Its outputs must
be exactly those of synchronous steps (and of mlx-lm for greedy requests), whatever stops,
preempts, aborts or samples."""

from __future__ import annotations

import pytest

from macbatch.engine import Engine, EngineConfig, FinishReason, SamplingParams
from tests.support.oracle import assert_pool_idle, mlx_lm_greedy
from tests.support.tiny import build_model


@pytest.fixture(scope="module")
def model():
    return build_model("qwen3")


def _engine(model, tokenizer, pipelined: bool, num_blocks: int = 64) -> Engine:
    config = EngineConfig(
        num_blocks=num_blocks, block_size=8, max_num_batched_tokens=24, pipelined=pipelined
    )
    return Engine(model, tokenizer, config)


def _workload(model) -> tuple[list[list[int]], list[SamplingParams]]:
    prompts = [list(range(10 + 7 * i, 10 + 7 * i + 5 + 4 * i)) for i in range(6)]
    stop_token = mlx_lm_greedy(model, prompts[3], 10)[4]
    params = [
        SamplingParams(max_tokens=12, temperature=0, ignore_eos=True),
        SamplingParams(max_tokens=12, temperature=1.0, top_p=0.9, seed=5, logprobs=2),
        SamplingParams(max_tokens=12, temperature=0.8, repetition_penalty=1.3, seed=1),
        SamplingParams(max_tokens=10, temperature=0, logprobs=0, stop_token_ids=[stop_token]),
        SamplingParams(max_tokens=1, temperature=0, ignore_eos=True),
        SamplingParams(max_tokens=12, temperature=0.7, presence_penalty=0.5, seed=9),
    ]
    return prompts, params


@pytest.mark.parametrize("num_blocks", [64, 6])  # 6 blocks: requests are preempted
def test_pipelined_outputs_equal_synchronous_ones(model, tiny_tokenizer, num_blocks):
    prompts, params = _workload(model)
    runs = {}
    for pipelined in (False, True):
        engine = _engine(model, tiny_tokenizer, pipelined, num_blocks)
        runs[pipelined] = engine.generate(prompts, params)
        assert_pool_idle(engine)
        if num_blocks == 6:
            assert engine.stats().preemptions > 0
    for sync, piped in zip(runs[False], runs[True]):
        assert piped.token_ids == sync.token_ids
        assert piped.finish_reason == sync.finish_reason
        assert piped.text == sync.text
        assert (piped.logprobs is None) == (sync.logprobs is None)
        if sync.logprobs is not None:
            assert piped.logprobs == pytest.approx(sync.logprobs, abs=1e-5)
        for piped_top, sync_top in zip(piped.top_logprobs or [], sync.top_logprobs or []):
            assert piped_top.keys() == sync_top.keys()
            assert list(piped_top.values()) == pytest.approx(list(sync_top.values()), abs=1e-5)
    greedy = runs[True][0]
    assert greedy.token_ids == mlx_lm_greedy(model, prompts[0], 12)
    stopped = runs[True][3]
    assert stopped.finish_reason == FinishReason.STOP
    assert len(stopped.token_ids) == 4 == len(stopped.logprobs)  # the stop token has neither
    assert len(runs[True][4].token_ids) == 1


def test_outputs_come_one_step_later_and_a_stop_never_leaks(model, tiny_tokenizer):
    prompt = [40, 41, 42]
    reference = mlx_lm_greedy(model, prompt, 8)
    stop = reference[2]
    engine = _engine(model, tiny_tokenizer, pipelined=True)
    rid = engine.add_request(
        prompt, SamplingParams(max_tokens=8, temperature=0, stop_token_ids=[stop])
    )
    assert engine.step() == []  # the prefill is in flight; its token is read next step
    streamed, final, prefixes = [], None, []
    while engine.has_unfinished():
        for out in engine.step():
            streamed += out.new_token_ids
            final = out
            prefixes.append((out, list(streamed)))
    assert final.request_id == rid and final.finished
    assert streamed == final.token_ids == reference[: reference.index(stop)]
    for out, tokens_then in prefixes:  # read after the run: still as of its own step
        assert out.token_ids == tokens_then
    assert engine.stats().generated_tokens == len(streamed)
    assert_pool_idle(engine)


def test_abort_while_a_step_is_in_flight(model, tiny_tokenizer):
    engine = _engine(model, tiny_tokenizer, pipelined=True)
    params = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)
    victim = engine.add_request([5, 6, 7], params)
    keeper = engine.add_request([8, 9, 10, 11], params)
    seen = []
    for _ in range(4):
        seen += [o for o in engine.step() if o.request_id == victim]
    engine.abort(victim)
    finals = {}
    while engine.has_unfinished():
        for out in engine.step():
            assert out.request_id != victim or out.finished, "a token after the abort"
            if out.finished:
                finals[out.request_id] = out
    assert finals[victim].finish_reason == FinishReason.ABORT
    assert finals[victim].token_ids == seen[-1].token_ids
    assert finals[keeper].token_ids == mlx_lm_greedy(model, [8, 9, 10, 11], 10)
    assert_pool_idle(engine)


def test_text_is_the_same_whenever_and_in_whatever_order_it_is_read(model, tiny_tokenizer):
    engine = _engine(model, tiny_tokenizer, pipelined=True)
    engine.add_request([50, 51], SamplingParams(max_tokens=10, temperature=0, ignore_eos=True))
    outputs = []
    while engine.has_unfinished():
        outputs += engine.step()
    final = outputs[-1]
    assert final.text == tiny_tokenizer.decode(final.token_ids)  # read first: resolves all
    assert "".join(o.new_text for o in outputs) == final.text
    for out in outputs[:-1]:  # as mlx-lm's streaming detokenizer shows the first k tokens
        streaming = tiny_tokenizer.detokenizer
        for token in out.token_ids:
            streaming.add_token(token)
        assert out.text == streaming.text


def test_steady_decoding_feeds_the_samples_straight_in_and_keeps_greedy_parity(
    model, tiny_tokenizer, monkeypatch
):
    """Decode-only steps over the requests the step in flight sampled, in its order, take its
    sampled tokens as their inputs as they are (no gather, no scatter): the tokens must still
    be mlx-lm's."""
    import macbatch.engine.engine as engine_module

    fed_straight = []
    feed = engine_module.feed_sampled_tokens

    def spy(batch, plan, previous):
        feed(batch, plan, previous)
        fed_straight.append(batch.token_ids is previous.sampled.tokens)

    monkeypatch.setattr(engine_module, "feed_sampled_tokens", spy)
    prompts = [[60 + i, 61 + i, 62 + i, 63 + i] for i in range(0, 12, 4)]
    params = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)
    outs = _engine(model, tiny_tokenizer, pipelined=True).generate(prompts, params)
    assert fed_straight.count(True) >= 5
    for prompt, out in zip(prompts, outs):
        assert out.token_ids == mlx_lm_greedy(model, prompt, 10)
