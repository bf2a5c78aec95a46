"""Tests of `service.runtime`: `sessionstate serve` as a process, alone and with workers, on
LevelDB and PostgreSQL, through full disks and outages."""
