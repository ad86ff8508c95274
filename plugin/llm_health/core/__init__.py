"""The seam between the runtime and its parts: the snapshot hub and the board-control
protocol every source of verdicts (probes, HDS, operators, later fleet peers, passive
traffic signals, discovery) goes through, and the component protocol with its extension
points. Depends on ``model`` (and on prometheus_client for the metric family type)."""
