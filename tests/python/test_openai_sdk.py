"""Spindle's daemon driven by the official OpenAI Python SDK.

Run by server/tests/openai_sdk.rs (via scripts/test.sh), which starts
`spindle serve` and sets OPENAI_BASE_URL (http://127.0.0.1:PORT/v1) and
OPENAI_API_KEY. To run by hand against a daemon you started yourself:

    OPENAI_BASE_URL=http://127.0.0.1:8080/v1 OPENAI_API_KEY=dummy \
        .venv-py/bin/python -m pytest tests/python -q

The default model is 135M parameters on CPU, so every request keeps
max_output_tokens small, samples greedily (temperature=0) so runs repeat, and
asserts on shapes, not on what the model says.
"""

import json
import os

import openai
import pytest

TERMINAL = ("response.completed", "response.incomplete")
LIFECYCLE = ("response.created", "response.queued", "response.in_progress") + TERMINAL


def assert_usage(usage):
    assert usage is not None
    assert usage.input_tokens > 0
    assert usage.output_tokens > 0
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert 0 <= usage.input_tokens_details.cached_tokens <= usage.input_tokens
    # SmolLM2 does not reason: no output token may be counted as reasoning.
    assert usage.output_tokens_details.reasoning_tokens == 0


def assert_finished(response):
    assert response.status in ("completed", "incomplete"), response.status
    if response.status == "incomplete":
        assert response.incomplete_details.reason == "max_output_tokens"


def test_create_plain(client, model):
    r = client.responses.create(model=model, input="Say hello.", max_output_tokens=16, temperature=0)
    assert r.object == "response"
    assert r.id.startswith("resp_")
    assert r.model == model
    assert_finished(r)
    assert isinstance(r.output_text, str) and r.output_text
    assert r.output[0].type == "message"
    assert r.output[0].role == "assistant"
    assert r.output[0].content[0].type == "output_text"
    assert_usage(r.usage)
    assert r.usage.output_tokens <= 16


def test_create_stream_events(client, model):
    stream = client.responses.create(
        model=model, input="Count to three.", max_output_tokens=24, temperature=0, stream=True
    )
    events = list(stream)
    types = [e.type for e in events]
    assert types[0] == "response.created", types
    assert types[-1] in TERMINAL, types
    assert "response.output_text.delta" in types, types
    assert [e.sequence_number for e in events] == list(range(len(events)))
    ids = {e.response.id for e in events if e.type in LIFECYCLE}
    assert len(ids) == 1, ids
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    done = [e.text for e in events if e.type == "response.output_text.done"]
    assert done == [deltas]
    final = events[-1].response
    assert_finished(final)
    assert final.output_text == deltas
    assert_usage(final.usage)


def test_stream_helper_final_response(client, model):
    # get_final_response() needs response.completed (the helper raises on
    # response.incomplete), so ask for a short answer with room to finish.
    snapshot = None
    with client.responses.stream(
        model=model,
        input="Reply with one word: yes or no. Is the sky blue?",
        max_output_tokens=32,
        temperature=0,
    ) as stream:
        for event in stream:
            if event.type == "response.output_text.delta":
                snapshot = event.snapshot
        final = stream.get_final_response()
    assert final.status == "completed"
    assert final.id.startswith("resp_")
    assert final.output_text
    assert final.output_text == snapshot
    assert_usage(final.usage)


WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the current weather for a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
    "strict": False,
}


def test_function_call_round_trip(client, model):
    # The client ran the tool for a call the model made earlier; it sends the
    # call and its output back and gets a text answer. (The 135M model does
    # not call tools reliably by itself, so the call is supplied.)
    r = client.responses.create(
        model=model,
        input=[
            {"role": "user", "content": "What is the weather in Paris?"},
            {
                "type": "function_call",
                "call_id": "call_weather_1",
                "name": "get_weather",
                "arguments": json.dumps({"city": "Paris"}),
            },
            {
                "type": "function_call_output",
                "call_id": "call_weather_1",
                "output": json.dumps({"temperature_c": 18, "sky": "sunny"}),
            },
        ],
        tools=[WEATHER_TOOL],
        max_output_tokens=32,
        temperature=0,
    )
    assert_finished(r)
    assert r.tools and r.tools[0].name == "get_weather"
    messages = [item for item in r.output if item.type == "message"]
    assert messages, [item.type for item in r.output]
    assert r.output_text
    assert_usage(r.usage)


def test_previous_response_id_continuation(client, model):
    first = client.responses.create(model=model, input="My name is Ada.", max_output_tokens=16, temperature=0)
    assert_finished(first)
    second = client.responses.create(
        model=model, input="What is my name?", previous_response_id=first.id, max_output_tokens=16, temperature=0
    )
    assert_finished(second)
    assert second.previous_response_id == first.id
    assert second.id != first.id
    assert second.usage.input_tokens > first.usage.input_tokens
    assert second.output_text


def test_retrieve_input_items_and_delete(client, model):
    r = client.responses.create(model=model, input="Say hello.", max_output_tokens=16)
    got = client.responses.retrieve(r.id)
    assert got.id == r.id
    assert got.status == r.status
    assert got.output_text == r.output_text
    assert got.usage.output_tokens == r.usage.output_tokens
    items = list(client.responses.input_items.list(r.id))
    assert any(getattr(item, "role", None) == "user" for item in items), items
    assert client.responses.delete(r.id) is None
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)


def test_errors_map_to_sdk_exceptions(client, model):
    with pytest.raises(openai.NotFoundError) as e:
        client.responses.create(model="no-such-model", input="hi", max_output_tokens=16)
    assert e.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model=model, input="hi", temperature=5)
    assert e.value.param == "temperature"


def test_input_items_have_the_sdk_item_shape(client, model):
    r = client.responses.create(model=model, input="Say hello.", max_output_tokens=16, temperature=0)
    items = list(client.responses.input_items.list(r.id))
    assert items
    for item in items:
        assert isinstance(item.id, str) and item.id
    user = [item for item in items if getattr(item, "role", None) == "user"]
    assert user and isinstance(user[0].content, list)
    assert user[0].content[0].type == "input_text"
