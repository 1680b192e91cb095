"""Tiny chat models that write each family's tool-call and reasoning format, for the parsers' end-to-end tests.

Each is a tiny random model of the family's architecture (workers/tiny/families.py; the nearest one
where that list has none: Llama for Llama 4 and GLM-4.5, Gemma 3 for Gemma 4, DeepSeek V3's for Kimi
K2, as Kimi K2 is) with the tiny tokenizer, given the family's marker tokens (special where
the family's are: they vanish from a plain decode, as in the real tokenizers) and a chat template
written for these tests from the family's documented format: tools declared, assistant tool calls and
reasoning, tool results, the generation prompt. What the server's parsing depends on is there; the
weights are random (the tests force the answer with a grammar).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

ARGS = "{{ call.arguments if call.arguments is string else call.arguments | tojson }}"
CALL = "{%- set call = call.function if call.function is defined else call %}"
TOOLS_JSON = "{%- for tool in tools %}{{ tool | tojson }}{%- endfor %}"


@dataclass(frozen=True)
class ChatFormat:
    template: str
    special: tuple[str, ...]  # added as special tokens (a plain decode drops them)
    eos: tuple[str, ...] = ()  # end-of-turn tokens the model stops at (beside the tokenizer's own EOS)
    plain: tuple[str, ...] = field(default=())  # added as ordinary (never split) tokens
    architecture: str = "llama"  # its model's family in workers/tiny/families.py
    response_template: dict | None = None  # the tokenizer's own (transformers' parser reads the answer with it)


CHATML_TOOLS = (
    "{%- if tools %}<|im_start|>system\n# Tools\n<tools>\n" + TOOLS_JSON + "\n</tools><|im_end|>\n{%- endif %}"
)
QWEN3_CODER = ChatFormat(
    CHATML_TOOLS + """
{%- for m in messages %}
{%- if m.role == 'assistant' %}<|im_start|>assistant
{% if m.reasoning_content %}<think>
{{ m.reasoning_content }}
</think>

{% endif %}{{ m.content or '' }}
{%- for call in m.tool_calls or [] %}""" + CALL + """<tool_call>
<function={{ call.name }}>
{% for key, value in call.arguments.items() %}<parameter={{ key }}>
{{ value }}
</parameter>
{% endfor %}</function>
</tool_call>{% endfor %}<|im_end|>
{% elif m.role == 'tool' %}<|im_start|>user
<tool_response>
{{ m.content }}
</tool_response><|im_end|>
{% else %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endif %}{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}""", (), ("<|im_end|>",), architecture="qwen3.5")

LLAMA3 = ChatFormat("""<|begin_of_text|>
{%- if tools %}<|start_header_id|>system<|end_header_id|>

Environment: ipython
Respond with a JSON object {"name": function name, "parameters": arguments}.
""" + TOOLS_JSON + """<|eot_id|>{%- endif %}
{%- for m in messages %}
{%- if m.role == 'assistant' and m.tool_calls %}<|start_header_id|>assistant<|end_header_id|>

{% for call in m.tool_calls %}""" + CALL + """{"name": "{{ call.name }}", "parameters": """ + ARGS + """}{% endfor %}<|eot_id|>
{%- elif m.role == 'tool' %}<|start_header_id|>ipython<|end_header_id|>

{{ m.content }}<|eot_id|>
{%- else %}<|start_header_id|>{{ m.role }}<|end_header_id|>

