"""Tests of the Python client against the real service: its calls, its wheel in a clean venv,
its contract copies and the example model service."""
