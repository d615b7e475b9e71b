"""Checks `mollm serve` through the real `openai` Python client (and plain HTTP where the
client cannot say what is sent). Run by cli/tests/serve.rs against a server it started:

    openai_client.py api URL KEY          the endpoints, fields and errors
    openai_client.py invariance URL KEY   16 greedy prompts at once; prints their answers (JSON)
    openai_client.py load URL KEY PID SECS  64 streaming clients, then disconnects and /metrics
    openai_client.py limits URL           429 with Retry-After, 413 (a server with --parallel 1 --queue 1)
    openai_client.py tools URL KEY         tool calls: auto, required, named, none, streamed deltas,
                                          a round trip with a tool result (a model with a tool template)
    openai_client.py responses URL KEY     the Responses API: text, streamed events, function calls and
                                          their outputs, text.format json_schema, previous_response_id
    openai_client.py llama URL KEY         llama-server's /props, /apply-template, /infill, and CORS
                                          (a server with --cors http://localhost:3000)
    openai_client.py structured URL KEY N  json_schema / json_object / Lark grammar outputs: N sampled
                                          generations at temperature 1, every one parses and validates
    openai_client.py embeddings URL KEY M  /v1/embeddings of model M's golden inputs (fixtures/golden/
                                          embed.json): base64 and float, token-id inputs, concurrent
                                          requests, errors

Every check raises on failure; the exit status says it all.
"""

import asyncio
import json
import re
import sys
import threading
import time
import urllib.error
import urllib.request

import openai


def client(url, key, **kw):
    return openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=120, **kw)


