"""The operator surface (docs/design.md §5): the HTTP port (/livez, /readyz, /status,
/metrics and the status page at /), the /status document, the Prometheus metrics, the log
format and the scrubbing of secrets from logs and /status. Read by the runtime; reads the
board's snapshots and the components' ``status()``, never drives them."""
