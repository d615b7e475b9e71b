"""Checks `mollm serve` through LangChain's `ChatOpenAI` (langchain-openai, pinned in
cli/tests/serve.rs and installed from PyPI when missing), on a model whose chat template has a
tool section (Qwen2.5's Hermes-style `<tool_call>`):

    langchain_client.py URL KEY

  tools       bind_tools with a @tool function and a Pydantic class: tool_choice "required",
              "any", True, a tool's name, OpenAI's dict, strict schemas with
              parallel_tool_calls=False; the calls' args validate (types, required keys), also
              sampled at temperature 1; a round trip with ToolMessages, answered without forcing
  stream      bind_tools(tool_choice="required").stream(): the chunks add up to an
              AIMessageChunk whose calls validate and equal the whole answer's; usage when asked;
              the same through astream
  structured  with_structured_output(Pydantic model with an enum, a nested object and a list):
              method="json_schema", the default, "function_calling", include_raw, streamed;
              10 json_schema draws at temperature 1 (and 4 function_calling ones) all validate
  responses   use_responses_api=True: a forced call, a round trip, a structured output

Every check raises on failure; the last line printed is {"langchain": "ok", ...counts}.
"""

import asyncio
import enum
import functools
import json
import operator
import re
import sys
import time
import warnings

import pydantic
from langchain_core.messages import AIMessage, AIMessageChunk, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI

# LangChain keeps the parsed model in a dict-typed field and pydantic warns when it dumps it.
warnings.filterwarnings("ignore", message="Pydantic serializer warnings")

COUNTS = {}


def count(what, n=1):
    COUNTS[what] = COUNTS.get(what, 0) + n


def chat(url, key, **kw):
    """ChatOpenAI on the server: greedy unless `kw` says otherwise, no retries."""
    return ChatOpenAI(**{"base_url": url + "/v1", "api_key": key, "model": "m", "temperature": 0,
                         "max_retries": 0, "timeout": 120, **kw})


@tool
def get_weather(city: str) -> str:
    """The current weather in a city."""
    return json.dumps({"city": city, "temperature": 21, "sky": "sunny"})


class add(pydantic.BaseModel):
    """Add two integers."""

    a: int = pydantic.Field(description="The first number")
    b: int = pydantic.Field(description="The second number")


TOOLS = [get_weather, add]
WEATHER = "What is the weather in Paris?"
SUM = "What is 2 plus 3? Use the add tool."


def valid_call(tc, names=("get_weather", "add"), exact=False):
    """One LangChain tool call: a known name, an id, args of the right types with the required
    keys (and only those when `exact`, the strict schemas' additionalProperties: false)."""
    assert tc["type"] == "tool_call" and tc["id"], tc
    assert tc["name"] in names, tc
    args = tc["args"]
    assert isinstance(args, dict), tc
    if tc["name"] == "get_weather":
        want = {"city"}
        get_weather.args_schema.model_validate(args, strict=True)
        assert isinstance(args["city"], str), tc
    else:
        want = {"a", "b"}
        add.model_validate(args, strict=True)
        assert all(isinstance(args[k], int) and not isinstance(args[k], bool) for k in "ab"), tc
    assert want <= set(args), tc
    if exact:
        assert set(args) == want, tc
    return args


def valid_calls(m, names=("get_weather", "add"), exact=False, kind=AIMessage):
    assert isinstance(m, kind), (type(m), m)
    assert m.response_metadata.get("finish_reason") == "tool_calls", m
    assert m.tool_calls and not m.invalid_tool_calls, m
    for tc in m.tool_calls:
        valid_call(tc, names, exact)
        count("tool_calls")
    return m.tool_calls


