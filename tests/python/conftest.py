"""Fixtures shared by the SDK tests: a client for the daemon that
server/tests/openai_sdk.rs starts (OPENAI_BASE_URL, OPENAI_API_KEY), and the
served model's id."""

import os

import openai
import pytest


@pytest.fixture(scope="session")
def client():
    if not os.environ.get("OPENAI_BASE_URL"):
        pytest.fail("OPENAI_BASE_URL not set (server/tests/openai_sdk.rs sets it)")
    return openai.OpenAI(max_retries=0, timeout=300)


@pytest.fixture(scope="session")
def model(client):
    """The served model's id, as GET /v1/models reports it."""
    if os.environ.get("SPINDLE_TEST_MODEL"):
        return os.environ["SPINDLE_TEST_MODEL"]
    models = client.models.list().data
    assert models, "GET /v1/models returned no models"
    return models[0].id
