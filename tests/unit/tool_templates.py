"""Chat templates that render tool calls the way each model family's own template does (written from the
families' public formats: no checkpoint can be downloaded here): rollart's tiny ChatML template with its
Hermes call loop replaced by the family's. For round trips (the parser reads what the template renders) and
for the engine writing forced calls under each family's grammar."""

from __future__ import annotations

from rollart.models.tiny import CHATML_TEMPLATE

HERMES_LOOP = CHATML_TEMPLATE[CHATML_TEMPLATE.index("{% for call in message['tool_calls'] %}"):
                              CHATML_TEMPLATE.index("{% endfor %}<|im_end|>{{ '\n' }}{% else %}") + len("{% endfor %}")]
_FN = "{% set fn = call['function'] %}"

CALL_LOOPS = {
    "hermes": HERMES_LOOP,
    # Qwen3-Coder: strings as written, other values as JSON
    "qwen3_coder": "{% for call in message['tool_calls'] %}" + _FN + "{% if not loop.first %}{{ '\\n' }}{% endif %}"
    "<tool_call>{{ '\\n' }}<function={{ fn['name'] }}>{{ '\\n' }}"
    "{% for k, v in fn['arguments'].items() %}<parameter={{ k }}>{{ '\\n' }}"
    "{% if v is string %}{{ v }}{% else %}{{ v | tojson }}{% endif %}{{ '\\n' }}</parameter>{{ '\\n' }}{% endfor %}"
    "</function>{{ '\\n' }}</tool_call>{% endfor %}",
    # Llama 3.1-3.3: one JSON object per call, joined by '; '
    "llama3_json": "{% for call in message['tool_calls'] %}" + _FN + "{% if not loop.first %}; {% endif %}"
    "{{ '{\"name\": \"' + fn['name'] + '\", \"parameters\": ' }}{{ fn['arguments'] | tojson }}{{ '}' }}{% endfor %}",
    # Mistral v0.3: [TOOL_CALLS] and a JSON array with 9-character ids
    "mistral": "[TOOL_CALLS] [{% for call in message['tool_calls'] %}" + _FN + "{% if not loop.first %}, {% endif %}"
    "{{ '{\"name\": \"' + fn['name'] + '\", \"arguments\": ' }}{{ fn['arguments'] | tojson }}"
    "{{ ', \"id\": \"' + call['id'] + '\"}' }}{% endfor %}]",
    # DeepSeek V3: markers, then the arguments in a ```json block
    "deepseek_v3": "<｜tool▁calls▁begin｜>{% for call in message['tool_calls'] %}" + _FN +
    "{% if not loop.first %}{{ '\\n' }}{% endif %}<｜tool▁call▁begin｜>function<｜tool▁sep｜>{{ fn['name'] }}"
    "{{ '\\n' }}```json{{ '\\n' }}{{ fn['arguments'] | tojson }}{{ '\\n' }}```<｜tool▁call▁end｜>{% endfor %}"
    "<｜tool▁calls▁end｜>",
    # GLM-4.5: <arg_key>/<arg_value> pairs
    "glm45": "{% for call in message['tool_calls'] %}" + _FN + "{% if not loop.first %}{{ '\\n' }}{% endif %}"
    "<tool_call>{{ fn['name'] }}{{ '\\n' }}{% for k, v in fn['arguments'].items() %}<arg_key>{{ k }}</arg_key>"
    "{{ '\\n' }}<arg_value>{% if v is string %}{{ v }}{% else %}{{ v | tojson }}{% endif %}</arg_value>{{ '\\n' }}"
    "{% endfor %}</tool_call>{% endfor %}",
    # Kimi K2: the call id (functions.NAME:INDEX) written back
    "kimi_k2": "<|tool_calls_section_begin|>{% for call in message['tool_calls'] %}" + _FN +
    "<|tool_call_begin|>{{ call['id'] }}<|tool_call_argument_begin|>{{ fn['arguments'] | tojson }}<|tool_call_end|>"
    "{% endfor %}<|tool_calls_section_end|>",
}


def template(family: str) -> str:
    return CHATML_TEMPLATE.replace(HERMES_LOOP, CALL_LOOPS[family])


def call_ids(family: str, names: list[str], prefix: str = "call_0") -> list[str]:
    """Ids as the family's own stack gives them (what its template expects to write back)."""
    from rollart.envs.tool_calls.mistral import call_id

    if family == "mistral":
        return [call_id(prefix, i) for i in range(len(names))]
    if family == "kimi_k2":
        return [f"functions.{n}:{i}" for i, n in enumerate(names)]
    return [f"{prefix}_{i}" for i in range(len(names))]