def tools(url, key):
    llm = chat(url, key)

    # Forced: "required" and the spellings LangChain turns into it.
    for choice in ("required", "any", True):
        valid_calls(llm.bind_tools(TOOLS, tool_choice=choice).invoke(WEATHER))
    # Named: by the tool's name (a @tool and a Pydantic class) and OpenAI's dict.
    calls = valid_calls(llm.bind_tools(TOOLS, tool_choice="add").invoke(SUM), ("add",))
    assert [tc["name"] for tc in calls] == ["add"], calls
    calls = valid_calls(llm.bind_tools(TOOLS, tool_choice="get_weather").invoke(WEATHER),
                        ("get_weather",))
    assert [tc["name"] for tc in calls] == ["get_weather"], calls
    calls = valid_calls(llm.bind_tools(TOOLS, tool_choice={"type": "function", "function": {
        "name": "add"}}).invoke(SUM), ("add",))
    assert [tc["name"] for tc in calls] == ["add"], calls
    # Strict schemas (additionalProperties: false), one call asked for.
    calls = valid_calls(llm.bind_tools(TOOLS, tool_choice="required", strict=True,
                                       parallel_tool_calls=False).invoke(WEATHER), exact=True)
    # parallel_tool_calls=false (what with_structured_output(method="function_calling") sends
    # too): exactly one call.
    assert len(calls) == 1, calls
    COUNTS["calls_without_parallel"] = len(calls)
    # "none": never a call.
    m = llm.bind_tools(TOOLS, tool_choice="none").invoke(WEATHER, max_tokens=24)
    assert isinstance(m, AIMessage) and not m.tool_calls and not m.invalid_tool_calls, m
    assert isinstance(m.content, str) and m.content, m

    # Sampled at temperature 1, at once: every forced call validates.
    hot = chat(url, key, temperature=1).bind_tools(TOOLS, tool_choice="required")
    for m in hot.batch([WEATHER, SUM] * 3, config={"max_concurrency": 4}):
        valid_calls(m)
        count("sampled_tool_answers")

    # A round trip: the calls, their results as ToolMessages (the @tool run by LangChain
    # itself), and the model goes on without being forced: text or further calls, well formed.
    forced = llm.bind_tools(TOOLS, tool_choice="get_weather").invoke(WEATHER)
    valid_calls(forced, ("get_weather",))
    history = [HumanMessage(WEATHER), forced]
    for tc in forced.tool_calls:
        result = get_weather.invoke(tc)
        assert isinstance(result, ToolMessage) and result.tool_call_id == tc["id"], result
        history.append(result)
    summed = llm.bind_tools(TOOLS, tool_choice="add").invoke(SUM)
    valid_calls(summed, ("add",))
    history2 = [HumanMessage(SUM), summed] + [
        ToolMessage(tool_call_id=tc["id"], content=str(tc["args"]["a"] + tc["args"]["b"]))
        for tc in summed.tool_calls]
    short = chat(url, key, max_tokens=60).bind_tools(TOOLS)
    for h in (history, history2):
        m = short.invoke(h)
        assert isinstance(m, AIMessage) and isinstance(m.content, str), m
        assert m.response_metadata.get("finish_reason") in ("stop", "length", "tool_calls"), m
        assert not m.invalid_tool_calls, m
        if m.tool_calls:
            for tc in m.tool_calls:
                assert tc["name"] in ("get_weather", "add") and isinstance(tc["args"], dict), tc
        else:
            assert m.content, m
        count("round_trips")
    print(json.dumps({"tools": "ok"}), flush=True)


def stream(url, key):
    llm = chat(url, key)
    forced = llm.bind_tools(TOOLS, tool_choice="required")
    whole = valid_calls(forced.invoke(WEATHER))
    chunks = list(forced.stream(WEATHER))
    assert len(chunks) > 1 and all(isinstance(c, AIMessageChunk) for c in chunks), chunks
    total = functools.reduce(operator.add, chunks)
    calls = valid_calls(total, kind=AIMessageChunk)
    assert [(tc["name"], tc["args"]) for tc in calls] == \
        [(tc["name"], tc["args"]) for tc in whole], (calls, whole)
    assert [tc["id"] for tc in calls] == [tc["id"] for tc in total.tool_call_chunks], total
    for tc in total.tool_call_chunks:
        json.loads(tc["args"])
    count("streamed_chunks", len(chunks))

    # Usage when asked (stream_options.include_usage), and a named call streamed.
    named = chat(url, key, stream_usage=True).bind_tools(TOOLS, tool_choice="add")
    total = functools.reduce(operator.add, named.stream(SUM))
    assert [tc["name"] for tc in valid_calls(total, ("add",), kind=AIMessageChunk)] == ["add"], total
    u = total.usage_metadata
    assert u and u["input_tokens"] > 0 and u["output_tokens"] > 0, total
    assert u["total_tokens"] == u["input_tokens"] + u["output_tokens"], u

    # The async client, the same calls.
    async def astream():
        return [c async for c in forced.astream(WEATHER)]
    total = functools.reduce(operator.add, asyncio.run(astream()))
    calls = valid_calls(total, kind=AIMessageChunk)
    assert [(tc["name"], tc["args"]) for tc in calls] == \
        [(tc["name"], tc["args"]) for tc in whole], (calls, whole)
    print(json.dumps({"stream": "ok"}), flush=True)


