"""sessionstate service: HTTP app, policy client, OPA sidecar, replay planner, CLI."""
