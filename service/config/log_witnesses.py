"""`SESSIONSTATE_LOG_WITNESSES` and `SESSIONSTATE_LOG_WITNESS_QUORUM`, parsed: the C2SP
tlog-witnesses that cosign the decision log's checkpoint notes, and how many of them a
head needs.

The setting is a JSON array of `{"vkey": "<the witness's note verifier key>", "url":
"<its base URL>"}`: each vkey must parse as a note key of type 0x04 (a tlog-cosignature
v1 Ed25519 key, `store.chain.cosignature`), each url must be http(s)://host[/path],
and no witness may be named twice. The quorum defaults to every witness configured and
must be between 1 and their count. A value that does not hold is a `ConfigurationError`
naming the variable and what is wrong (with the witness's place in the array), never
the value.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError

from service.config.configuration_error import ConfigurationError
from service.config.http_url import is_http_url
from service.config.settings import MAX_WITNESSES, Settings
from store.chain.cosignature import COSIGNATURE_V1
from store.chain.note import NoteError, VerifierKey

WITNESSES = "SESSIONSTATE_LOG_WITNESSES"
QUORUM = "SESSIONSTATE_LOG_WITNESS_QUORUM"


class _WitnessEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)

    vkey: str
    url: str


_ENTRIES = TypeAdapter(list[_WitnessEntry])


@dataclass(frozen=True)
class LogWitness:
    """One witness: its cosignature key and where `/add-checkpoint` is posted."""

    vkey: VerifierKey
    url: str

    @property
    def name(self) -> str:
        return self.vkey.name

    @property
    def add_checkpoint_url(self) -> str:
        return self.url.rstrip("/") + "/add-checkpoint"


@dataclass(frozen=True)
class WitnessSet:
    """The witnesses configured (none: the log is not witnessed) and the quorum."""

    witnesses: tuple[LogWitness, ...] = ()
    quorum: int = 0

    def __bool__(self) -> bool:
        return bool(self.witnesses)


def log_witnesses(settings: Settings) -> WitnessSet:
    """The witnesses and quorum the settings name; `ConfigurationError` when they do not hold."""
    raw = settings.log_witnesses
    witnesses = () if raw is None else _parsed(raw)
    quorum = settings.log_witness_quorum
    if quorum is not None and not 1 <= quorum <= len(witnesses):
        raise ConfigurationError(
            f"{QUORUM} must be from 1 to the number of witnesses in {WITNESSES}"
        )
    return WitnessSet(witnesses, len(witnesses) if quorum is None else quorum)


def _parsed(raw: str) -> tuple[LogWitness, ...]:
    try:
        entries = _ENTRIES.validate_json(raw)
    except ValidationError:
        raise ConfigurationError(
            f'{WITNESSES} must be a JSON array of {{"vkey": "<note verifier key>", '
            '"url": "<http(s) base URL>"}} objects'
        ) from None
    if len(entries) > MAX_WITNESSES:
        raise ConfigurationError(f"{WITNESSES} names at most {MAX_WITNESSES} witnesses")
    witnesses = tuple(_witness(index, entry) for index, entry in enumerate(entries))
    names = [w.name for w in witnesses]
    if len(set(names)) != len(names):
        raise ConfigurationError(f"{WITNESSES} names a witness key twice")
    return witnesses


def _witness(index: int, entry: _WitnessEntry) -> LogWitness:
    where = f"{WITNESSES} witness {index + 1}"
    try:
        vkey = VerifierKey.parse(entry.vkey)
        vkey.ed25519_key(COSIGNATURE_V1)
    except NoteError as error:
        raise ConfigurationError(
            f"{where}: its vkey must be a note verifier key of type 0x04 "
            f"(a tlog-cosignature v1 Ed25519 key): {error}"
        ) from None
    if not is_http_url(entry.url):
        raise ConfigurationError(
            f"{where}: its url must be http(s)://host[:port][/path], without query or user"
        )
    return LogWitness(vkey, entry.url)
