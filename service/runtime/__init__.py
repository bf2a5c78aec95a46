"""The serving process: the data dir held, the port bound, the OPA sidecars started, and HTTP
served by one process or by workers (`serve --workers N`), each through the same `serve_http`."""
