"""The server's test suite, one folder per package it specifies; shared helpers in
`tests.support`."""