def raw(url, path, body=None, key=None, method=None):
    """(status, headers, parsed JSON or text) of one plain HTTP request."""
    data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    req = urllib.request.Request(url + path, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    if key:
        req.add_header("Authorization", "Bearer " + key)
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            status, headers, text = r.status, dict(r.headers), r.read().decode()
    except urllib.error.HTTPError as e:
        status, headers, text = e.code, dict(e.headers), e.read().decode()
    try:
        return status, headers, json.loads(text)
    except ValueError:
        return status, headers, text


def check_error(body, param=None, code=None, kind=None):
    """One OpenAI error body: {"error": {"message", "type", "param", "code"}}."""
    e = body["error"]
    assert set(e) == {"message", "type", "param", "code"}, e
    assert isinstance(e["message"], str) and e["message"], e
    if param is not None:
        assert e["param"] == param, e
    if code is not None:
        assert e["code"] == code, e
    if kind is not None:
        assert e["type"] == kind, e


def metrics(url, key):
    _, _, text = raw(url, "/metrics", key=key)
    out = {}
    for line in text.splitlines():
        m = re.match(r"^([a-z_:]+)(\{[^}]*\})? (\S+)$", line)
        if m:
            out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return out


CHAT = [{"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Name three colours of the rainbow."}]


def api(url, key):
    c = client(url, key)
    models = c.models.list().data
    assert len(models) == 1 and models[0].object == "model", models
    model = models[0].id

    # Chat, whole and streamed: the same greedy text, one id per stream, role first.
    r = c.chat.completions.create(model=model, messages=CHAT, max_tokens=24, temperature=0)
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-"), r
    ch = r.choices[0]
    assert ch.message.role == "assistant" and ch.message.content, r
    assert ch.finish_reason in ("stop", "length"), r
    u = r.usage
    assert u.prompt_tokens > 0 and 0 < u.completion_tokens <= 24, u
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens, u
    assert u.prompt_tokens_details.cached_tokens == 0, u

    chunks = list(c.chat.completions.create(model=model, messages=CHAT, max_tokens=24,
                                            temperature=0, stream=True))
    assert len({k.id for k in chunks}) == 1, "one id per stream"
    assert len({k.created for k in chunks}) == 1
    assert all(k.object == "chat.completion.chunk" for k in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(k.choices[0].delta.role is None for k in chunks[1:])
    fins = [k.choices[0].finish_reason for k in chunks if k.choices[0].finish_reason]
    assert fins == [ch.finish_reason], fins
    assert chunks[-1].choices[0].finish_reason, "the last chunk carries finish_reason"
    assert "".join(k.choices[0].delta.content or "" for k in chunks) == ch.message.content

    # Completions, whole and streamed with usage.
    r = c.completions.create(model=model, prompt="The capital of France is", max_tokens=12,
                             temperature=0)
    assert r.object == "text_completion" and r.choices[0].text, r
    text = r.choices[0].text
    chunks = list(c.completions.create(model=model, prompt="The capital of France is",
                                       max_tokens=12, temperature=0, stream=True,
                                       stream_options={"include_usage": True}))
    assert chunks[-1].choices == [] and chunks[-1].usage is not None, chunks[-1]
    assert all(k.usage is None for k in chunks[:-1])
    assert chunks[-1].usage.completion_tokens == r.usage.completion_tokens
    assert "".join(k.choices[0].text for k in chunks[:-1]) == text

    # Log-probabilities: one entry per token, the greedy choice ranked first.
    r = c.chat.completions.create(model=model, messages=CHAT, max_tokens=8, temperature=0,
                                  logprobs=True, top_logprobs=3)
    lp = r.choices[0].logprobs.content
    assert len(lp) == r.usage.completion_tokens, (len(lp), r.usage)
    for t in lp:
        assert len(t.top_logprobs) == 3 and t.logprob <= 0
        assert t.top_logprobs[0].token == t.token and t.top_logprobs[0].logprob == t.logprob
        assert t.top_logprobs[0].logprob >= t.top_logprobs[1].logprob >= t.top_logprobs[2].logprob
        assert bytes(t.bytes).decode("utf-8", "replace") == t.token or t.bytes
    r = c.completions.create(model=model, prompt="1, 2, 3,", max_tokens=4, temperature=0, logprobs=2)
    l = r.choices[0].logprobs
    assert len(l.tokens) == len(l.token_logprobs) == len(l.top_logprobs) == 4, l
    assert "".join(l.tokens) == r.choices[0].text, l
    assert l.text_offset[0] == 0 and all(len(d) == 2 for d in l.top_logprobs), l

    # Stop strings: the text ends just before the first one; streamed the same.
    long = c.completions.create(model=model, prompt="Once upon a time", max_tokens=40,
                                temperature=0).choices[0].text
    words = long.split(" ")
    stop = " " + words[len(words) // 2]
    want = long[:long.index(stop)]
    r = c.completions.create(model=model, prompt="Once upon a time", max_tokens=40,
                             temperature=0, stop=[stop, "never-there"])
    assert r.choices[0].text == want and r.choices[0].finish_reason == "stop", (r, stop)
    streamed = "".join(k.choices[0].text for k in c.completions.create(
        model=model, prompt="Once upon a time", max_tokens=40, temperature=0, stop=stop,
        stream=True))
    assert streamed == want, (streamed, want)

    # Seeds: the same seed, the same text; other seeds differ.
    def sample(seed):
        return c.chat.completions.create(model=model, messages=CHAT, max_tokens=24,
                                         temperature=1.0, seed=seed).choices[0].message.content
    a = sample(42)
    assert sample(42) == a, "same seed, other text"
    assert any(sample(s) != a for s in (43, 44, 45)), "seeds do not change the draw"

    # Several choices: each its own sequence (seeds seed, seed + 1, ...), streamed with their
    # index; the usage counts the prompt once.
    r = c.chat.completions.create(model=model, messages=CHAT, max_tokens=12, temperature=1.0,
                                  seed=7, n=3)
    assert [x.index for x in r.choices] == [0, 1, 2], r
    total = 0
    for x in r.choices:
        one = c.chat.completions.create(model=model, messages=CHAT, max_tokens=12,
                                        temperature=1.0, seed=7 + x.index)
        assert x.message.content == one.choices[0].message.content, (x, one)
        total += one.usage.completion_tokens
    assert r.usage.completion_tokens == total and r.usage.prompt_tokens == one.usage.prompt_tokens, r.usage
    texts, fins = {}, {}
    for k in c.chat.completions.create(model=model, messages=CHAT, max_tokens=12, temperature=1.0,
                                       seed=7, n=3, stream=True):
        ch = k.choices[0]
        texts[ch.index] = texts.get(ch.index, "") + (ch.delta.content or "")
        if ch.finish_reason:
            assert ch.index not in fins
            fins[ch.index] = ch.finish_reason
    assert sorted(fins) == [0, 1, 2], fins
    assert [texts[i] for i in range(3)] == [x.message.content for x in r.choices], texts

    # Refused: fields not implemented (400 naming them), bad values, overflow, no key.
    for kw, param in [({"tool_choice": "required"}, "tool_choice"),
                      ({"logit_bias": {"999999999": 10}}, "logit_bias.999999999"),
                      ({"logit_bias": {"5": 500}}, "logit_bias.5"),
                      ({"extra_body": {"typical_p": 0.5}}, "typical_p"),
                      ({"extra_body": {"n_predict": 0}}, "n_predict"),
                      ({"n": 17}, "n"),
                      ({"temperature": 101}, "temperature"),
                      ({"top_p": 0}, "top_p"),
                      ({"top_logprobs": 3}, "top_logprobs"),
                      ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
                      ({"stop": "x" * 2000}, "stop"),
                      ({"max_tokens": 10 ** 6}, "max_tokens")]:
        try:
            c.chat.completions.create(model=model, messages=CHAT, **kw)
        except openai.BadRequestError as e:
            check_error(e.response.json(), param=param)
            assert e.body["param"] == param if isinstance(e.body, dict) and "param" in e.body else True
        else:
            raise AssertionError(f"{kw} was accepted")
    # What real clients send: unknown fields are ignored and listed in a header; llama-server's
    # names are aliases; a logit bias moves the pick; a last assistant message is continued.
    status, headers, body = raw(url, "/v1/chat/completions", {
        "model": model, "messages": CHAT, "max_tokens": 4, "frobnicate": 1,
        "metadata": {"app": "test"}, "cache_prompt": True, "reasoning_effort": "low",
        "chat_template_kwargs": {"enable_thinking": False}}, key=key)
    assert status == 200, body
    assert {k.lower(): v for k, v in headers.items()}.get("x-mollm-ignored-fields") == "frobnicate", headers
    r = c.completions.create(model=model, prompt="Once upon a time", temperature=0,
                             extra_body={"n_predict": 3, "repetition_penalty": 1.1})
    assert r.usage.completion_tokens == 3, r.usage
    # The runner-up of the first greedy pick, biased by +100, becomes the pick.
    plain = c.completions.create(model=model, prompt="Once upon a time", max_tokens=1, temperature=0,
                                 logprobs=2)
    top = plain.choices[0].logprobs.top_logprobs[0]
    runner_up = [t for t in top if t != plain.choices[0].text][0]
    status, _, tok = raw(url, "/tokenize", {"content": runner_up, "add_special": False}, key=key)
    assert status == 200, tok
    if len(tok["tokens"]) == 1:
        biased = c.completions.create(model=model, prompt="Once upon a time", max_tokens=1,
                                      temperature=0, logit_bias={str(tok["tokens"][0]): 100})
        assert biased.choices[0].text == runner_up, (biased.choices[0].text, runner_up)
    pre = CHAT + [{"role": "assistant", "content": "Red, orange"}]
    r = c.chat.completions.create(model=model, messages=pre, max_tokens=8, temperature=0)
    whole = c.chat.completions.create(model=model, messages=CHAT, max_tokens=16, temperature=0)
    assert r.choices[0].message.content, r
    if whole.choices[0].message.content.startswith("Red, orange"):
        assert whole.choices[0].message.content[len("Red, orange"):].startswith(r.choices[0].message.content[:4]), (r, whole)

    try:
        c.completions.create(model=model, prompt="hello " * 20000, max_tokens=4)
    except openai.BadRequestError as e:
        check_error(e.response.json(), param="prompt", code="context_length_exceeded")
    else:
        raise AssertionError("a prompt longer than the context was accepted")
    try:
        client(url, "wrong-key").models.list()
    except openai.AuthenticationError as e:
        check_error(e.response.json(), kind="authentication_error")
    else:
        raise AssertionError("a wrong API key was accepted")
    status, _, body = raw(url, "/v1/models")
    assert status == 401, status
    status, _, body = raw(url, "/health")
    assert status == 200, (status, body)
    status, _, body = raw(url, "/v1/nothing", key=key)
    assert status == 404, status
    check_error(body)
    status, _, body = raw(url, "/v1/chat/completions", body=b"{not json", key=key)
    assert status == 400, status
    check_error(body)

    # tokenize / detokenize round trip.
    status, _, t = raw(url, "/tokenize", {"content": "Hello world"}, key=key)
    assert status == 200 and t["tokens"], t
    status, _, d = raw(url, "/detokenize", {"tokens": t["tokens"]}, key=key)
    assert status == 200 and d["content"] == "Hello world", d

    # A chat's next turn reuses its first turn's cached prompt: the whole prompt chunks
    # (--batch 512, the default) from its start.
    conv = [{"role": "user", "content": "Write a long story about a dragon. " * 80}]
    r1 = c.chat.completions.create(model=model, messages=conv, max_tokens=8, temperature=0)
    conv += [{"role": "assistant", "content": r1.choices[0].message.content},
             {"role": "user", "content": "And then?"}]
    r2 = c.chat.completions.create(model=model, messages=conv, max_tokens=8, temperature=0)
    cached = r2.usage.prompt_tokens_details.cached_tokens
    assert cached >= 512 and cached % 512 == 0, r2.usage
    m = metrics(url, key)
    assert m["mollm:prompt_tokens_cached_total"] >= cached, m
    print("api: ok")


INV_PROMPTS = [
    "The capital of France is", "def fibonacci(n):", "Once upon a time in a small village,",
    "The three laws of thermodynamics are", "import numpy as np\n", "A haiku about the sea:",
    "Q: What is 12 times 12?\nA:", "The best way to learn a language is",
]
INV_CHATS = [
    "What is a B-tree?", "Give me a recipe for pancakes.", "Why is the sky blue?",
    "Translate 'good morning' into Spanish.", "List three prime numbers.",
    "What does HTTP stand for?", "Explain recursion in one sentence.", "Who wrote Hamlet?",
]


def invariance(url, key):
    """16 greedy requests at once (completions and chats); prints each answer as JSON lines."""
    ac = openai.AsyncOpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=300)

    async def one(kind, p):
        if kind == "completion":
            r = await ac.completions.create(model="m", prompt=p, max_tokens=24, temperature=0)
            return r.choices[0].text, r.usage.completion_tokens
        r = await ac.chat.completions.create(model="m", messages=[{"role": "user", "content": p}],
                                             max_tokens=24, temperature=0)
        return r.choices[0].message.content, r.usage.completion_tokens

    async def main():
        jobs = [("completion", p) for p in INV_PROMPTS] + [("chat", p) for p in INV_CHATS]
        res = await asyncio.gather(*(one(k, p) for k, p in jobs))
        for (k, p), (text, n) in zip(jobs, res):
            print(json.dumps({"kind": k, "prompt": p, "text": text, "completion_tokens": n}))

    asyncio.run(main())


PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "colour": {"enum": ["red", "green", "blue"]},
        "address": {"type": "object",
                    "properties": {"city": {"type": "string", "maxLength": 20},
                                   "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                    "required": ["city", "zip"], "additionalProperties": False},
        "hobbies": {"type": "array", "items": {"type": "string", "maxLength": 16}, "maxItems": 3},
    },
    "required": ["name", "age", "colour", "address", "hobbies"],
    "additionalProperties": False,
}


def valid_person(p):
    assert set(p) == {"name", "age", "colour", "address", "hobbies"}, p
    assert isinstance(p["name"], str) and len(p["name"]) <= 20, p
    assert isinstance(p["age"], int) and not isinstance(p["age"], bool) and 0 <= p["age"] <= 120, p
    assert p["colour"] in ("red", "green", "blue"), p
    a = p["address"]
    assert set(a) == {"city", "zip"} and len(a["city"]) <= 20, p
    assert re.fullmatch(r"[0-9]{5}", a["zip"]), p
    assert isinstance(p["hobbies"], list) and len(p["hobbies"]) <= 3, p
    assert all(isinstance(h, str) and len(h) <= 16 for h in p["hobbies"]), p


def structured(url, key, n):
    """Constrained decoding through the client: json_schema (strict, enums, nested objects and
    arrays), chat.completions.parse with a Pydantic model, json_object, a Lark grammar, and
    the 400s of bad schemas; `n` sampled generations at temperature 1 all parse and validate."""
    import concurrent.futures
    import pydantic
    c = client(url, key)
    model = c.models.list().data[0].id
    ask = [{"role": "user", "content": "Invent a person. Answer in JSON."}]
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "strict": True, "schema": PERSON}}

    def one(seed):
        r = c.chat.completions.create(model=model, messages=ask, response_format=fmt, n=8,
                                      temperature=1.0, seed=seed, max_tokens=300)
        out = []
        for ch in r.choices:
            assert ch.finish_reason == "stop", (ch.finish_reason, ch.message.content)
            p = json.loads(ch.message.content)
            valid_person(p)
            out.append(p)
        return out
    t0 = time.time()
    with concurrent.futures.ThreadPoolExecutor(4) as ex:
        people = [p for ps in ex.map(one, range(0, n, 8)) for p in ps]
    assert len(people) >= n, len(people)
    assert len({json.dumps(p, sort_keys=True) for p in people}) > n // 2, "the draws do not vary"
    print(json.dumps({"structured": len(people), "seconds": round(time.time() - t0, 1)}))

    # Streamed: the pieces put together are the same schema-valid JSON.
    text = "".join(k.choices[0].delta.content or "" for k in c.chat.completions.create(
        model=model, messages=ask, response_format=fmt, temperature=1.0, seed=5,
        max_tokens=300, stream=True))
    valid_person(json.loads(text))

    class Pet(pydantic.BaseModel):
        kind: str
        legs: int

    class Owner(pydantic.BaseModel):
        name: str
        pets: list[Pet]
    r = c.chat.completions.parse(model=model, messages=[{"role": "user", "content": "An owner and pets."}],
                                 response_format=Owner, temperature=0.7, seed=1, max_tokens=300)
    owner = r.choices[0].message.parsed
    assert isinstance(owner, Owner), r

    # Any object: free-form, so a draw may run out of tokens; what ends, parses.
    r = c.chat.completions.create(model=model, messages=ask, response_format={"type": "json_object"},
                                  temperature=0.7, seed=2, max_tokens=300, n=4)
    ended = [ch for ch in r.choices if ch.finish_reason == "stop"]
    assert ended, r
    for ch in ended:
        assert isinstance(json.loads(ch.message.content), dict), ch

    # llama.cpp's GBNF, the same language.
    for seed in range(4):
        r = c.completions.create(model=model, prompt="Is the sky blue? Answer:", max_tokens=8,
                                 temperature=1.0, seed=seed,
                                 extra_body={"grammar": 'root ::= " yes" | " no" | " " [0-9]{2}'})
        t = r.choices[0].text
        assert t in (" yes", " no") or re.fullmatch(r" [0-9]{2}", t), t
    for seed in range(4):
        r = c.completions.create(model=model, prompt="Is the sky blue? Answer:", max_tokens=8,
                                 temperature=1.0, seed=seed,
                                 extra_body={"grammar": 'start: " yes" | " no" | " " /[0-9]{2}/'})
        t = r.choices[0].text
        assert t in (" yes", " no") or re.fullmatch(r" [0-9]{2}", t), t

    for kw, param in [({"response_format": {"type": "json_schema",
                                            "json_schema": {"name": "x", "schema": {"type": "frob"}}}},
                       "response_format.json_schema.schema"),
                      ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
                       "response_format.json_schema.schema"),
                      ({"response_format": {"type": "xml"}}, "response_format.type"),
                      ({"extra_body": {"grammar": "answer ::= \"a\""}}, "grammar"),
                      ({"extra_body": {"grammar": "start: nothing_here"}}, "grammar")]:
        try:
            c.chat.completions.create(model=model, messages=ask, max_tokens=8, **kw)
        except openai.BadRequestError as e:
            check_error(e.response.json(), param=param)
        else:
            raise AssertionError(f"{kw} was accepted")


TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "The current weather in a city",
        "parameters": {"type": "object",
                       "properties": {"city": {"type": "string", "maxLength": 40},
                                      "unit": {"enum": ["celsius", "fahrenheit"]}},
                       "required": ["city", "unit"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "add", "description": "Add two numbers",
        "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                       "required": ["a", "b"], "additionalProperties": False}}},
]


def valid_call(tc, names=("get_weather", "add")):
    assert tc.type == "function" and tc.id.startswith("call_"), tc
    assert tc.function.name in names, tc
    args = json.loads(tc.function.arguments)
    if tc.function.name == "get_weather":
        assert set(args) == {"city", "unit"} and isinstance(args["city"], str), args
        assert args["unit"] in ("celsius", "fahrenheit"), args
    else:
        assert set(args) == {"a", "b"}, args
        assert all(isinstance(args[k], (int, float)) and not isinstance(args[k], bool) for k in "ab"), args
    return args


def tools(url, key):
    """Tool calls through the client, on a model whose template has a tool section."""
    c = client(url, key)
    model = c.models.list().data[0].id
    ask = [{"role": "user", "content": "What is the weather in Paris, in celsius?"}]

    # Required: always a call that validates, also sampled at temperature 1.
    for seed in range(12):
        r = c.chat.completions.create(model=model, messages=ask, tools=TOOLS, tool_choice="required",
                                      temperature=1.0, seed=seed, max_tokens=120)
        ch = r.choices[0]
        assert ch.finish_reason == "tool_calls" and ch.message.tool_calls, ch
        for tc in ch.message.tool_calls:
            valid_call(tc)
    # Named: that function.
    r = c.chat.completions.create(model=model, messages=ask, tools=TOOLS, temperature=0, max_tokens=120,
                                  tool_choice={"type": "function", "function": {"name": "add"}})
    assert [tc.function.name for tc in r.choices[0].message.tool_calls] == ["add"], r
    valid_call(r.choices[0].message.tool_calls[0], ("add",))

    # Streamed: the deltas put together are the whole answer's calls.
    whole = c.chat.completions.create(model=model, messages=ask, tools=TOOLS, tool_choice="required",
                                      temperature=0, max_tokens=120).choices[0].message.tool_calls
    calls, fin = {}, None
    for k in c.chat.completions.create(model=model, messages=ask, tools=TOOLS, tool_choice="required",
                                       temperature=0, max_tokens=120, stream=True):
        ch = k.choices[0]
        for d in ch.delta.tool_calls or []:
            e = calls.setdefault(d.index, {"id": None, "name": "", "arguments": "", "parts": 0})
            e["id"] = d.id or e["id"]
            e["name"] += (d.function.name or "") if d.function else ""
            part = (d.function.arguments or "") if d.function else ""
            e["arguments"] += part
            e["parts"] += 1 if part else 0
        fin = ch.finish_reason or fin
    assert fin == "tool_calls", fin
    assert [(e["name"], e["arguments"]) for _, e in sorted(calls.items())] == \
        [(tc.function.name, tc.function.arguments) for tc in whole], (calls, whole)
    # The arguments stream as they are written, not in one piece at the end.
    assert all(e["parts"] >= 2 for e in calls.values()), calls

    # Auto: a call if the model writes one (tags or not), else text.
    r = c.chat.completions.create(model=model, messages=ask, tools=TOOLS, temperature=0, max_tokens=120)
    ch = r.choices[0]
    if ch.message.tool_calls:
        assert ch.finish_reason == "tool_calls", ch
        for tc in ch.message.tool_calls:
            assert tc.function.name in ("get_weather", "add"), tc
            json.loads(tc.function.arguments)
    # None: never a call.
    r = c.chat.completions.create(model=model, messages=ask, tools=TOOLS, tool_choice="none",
                                  temperature=0, max_tokens=40)
    assert not r.choices[0].message.tool_calls and r.choices[0].finish_reason in ("stop", "length"), r

    # A round trip: the call, its result as a tool message, and the model goes on.
    call = whole[0]
    follow = ask + [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                    {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature": 21})}]
    r = c.chat.completions.create(model=model, messages=follow, tools=TOOLS, temperature=0, max_tokens=40)
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls"), r

    # Refused, naming the field.
    for kw, param in [({"tool_choice": {"type": "function", "function": {"name": "nope"}}},
                       "tool_choice.function.name"),
                      ({"tools": [{"type": "function", "function": {"name": "bad name"}}]},
                       "tools[0].function.name"),
                      ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "frob"}}}]},
                       "tools[0].function.parameters")]:
        try:
            c.chat.completions.create(model=model, messages=ask, max_tokens=8, **{"tools": TOOLS, **kw})
        except openai.BadRequestError as e:
            check_error(e.response.json(), param=param)
        else:
            raise AssertionError(f"{kw} was accepted")
    bad = ask + [{"role": "tool", "content": "x"}]
    try:
        c.chat.completions.create(model=model, messages=bad, max_tokens=8)
    except openai.BadRequestError as e:
        check_error(e.response.json(), param="messages[1].tool_call_id")
    else:
        raise AssertionError("a tool message without its call id was accepted")
    print(json.dumps({"tools": "ok"}))


