"""Helpers the tests share: the live service in process and as a process, a real PostgreSQL,
factories, damage and paths."""
