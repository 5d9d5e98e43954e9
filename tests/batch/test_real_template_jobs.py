"""`macbatch run` on Qwen3.5's real chat template (tests/support/templates): OpenAI-batch rows
with forced tool calls come back as calls in its XML syntax, parsed into `tool_calls` whose
arguments validate against the tool (`jsonschema`, re-read from the output file); a plain row
reasons first (the template thinks by default), and `enable_thinking: false` turns it off."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema

from tests.support.job_files import read_jsonl, write_job
from tests.support.real_templates import save_with_template
from tests.support.structured import ADD_TOOL, WEATHER_TOOL

ASK = [{"role": "user", "content": "Add 2 and 3."}]
TOOLS = [WEATHER_TOOL, ADD_TOOL]
NAMED = {"type": "function", "function": {"name": "add"}}
# one call; a random model that reasons never stops
FORCED = {"thinking_token_budget": 0, "parallel_tool_calls": False}


def _row(custom_id: str, **body) -> str:
    return json.dumps({"custom_id": custom_id, "body": {"messages": ASK, **body}}) + "\n"


def test_forced_calls_and_thinking_on_qwen3_5(tmp_path: Path, macbatch_run):
    model = save_with_template(tmp_path / "qwen3_5", "qwen3_5")
    rows = [
        _row("required", tools=TOOLS, tool_choice="required", **FORCED),
        _row("named", tools=TOOLS, tool_choice=NAMED, **FORCED),
        _row("thinks", max_tokens=6),
        _row("plain", max_tokens=6, chat_template_kwargs={"enable_thinking": False}),
    ]
    (tmp_path / "rows.jsonl").write_text("".join(rows))
    job = write_job(
        tmp_path,
        f"""
        model: {model}
        defaults: {{sampling: {{temperature: 0, max_tokens: 120}}}}
        jobs:
          - name: rows
            input: rows.jsonl
        """,
    )
    result = macbatch_run(job)
    assert result.exit_code == 0, result.output
    lines = {line["custom_id"]: line for line in read_jsonl(tmp_path / "out" / "rows.jsonl")}
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    for custom_id in ("required", "named"):
        [choice] = lines[custom_id]["response"]["body"]["choices"]
        assert choice["finish_reason"] == "tool_calls"
        [call] = choice["message"]["tool_calls"]
        assert call["function"]["name"] == "add" or custom_id == "required"
        name, arguments = call["function"]["name"], call["function"]["arguments"]
        jsonschema.validate(json.loads(arguments), schemas[name])
    thinks = lines["thinks"]["response"]["body"]["choices"][0]["message"]
    plain = lines["plain"]["response"]["body"]["choices"][0]["message"]
    assert "reasoning_content" in thinks and "reasoning_content" not in plain
