"""Endpoints from DNS (docs/design.md §11): a cluster's addresses from A/AAAA records of a
name (a Kubernetes headless Service) or from SRV records (a port per target).

- ``settings``: what ``clusters[].discovery`` and ``dns:`` configure, in domain form;
- ``answers``: pure rules: which records make endpoints, how long until the next
  resolution, what a fault is called;
- ``lookup``: the resolver (dnspython's asyncio resolver, no cache of its own);
- ``watcher``: one cluster's resolve loop: back-off on faults, the last good set kept.

Depends on ``model`` and ``errors`` only; the app turns a discovered set into board
endpoints and probe targets.
"""
