"""Fleet mode (docs/design.md §12): gateway replicas sharing one probe per endpoint
through Redis.

- ``settings``: what ``fleet:`` configures, in domain form;
- ``ownership``: rendezvous hashing of endpoints over live members (pure);
- ``wire``: verdicts, membership and operator actions as stored in Redis: encoding,
  strict decoding of what other replicas wrote (untrusted), the rules for applying one;
- ``scripts``: the Lua scripts that make membership, fencing and publishing atomic;
- ``store``: the Redis client (redis.asyncio) running them.

Depends on ``model`` and ``errors`` only; ``app.fleet`` wires it to the board and prober.
"""
