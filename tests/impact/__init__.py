"""Tests of `service.impact`: impact analysis of a candidate policy set and how a decision
changes."""