def responses(url, key):
    """The Responses API through the client (stateless)."""
    c = client(url, key)
    model = c.models.list().data[0].id
    r = c.responses.create(model=model, input="Name three colours of the rainbow.",
                           instructions="You are terse.", max_output_tokens=32, temperature=0)
    assert r.status in ("completed", "incomplete") and r.id.startswith("resp_"), r
    assert r.output[0].type == "message" and r.output_text, r
    assert r.usage.input_tokens > 0 and 0 < r.usage.output_tokens <= 32, r.usage

    # Streamed: the events up to response.completed, the deltas making the same text.
    kinds, text, final = [], "", None
    for e in c.responses.create(model=model, input="Name three colours of the rainbow.",
                                instructions="You are terse.", max_output_tokens=32, temperature=0,
                                stream=True):
        kinds.append(e.type)
        if e.type == "response.output_text.delta":
            text += e.delta
        if e.type in ("response.completed", "response.incomplete"):
            final = e.response
    assert kinds[:2] == ["response.created", "response.in_progress"], kinds
    assert kinds[-1] in ("response.completed", "response.incomplete"), kinds
    assert "response.output_item.added" in kinds and "response.output_text.done" in kinds, kinds
    assert text == r.output_text == final.output_text, (text, r.output_text)

    # Function calls, required: a call item; its output sent back as an input item.
    tools = [{"type": "function", "name": t["function"]["name"], "description": t["function"]["description"],
              "parameters": t["function"]["parameters"]} for t in TOOLS]
    ask = [{"role": "user", "content": "What is the weather in Paris, in celsius?"}]
    r = c.responses.create(model=model, input=ask, tools=tools, tool_choice="required", temperature=0,
                           max_output_tokens=120)
    calls = [o for o in r.output if o.type == "function_call"]
    assert calls, r
    args = json.loads(calls[0].arguments)
    assert calls[0].name in ("get_weather", "add") and isinstance(args, dict), calls
    follow = ask + [{"type": "function_call", "call_id": calls[0].call_id, "name": calls[0].name,
                     "arguments": calls[0].arguments},
                    {"type": "function_call_output", "call_id": calls[0].call_id, "output": "21 degrees"}]
    r2 = c.responses.create(model=model, input=follow, tools=tools, temperature=0, max_output_tokens=40)
    assert r2.output, r2
    # Streamed call: its arguments in the done event equal the whole answer's.
    done = [e for e in c.responses.create(model=model, input=ask, tools=tools, tool_choice="required",
                                          temperature=0, max_output_tokens=120, stream=True)
            if e.type == "response.function_call_arguments.done"]
    assert done and done[0].arguments == calls[0].arguments, (done, calls)

    # Structured output through text.format.
    r = c.responses.create(model=model, input="Invent a person. Answer in JSON.", temperature=1.0,
                           max_output_tokens=300,
                           text={"format": {"type": "json_schema", "name": "person", "schema": PERSON,
                                            "strict": True}})
    valid_person(json.loads(r.output_text))

    try:
        c.responses.create(model=model, input="hi", previous_response_id="resp_123")
    except openai.BadRequestError as e:
        check_error(e.response.json(), param="previous_response_id")
    else:
        raise AssertionError("previous_response_id was accepted")
    print(json.dumps({"responses": "ok"}))


