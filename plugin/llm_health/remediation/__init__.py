"""Remediation hooks (docs/design.md §13): run a command or call a webhook for an endpoint
that stays in a bad state, within guardrails that keep the automation from becoming the
outage. ``settings``: the ``remediation:`` and ``limits:`` sections, the types the rest
receives; ``decide``: which endpoints are due and which of them the limits let through
(pure, table-tested); ``template``: argv templating (no shell); ``component``: the
runner (child processes, webhook POSTs, the audit).
"""
