"""Tests of the service's small rooms at its top level: the replay planner and the per-actor
rate limits."""
