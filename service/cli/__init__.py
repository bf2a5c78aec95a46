"""The `sessionstate` command, one module per subcommand (`serve`, `policy`, `token` in
`mint`, `decisions` in `decision_log`, `secrets` in `secret_export`, `db`), dispatched by
`dispatch.main`, which the console script and `python -m service.cli` run."""

from service.cli.dispatch import main

__all__ = ["main"]
