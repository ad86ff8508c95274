"""``make demo``: llm-health in front of a real Envoy, live, in about 90 seconds.

Starts three simulators (fast; slow -> Degraded; a zombie whose /health says 200 while
inference hangs), the plugin, and Envoy from envoy-configs/sidecar-ads.yaml; drives a steady
bounded stream of requests through Envoy and shows, per backend, the plugin's verdict, what
Envoy received, and the share of user traffic Envoy sent there. Midway the fast backend
starts failing with a CUDA error, later it heals. Ends by itself or on Ctrl-C, and stops
every process it started.

``make demo-vllm`` (``--engine vllm``): the same table over three real vLLM servers, one
frozen for the middle third, one saturated by a load (``vllm.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
from pathlib import Path

from .engine import MODEL_ENV, VENV_ENV
from .show import Timeline
from .sims import SimCast
from .stage import Cast, Stage
from .vllm import VllmCast

REPO = Path(__file__).resolve().parents[3]
DURATION_S = {"sim": 78.0, "vllm": 90.0}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="llm-health demo", description=__doc__)
    parser.add_argument(
        "--envoy-config", type=Path, default=REPO / "envoy-configs" / "sidecar-ads.yaml"
    )
    parser.add_argument("--duration", type=float, help="seconds of traffic (78; vllm: 90)")
    parser.add_argument("--engine", choices=("sim", "vllm"), default="sim")
    parser.add_argument(
        "--vllm-venv",
        type=Path,
        default=os.environ.get(VENV_ENV),
        help=f"the venv tests/engine/install-vllm.sh made (${VENV_ENV})",
    )
    parser.add_argument(
        "--vllm-model",
        type=Path,
        default=os.environ.get(MODEL_ENV),
        help=f"the model tests/engine/make_vllm_model.py made (${MODEL_ENV})",
    )
    args = parser.parse_args(argv)
    duration = args.duration or DURATION_S[args.engine]
    cast: Cast
    if args.engine == "sim":
        timeline = Timeline(end_at=duration, break_at=duration * 0.32, heal_at=duration * 0.64)
        cast = SimCast(timeline)
    else:
        if args.vllm_venv is None or args.vllm_model is None:
            parser.error("--engine vllm needs --vllm-venv and --vllm-model: run `make demo-vllm`")
        timeline = Timeline(end_at=duration, break_at=duration / 3, heal_at=duration * 2 / 3)
        cast = VllmCast(timeline, args.vllm_venv, args.vllm_model)
    try:
        return asyncio.run(Stage(args.envoy_config, timeline, cast).run())
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("\ninterrupted; every process stopped.")
        return 130