def llama_routes(url, key):
    """llama-server's routes for editors and front-ends, and CORS."""
    status, _, p = raw(url, "/props", key=key, method="GET")
    assert status == 200 and p["total_slots"] >= 1 and p["chat_template"] and p["infill"] is True, p
    status, _, t = raw(url, "/apply-template", {"messages": [{"role": "user", "content": "hi there"}]}, key=key)
    assert status == 200 and "hi there" in t["prompt"] and t["prompt"] != "hi there", t
    status, _, r = raw(url, "/infill", {"input_prefix": "def add(a, b):\n    ",
                                        "input_suffix": "\n\nprint(add(1, 2))\n", "n_predict": 12,
                                        "temperature": 0}, key=key)
    assert status == 200 and r["content"] and r["stop"] is True, r
    assert r["tokens_predicted"] <= 12 and r["tokens_evaluated"] > 5, r
    # Streamed infill: the pieces make the same text.
    req = urllib.request.Request(url + "/infill", data=json.dumps(
        {"input_prefix": "def add(a, b):\n    ", "input_suffix": "\n\nprint(add(1, 2))\n",
         "n_predict": 12, "temperature": 0, "stream": True}).encode(), method="POST")
    req.add_header("Authorization", "Bearer " + key)
    text, last = "", None
    with urllib.request.urlopen(req, timeout=120) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith("data: "):
                d = json.loads(line[6:])
                text += d["content"]
                last = d
    assert last["stop"] is True and text == r["content"], (text, r)
    # CORS: a preflight without the key is answered; answers carry the origin.
    status, h, _ = raw(url, "/v1/chat/completions", method="OPTIONS")
    h = {k.lower(): v for k, v in h.items()}
    assert status == 204 and h.get("access-control-allow-origin") == "http://localhost:3000", (status, h)
    _, h, _ = raw(url, "/v1/models", key=key)
    assert {k.lower(): v for k, v in h.items()}.get("access-control-allow-origin") == "http://localhost:3000", h
    print(json.dumps({"llama": "ok"}))


