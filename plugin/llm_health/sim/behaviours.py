"""How each fault of :data:`llm_health.sim.faults.FAULTS` answers an inference call.

:func:`serve_fault` runs the behaviour of the fault chosen for the call. A behaviour
sets ``call.outcome`` to "completed" only when it served the tokens asked for; every
wait goes through :func:`llm_health.sim.call.pause`, and every hang is bounded by
``FaultSpec.hang_max``, so no behaviour outlives its client or blocks shutdown.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

from aiohttp import web

from llm_health.sim.admission import admit
from llm_health.sim.call import Call, open_response, pause, send_whole
from llm_health.sim.tokens import steps_for
from llm_health.sim.wire import (
    DONE_EVENT,
    error_body,
    error_response,
    full_body,
    role_chunk,
    send_event,
    token_chunk,
    usage_chunk,
)

__all__ = ["CUDA_ERROR_MESSAGE", "serve_fault"]

CUDA_ERROR_MESSAGE = (
    "EngineCore encountered an issue. See stack trace (above) for the root cause. "
    "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.\n"
    "RuntimeError: CUDA error: an illegal memory access was encountered\n"
    "CUDA kernel errors might be asynchronously reported at some other API call, "
    "so the stacktrace below might be incorrect.\n"
    "For debugging consider passing CUDA_LAUNCH_BLOCKING=1\n"
    "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n"
)
_GARBAGE_LINES = (
    b"data: \x00\x01\x02\xff\xfe\xfd garbage \x7f\x80\x81\n\n",
    b"data: {this is not json\n\n",
    b"<html><body><h1>502 Bad Gateway</h1></body></html>\n",
    b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\n\n",
    b"data: }}}{{{ ,,, \n\n",
)


async def serve_fault(call: Call) -> web.StreamResponse:
    """Answer ``call`` the way its chosen fault (``call.fault``) behaves."""
    return await _FAULT_HANDLERS[call.fault](call)


# ------------------------------------------------------------ streams


async def _open_stream(call: Call) -> web.StreamResponse:
    """Send 200 SSE headers and, for chat, the role delta vLLM flushes before any token."""
    response = await open_response(call)
    if call.kind == "chat":
        await send_event(response, role_chunk(call))
    return response


async def _end_stream(response: web.StreamResponse) -> None:
    """Close a stream the way vLLM does: ``[DONE]``, then the end of the body."""
    await response.write(DONE_EVENT)
    await response.write_eof()


async def _generate(call: Call, ttft: float, garbage: bool = False) -> web.StreamResponse:
    """Serve ``max_tokens`` tokens, streamed or as one JSON; sets outcome 'completed'.

    The tokens are the spec's answer (repeated as needed), or "!" with NaN logprobs if
    ``garbage`` (see :mod:`llm_health.sim.tokens`).
    """
    steps = steps_for(call.spec, garbage)
    if not call.params.stream:
        if not await admit(call):
            message = "simulated engine admitted nothing before hang_max"
            return await send_whole(call, error_response(504, message, "GatewayTimeoutError"))
        await pause(call, ttft)
        call.mark_running()
        call.mark_first_token()  # the first token exists now: an engine's TTFT ends here
        await _decode(call)
        whole = await send_whole(call, web.json_response(full_body(call, steps)))
        call.note_first_token_written()  # --record-first-tokens: the bytes are written now
        call.mark_completed()
        return whole
    response = await _open_stream(call)
    if not await admit(call):  # the headers went out; the engine never starts it
        await response.write_eof()
        return response
    await pause(call, ttft)
    call.mark_running()
    last = call.params.max_tokens - 1
    offset = 0
    for index in range(call.params.max_tokens):
        if call.state.fault.fault == "frozen":  # the engine core stopped mid-stream
            await _hang(call)
            await response.write_eof()
            return response
        call.state.generation_tokens += 1
        step = steps[index % len(steps)]
        finish = "length" if index == last else None
        await send_event(response, token_chunk(call, step, offset, finish))
        call.note_first_token_written()  # --record-first-tokens (probes; once, first)
        call.mark_first_token()  # written: the TTFT ends here (observed once)
        offset += len(step.text)
        # Also after the last token: a client closing right after it is still seen.
        await pause(call, call.spec.tpot)
    if call.params.include_usage:
        await send_event(response, usage_chunk(call))
    await _end_stream(response)
    call.mark_completed()
    return response


async def _decode(call: Call) -> None:
    """A whole answer's tokens, counted one by one as the engine decodes them (its
    generation counter moves meanwhile); a freeze stops it (then a hang)."""
    call.state.generation_tokens += 1
    for _ in range(call.params.max_tokens - 1):
        await pause(call, call.spec.tpot)
        if call.state.fault.fault == "frozen":
            await _hang(call)
        call.state.generation_tokens += 1


async def _hang(call: Call) -> None:
    """Wait up to ``hang_max``, ending early on disconnect or shutdown (by raising)."""
    await pause(call, call.spec.hang_max)


# ------------------------------------------------------------ fault handlers


async def _fault_none(call: Call) -> web.StreamResponse:
    """Normal service: TTFT wait, then tokens every tpot."""
    return await _generate(call, call.spec.draw_ttft(call.state.rng))


async def _fault_garbage_tokens(call: Call) -> web.StreamResponse:
    """Normal timing and shape, but every token is "!" with id 0 and NaN logprobs."""
    return await _generate(call, call.spec.draw_ttft(call.state.rng), garbage=True)


async def _fault_slow_under_load(call: Call) -> web.StreamResponse:
    """Normal service whose TTFT grows with the other requests in flight."""
    others = max(0, call.state.in_flight - 1)
    extra = call.spec.load_ttft_per_request * others
    return await _generate(call, call.spec.draw_ttft(call.state.rng) + extra)


async def _fault_not_admitting(call: Call) -> web.StreamResponse:
    """ "frozen", "deadlock": normal service, which ``admit`` never lets start while the
    fault holds (the faults act on the engine: whichever fault a request drew, probes
    spared by ``affects`` too, nothing new is admitted)."""
    return await _generate(call, call.spec.draw_ttft(call.state.rng))


async def _fault_hang_before_headers(call: Call) -> web.StreamResponse:
    """Never answer; after ``hang_max`` give up with a 504."""
    await _hang(call)
    message = "simulated hang ended after hang_max"
    return await send_whole(call, error_response(504, message, "GatewayTimeoutError"))


async def _fault_hang_after_headers(call: Call) -> web.StreamResponse:
    """Send 200 headers, then nothing; after ``hang_max`` end the empty body."""
    response = await open_response(call)
    await _hang(call)
    await response.write_eof()
    return response


async def _fault_hang_after_role_chunk(call: Call) -> web.StreamResponse:
    """Chat streams: flush the role delta, then nothing. Others: hang after headers."""
    if not (call.params.stream and call.kind == "chat"):
        return await _fault_hang_after_headers(call)
    response = await _open_stream(call)
    await _hang(call)
    await response.write_eof()
    return response


async def _fault_hang_after_first_token(call: Call) -> web.StreamResponse:
    """Streams: the role delta (chat) and the first token at the normal TTFT, then
    nothing: a hang mid-body. A non-streamed request: hang before headers."""
    if not call.params.stream:
        return await _fault_hang_before_headers(call)
    response = await _open_stream(call)
    await pause(call, call.spec.draw_ttft(call.state.rng))
    call.mark_running()
    finish = "length" if call.params.max_tokens == 1 else None
    await send_event(response, token_chunk(call, steps_for(call.spec, False)[0], 0, finish))
    call.note_first_token_written()
    call.mark_first_token()
    await _hang(call)
    await response.write_eof()
    return response


async def _fault_http_500(call: Call) -> web.StreamResponse:
    """A generic 500."""
    return await send_whole(
        call, error_response(500, "Internal Server Error", "InternalServerError")
    )


async def _fault_cuda_error(call: Call) -> web.StreamResponse:
    """A 500 whose body carries vLLM's CUDA illegal-memory-access / EngineDeadError text."""
    return await send_whole(call, error_response(500, CUDA_ERROR_MESSAGE, "InternalServerError"))


