"""Tests of `service.approvals`: operator approvals, their one write path and their index."""