def rss(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def load(url, key, pid, secs):
    """64 streaming clients for `secs` (two halves: memory must not grow between them), then
    clients that drop mid-stream; /metrics must count what the clients saw."""
    stats = {"requests": 0, "completion_tokens": 0, "prompt_tokens": 0}

    async def stream_one(ac, i, n):
        s = await ac.chat.completions.create(
            model="m", max_tokens=8 + (i * 7 + n * 3) % 40, temperature=0.7, seed=i * 1000 + n,
            messages=[{"role": "user", "content": f"Client {i} request {n}: tell me about the number {i * n}."}],
            stream=True, stream_options={"include_usage": True})
        ids, role, finish, usage = set(), None, [], None
        async for k in s:
            ids.add(k.id)
            if not k.choices:
                assert usage is None, "one usage chunk"
                usage = k.usage
                continue
            assert usage is None, "usage comes last"
            d = k.choices[0]
            if d.delta.role:
                assert role is None, "the role comes once"
                role = d.delta.role
            if d.finish_reason:
                finish.append(d.finish_reason)
        assert len(ids) == 1, ids
        assert role == "assistant" and len(finish) == 1 and finish[0] in ("stop", "length"), (role, finish)
        assert usage is not None and usage.completion_tokens >= 1, usage
        stats["requests"] += 1
        stats["completion_tokens"] += usage.completion_tokens
        stats["prompt_tokens"] += usage.prompt_tokens

    async def clients(ac, until):
        async def worker(i):
            n = 0
            while time.monotonic() < until:
                await stream_one(ac, i, n)
                n += 1
        await asyncio.gather(*(worker(i) for i in range(64)))

    async def drop_one(ac, i):
        s = await ac.chat.completions.create(
            model="m", max_tokens=400, temperature=0.7, seed=i, stream=True,
            messages=[{"role": "user", "content": f"Write a very long essay number {i}."}])
        got = 0
        async for _ in s:
            got += 1
            if got == 4:
                break
        await s.close()

    async def main():
        ac = openai.AsyncOpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=300)
        m0 = metrics(url, key)
        await clients(ac, time.monotonic() + secs / 2)
        rss1 = rss(pid)
        await clients(ac, time.monotonic() + secs / 2)
        rss2 = rss(pid)
        m1 = metrics(url, key)
        # The gauges follow the engine's next step, which may come just after a client read
        # its last chunk: give them a moment.
        settle = time.monotonic() + 10
        while (m1["mollm:num_requests_running"] or m1["mollm:num_requests_waiting"]) \
                and time.monotonic() < settle:
            time.sleep(0.05)
            m1 = metrics(url, key)
        route = 'mollm:requests_total{route="/v1/chat/completions",status="200"}'
        d = lambda k: m1.get(k, 0) - m0.get(k, 0)
        assert d(route) == stats["requests"], (d(route), stats)
        assert d("mollm:generation_tokens_total") == stats["completion_tokens"], (d("mollm:generation_tokens_total"), stats)
        assert d("mollm:prompt_tokens_total") == stats["prompt_tokens"], (d("mollm:prompt_tokens_total"), stats)
        assert d("mollm:time_to_first_token_seconds_count") == stats["requests"], stats
        assert m1["mollm:num_requests_running"] == 0 and m1["mollm:num_requests_waiting"] == 0, m1
        assert rss2 <= rss1 + 64 * 2**20, f"server memory grew from {rss1} to {rss2} bytes"

        # Clients that drop mid-stream: their sequences end and their KV pages come back.
        t = time.monotonic()
        await asyncio.gather(*(drop_one(ac, i) for i in range(16)))
        t_drop = time.monotonic()
        freed, m2 = None, None
        while time.monotonic() < t_drop + 30:
            m2 = metrics(url, key)
            if m2["mollm:num_requests_running"] == 0 and m2["mollm:kv_cache_pages_used"] == 0:
                freed = time.monotonic()
                break
            await asyncio.sleep(0.05)
        assert freed is not None, m2
        gen = m2["mollm:generation_tokens_total"] - m1["mollm:generation_tokens_total"]
        assert gen < 16 * 400 / 2, f"dropped clients kept generating: {gen} tokens"
        assert freed - t_drop < 1.0, f"slots freed {freed - t_drop:.2f} s after the last drop"
        print(json.dumps({"load": "ok", **stats, "rss_mid": rss1, "rss_end": rss2,
                          "dropped_tokens": gen, "seconds_to_free": round(freed - t_drop, 3)}))

    asyncio.run(main())


