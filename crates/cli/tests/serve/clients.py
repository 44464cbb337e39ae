"""The official `ollama` and `openai` Python clients against a running `llamay serve`.

usage: clients.py BASE_URL GROUP      (GROUP: ollama | openai | tools)

The server serves the Gemma 3 270M file as `gemma3:270m` (built-in gemma template)
and, as `tools`, a copy whose template is tests/data/serve/llama3-tools.jinja.
Every check prints `ok NAME`; a failed assertion exits non-zero with its traceback.
"""

import json
import os
import sys

import httpx

BASE = sys.argv[1]
GROUP = sys.argv[2]
MODEL = "gemma3:270m"
GREEDY = {"temperature": 0, "seed": 7, "num_predict": 24}
# Raw HTTP checks beside the clients; LLAMAY_TEST_TIME_SCALE stretches the wait for a
# slow device (lavapipe decodes Gemma at ~2 tokens/s).
http = httpx.Client(timeout=30 * float(os.environ.get("LLAMAY_TEST_TIME_SCALE", "1")))


def ok(name):
    print("ok", name, flush=True)


def ollama_checks():
    import ollama

    c = ollama.Client(host=BASE)

    names = [m.model for m in c.list().models]
    assert MODEL in names and "tools" in names, names
    ok("list names the aliases exactly, tags included")

    info = c.show(MODEL)
    assert info.modelinfo["general.architecture"] == "gemma3", info.modelinfo
    assert info.details.format == "gguf" and info.details.quantization_level == "Q4_K_M", info.details
    assert info.template and "start_of_turn" in info.template
    assert info.capabilities == ["completion"], info.capabilities
    assert "tools" in c.show("tools").capabilities
    ok("show reports model_info, details, the template and the capabilities")
    # Thinking asked of a model without reasoning is a 400 as Ollama gives it, not ignored.
    for call in (lambda: c.chat(model=MODEL, messages=[{"role": "user", "content": "hi"}], think=True),
                 lambda: c.generate(model=MODEL, prompt="hi", think=True)):
        try:
            call()
            raise AssertionError("think on a model without reasoning was accepted")
        except ollama.ResponseError as e:
            assert e.status_code == 400 and "does not support thinking" in e.error, e.error
    ok("think on a model without reasoning is a 400")

    # A widely used integration sends the training context from /api/show on every
    # call: above --ctx-size it is clamped, as Ollama does, not refused.
    for _ in range(2):
        r = c.generate(model=MODEL, prompt="Hi", raw=True, options={**GREEDY, "num_ctx": 131072, "num_predict": 2})
        assert r.done, r
    ok("num_ctx above --ctx-size is clamped")

    whole = c.generate(model=MODEL, prompt="The capital of France is", raw=True, options=GREEDY)
    assert whole.done and whole.done_reason in ("stop", "length"), whole
    assert whole.eval_count >= 1 and whole.prompt_eval_count >= 1
    for d in (whole.total_duration, whole.prompt_eval_duration, whole.eval_duration, whole.load_duration):
        assert isinstance(d, int), d
    assert whole.context and len(whole.context) == whole.prompt_eval_count + whole.eval_count, (
        len(whole.context), whole.prompt_eval_count, whole.eval_count)
    pieces = list(c.generate(model=MODEL, prompt="The capital of France is", raw=True, options=GREEDY, stream=True))
    text = "".join(p.response for p in pieces)
    assert text == whole.response, (text, whole.response)
    assert pieces[-1].done and not any(p.done for p in pieces[:-1])
    # Token by token: every token but those that end inside a character has its own line.
    assert len(pieces) - 1 >= whole.eval_count - 2, (len(pieces), whole.eval_count)
    ok("generate: streamed pieces concatenate to the whole answer, token by token")

    templated = c.generate(model=MODEL, prompt="Name a colour.", options=GREEDY)
    assert templated.prompt_eval_count > whole.prompt_eval_count, "the chat template was not applied"
    ok("generate applies the chat template unless raw")

    msgs = [{"role": "user", "content": "Write one sentence about the sea."}]
    whole = c.chat(model=MODEL, messages=msgs, options=GREEDY)
    assert whole.message.role == "assistant" and whole.message.content
    streamed = "".join(p.message.content for p in c.chat(model=MODEL, messages=msgs, options=GREEDY, stream=True))
    assert streamed == whole.message.content, (streamed, whole.message.content)
    ok("chat: streamed equals whole")

    limited = c.generate(model=MODEL, prompt="Once upon a time", raw=True, options={"temperature": 0, "num_predict": 5})
    assert limited.eval_count == 5 and limited.done_reason == "length", limited
    stopped = c.generate(model=MODEL, prompt="1, 2, 3, 4,", raw=True,
                         options={"temperature": 0, "num_predict": 40, "stop": [" 7"]})
    assert " 7" not in stopped.response and stopped.done_reason == "stop", stopped.response
    ok("num_predict and stop")

    seeded = [c.generate(model=MODEL, prompt="A story:", raw=True,
                         options={"temperature": 1.0, "seed": 42, "num_predict": 16}).response for _ in range(2)]
    assert seeded[0] == seeded[1], seeded
    ok("a seed makes sampling repeatable")

    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 24},
                                               "age": {"type": "integer"}},
              "required": ["name", "age"]}
    r = c.generate(model=MODEL, prompt="A person, as JSON:", format=schema, options={"temperature": 0, "num_predict": 80})
    v = json.loads(r.response)
    assert isinstance(v["name"], str) and isinstance(v["age"], int), v
    few_shot = 'Input: a=1\nJSON: {"a": 1}\nInput: b=2\nJSON: {"b": 2}\nInput: c=3\nJSON: '
    r = c.generate(model=MODEL, prompt=few_shot, raw=True, format="json", options={"temperature": 0, "num_predict": 100})
    assert r.done_reason == "stop", r
    # Ollama's JSON mode is an object (its grammar's root is `object`), never a bare value.
    assert isinstance(json.loads(r.response), dict), r.response
    ok("structured output: a schema and format json (an object)")

    ps = c.ps()
    assert [m.model for m in ps.models] and ps.models[0].expires_at is not None, ps
    ok("ps lists the loaded model")

    c.copy(MODEL, "mine:copy")
    assert "mine:copy" in [m.model for m in c.list().models]
    r = c.generate(model="mine:copy", prompt="The capital of France is", raw=True, options=GREEDY)
    assert r.response == whole_generate_text(c), "the copy answers as its source"
    c.delete("mine:copy")
    assert "mine:copy" not in [m.model for m in c.list().models]
    try:
        c.generate(model="mine:copy", prompt="x")
        raise AssertionError("a deleted name still answers")
    except ollama.ResponseError as e:
        assert e.status_code == 404, e
    ok("copy, then delete")

    for bad in ("gemma3:999m", "nope"):
        try:
            c.chat(model=bad, messages=msgs)
            raise AssertionError(f"{bad} answered")
        except ollama.ResponseError as e:
            assert e.status_code == 404 and bad in str(e), e
    ok("unknown models are 404")

    e = c.embed(model=MODEL, input=["hello world", "goodbye"])
    assert len(e.embeddings) == 2 and len(e.embeddings[0]) == info.modelinfo["gemma3.embedding_length"]
    for v in e.embeddings:
        assert abs(sum(x * x for x in v) - 1) < 1e-4, "embed vectors are unit length"
    assert e.embeddings[0] != e.embeddings[1]
    one = c.embed(model=MODEL, input="hello world").embeddings[0]
    assert max(abs(a - b) for a, b in zip(one, e.embeddings[0])) < 1e-6, "batched inputs equal single ones"
    short = c.embed(model=MODEL, input="hello world", dimensions=64).embeddings[0]
    assert len(short) == 64 and abs(sum(x * x for x in short) - 1) < 1e-4
    legacy = c.embeddings(model=MODEL, prompt="hello world").embedding
    n = sum(x * x for x in legacy) ** 0.5
    assert max(abs(a / n - b) for a, b in zip(legacy, one)) < 1e-5, "legacy = the unnormalised vector"
    ok("embed (normalised, batched, dimensions) and the legacy embeddings route")

    try:
        c.generate(model=MODEL, prompt="x", images=["aGVsbG8="])
        raise AssertionError("an image was accepted")
    except ollama.ResponseError as e:
        assert e.status_code == 400 and "image" in str(e), e
    ok("images are refused by name")

    v = http.get(BASE + "/api/version").json()
    assert v["version"], v
    ok("version")


