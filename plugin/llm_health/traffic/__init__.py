"""Passive health from real traffic (docs/design.md §15): what Envoy's access-log stream
and the engines' TTFT histograms say about each endpoint.

- ``settings``: the ``probe.quality`` and ``probe.backoff_when_busy`` sections;
- ``entries``: one Envoy HTTP access-log entry -> one ``Request`` (pure; untrusted input);
- ``window``: a rolling window per endpoint, O(1) per request, bounded memory;
- ``quality``: the window -> a verdict ("error rate 3.1 % over 60 s (412 requests)");
- ``busy``: when real traffic already proves an endpoint healthy, fewer probes;
- ``component``: all of it wired to the board, the gRPC port and the scheduler.

The parts above ``component`` depend on ``model``, ``errors`` and ``core`` (and Envoy's
protos) only.
"""