{{ m.content }}<|eot_id|>
{%- endif %}{%- endfor %}
{%- if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>

{% endif %}""", ("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>",
                 "<|python_tag|>"), ("<|eot_id|>", "<|eom_id|>"))

LLAMA4 = ChatFormat("""<|begin_of_text|>
{%- if tools %}<|header_start|>system<|header_end|>

Call functions as [func(param=value)]: """ + TOOLS_JSON + """<|eot|>{%- endif %}
{%- for m in messages %}
{%- if m.role == 'assistant' and m.tool_calls %}<|header_start|>assistant<|header_end|>

<|python_start|>[{% for call in m.tool_calls %}""" + CALL + """{{ call.name }}({% for key, value in call.arguments.items() %}{{ key }}={{ value | tojson }}{{ ', ' if not loop.last }}{% endfor %}){{ ', ' if not loop.last }}{% endfor %}]<|python_end|><|eot|>
{%- elif m.role == 'tool' %}<|header_start|>ipython<|header_end|>

{{ m.content }}<|eot|>
{%- else %}<|header_start|>{{ m.role }}<|header_end|>

{{ m.content }}<|eot|>
{%- endif %}{%- endfor %}
{%- if add_generation_prompt %}<|header_start|>assistant<|header_end|>

{% endif %}""", ("<|begin_of_text|>", "<|header_start|>", "<|header_end|>", "<|eot|>", "<|eom|>", "<|python_start|>",
                 "<|python_end|>"), ("<|eot|>", "<|eom|>"))

MISTRAL = ChatFormat("""{{ bos_token }}{%- if tools %}[AVAILABLE_TOOLS][""" + "{%- for tool in tools %}{{ tool | tojson }}{{ ', ' if not loop.last }}{%- endfor %}" + """][/AVAILABLE_TOOLS]{%- endif %}
{%- for m in messages %}
{%- if m.role == 'user' %}[INST]{{ m.content }}[/INST]
{%- elif m.role == 'system' %}[SYSTEM_PROMPT]{{ m.content }}[/SYSTEM_PROMPT]
{%- elif m.role == 'assistant' %}{% if m.reasoning_content %}[THINK]{{ m.reasoning_content }}[/THINK]{% endif %}{{ m.content or '' }}
{%- for call in m.tool_calls or [] %}""" + CALL + """[TOOL_CALLS]{{ call.name }}[ARGS]""" + ARGS + """{% endfor %}{{ eos_token }}
{%- elif m.role == 'tool' %}[TOOL_RESULTS]{{ m.content }}[/TOOL_RESULTS]
{%- endif %}{%- endfor %}""", ("[INST]", "[/INST]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[SYSTEM_PROMPT]",
                                 "[/SYSTEM_PROMPT]", "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]", "[TOOL_RESULTS]",
                                 "[/TOOL_RESULTS]", "[THINK]", "[/THINK]"), architecture="mistral")

DEEPSEEK_V31 = ChatFormat("""<｜begin▁of▁sentence｜>{%- if tools %}## Tools
""" + TOOLS_JSON + """
{%- endif %}
{%- for m in messages %}
{%- if m.role == 'user' %}<｜User｜>{{ m.content }}
{%- elif m.role == 'assistant' %}<｜Assistant｜></think>{{ m.content or '' }}
{%- if m.tool_calls %}<｜tool▁calls▁begin｜>{% for call in m.tool_calls %}""" + CALL + """<｜tool▁call▁begin｜>{{ call.name }}<｜tool▁sep｜>""" + ARGS + """<｜tool▁call▁end｜>{% endfor %}<｜tool▁calls▁end｜>{% endif %}<｜end▁of▁sentence｜>
{%- elif m.role == 'tool' %}<｜tool▁output▁begin｜>{{ m.content }}<｜tool▁output▁end｜>
{%- else %}{{ m.content }}
{%- endif %}{%- endfor %}
{%- if add_generation_prompt %}<｜Assistant｜>{{ '<think>' if thinking is defined and thinking else '</think>' }}{% endif %}""",
    ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>", "<｜tool▁calls▁begin｜>",
     "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>", "<｜tool▁output▁begin｜>",
     "<｜tool▁output▁end｜>"), ("<｜end▁of▁sentence｜>",), architecture="deepseek-v3")

GRANITE = ChatFormat("""{%- if tools %}<|start_of_role|>tools<|end_of_role|>[""" + "{%- for tool in tools %}{{ tool | tojson }}{{ ', ' if not loop.last }}{%- endfor %}" + """]<|end_of_text|>
{% endif %}
{%- for m in messages %}
{%- if m.role == 'assistant' %}<|start_of_role|>assistant<|end_of_role|>{% if m.reasoning_content %}Here is my thought process: {{ m.reasoning_content }} Here is my response: {% endif %}{{ m.content or '' }}
{%- if m.tool_calls %}<|tool_call|>[{% for call in m.tool_calls %}""" + CALL + """{"name": "{{ call.name }}", "arguments": """ + ARGS + """}{{ ', ' if not loop.last }}{% endfor %}]{% endif %}<|end_of_text|>
{% elif m.role == 'tool' %}<|start_of_role|>tool_response<|end_of_role|>{{ m.content }}<|end_of_text|>
{% else %}<|start_of_role|>{{ m.role }}<|end_of_role|>{{ m.content }}<|end_of_text|>
{% endif %}{%- endfor %}
{%- if add_generation_prompt %}<|start_of_role|>assistant<|end_of_role|>{% endif %}""",
    ("<|start_of_role|>", "<|end_of_role|>", "<|end_of_text|>", "<|tool_call|>"), ("<|end_of_text|>",),
    architecture="granite")

GEMMA4_VALUE = ("{%- if value is string %}<|\"|>{{ value }}<|\"|>{%- else %}{{ value | tojson }}{%- endif %}")
GEMMA4 = ChatFormat("""<bos>
{%- if tools %}<|turn>system
{% for tool in tools %}<|tool>declaration:{{ tool.function.name }}{{ tool.function | tojson }}<tool|>{% endfor %}<turn|>
{% endif %}
{%- for m in messages %}
{%- if m.role == 'assistant' %}<|turn>model
{% if m.reasoning_content %}<|channel>thought
{{ m.reasoning_content }}<channel|>{% endif %}{{ m.content or '' }}
{%- for call in m.tool_calls or [] %}""" + CALL + """<|tool_call>call:{{ call.name }}{{ '{' }}{% for key, value in call.arguments.items() %}{{ key }}:""" + GEMMA4_VALUE + """{{ ',' if not loop.last }}{% endfor %}{{ '}' }}<tool_call|>{% endfor %}<turn|>
{% elif m.role == 'tool' %}<|turn>user
<|tool_response>response:{{ m.content }}<tool_response|><turn|>
{% else %}<|turn>{{ 'user' if m.role == 'user' else 'system' }}
{{ m.content }}<turn|>
{% endif %}{%- endfor %}
{%- if add_generation_prompt %}<|turn>model
{% endif %}""", ("<bos>", "<|turn>", "<turn|>", "<|tool>", "<tool|>", "<|tool_call>", "<tool_call|>", "<|tool_response>",
                 "<tool_response|>", '<|"|>', "<|channel>", "<channel|>"), ("<turn|>",), architecture="gemma3")

KIMI_K2 = ChatFormat("""{%- if tools %}<|im_system|>tool_declare<|im_middle|>""" + TOOLS_JSON + """<|im_end|>{%- endif %}
{%- for m in messages %}
{%- if m.role == 'assistant' %}<|im_assistant|>assistant<|im_middle|>{% if m.reasoning_content %}<think>{{ m.reasoning_content }}</think>{% endif %}{{ m.content or '' }}
{%- if m.tool_calls %}<|tool_calls_section_begin|>{% for call in m.tool_calls %}{% set index = loop.index0 %}""" + CALL + """<|tool_call_begin|>functions.{{ call.name }}:{{ index }}<|tool_call_argument_begin|>""" + ARGS + """<|tool_call_end|>{% endfor %}<|tool_calls_section_end|>{% endif %}<|im_end|>
{%- elif m.role == 'tool' %}<|im_system|>tool<|im_middle|>## Return of {{ m.tool_call_id }}
{{ m.content }}<|im_end|>
{%- else %}<|im_{{ 'user' if m.role == 'user' else 'system' }}|>{{ m.role }}<|im_middle|>{{ m.content }}<|im_end|>
{%- endif %}{%- endfor %}
{%- if add_generation_prompt %}<|im_assistant|>assistant<|im_middle|>{% endif %}""",
    ("<|im_user|>", "<|im_assistant|>", "<|im_system|>", "<|im_middle|>", "<|tool_calls_section_begin|>",
     "<|tool_calls_section_end|>", "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"),
    ("<|im_end|>",), architecture="deepseek-v3")

GLM45 = ChatFormat("""[gMASK]<sop>
{%- if tools %}<|system|>
# Tools
""" + TOOLS_JSON + """{%- endif %}
{%- for m in messages %}
{%- if m.role == 'assistant' %}<|assistant|>
<think>{{ m.reasoning_content or '' }}</think>
{{ m.content or '' }}
{%- for call in m.tool_calls or [] %}""" + CALL + """<tool_call>{{ call.name }}
{% for key, value in call.arguments.items() %}<arg_key>{{ key }}</arg_key>
<arg_value>{{ value if value is string else value | tojson }}</arg_value>
{% endfor %}</tool_call>{% endfor %}
{%- elif m.role == 'tool' %}<|observation|>
<tool_response>
{{ m.content }}
</tool_response>
{%- else %}<|{{ m.role }}|>
{{ m.content }}
{%- endif %}{%- endfor %}
{%- if add_generation_prompt %}<|assistant|>
{% endif %}""", ("[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>", "<tool_call>",
                 "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"), ("<|user|>", "<|observation|>"))

HARMONY = ChatFormat("""<|start|>system<|message|>You are a helpful assistant.
Reasoning: medium
# Valid channels: analysis, commentary, final.<|end|>
{%- if tools %}<|start|>developer<|message|># Tools

## functions

namespace functions {
{% for tool in tools %}// {{ tool.function.description }}
type {{ tool.function.name }} = (_: {{ tool.function.parameters | tojson }}) => any;
{% endfor %}} // namespace functions<|end|>{%- endif %}
{%- for m in messages %}
{%- if m.role == 'assistant' %}
{%- if m.reasoning_content %}<|start|>assistant<|channel|>analysis<|message|>{{ m.reasoning_content }}<|end|>{% endif %}
{%- for call in m.tool_calls or [] %}""" + CALL + """<|start|>assistant to=functions.{{ call.name }}<|channel|>commentary <|constrain|>json<|message|>""" + ARGS + """<|call|>{% endfor %}
{%- if m.content %}<|start|>assistant<|channel|>final<|message|>{{ m.content }}<|end|>{% endif %}
{%- elif m.role == 'tool' %}{%- set ns = namespace(name='') %}
{%- for prior in messages %}{%- for call in prior.tool_calls or [] %}{%- if call.id == m.tool_call_id %}{%- set ns.name = call.function.name %}{%- endif %}{%- endfor %}{%- endfor %}
<|start|>functions.{{ ns.name }} to=assistant<|channel|>commentary<|message|>{{ m.content }}<|end|>
{%- else %}<|start|>{{ 'user' if m.role == 'user' else 'developer' }}<|message|>{{ m.content }}<|end|>
{%- endif %}{%- endfor %}
{%- if add_generation_prompt %}<|start|>assistant{% endif %}""",
    ("<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|return|>", "<|call|>"),
    ("<|return|>", "<|call|>"), architecture="gpt-oss")

# The tiny models' own ChatML template, with a `response_template` as Qwen's in tokenizer_config.json.
QWEN_RESPONSE_TEMPLATE = {
    "defaults": {"role": "assistant"}, "start_anchor": "<|im_start|>assistant\n",
    "fields": {
        "reasoning_content": {"open": "<think>", "close": "</think>", "content": "text"},
        "tool_calls": {"open_pattern": r"\s*<tool_call>", "close": "</tool_call>", "repeats": True, "content": "json",
                       "transform": {"type": "function", "function": "{content}"}},
        "content": {"close_pattern": r"\s*<\|im_end\|>", "content": "text"},
    },
}
RESPONSE_TEMPLATE = ChatFormat("", (), ("<|im_end|>",), architecture="qwen3", response_template=QWEN_RESPONSE_TEMPLATE)

FORMATS: dict[str, ChatFormat] = {
    "qwen3_coder": QWEN3_CODER, "llama3_json": LLAMA3, "llama4_pythonic": LLAMA4, "mistral": MISTRAL,
    "deepseek_v31": DEEPSEEK_V31, "granite": GRANITE, "gemma4": GEMMA4, "kimi_k2": KIMI_K2, "glm45": GLM45,
    "openai": HARMONY, "response_template": RESPONSE_TEMPLATE,
}


def format_tokenizer(family: str, base=None):
    """The tiny tokenizer with the family's markers added and its chat template (`base`: a trained one to copy)."""
    import copy

    from tokenizers import AddedToken

    from .builders import SIZES, train_tokenizer

    tokenizer = copy.deepcopy(base) if base is not None else train_tokenizer(SIZES["tiny"]["vocab_target"])
    chat_format = FORMATS[family]
    tokenizer.add_tokens([AddedToken(t, special=True, normalized=False) for t in chat_format.special], special_tokens=True)
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in chat_format.plain])
    tokenizer.chat_template = chat_format.template or tokenizer.chat_template
    tokenizer.response_template = chat_format.response_template
    return tokenizer


def build_chat_format_model(repo_id: str, family: str, cache_dir: str | os.PathLike | None = None,
                            tokenizer=None) -> object:
    """Store `family`'s tiny model (its architecture, tokenizer and template) as `repo_id`; returns its snapshot."""
    from .builders import EOS
    from .families import build_tiny_family

    tokenizer = format_tokenizer(family, tokenizer)
    chat_format = FORMATS[family]
    eos_ids = [tokenizer.convert_tokens_to_ids(t) for t in (EOS, *chat_format.eos)]
    return build_tiny_family(chat_format.architecture, repo_id, cache_dir, tokenizer=tokenizer, eos_token_ids=eos_ids)
