"""Engine checks (docs/design.md §14): what a fast first token does not show: the answer,
the model served, the engine's own load, and which engine it is.

    settings       what ``probe.verify`` and ``probe.engine_metrics`` configure
    verify         judging known-answer answers: garbage, expect, consensus       (pure)
    served_model   the ``/v1/models`` list and the wrong-model reason             (pure)
    metrics        an engine's load from its Prometheus text; staleness           (pure)
    detect         which engine: metric names, info endpoints                     (pure)
    schedule       when each endpoint's side reads are due, within a budget       (pure)
    side_reads     the checks' own bounded HTTP client for those reads
    verdicts       the board's "verify", "model" signals and "engine" limit       (pure)
    book           what the checks know per endpoint, and the checks in force
    board_signal   a signal set on the board, its transitions reported
    known_answer   known-answer probes: when due, judged into the "verify" signal
    load_reads     /metrics reads: saturation ("engine" limit), admission evidence
    model_check    the served-model check and engine detection, as side reads
    read_queue     when side reads start: the due queue, the pending bound, a runner
    report         /status and the Prometheus families
    component      ``EngineChecks``: composes the above for the runtime

What stays in ``probe`` as the probe's own concern: the request body per engine and the
reading of a known-answer stream (``probe.client``, ``probe.answer``), done inside the
exchange, in a probe worker process too. The checks reach the probe through the seams
declared there (``probe.client.ProbeWrapper``, ``probe.client.Question``); the probe never
imports this package. The load figures they share with passive health are pure data in
``model.engine_load``.
"""
