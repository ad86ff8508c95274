"""The simulator's newer fault knobs and request fields: validation, defaults, round trips."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from llm_health.sim.faults import FAULTS, FaultSpec
from llm_health.sim.server import SimHandle, SimSettings
from llm_health.sim.wire import BadRequest, parse_params
from tests.unit.sim.test_sim import chat, completion, parse, set_fault

NEW_KNOB_DEFAULTS = {
    "answer": " Paris is a city",
    "top_alternatives": [" Lyon", " the", " a", " France"],
    "served_model": None,
    "metrics": "ok",
    "metrics_waiting": None,
    "metrics_kv_cache": None,
}


# ---------------------------------------------------------------- FaultSpec knobs


def test_new_knobs_have_documented_defaults() -> None:
    doc = FaultSpec().to_json()
    assert {key: doc[key] for key in NEW_KNOB_DEFAULTS} == NEW_KNOB_DEFAULTS
    assert "garbage_tokens" in FAULTS


def test_new_knobs_round_trip_through_json() -> None:
    data = {
        "fault": "garbage_tokens",
        "answer": "Hello world ",
        "top_alternatives": [" Hi", "Hey"],
        "served_model": "org/other-model",
        "metrics": "garbage",
        "metrics_waiting": 12,
        "metrics_kv_cache": 1,
    }
    spec = FaultSpec.from_json(data)
    assert spec.top_alternatives == (" Hi", "Hey")
    assert spec.metrics_kv_cache == 1.0 and isinstance(spec.metrics_kv_cache, float)
    assert FaultSpec.from_json(spec.to_json()) == spec
    assert {key: spec.to_json()[key] for key in data} == {**data, "metrics_kv_cache": 1.0}
    back = FaultSpec.from_json({"served_model": None, "metrics_waiting": None}, base=spec)
    assert (back.served_model, back.metrics_waiting, back.answer) == (None, None, "Hello world ")


@pytest.mark.parametrize(
    ("data", "named"),
    [
        ({"answer": 3}, '"answer"'),
        ({"answer": ""}, '"answer"'),
        ({"answer": " \n "}, '"answer"'),
        ({"answer": "x" * 201}, '"answer"'),
        ({"top_alternatives": " Lyon"}, '"top_alternatives"'),
        ({"top_alternatives": [1]}, '"top_alternatives"'),
        ({"top_alternatives": [""]}, '"top_alternatives"'),
        ({"top_alternatives": ["x" * 51]}, '"top_alternatives"'),
        ({"top_alternatives": [" a", " a"]}, '"top_alternatives"'),
        ({"top_alternatives": [f" w{i}" for i in range(20)]}, '"top_alternatives"'),
        ({"served_model": 5}, '"served_model"'),
        ({"served_model": ""}, '"served_model"'),
        ({"served_model": "m" * 201}, '"served_model"'),
        ({"metrics": "500"}, '"metrics"'),
        ({"metrics": 404}, '"metrics"'),
        ({"metrics_waiting": -1}, '"metrics_waiting"'),
        ({"metrics_waiting": 1.5}, '"metrics_waiting"'),
        ({"metrics_waiting": True}, '"metrics_waiting"'),
        ({"metrics_waiting": "12"}, '"metrics_waiting"'),
        ({"metrics_kv_cache": 1.5}, '"metrics_kv_cache"'),
        ({"metrics_kv_cache": -0.1}, '"metrics_kv_cache"'),
        ({"metrics_kv_cache": True}, '"metrics_kv_cache"'),
        ({"metrics_kv_cache": "0.5"}, '"metrics_kv_cache"'),
        ({"metrics_kv_cache": float("nan")}, '"metrics_kv_cache"'),
    ],
)
def test_new_knobs_reject_bad_values_naming_the_key(data: dict[str, Any], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        FaultSpec.from_json(data)


def test_limits_are_inclusive() -> None:
    spec = FaultSpec.from_json(
        {
            "answer": "x" * 200,
            "top_alternatives": [f" w{i}" for i in range(19)],
            "metrics_waiting": 0,
            "metrics_kv_cache": 0,
        }
    )
    assert len(spec.top_alternatives) == 19
    assert FaultSpec.from_json({"top_alternatives": []}).top_alternatives == ()


def test_direct_construction_is_validated_and_lists_become_tuples() -> None:
    spec = FaultSpec(top_alternatives=[" x", " y"])  # type: ignore[arg-type]
    assert spec.top_alternatives == (" x", " y")
    hash(spec)  # still a hashable value
    with pytest.raises(ValueError, match='"metrics_waiting"'):
        FaultSpec(metrics_waiting=-3)
    with pytest.raises(ValueError, match='"answer"'):
        FaultSpec(answer="")


async def test_post_sim_fault_refuses_a_bad_knob_and_keeps_the_spec(
    sim: SimHandle, session: aiohttp.ClientSession
) -> None:
    await set_fault(session, sim, answer=" Rome")
    async with session.post(f"{sim.base_url}/sim/fault", json={"metrics": "broken"}) as resp:
        assert resp.status == 400
        assert '"metrics"' in (await resp.json())["error"]["message"]
    assert (sim.state.fault.answer, sim.state.fault.metrics) == (" Rome", "ok")


# ---------------------------------------------------------------- request fields


def test_params_accept_what_the_prober_sends_and_the_new_fields() -> None:
    settings = SimSettings()
    probe = {"stream": True, "max_tokens": 1, "temperature": 0, "top_p": 1, "cache_salt": "n"}
    params = parse_params({**probe, "model": "sim-model", "prompt": "hi"}, "completions", settings)
    assert (params.temperature, params.logprobs, params.return_token_ids) == (0.0, None, False)
    assert params.cache_salt == "n" and params.cache_prompt is None
    body = {
        **probe,
        "prompt": "hi",
        "logprobs": 5,
        "return_token_ids": True,
        "cache_prompt": False,
        "temperature": 0.7,
    }
    params = parse_params(body, "completions", settings)
    assert (params.logprobs, params.return_token_ids) == (5, True)
    assert (params.cache_prompt, params.temperature) == (False, 0.7)
    messages = [{"role": "user", "content": "hi"}]
    chat_params = parse_params(
        {"messages": messages, "logprobs": True, "top_logprobs": 20}, "chat", settings
    )
    assert chat_params.logprobs == 20
    assert parse_params({"messages": messages, "logprobs": True}, "chat", settings).logprobs == 0
    assert (
        parse_params({"messages": messages, "logprobs": False}, "chat", settings).logprobs is None
    )
    plain = parse_params({"messages": messages, "top_logprobs": 0}, "chat", settings)
    assert plain.logprobs is None


@pytest.mark.parametrize(
    ("kind", "fields", "fragment"),
    [
        ("completions", {"logprobs": 21}, "greater than max allowed: 20"),
        ("completions", {"logprobs": -1}, '"logprobs"'),
        ("completions", {"logprobs": True}, '"logprobs"'),
        ("completions", {"logprobs": "3"}, '"logprobs"'),
        ("completions", {"top_logprobs": 21}, '"top_logprobs"'),
        ("chat", {"logprobs": 3}, '"logprobs" must be a boolean'),
        ("chat", {"logprobs": True, "top_logprobs": 21}, '"top_logprobs"'),
        ("chat", {"logprobs": True, "top_logprobs": -1}, '"top_logprobs"'),
        ("chat", {"logprobs": True, "top_logprobs": "2"}, '"top_logprobs"'),
        ("chat", {"top_logprobs": 2}, '"logprobs" must be set to true'),
        ("chat", {"logprobs": False, "top_logprobs": 2}, '"logprobs" must be set to true'),
        ("completions", {"return_token_ids": "yes"}, '"return_token_ids"'),
        ("completions", {"temperature": -0.5}, '"temperature"'),
        ("completions", {"temperature": "hot"}, '"temperature"'),
        ("completions", {"temperature": True}, '"temperature"'),
        ("completions", {"temperature": float("inf")}, '"temperature"'),
        ("chat", {"cache_prompt": 1}, '"cache_prompt"'),
    ],
)
def test_params_refuse_bad_new_fields_naming_them(
    kind: str, fields: dict[str, Any], fragment: str
) -> None:
    base = completion() if kind == "completions" else chat()
    with pytest.raises(BadRequest, match=fragment) as info:
        parse_params({**base, **fields}, kind, SimSettings())  # type: ignore[arg-type]
    assert info.value.status == 400


async def test_bad_logprobs_request_is_a_400_over_http(
    sim: SimHandle, session: aiohttp.ClientSession
) -> None:
    url = f"{sim.base_url}/v1/completions"
    async with session.post(url, json=completion(logprobs=25)) as resp:
        assert resp.status == 400
        error = (await resp.json())["error"]
    assert error["type"] == "BadRequestError" and "max allowed: 20" in error["message"]
    assert (sim.state.counters.bad_requests, sim.state.counters.requests) == (1, 0)


# ---------------------------------------------------------------- engine setting


def test_engine_setting_is_validated() -> None:
    for engine in ("vllm", "sglang", "tgi", "llamacpp"):
        assert SimSettings(engine=engine).engine == engine
    assert SimSettings().engine == "vllm"
    with pytest.raises(ValueError, match="engine"):
        SimSettings(engine="trtllm")


def test_cli_engine_flag(capsys: pytest.CaptureFixture[str]) -> None:
    from llm_health.cli.sim import settings_from_args

    assert settings_from_args(parse(["sim", "--port", "9000"])).engine == "vllm"
    args = parse(["sim", "--port", "9000", "--engine", "llamacpp"])
    assert settings_from_args(args).engine == "llamacpp"
    with pytest.raises(SystemExit) as exit_info:
        parse(["sim", "--port", "9000", "--engine", "trtllm"])
    assert exit_info.value.code == 2
    assert "--engine" in capsys.readouterr().err
