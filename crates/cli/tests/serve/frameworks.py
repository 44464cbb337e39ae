"""The frameworks people put in front of a local server, each used as its README shows.

usage: frameworks.py BASE_URL

LangChain's Ollama and OpenAI integrations (langchain-ollama, langchain-openai),
a structured-output library (instructor) and an agent SDK on the Responses API
(openai-agents), against `llamay serve` serving the Gemma 3 270M file as `gemma3:270m`
(no tool syntax in its template: tools go through the generic format) and, as `tools`,
a copy with a Llama 3 tool-calling template. Versions are pinned by scripts/test.
Every check prints `ok NAME`; a failure exits non-zero.
"""

import sys
from typing import Literal

from pydantic import BaseModel, Field

BASE = sys.argv[1]
MODEL = "gemma3:270m"


def ok(name):
    print("ok", name, flush=True)


class City(BaseModel):
    name: str = Field(max_length=20)
    country: str = Field(max_length=20)


class Colour(BaseModel):
    colour: Literal["red", "green", "blue", "grey"]


def langchain_ollama():
    from langchain_ollama import ChatOllama, OllamaEmbeddings

    llm = ChatOllama(model=MODEL, base_url=BASE, temperature=0, num_predict=24)
    r = llm.invoke("Write one sentence about the sea.")
    assert r.content and r.response_metadata.get("done_reason") in ("stop", "length"), r
    streamed = "".join(c.content for c in llm.stream("Write one sentence about the sea."))
    assert streamed == r.content, (streamed, r.content)
    ok("langchain-ollama: invoke and stream")
    # Structured output as its README shows (JSON schema through `format`).
    city = ChatOllama(model=MODEL, base_url=BASE, temperature=0, num_predict=80).with_structured_output(City)
    c = city.invoke("Name a city in France.")
    assert isinstance(c, City), c
    ok("langchain-ollama: with_structured_output")
    # The integration sends num_ctx from the model's training context when asked to.
    big = ChatOllama(model=MODEL, base_url=BASE, temperature=0, num_predict=4, num_ctx=131072)
    assert big.invoke("Hi").content is not None
    ok("langchain-ollama: num_ctx above the server's context is clamped")
    v = OllamaEmbeddings(model=MODEL, base_url=BASE).embed_query("hello world")
    assert len(v) == 640 and abs(sum(x * x for x in v) - 1) < 1e-3, len(v)
    ok("langchain-ollama: embeddings")


def langchain_openai():
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(model=MODEL, base_url=BASE + "/v1", api_key="none", temperature=0, max_tokens=24)
    r = llm.invoke("Write one sentence about the sea.")
    assert r.content, r
    assert "".join(c.content for c in llm.stream("Write one sentence about the sea.")) == r.content
    ok("langchain-openai: invoke and stream")
    wide = ChatOpenAI(model=MODEL, base_url=BASE + "/v1", api_key="none", temperature=0, max_tokens=120)
    # Both of its structured-output methods: response_format json_schema, and a forced
    # tool call (tool_choice naming the schema's function).
    for method in ("json_schema", "function_calling"):
        c = wide.with_structured_output(City, method=method).invoke("Name a city in France.")
        assert isinstance(c, City), (method, c)
    ok("langchain-openai: with_structured_output (json_schema, function_calling)")
    tools_llm = ChatOpenAI(model="tools", base_url=BASE + "/v1", api_key="none", temperature=0, max_tokens=80)

    def get_weather(city: str) -> str:
        """The weather in a city."""
        return "sunny"

    m = tools_llm.bind_tools([get_weather], tool_choice="get_weather").invoke("What is the weather in Paris?")
    assert m.tool_calls and m.tool_calls[0]["name"] == "get_weather", m
    assert isinstance(m.tool_calls[0]["args"]["city"], str), m.tool_calls
    ok("langchain-openai: bind_tools with a forced tool")
    resp = ChatOpenAI(model=MODEL, base_url=BASE + "/v1", api_key="none", temperature=0, max_tokens=24,
                      use_responses_api=True)
    assert resp.invoke("Write one sentence about the sea.").text
    ok("langchain-openai: on the Responses API")


