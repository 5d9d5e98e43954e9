"""Chat's line under a reply shows speculative decoding's acceptance when the reply speculated,
from the engine's own per-request counts."""

from __future__ import annotations

from macbatch.engine import Engine, EngineConfig, SamplingParams
from macbatch.tui.reply import reply_metrics
from macbatch.tui.store import Message
from macbatch.tui.widgets.message_view import describe
from tests.support.tiny import build_model


def test_the_reply_line_shows_acceptance_only_for_speculating_replies(tiny_tokenizer):
    model = build_model("qwen3")
    prompt = [40, 41, 42, 43, 40, 41, 42, 43, 40, 41]
    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    lines = {}
    for mode in ("off", "ngram"):
        engine = Engine(model, tiny_tokenizer, EngineConfig(num_blocks=32, speculative=mode))
        out = engine.generate([prompt], params)[0]
        metrics = reply_metrics(out)
        lines[mode] = describe(Message(1, 1, "assistant", out.text, metrics=metrics))
        spec = out.metrics.speculation
        if mode == "ngram":
            assert spec.verifications > 0
            assert metrics.acceptance_rate == spec.acceptance_rate
            assert f"drafts {spec.acceptance_rate:.0%} accepted" in lines[mode]
            assert f"{spec.mean_accepted_length:.1f} tok/step" in lines[mode]
    assert "drafts" not in lines["off"]
    assert lines["off"].split(" · ")[0] == lines["ngram"].split(" · ")[0] == "16 tokens"
