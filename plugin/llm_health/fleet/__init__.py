"""Fleet mode (docs/design.md §12): gateway replicas sharing one probe per endpoint
through Redis.

- ``settings``: the ``fleet:`` section (validated; the type the fleet receives);
- ``ownership``: rendezvous hashing of endpoints over live members (pure);
- ``membership``: this replica's mode, epoch, member list and owned endpoints (pure);
- ``verdicts``: which verdicts are published and which adopted: fencing, takeover
  without flap, warm start (pure);
- ``actions``: operator actions shared by the fleet (pure);
- ``wire``: verdicts, membership and operator actions as stored in Redis: encoding,
  strict decoding of what other replicas wrote (untrusted), the rules for applying one;
- ``scripts``: the Lua scripts that make membership, fencing and publishing atomic;
- ``store``: the Redis client (redis.asyncio) running them, and the heartbeat's own
  blocking connection;
- ``pulse``: the heartbeat's thread, which beats whatever the loop is doing;
- ``component``: the ``fleet`` component, wiring all of it to the board
  (``core.control.BoardControl``) and to the catalog's probe filter.
"""