def instructor_checks():
    import instructor
    from openai import OpenAI

    # Its default (TOOLS: a forced, named tool_choice) and JSON_SCHEMA. (Its JSON mode
    # only asks for an object and puts the schema in the prompt: a 270M model echoes
    # the schema back, which says nothing about the server.)
    for mode in (instructor.Mode.TOOLS, instructor.Mode.JSON_SCHEMA):
        client = instructor.from_openai(OpenAI(base_url=BASE + "/v1", api_key="none"), mode=mode)
        c = client.chat.completions.create(model=MODEL, response_model=City, temperature=0, max_tokens=120,
                                           messages=[{"role": "user", "content": "Name a city in France."}])
        assert isinstance(c, City), (mode, c)
        k = client.chat.completions.create(model=MODEL, response_model=Colour, temperature=0, max_tokens=60,
                                           messages=[{"role": "user", "content": "The colour of the sky?"}])
        assert k.colour in ("red", "green", "blue", "grey"), k
    ok("instructor: TOOLS (a forced, named tool_choice) and JSON_SCHEMA modes")


def agents_checks():
    from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    client = AsyncOpenAI(base_url=BASE + "/v1", api_key="none")
    # The served file is a base model: a free-text answer rambles to the token limit
    # (which the SDK treats as a failed run), so each agent has an output_type, which
    # the SDK sends as text.format json_schema and reads back.
    plain = Agent(name="geographer", instructions="Answer with a city.", output_type=City,
                  model=OpenAIResponsesModel(model=MODEL, openai_client=client),
                  model_settings=ModelSettings(temperature=0, max_tokens=200))
    out = Runner.run_sync(plain, "Name a city in France.")
    assert isinstance(out.final_output, City), out
    whole = out.final_output
    ok("openai-agents: an agent on the Responses API, output_type")

    called = []

    @function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        called.append(city)
        return "sunny"

    # The Llama 3 template's own syntax: the call, its result sent back, a final answer.
    agent = Agent(name="weather", instructions="Use the tools to answer.", tools=[get_weather],
                  output_type=City, model=OpenAIResponsesModel(model="tools", openai_client=client),
                  model_settings=ModelSettings(temperature=0, max_tokens=200, tool_choice="required",
                                               parallel_tool_calls=False))
    out = Runner.run_sync(agent, "What is the weather in Paris?", max_turns=4)
    assert called and isinstance(called[0], str), out
    assert isinstance(out.final_output, City), out
    # The generic format (a base model given the choice keeps calling, so the run
    # stops at the first tool, as the SDK documents).
    called.clear()
    agent = Agent(name="weather", instructions="Use the tools to answer.", tools=[get_weather],
                  tool_use_behavior="stop_on_first_tool", model=OpenAIResponsesModel(model=MODEL, openai_client=client),
                  model_settings=ModelSettings(temperature=0, max_tokens=200, tool_choice="required",
                                               parallel_tool_calls=False))
    out = Runner.run_sync(agent, "What is the weather in Paris?", max_turns=2)
    assert called and out.final_output == "sunny", out
    ok("openai-agents: a function tool called through the Responses API, its result sent back")

    async def streamed_run():
        agent = plain.clone(model=OpenAIResponsesModel(model=MODEL, openai_client=AsyncOpenAI(
            base_url=BASE + "/v1", api_key="none")))
        run = Runner.run_streamed(agent, "Name a city in France.")
        kinds = [e.type async for e in run.stream_events()]
        return run.final_output, kinds

    import asyncio

    final, kinds = asyncio.run(streamed_run())
    assert "raw_response_event" in kinds, kinds
    assert final == whole, (final, whole)
    ok("openai-agents: a streamed run")


langchain_ollama()
langchain_openai()
instructor_checks()
agents_checks()
