"""The tool-call syntaxes macbatch parses, by name: one file per family, each a ``CallSyntax``
(``engine/parsers/tool_calls.py``). Detection (``detect.py``) tries them in this order on a probe
call
rendered by the model's own template; where two could read the same text the stricter comes
first (Qwen3.5's XML and GLM's ``<arg_key>`` before Hermes JSON, all of which open with
``<tool_call>``)."""

from __future__ import annotations

from macbatch.engine.parsers.tool_calls import CallSyntax
from macbatch.engine.parsers.tool_formats.gemma4 import Gemma4
from macbatch.engine.parsers.tool_formats.glm import Glm
from macbatch.engine.parsers.tool_formats.harmony import Harmony
from macbatch.engine.parsers.tool_formats.hermes import Hermes
from macbatch.engine.parsers.tool_formats.invoke import InvokeCalls
from macbatch.engine.parsers.tool_formats.json_list import JsonList
from macbatch.engine.parsers.tool_formats.llama3 import Llama3Json
from macbatch.engine.parsers.tool_formats.mistral_args import MistralArgs
from macbatch.engine.parsers.tool_formats.pythonic import Pythonic
from macbatch.engine.parsers.tool_formats.qwen_xml import QwenXml
from macbatch.engine.parsers.tool_formats.sections import SectionCalls

SYNTAXES: dict[str, CallSyntax] = {
    "harmony": Harmony(),
    "mistral_args": MistralArgs(),
    "mistral": JsonList("mistral", "[TOOL_CALLS]", None, gap=" "),
    "mistral_nemo": JsonList("mistral_nemo", "[TOOL_CALLS]", None),
    "nemotron_v2": JsonList("nemotron_v2", "<TOOLCALL>", "</TOOLCALL>"),
    "apriel": JsonList("apriel", "<tool_calls>", "</tool_calls>"),
    "qwen3_xml": QwenXml(),
    "seed_oss": QwenXml("seed_oss", ("<seed:tool_call>", "</seed:tool_call>"), value_lines=False),
    "glm45": Glm(),
    "glm47": Glm("glm47", newlines=False),
    "minimax_m2": InvokeCalls("minimax_m2", ("<minimax:tool_call>", "</minimax:tool_call>")),
    "deepseek_v32": InvokeCalls(
        "deepseek_v32",
        ("<｜DSML｜function_calls>", "</｜DSML｜function_calls>"),
        tag="｜DSML｜",
        string_flag=True,
    ),
    "deepseek_v31": SectionCalls(
        "deepseek_v31",
        ("<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"),
        call=("<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>"),
        sep="<｜tool▁sep｜>",
    ),
    "kimi_k2": SectionCalls(
        "kimi_k2",
        ("<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"),
        call=("<|tool_call_begin|>", "<|tool_call_end|>"),
        sep="<|tool_call_argument_begin|>",
        name_prefix="functions.",
        indexed=True,
    ),
    "gemma4": Gemma4(),
    "lfm2": Pythonic(),
    "hermes": Hermes(),
    "llama3_json": Llama3Json(),
}
