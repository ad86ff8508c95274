"""The seam between the runtime and its parts: the snapshot hub and the board-control
protocol every source of verdicts (probes, HDS, operators, later fleet peers, passive
traffic signals, discovery) goes through. Depends on ``model`` only."""