def whole_generate_text(c):
    return c.generate(model=MODEL, prompt="The capital of France is", raw=True, options=GREEDY).response


def openai_checks():
    import openai

    c = openai.OpenAI(base_url=BASE + "/v1", api_key="unused")
    ids = [m.id for m in c.models.list()]
    assert MODEL in ids and "tools" in ids, ids
    ok("models")

    # The Responses API (stateless, as Ollama serves it): whole and streamed, the
    # documented events in order, the streamed text equal to the whole.
    whole = c.responses.create(model=MODEL, input="Write one sentence about the sea.", temperature=0, max_output_tokens=24)
    assert whole.object == "response" and whole.status in ("completed", "incomplete"), whole
    assert whole.output_text and whole.usage.output_tokens > 0 and whole.usage.input_tokens > 0, whole
    assert whole.output[0].type == "message" and whole.output[0].content[0].type == "output_text"
    events = list(c.responses.create(model=MODEL, input="Write one sentence about the sea.", temperature=0,
                                     max_output_tokens=24, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"], kinds
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed" if whole.status == "completed" else "response.incomplete"], kinds
    assert [e.sequence_number for e in events] == list(range(len(events)))
    streamed = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert streamed == whole.output_text == events[-1].response.output_text, (streamed, whole.output_text)
    cut = c.responses.create(model=MODEL, input="Count from one to a hundred.", temperature=0, max_output_tokens=4)
    assert cut.status == "incomplete" and cut.incomplete_details.reason == "max_output_tokens", cut
    schema = {"type": "object", "properties": {"colour": {"type": "string", "maxLength": 12}}, "required": ["colour"],
              "additionalProperties": False}
    r = c.responses.create(model=MODEL, instructions="Answer in JSON.",
                           input=[{"role": "user", "content": [{"type": "input_text", "text": "The sky's colour?"}]}],
                           temperature=0, max_output_tokens=60,
                           text={"format": {"type": "json_schema", "name": "c", "schema": schema, "strict": True}})
    assert set(json.loads(r.output_text)) == {"colour"}, r.output_text
    try:
        c.responses.create(model=MODEL, input="x", previous_response_id="resp_1")
        raise AssertionError("previous_response_id was accepted")
    except openai.BadRequestError as e:
        assert "previous_response_id" in e.body["message"], e.body
    ok("responses: text, streamed events in order, incomplete, text.format json_schema, previous_response_id refused")

    # An unknown route under /v1 answers in OpenAI's error shape (the client reads it).
    try:
        c.post("/no-such-route", cast_to=object, body={})
        raise AssertionError("an unknown route answered")
    except openai.NotFoundError as e:
        assert "no route /v1/no-such-route" in e.body["message"], e.body
    assert http.get(BASE + "/api/no-such-route").json() == {"error": "no route /api/no-such-route"}
    ok("unknown routes: OpenAI's error shape under /v1, Ollama's elsewhere")

    msgs = [{"role": "user", "content": "Write one sentence about the sea."}]
    args = dict(model=MODEL, messages=msgs, temperature=0, seed=7, max_tokens=24)
    whole = c.chat.completions.create(**args)
    ch = whole.choices[0]
    assert ch.message.role == "assistant" and ch.message.content and ch.finish_reason in ("stop", "length")
    chunks = list(c.chat.completions.create(**args, stream=True, stream_options={"include_usage": True}))
    text = "".join(k.choices[0].delta.content or "" for k in chunks if k.choices)
    assert text == ch.message.content, (text, ch.message.content)
    assert chunks[-1].usage is not None and not chunks[-1].choices
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    # prompt_tokens counts every prompt token, BOS included, also when the prefix came
    # from the cache (this third request reuses the first's).
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens
    assert whole.usage.prompt_tokens == count_tokens(msgs), (whole.usage.prompt_tokens, count_tokens(msgs))
    ok("chat completions: streamed equals whole; include_usage; prompt_tokens")

    r = c.chat.completions.create(**args, logprobs=True, top_logprobs=3)
    lp = r.choices[0].logprobs.content
    assert len(lp) == r.usage.completion_tokens
    for t in lp:
        assert t.logprob <= 0 and len(t.top_logprobs) == 3
        # Greedy: the chosen token is the likeliest.
        assert abs(t.top_logprobs[0].logprob - t.logprob) < 1e-5, t
    ok("logprobs and top_logprobs")

    schema = {"type": "object", "properties": {"colour": {"type": "string", "maxLength": 16}}, "required": ["colour"],
              "additionalProperties": False}
    r = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "A colour?"}], temperature=0,
                                  max_tokens=60,
                                  response_format={"type": "json_schema", "json_schema": {"name": "c", "schema": schema}})
    v = json.loads(r.choices[0].message.content)
    assert set(v) == {"colour"} and isinstance(v["colour"], str), v
    r = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": 'Return {"a": 1} as JSON.'}, {"role": "assistant", "content": '{"a": 1}'},
                                                                 {"role": "user", "content": 'Return {"ok": true} as JSON.'}], temperature=0,
                                  max_tokens=400, response_format={"type": "json_object"})
    assert r.choices[0].finish_reason == "stop", r
    assert isinstance(json.loads(r.choices[0].message.content), dict), r.choices[0].message.content
    ok("response_format json_schema and json_object (an object)")

    r = c.completions.create(model=MODEL, prompt="The capital of France is", temperature=0, max_tokens=12)
    assert r.choices[0].text and r.usage.completion_tokens == 12 and r.choices[0].finish_reason == "length"
    toks = http.post(BASE + "/api/generate", json={"model": MODEL, "prompt": "The capital of France is", "raw": True, "stream": False,
                                                     "options": {"num_predict": 1}}).json()["context"][:-1]
    r2 = c.completions.create(model=MODEL, prompt=toks, temperature=0, max_tokens=12)
    assert r2.choices[0].text == r.choices[0].text, (r2.choices[0].text, r.choices[0].text)
    assert r2.usage.prompt_tokens == len(toks) == r.usage.prompt_tokens
    streamed = "".join(k.choices[0].text for k in c.completions.create(
        model=MODEL, prompt="The capital of France is", temperature=0, max_tokens=12, stream=True))
    assert streamed == r.choices[0].text
    ok("completions: text and token-id prompts agree; streaming")

    # n choices: each its own seed, the prompt's prefill shared (later choices fork the
    # first's cache); at temperature 0 every choice is the single answer.
    greedy = c.chat.completions.create(model=MODEL, messages=msgs, temperature=0, max_tokens=12)
    many = c.chat.completions.create(model=MODEL, messages=msgs, temperature=0, max_tokens=12, n=3)
    assert [ch.index for ch in many.choices] == [0, 1, 2], many
    assert all(ch.message.content == greedy.choices[0].message.content for ch in many.choices), many
    assert many.usage.prompt_tokens == greedy.usage.prompt_tokens
    assert many.usage.completion_tokens == 3 * greedy.usage.completion_tokens, many.usage
    sampled = c.chat.completions.create(model=MODEL, messages=msgs, temperature=1.0, seed=5, max_tokens=12, n=3)
    alone = [c.chat.completions.create(model=MODEL, messages=msgs, temperature=1.0, seed=5 + i, max_tokens=12)
             for i in range(3)]
    assert [ch.message.content for ch in sampled.choices] == [a.choices[0].message.content for a in alone], sampled
    chunks = list(c.chat.completions.create(model=MODEL, messages=msgs, temperature=1.0, seed=5, max_tokens=12, n=3,
                                            stream=True))
    for i in range(3):
        text = "".join(k.choices[0].delta.content or "" for k in chunks if k.choices and k.choices[0].index == i)
        assert text == sampled.choices[i].message.content, (i, text)
    two = c.completions.create(model=MODEL, prompt="The capital of France is", temperature=1.0, seed=9, max_tokens=8, n=2)
    for i, ch in enumerate(two.choices):
        one = c.completions.create(model=MODEL, prompt="The capital of France is", temperature=1.0, seed=9 + i, max_tokens=8)
        assert ch.index == i and ch.text == one.choices[0].text, (i, ch.text, one.choices[0].text)
    ok("n choices: seeds seed..seed+n-1, each equal to its request alone, streamed and not (chat and completions)")
    try:
        c.completions.create(model=MODEL, prompt=[10**9], max_tokens=2)
        raise AssertionError("a token id outside the vocabulary was accepted")
    except openai.BadRequestError as e:
        assert "vocabulary" in str(e), e
    try:
        c.chat.completions.create(model="nope", messages=msgs)
        raise AssertionError("unknown model answered")
    except openai.NotFoundError:
        pass
    ok("errors: token ids outside the vocabulary, unknown model")

    import base64
    import struct
    f = c.embeddings.create(model=MODEL, input=["hello world", "goodbye"], encoding_format="float")
    assert [d.index for d in f.data] == [0, 1] and f.usage.prompt_tokens > 2
    raw = http.post(BASE + "/v1/embeddings", json={"model": MODEL, "input": "hello world",
                                                     "encoding_format": "base64"}).json()
    b = raw["data"][0]["embedding"]
    floats = struct.unpack(f"<{len(base64.b64decode(b)) // 4}f", base64.b64decode(b))
    assert max(abs(x - y) for x, y in zip(floats, f.data[0].embedding)) < 1e-6, "base64 decodes to the floats"
    # The client's default asks for base64 and decodes it itself.
    d = c.embeddings.create(model=MODEL, input="hello world")
    assert max(abs(x - y) for x, y in zip(d.data[0].embedding, f.data[0].embedding)) < 1e-6
    toks = http.post(BASE + "/api/generate", json={"model": MODEL, "prompt": "hello world", "raw": True, "stream": False,
                                                     "options": {"num_predict": 1}}).json()["context"][:-1]
    t = c.embeddings.create(model=MODEL, input=[toks], encoding_format="float")
    assert max(abs(x - y) for x, y in zip(t.data[0].embedding, f.data[0].embedding)) < 1e-6, "token ids = text"
    ok("embeddings: float, base64, token ids")


