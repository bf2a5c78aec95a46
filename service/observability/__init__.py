"""What the service says of itself while it runs: its JSON log lines, its Prometheus metrics,
and its OpenTelemetry traces."""
