"""What discovery and load-reading clients see: served_model, /metrics knobs, engine flavours."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from llm_health.cli.sim import announce
from llm_health.sim.engines import ENGINES
from llm_health.sim.faults import FaultSpec
from llm_health.sim.metrics import METRICS_GARBAGE
from llm_health.sim.server import SimHandle, SimSettings, running_sim
from tests.polling import wait_until_async
from tests.unit.sim.test_sim import HANG_TIMEOUT, completion, read_events, set_fault

INFO_PATHS = ("/version", "/get_server_info", "/info", "/props")


async def get_json(session: aiohttp.ClientSession, url: str) -> Any:
    async with session.get(url) as resp:
        assert resp.status == 200, url
        return await resp.json()


def samples(text: str) -> dict[str, float]:
    """Every sample of a Prometheus document by name (parsed by prometheus_client)."""
    values = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = dict(sample.labels)
            le = labels.pop("le", None)  # histogram buckets: keyed "name{le}"
            if sample.name.startswith("tgi_batch_inference_count"):  # TGI's prefill series
                assert labels.pop("method") == "prefill"
            assert labels == {"model_name": "sim-model"}
            values[sample.name if le is None else f"{sample.name}{{{le}}}"] = sample.value
    return values


# ---------------------------------------------------------------- served_model


async def test_served_model_is_listed_while_requests_keep_the_configured_name(
    sim: SimHandle, session: aiohttp.ClientSession
) -> None:
    models = await get_json(session, f"{sim.base_url}/v1/models")
    assert [(m["id"], m["root"]) for m in models["data"]] == [("sim-model", "sim-model")]
    await set_fault(session, sim, served_model="org/other-weights")
    models = await get_json(session, f"{sim.base_url}/v1/models")
    assert [(m["id"], m["root"]) for m in models["data"]] == [
        ("org/other-weights", "org/other-weights")
    ]
    url = f"{sim.base_url}/v1/completions"
    async with session.post(url, json=completion(max_tokens=1)) as resp:
        assert resp.status == 200  # the right name is still accepted: wrong weights behind it
        events = await read_events(resp)
    assert '"model":"sim-model"' in events[0]
    async with session.post(url, json=completion(model="org/other-weights")) as resp:
        assert resp.status == 404  # acceptance as before: only the configured name
    metrics = await (await session.get(f"{sim.base_url}/metrics")).text()
    assert 'model_name="sim-model"' in metrics  # labels stay the configured name
    await set_fault(session, sim, served_model=None)
    models = await get_json(session, f"{sim.base_url}/v1/models")
    assert [m["id"] for m in models["data"]] == ["sim-model"]


# ---------------------------------------------------------------- /metrics knobs


async def test_metrics_overrides_report_a_saturated_engine(
    sim: SimHandle, session: aiohttp.ClientSession
) -> None:
    text = await (await session.get(f"{sim.base_url}/metrics")).text()
    before = samples(text)
    assert before["vllm:num_requests_waiting"] == 0.0
    assert before["vllm:kv_cache_usage_perc"] == 0.0
    await set_fault(session, sim, metrics_waiting=12, metrics_kv_cache=0.97)
    text = await (await session.get(f"{sim.base_url}/metrics")).text()
    after = samples(text)
    assert after["vllm:num_requests_waiting"] == 12.0
    assert after["vllm:kv_cache_usage_perc"] == 0.97
    assert after["vllm:num_requests_running"] == 0.0  # not overridden
    assert 'vllm:num_requests_waiting{model_name="sim-model"} 12.0' in text
    await set_fault(session, sim, metrics_waiting=None, metrics_kv_cache=None)
    text = await (await session.get(f"{sim.base_url}/metrics")).text()
    assert samples(text)["vllm:num_requests_waiting"] == 0.0


async def test_metrics_mode_404_and_garbage(sim: SimHandle, session: aiohttp.ClientSession) -> None:
    await set_fault(session, sim, metrics="404")
    async with session.get(f"{sim.base_url}/metrics") as resp:
        assert resp.status == 404
        assert "vllm:" not in await resp.text()
    await set_fault(session, sim, metrics="garbage")
    async with session.get(f"{sim.base_url}/metrics") as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/plain")
        body = await resp.read()
    assert body == METRICS_GARBAGE
    with pytest.raises(ValueError):
        list(text_string_to_metric_families(body.decode("utf-8", errors="replace")))
    with pytest.raises(UnicodeDecodeError):
        body.decode("utf-8")
    async with session.get(f"{sim.base_url}/health") as resp:
        assert resp.status == 200  # only /metrics is affected
    await set_fault(session, sim, metrics="ok")
    text = await (await session.get(f"{sim.base_url}/metrics")).text()
    assert "vllm:num_requests_running" in samples(text)


async def test_metrics_mode_hostile(sim: SimHandle, session: aiohttp.ClientSession) -> None:
    """4 MiB (the most the engine checks read) of line breaks, then more samples of one
    series than any engine writes."""
    await set_fault(session, sim, metrics="hostile")
    async with session.get(f"{sim.base_url}/metrics") as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/plain")
        body = await resp.read()
    assert len(body) == 4 * 1024 * 1024
    text = body.decode()
    lines = text.lstrip("\n").splitlines()
    assert lines == ["vllm:num_requests_waiting 1"] * 10_000
    assert text.count("\n") > 3_900_000


async def test_metrics_mode_hang_until_the_client_leaves_or_hang_max(
    sim: SimHandle, session: aiohttp.ClientSession
) -> None:
    await set_fault(session, sim, metrics="hang")
    with pytest.raises(asyncio.TimeoutError):
        async with session.get(f"{sim.base_url}/metrics", timeout=HANG_TIMEOUT) as resp:
            await resp.read()
    async with session.post(f"{sim.base_url}/v1/completions", json=completion()) as resp:
        assert resp.status == 200  # inference is not affected
        await resp.read()
    await set_fault(session, sim, hang_max="200ms")
    async with session.get(f"{sim.base_url}/metrics") as resp:
        assert resp.status == 504
    await wait_until_async(lambda: sim.state.paths["/metrics"] == 2, 5, "two /metrics calls")


async def test_metrics_hang_does_not_hold_up_shutdown(session: aiohttp.ClientSession) -> None:
    loop = asyncio.get_running_loop()
    async with running_sim(SimSettings(fault=FaultSpec(metrics="hang"))) as sim:
        pending = asyncio.create_task(session.get(f"{sim.base_url}/metrics"))
        await wait_until_async(lambda: sim.state.paths["/metrics"] == 1, 5, "/metrics seen")
        started = loop.time()
    assert loop.time() - started < 2.0
    response = await asyncio.wait_for(pending, 2)
    assert response.status == 503
    response.release()


@pytest.mark.parametrize("path", ["/v1/models", *INFO_PATHS])
async def test_info_mode_hang_holds_the_model_list_and_every_info_endpoint(
    sim: SimHandle, session: aiohttp.ClientSession, path: str
) -> None:
    """A wedged server: the played engine's info endpoint, the others' (else 404) and the
    model list answer nothing; /health, /metrics and inference are not affected."""
    await set_fault(session, sim, info="hang")
    with pytest.raises(asyncio.TimeoutError):
        async with session.get(f"{sim.base_url}{path}", timeout=HANG_TIMEOUT) as resp:
            await resp.read()
    for other in ("/health", "/metrics"):
        async with session.get(f"{sim.base_url}{other}") as resp:
            assert resp.status == 200, other
    async with session.post(f"{sim.base_url}/v1/completions", json=completion()) as resp:
        assert resp.status == 200
        await resp.read()
    await set_fault(session, sim, hang_max="200ms")
    async with session.get(f"{sim.base_url}{path}") as resp:
        assert resp.status == 504
    await set_fault(session, sim, info="ok")
    async with session.get(f"{sim.base_url}{path}") as resp:
        assert resp.status == (200 if path in ("/v1/models", "/version") else 404)


# ---------------------------------------------------------------- engine flavours

EXPECTED_METRICS = {
    "vllm": {"vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc"},
    "sglang": {"sglang:num_queue_reqs", "sglang:num_running_reqs", "sglang:token_usage"},
    "tgi": {"tgi_queue_size", "tgi_batch_current_size"},
    "llamacpp": {
        "llamacpp:requests_deferred",
        "llamacpp:requests_processing",
        "llamacpp:kv_cache_usage_ratio",
    },
}
EXPECTED_HISTOGRAMS = {
    "vllm": {"vllm:time_to_first_token_seconds", "vllm:e2e_request_latency_seconds"},
    "sglang": {"sglang:time_to_first_token_seconds", "sglang:e2e_request_latency_seconds"},
    "tgi": set(),
    "llamacpp": set(),
}
EXPECTED_INFO = {
    "vllm": "/version",
    "sglang": "/get_server_info",
    "tgi": "/info",
    "llamacpp": "/props",
}


@pytest.mark.parametrize("engine", sorted(EXPECTED_METRICS))
async def test_engine_flavour_names_its_metrics_and_info_endpoint(
    session: aiohttp.ClientSession, engine: str
) -> None:
    spec = FaultSpec(ttft=0.0, tpot=0.0, served_model="loaded/model", metrics_waiting=7)
    async with running_sim(SimSettings(engine=engine, fault=spec)) as sim:
        text = await (await session.get(f"{sim.base_url}/metrics")).text()
        families = {f.name: f.type for f in text_string_to_metric_families(text)}
        gauges = {name for name, kind in families.items() if kind == "gauge"}
        assert gauges == EXPECTED_METRICS[engine]
        histograms = {name for name, kind in families.items() if kind == "histogram"}
        assert histograms == EXPECTED_HISTOGRAMS[engine]
        assert {kind for name, kind in families.items() if name.startswith("llm_health_sim_")} == {
            "counter"
        }
        assert samples(text)[ENGINES[engine].waiting_metric] == 7.0
        assert "llm_health_sim_requests_total" in text
        for path in INFO_PATHS:
            async with session.get(sim.base_url + path) as resp:
                assert resp.status == (200 if path == EXPECTED_INFO[engine] else 404), path
                info = await resp.json() if resp.status == 200 else None
            if info is None:
                continue
            if engine == "vllm":
                assert info == {"version": "0.11.0"}
            elif engine == "sglang":
                assert isinstance(info["version"], str) and info["version"]
                assert info["model_path"] == "loaded/model"
            elif engine == "tgi":
                assert info["model_id"] == "loaded/model"
                assert isinstance(info["version"], str) and info["version"]
            else:
                assert info["model_path"] == "loaded/model"
                assert isinstance(info["default_generation_settings"], dict)
                assert isinstance(info["build_info"], str) and info["build_info"]
        models = await get_json(session, f"{sim.base_url}/v1/models")
        assert models["data"][0]["id"] == "loaded/model"
        assert models["data"][0]["owned_by"] == ENGINES[engine].owned_by
        url = f"{sim.base_url}/v1/completions"
        async with session.post(url, json=completion(max_tokens=1)) as resp:
            assert resp.status == 200  # every flavour serves the same OpenAI API
            await resp.read()


async def test_kv_cache_override_shows_on_sglang_and_llamacpp_names(
    session: aiohttp.ClientSession,
) -> None:
    for engine, name in (
        ("sglang", "sglang:token_usage"),
        ("llamacpp", "llamacpp:kv_cache_usage_ratio"),
    ):
        spec = FaultSpec(metrics_kv_cache=0.5)
        async with running_sim(SimSettings(engine=engine, fault=spec)) as sim:
            text = await (await session.get(f"{sim.base_url}/metrics")).text()
        assert samples(text)[name] == 0.5


def test_announce_names_a_non_default_engine() -> None:
    class Handle:
        base_url = "http://127.0.0.1:8000"
        ports = (8000,)

    line = announce(Handle(), SimSettings(engine="tgi"))  # type: ignore[arg-type]
    assert (
        line
        == "llm-health sim listening on http://127.0.0.1:8000 (model sim-model, fault none, engine tgi)"
    )
    default = announce(Handle(), SimSettings())  # type: ignore[arg-type]
    assert default.endswith("(model sim-model, fault none)")
