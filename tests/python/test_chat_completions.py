"""/v1/chat/completions and /v1/completions through the official OpenAI
Python SDK: plain, streamed with usage, a streamed tool call reassembled by
the SDK's own stream helper, structured output parsed by the SDK, and a raw
completion. Greedy sampling; assertions on shapes and on what the server
must guarantee (a forced call, a schema), not on what the model says."""

import json

import openai
import pydantic
import pytest

MESSAGES = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Name three colors."},
]

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
            "additionalProperties": False,
        },
        "strict": True,
    },
}


def test_chat_completion_plain(client, model):
    c = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=24, temperature=0)
    assert c.object == "chat.completion"
    assert c.id.startswith("chatcmpl-")
    choice = c.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content
    assert choice.finish_reason in ("stop", "length")
    assert c.usage.prompt_tokens > 0 and c.usage.completion_tokens > 0
    assert c.usage.total_tokens == c.usage.prompt_tokens + c.usage.completion_tokens


def test_chat_completion_stream_with_usage_matches_the_plain_one(client, model):
    plain = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=24, temperature=0)
    chunks = list(client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=24, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == plain.choices[0].message.content
    finishes = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert finishes == [plain.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == plain.usage.completion_tokens


def test_a_streamed_tool_call_reassembles_with_the_sdk_helper(client, model):
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    with client.chat.completions.stream(model=model, messages=messages, tools=[WEATHER], tool_choice="required",
                                        max_tokens=64, temperature=0) as stream:
        for _ in stream:
            pass
        final = stream.get_final_completion()
    choice = final.choices[0]
    assert choice.finish_reason == "tool_calls"
    call = choice.message.tool_calls[0]
    assert call.function.name == "get_weather"
    assert isinstance(json.loads(call.function.arguments)["city"], str)
    # The call goes back as history with its result; the model answers.
    history = messages + [choice.message.model_dump(exclude_none=True),
                          {"role": "tool", "tool_call_id": call.id, "content": "18 C and sunny"}]
    answer = client.chat.completions.create(model=model, messages=history, tools=[WEATHER], tool_choice="none",
                                            max_tokens=24, temperature=0)
    assert answer.choices[0].message.content and not answer.choices[0].message.tool_calls


class City(pydantic.BaseModel):
    name: str
    country: str


def test_structured_output_parses_with_the_sdk(client, model):
    messages = [{"role": "user", "content": "Give a city and its country as JSON."}]
    c = client.chat.completions.parse(model=model, messages=messages, response_format=City, max_tokens=64, temperature=0)
    choice = c.choices[0]
    if choice.finish_reason == "length":
        pytest.fail(f"the JSON did not finish within 64 tokens: {choice.message.content!r}")
    assert isinstance(choice.message.parsed, City)


def test_chat_errors_are_openai_errors(client, model):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model, messages=MESSAGES, n=2, max_tokens=4)
    assert e.value.body["param"] == "n"
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="no-such-model", messages=MESSAGES, max_tokens=4)


def test_completion_raw_prompt(client, model):
    c = client.completions.create(model=model, prompt="The capital of France is", max_tokens=5, temperature=0)
    assert c.object == "text_completion"
    assert c.choices[0].text
    assert c.usage.completion_tokens <= 5
    streamed = "".join(ch.choices[0].text for ch in client.completions.create(
        model=model, prompt="The capital of France is", max_tokens=5, temperature=0, stream=True) if ch.choices)
    assert streamed == c.choices[0].text
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=model, prompt="x", max_tokens=5, echo=True)