async def _fault_error_mid_stream(call: Call) -> web.StreamResponse:
    """200 SSE, then after the TTFT wait an error event (CUDA error), then [DONE]."""
    if not call.params.stream:
        await pause(call, call.spec.draw_ttft(call.state.rng))
        return await _fault_cuda_error(call)
    response = await _open_stream(call)
    await pause(call, call.spec.draw_ttft(call.state.rng))
    await send_event(response, error_body(CUDA_ERROR_MESSAGE, "InternalServerError", 500))
    await _end_stream(response)
    return response


async def _fault_overloaded(call: Call) -> web.StreamResponse:
    """429 (rate limited) or 503 (overloaded) per ``overload_status``, with Retry-After."""
    if call.spec.overload_status == 429:
        message, error_type = "Too many requests, please try again later", "RateLimitError"
    else:
        message = "Server overloaded: too many pending requests"
        error_type = "ServiceUnavailableError"
    response = error_response(
        call.spec.overload_status, message, error_type, headers={"Retry-After": "1"}
    )
    return await send_whole(call, response)


async def _fault_garbage_stream(call: Call) -> web.StreamResponse:
    """200, then after the TTFT wait lines of non-JSON junk, no token, then the end."""
    response = await open_response(call)
    await pause(call, call.spec.draw_ttft(call.state.rng))
    for line in _GARBAGE_LINES:
        await response.write(line)
    await response.write_eof()
    return response


async def _fault_close_after_headers(call: Call) -> web.StreamResponse:
    """Send 200 headers, then abort the TCP connection (RST, no body)."""
    response = await open_response(call)
    transport = call.request.transport
    if transport is not None:
        transport.abort()
    return response


async def _fault_startup_delay(call: Call) -> web.StreamResponse:
    """503 "Model is still loading" (reached only while the delay runs)."""
    response = error_response(503, "Model is still loading", "ServiceUnavailableError")
    return await send_whole(call, response)


async def _fault_http_500_echo(call: Call) -> web.StreamResponse:
    """A 500 whose message quotes the request headers, Authorization included: what a
    debugging proxy or a careless engine does, and what llm-health must never repeat."""
    quoted = "; ".join(f"{name}: {value}" for name, value in call.request.headers.items())
    message = f"upstream rejected the request with headers {quoted}"
    return await send_whole(call, error_response(500, message, "InternalServerError"))


_FAULT_HANDLERS: Mapping[str, Callable[[Call], Awaitable[web.StreamResponse]]] = {
    "none": _fault_none,
    "hang_before_headers": _fault_hang_before_headers,
    "hang_after_headers": _fault_hang_after_headers,
    "hang_after_role_chunk": _fault_hang_after_role_chunk,
    "hang_after_first_token": _fault_hang_after_first_token,
    "http_500": _fault_http_500,
    "http_500_echo": _fault_http_500_echo,
    "cuda_error": _fault_cuda_error,
    "error_mid_stream": _fault_error_mid_stream,
    "overloaded": _fault_overloaded,
    "garbage_stream": _fault_garbage_stream,
    "close_after_headers": _fault_close_after_headers,
    "startup_delay": _fault_startup_delay,
    "slow_under_load": _fault_slow_under_load,
    "garbage_tokens": _fault_garbage_tokens,
    "frozen": _fault_not_admitting,
    "deadlock": _fault_not_admitting,
}
