"""``llm-health agent``: the micro-probe, the engine checks and the state machine against
the one engine of its own pod, answered to the kubelet (docs/agent.md).

    settings    the ``agent:`` section; the ``--engine`` URL and ``--http`` address rules
    signals     the kubelet's rules: startup, ready, live, the agent's own health  (pure)
    component   ``AgentSurface``: the HTTP answers, /metrics families, /status

The probing itself is the gateway side's (``probe``, ``model``, ``engines``), wired by
``app.agent``; nothing here judges an engine differently from ``llm-health serve``.
"""