def limits(url):
    """A server with --parallel 1 --queue 1 --max-body 4096 --strict: 429 with Retry-After, 413,
    unknown fields refused."""
    status, _, body = raw(url, "/v1/completions", {"prompt": "x", "max_tokens": 1, "frobnicate": 1})
    assert status == 400, (status, body)
    check_error(body, param="frobnicate")
    status, _, body = raw(url, "/v1/completions", b'{"prompt": "' + b"x" * 8192 + b'"}')
    assert status == 413, (status, body)
    check_error(body, code="payload_too_large")
    results = []

    def go(i):
        results.append(raw(url, "/v1/completions", {"prompt": f"Count to {i}:", "max_tokens": 48,
                                                   "temperature": 0}))
    threads = [threading.Thread(target=go, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    codes = sorted(s for s, _, _ in results)
    assert codes.count(200) >= 2 and 429 in codes and set(codes) <= {200, 429}, codes
    for s, h, b in results:
        if s == 429:
            assert h.get("Retry-After") or h.get("retry-after"), h
            check_error(b, code="rate_limit_exceeded")
    print("limits: ok", codes)


def cosine(a, b):
    dot = sum(x * y for x, y in zip(a, b))
    return dot / (sum(x * x for x in a) ** 0.5 * sum(y * y for y in b) ** 0.5)


def embeddings(url, key, model_key):
    """/v1/embeddings against llama.cpp's vectors for model_key's golden inputs."""
    import os
    path = os.path.join(os.path.dirname(__file__), "../../../fixtures/golden/embed.json")
    cases = [c for c in json.load(open(path))["cases"] if c["model"] == model_key]
    texts = [c["text"] for c in cases]
    c = client(url, key)
    # The client asks for base64 by default and decodes it.
    r = c.embeddings.create(model="m", input=texts)
    assert [d.index for d in r.data] == list(range(len(texts))), r.data
    n_tokens = sum(len(x["llama_token_ids"]) for x in cases)
    assert r.usage.prompt_tokens == n_tokens == r.usage.total_tokens, (r.usage, n_tokens)
    for case, d in zip(cases, r.data):
        cos = cosine(d.embedding, case["llama_embedding"])
        assert cos >= 0.9999, (case["input"], cos)
    floats = c.embeddings.create(model="m", input=texts, encoding_format="float")
    for a, b in zip(r.data, floats.data):
        assert max(abs(x - y) for x, y in zip(a.embedding, b.embedding)) < 1e-6
    # Token ids in, the same vector out; one string alone, the same as in the list.
    ids = c.embeddings.create(model="m", input=[cases[0]["llama_token_ids"]], encoding_format="float")
    one = c.embeddings.create(model="m", input=texts[0], encoding_format="float")
    assert ids.data[0].embedding == floats.data[0].embedding == one.data[0].embedding
    # Requests at once share steps and get what each gets alone.
    results = [None] * len(texts)

    def embed_one(i):
        results[i] = c.embeddings.create(model="m", input=texts[i], encoding_format="float").data[0].embedding

    threads = [threading.Thread(target=embed_one, args=(i,)) for i in range(len(texts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, v in enumerate(results):
        assert v == floats.data[i].embedding, ("concurrent differs", i)
    # Errors name the field.
    for body, param in [({"input": ""}, "input"), ({"input": []}, "input"), ({}, "input"),
                        ({"input": "x", "dimensions": 7}, "dimensions"),
                        ({"input": "x", "encoding_format": "int8"}, "encoding_format"),
                        ({"input": [[10 ** 9]]}, "input")]:
        status, _, b = raw(url, "/v1/embeddings", body, key=key)
        assert status == 400, (body, status, b)
        check_error(b, param=param)
    print(json.dumps({"embeddings": "ok", "model": model_key, "inputs": len(texts)}))


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "api":
        api(sys.argv[2], sys.argv[3])
    elif cmd == "invariance":
        invariance(sys.argv[2], sys.argv[3])
    elif cmd == "load":
        load(sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5]))
    elif cmd == "limits":
        limits(sys.argv[2])
    elif cmd == "tools":
        tools(sys.argv[2], sys.argv[3])
    elif cmd == "responses":
        responses(sys.argv[2], sys.argv[3])
    elif cmd == "llama":
        llama_routes(sys.argv[2], sys.argv[3])
    elif cmd == "embeddings":
        embeddings(sys.argv[2], sys.argv[3], sys.argv[4])
    elif cmd == "structured":
        structured(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        sys.exit(f"unknown command {cmd}")
