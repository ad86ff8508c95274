"""Endpoints from DNS (docs/design.md §11): a cluster's addresses from A/AAAA records of a
name (a Kubernetes headless Service) or from SRV records (a port per target).

- ``settings``: the ``clusters[].discovery`` and ``dns:`` sections (pydantic), the very
  types the resolver and the watchers receive;
- ``answers``: pure rules: which records make endpoints, how long until the next
  resolution, what a fault is called;
- ``lookup``: the resolver (dnspython's asyncio resolver, no cache of its own);
- ``watcher``: one cluster's resolve loop: back-off on faults, the last good set kept;
- ``component``: the runtime component, one watcher per cluster, following reloads.

All but ``component`` depend on ``model``, ``errors`` and ``core`` only; the app's
endpoint catalog turns a discovered set into board endpoints and probe targets.
"""
