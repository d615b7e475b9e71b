"""Checks `mollm serve`'s Messages API through the real `anthropic` Python client. Run by
cli/tests/serve.rs against a server it started (a model whose template has a tool section):

    anthropic_client.py URL KEY

Every check raises on failure; the exit status says it all.
"""

import json
import sys

import anthropic


def main(url, key):
    c = anthropic.Anthropic(base_url=url, api_key=key, max_retries=0, timeout=120)
    model = "any"
    ask = [{"role": "user", "content": "Name three colours of the rainbow."}]

    # A message: text blocks, a stop reason, usage.
    m = c.messages.create(model=model, max_tokens=32, system="You are terse.", messages=ask,
                          )
    assert m.type == "message" and m.role == "assistant" and m.id.startswith("msg_"), m
    assert m.content and m.content[0].type == "text" and m.content[0].text, m
    assert m.stop_reason in ("end_turn", "max_tokens"), m
    assert m.usage.input_tokens > 0 and 0 < m.usage.output_tokens <= 32, m.usage

    # Streamed: the events in Anthropic's order, the text the same as the whole message's.
    kinds, text = [], ""
    with c.messages.stream(model=model, max_tokens=32, system="You are terse.", messages=ask,
                           ) as s:
        for e in s:
            kinds.append(e.type)
            if e.type == "content_block_delta" and e.delta.type == "text_delta":
                text += e.delta.text
        final = s.get_final_message()
    raw = [k for k in kinds if k in ("message_start", "content_block_start", "content_block_delta",
                                     "content_block_stop", "message_delta", "message_stop")]
    assert raw[0] == "message_start" and raw[-2:] == ["message_delta", "message_stop"], raw
    assert raw[1] == "content_block_start" and "content_block_stop" in raw, raw
    assert text == m.content[0].text == final.content[0].text, (text, m.content[0].text)

    # A stop sequence: reported with its text.
    m2 = c.messages.create(model=model, max_tokens=64, messages=ask,
                           stop_sequences=[m.content[0].text[3:6]] if len(m.content[0].text) > 6 else ["\n"])
    assert m2.stop_reason in ("stop_sequence", "end_turn", "max_tokens"), m2
    if m2.stop_reason == "stop_sequence":
        assert m2.stop_sequence, m2

    # Tools: a forced call (any), its tool_use block, a tool_result round trip.
    tools = [{"name": "get_weather", "description": "The current weather in a city",
              "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                               "required": ["city"], "additionalProperties": False}}]
    ask_w = [{"role": "user", "content": "What is the weather in Paris?"}]
    m = c.messages.create(model=model, max_tokens=100, messages=ask_w, tools=tools,
                          tool_choice={"type": "any"})
    assert m.stop_reason == "tool_use", m
    uses = [b for b in m.content if b.type == "tool_use"]
    assert uses and uses[0].name == "get_weather" and isinstance(uses[0].input["city"], str), m
    follow = ask_w + [{"role": "assistant", "content": [b.model_dump() for b in m.content]},
                      {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id,
                                                    "content": "21 degrees, sunny"}]}]
    m = c.messages.create(model=model, max_tokens=40, messages=follow, tools=tools)
    assert m.stop_reason in ("end_turn", "max_tokens", "tool_use"), m
    # Streamed tool use: the block's input put together.
    with c.messages.stream(model=model, max_tokens=100, messages=ask_w, tools=tools,
                           tool_choice={"type": "tool", "name": "get_weather"}) as s:
        final = s.get_final_message()
    uses = [b for b in final.content if b.type == "tool_use"]
    assert final.stop_reason == "tool_use" and uses and isinstance(uses[0].input.get("city"), str), final

    # count_tokens: the prompt the request makes.
    n = c.messages.count_tokens(model=model, system="You are terse.", messages=ask)
    assert n.input_tokens == c.messages.create(model=model, max_tokens=1, system="You are terse.",
                                               messages=ask).usage.input_tokens, n

    # Errors in Anthropic's shape.
    try:
        c.messages.create(model=model, max_tokens=8, messages=[{"role": "robot", "content": "x"}])
    except anthropic.BadRequestError as e:
        body = e.response.json()
        assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error", body
    else:
        raise AssertionError("a bad role was accepted")
    print(json.dumps({"anthropic": "ok"}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
