"""llm-health: TTFT micro-probe health checking for Envoy-based LLM gateways."""

__version__ = "0.1.0"
__all__ = ["__version__"]