def count_tokens(msgs):
    """The prompt's token count, by the server's own rendering: /api/generate raw with
    the gemma template's text, BOS included."""
    text = "".join(f"<start_of_turn>{m['role']}\n{m['content']}<end_of_turn>\n" for m in msgs) + "<start_of_turn>model\n"
    r = http.post(BASE + "/api/generate", json={"model": MODEL, "prompt": text, "raw": True, "stream": False,
                                                 "options": {"num_predict": 1}}).json()
    return r["prompt_eval_count"]


WEATHER = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
CALL = {"type": "object", "properties": {"name": {"const": "get_weather"}, "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"]}},
    "required": ["name", "parameters"]}


def conversation():
    return [
        {"role": "user", "content": "What is the weather in Rome?"},
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Rome"}}}]},
        {"role": "tool", "content": "sunny"},
        {"role": "assistant", "content": "It is sunny in Rome."},
        {"role": "user", "content": "What is the weather in Paris?"},
    ]


def tools_checks():
    import ollama
    import openai

    c = ollama.Client(host=BASE)
    r = c.chat(model="tools", messages=conversation(), tools=WEATHER, format=CALL,
               options={"temperature": 0, "num_predict": 60})
    calls = r.message.tool_calls
    assert calls and calls[0].function.name == "get_weather", r.message
    assert isinstance(calls[0].function.arguments["city"], str), calls
    ok("ollama chat with tools: the call comes back parsed")

    o = openai.OpenAI(base_url=BASE + "/v1", api_key="unused")
    msgs = conversation()
    msgs[1] = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Rome\"}"}}]}
    msgs[2] = {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}
    r = o.chat.completions.create(model="tools", messages=msgs, tools=WEATHER, temperature=0, max_tokens=60,
                                  tool_choice="required")
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls", ch
    call = ch.message.tool_calls[0]
    assert call.type == "function" and call.function.name == "get_weather" and call.id
    assert isinstance(json.loads(call.function.arguments)["city"], str)
    chunks = list(o.chat.completions.create(model="tools", messages=msgs, tools=WEATHER, temperature=0, max_tokens=60,
                                            stream=True, tool_choice="required"))
    streamed = [tc for k in chunks if k.choices for tc in (k.choices[0].delta.tool_calls or [])]
    assert streamed and streamed[0].function.name == "get_weather", chunks
    assert json.loads(streamed[0].function.arguments) == json.loads(call.function.arguments)
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    # An answer under response_format is content, even when its JSON looks like a call
    # (as OpenAI reads it).
    r = o.chat.completions.create(model="tools", messages=msgs, tools=WEATHER, temperature=0, max_tokens=60,
                                  response_format={"type": "json_schema", "json_schema": {"name": "call", "schema": CALL}})
    assert not r.choices[0].message.tool_calls and json.loads(r.choices[0].message.content)["name"] == "get_weather", r
    ok("openai chat with tools: tool_calls and finish_reason, streamed and not; response_format answers are content")

    # A forced tool_choice (the default path of several structured-output libraries):
    # the answer is a call, in the model's own syntax (Llama 3 JSON for `tools`, the
    # generic JSON format for gemma3:270m, whose template has no tool syntax).
    TIME = {"type": "function", "function": {"name": "get_time", "description": "The local time in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    for model in ["tools", MODEL]:
        # One call (a 270M model given the choice repeats calls until the limit).
        r = o.chat.completions.create(model=model, messages=ask, tools=WEATHER + [TIME], tool_choice="required",
                                      parallel_tool_calls=False, temperature=0, max_tokens=200)
        ch = r.choices[0]
        assert ch.finish_reason == "tool_calls" and ch.message.tool_calls, (model, ch)
        assert {c.function.name for c in ch.message.tool_calls} <= {"get_weather", "get_time"}, ch
        for tc in ch.message.tool_calls:
            assert isinstance(json.loads(tc.function.arguments)["city"], str), tc
        r = o.chat.completions.create(model=model, messages=ask, tools=WEATHER + [TIME], temperature=0, max_tokens=200,
                                      tool_choice={"type": "function", "function": {"name": "get_time"}},
                                      parallel_tool_calls=False)
        ch = r.choices[0]
        assert ch.finish_reason == "tool_calls" and len(ch.message.tool_calls) == 1, (model, ch)
        assert ch.message.tool_calls[0].function.name == "get_time", ch
        # Cut by the token limit: "length", as OpenAI gives it.
        r = o.chat.completions.create(model=model, messages=ask, tools=WEATHER, tool_choice="required",
                                      temperature=0, max_tokens=3)
        assert r.choices[0].finish_reason == "length", r
    try:
        o.chat.completions.create(model="tools", messages=ask, tools=WEATHER, tool_choice={"type": "function", "function": {"name": "nope"}})
        raise AssertionError("a tool_choice naming no tool was accepted")
    except openai.BadRequestError as e:
        assert "nope" in e.body["message"], e.body
    ok("tool_choice required and named: a call of that function; parallel_tool_calls false: one; finish_reason length when cut")

    # The Responses API's function tools: a function_call item, then its output sent
    # back as a function_call_output item (the agent SDK's loop).
    fn = [{"type": "function", "name": "get_weather", "description": "The weather in a city",
           "parameters": WEATHER[0]["function"]["parameters"]}]
    first = o.responses.create(model="tools", input="What is the weather in Paris?", tools=fn, tool_choice="required",
                               temperature=0, max_output_tokens=100)
    calls = [it for it in first.output if it.type == "function_call"]
    assert calls and calls[0].name == "get_weather" and calls[0].call_id, first.output
    assert isinstance(json.loads(calls[0].arguments)["city"], str)
    second = o.responses.create(model="tools", tools=fn, temperature=0, max_output_tokens=30, input=[
        {"role": "user", "content": "What is the weather in Paris?"},
        {"type": "function_call", "call_id": calls[0].call_id, "name": "get_weather", "arguments": calls[0].arguments},
        {"type": "function_call_output", "call_id": calls[0].call_id, "output": "sunny"}])
    assert second.status in ("completed", "incomplete") and second.output, second
    ok("responses with function tools: a call, then its output sent back")

    # Tools on a template with no tool syntax: the generic format, read back as a call
    # or as plain content (never the format's JSON).
    r = c.chat(model=MODEL, messages=ask, tools=WEATHER, options={"temperature": 0, "num_predict": 200})
    assert r.message.tool_calls or (r.message.content and not r.message.content.lstrip().startswith('{"')), r.message
    ok("ollama chat with tools on a template without tool syntax: the generic format")


{"ollama": ollama_checks, "openai": openai_checks, "tools": tools_checks}[GROUP]()
