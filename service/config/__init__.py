"""Configuration: the settings read from the environment, each parsed into the typed value the
service works with, and the error that names a setting which cannot work."""
