"""The admin API (docs/design.md §5.4): operators list, watch, drain, force and probe
endpoints through ``llm_health.v1.Admin``.

- ``settings``: the ``admin:`` section (where it listens, its token);
- ``component``: the runtime component: where the API is served, and the backend the
  servicer calls, over ``BoardControl``.

The gRPC adapters (servicer, token guard, protobuf codec) are ``servers.admin`` and
``servers.admin_codec``.
"""