class Colour(str, enum.Enum):
    red = "red"
    green = "green"
    blue = "blue"


class Address(pydantic.BaseModel):
    city: str = pydantic.Field(max_length=30)
    zip: str = pydantic.Field(pattern=r"^[0-9]{5}$")


class Person(pydantic.BaseModel):
    """A person."""

    name: str = pydantic.Field(max_length=30)
    age: int = pydantic.Field(ge=0, le=120)
    colour: Colour
    address: Address
    hobbies: list[str] = pydantic.Field(max_length=3)


ASK = "Invent a person. Answer in JSON."


def valid_person(p):
    assert isinstance(p, Person), (type(p), p)
    # Validated once more from its JSON: the constraints hold, not only the types.
    Person.model_validate_json(p.model_dump_json(), strict=True)
    assert isinstance(p.colour, Colour) and isinstance(p.address, Address), p
    assert re.fullmatch(r"[0-9]{5}", p.address.zip) and len(p.hobbies) <= 3, p
    count("people")
    return p


def structured(url, key):
    llm = chat(url, key)
    for kw in ({"method": "json_schema"}, {}, {"method": "function_calling"}):
        valid_person(llm.with_structured_output(Person, **kw).invoke(ASK))
    # include_raw: the message and no parsing error.
    r = llm.with_structured_output(Person, method="json_schema", include_raw=True).invoke(ASK)
    assert r["parsing_error"] is None and isinstance(r["raw"], AIMessage), r
    valid_person(r["parsed"])
    # Streamed (the client's chat.completions.stream helper): the last piece is the model.
    pieces = list(llm.with_structured_output(Person, method="json_schema").stream(ASK))
    assert pieces, pieces
    valid_person(pieces[-1])

    # Sampled at temperature 1: every draw validates.
    t0 = time.time()
    hot = chat(url, key, temperature=1)
    drawn = hot.with_structured_output(Person, method="json_schema").batch(
        [ASK] * 10, config={"max_concurrency": 4})
    assert len(drawn) == 10, drawn
    for p in drawn:
        valid_person(p)
        count("sampled_json_schema")
    for p in hot.with_structured_output(Person, method="function_calling").batch(
            [ASK] * 4, config={"max_concurrency": 4}):
        valid_person(p)
        count("sampled_function_calling")
    distinct = len({p.model_dump_json() for p in drawn})
    print(json.dumps({"structured": "ok", "distinct": distinct,
                      "sampled_seconds": round(time.time() - t0, 1)}), flush=True)


def responses(url, key):
    """The same through the Responses API (use_responses_api=True): a forced call, its result
    sent back as a function_call_output item, and a structured output."""
    llm = chat(url, key, use_responses_api=True)
    forced = llm.bind_tools(TOOLS, tool_choice="required").invoke(WEATHER)
    assert forced.tool_calls and not forced.invalid_tool_calls, forced
    for tc in forced.tool_calls:
        valid_call(tc)
        count("tool_calls")
    history = [HumanMessage(WEATHER), forced] + [
        get_weather.invoke(tc) if tc["name"] == "get_weather" else
        ToolMessage(tool_call_id=tc["id"], content=str(tc["args"]["a"] + tc["args"]["b"]))
        for tc in forced.tool_calls]
    m = chat(url, key, use_responses_api=True, max_tokens=60).bind_tools(TOOLS).invoke(history)
    assert isinstance(m, AIMessage) and not m.invalid_tool_calls, m
    assert m.tool_calls or m.text, m
    count("round_trips")
    valid_person(llm.with_structured_output(Person, method="json_schema").invoke(ASK))
    print(json.dumps({"responses": "ok"}), flush=True)


if __name__ == "__main__":
    url, key = sys.argv[1], sys.argv[2]
    seconds = {}
    for check in (tools, stream, structured, responses):
        t0 = time.time()
        check(url, key)
        seconds[check.__name__] = round(time.time() - t0, 1)
    print(json.dumps({"langchain": "ok", **COUNTS, "seconds": seconds}))
