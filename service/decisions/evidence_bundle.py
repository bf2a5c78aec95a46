"""Evidence bundles: a tenant's decision log entries, packed for a reviewer to verify anywhere.

A bundle is one `.tar.gz` (tar and gzip are in every base system, unlike unzip,
and `tar -xzf` works on Linux, macOS and Windows 10+) holding one directory:

- `entries.ndjson`: the selected entries, byte for byte as stored, in chain order;
- `checkpoint.json`: a checkpoint of the head the whole chain verified up to;
- `manifest.json` and `manifest.sig`: the selection, that head, the `[seq, hash]`
  of every entry and the sha256 of every other file, signed with the checkpoint key;
- `public-key.pem`, `verify.py` (`service.decisions.shipped_verifier`) and `README.md`;
- the chain's Merkle evidence (`service.decisions.bundle_log_proofs`): its checkpoint
  note with the witnesses' cosignatures, each entry's inclusion proof against it, and
  the verifier keys, or, for a chain without a tree, the manifest's word why not.

The manifest covers `verify.py` and `README.md` too, so a reviewer who runs a
verifier obtained separately (`sessionstate decisions verifier`) sees a shipped
one that was replaced.

Each tenant's decisions are a chain of their own, so a tenant's bundle selects
from that chain only and the checkpoint names the tenant. With no filter but the
tenant it ships the whole chain from its start (or retention's anchor) to the
signed head, contiguous, so `verify.py` checks every link by content; with
filters (action, allow, time) a gap between shipped entries is tied to the
signed head by the manifest's `[seq, hash]` list only, and `verify.py` says
which links it checked by content and which rest on the signature. A bundle is
always one chain's: offline, `--tenant` may be left out only while the data dir
holds a single chain.
"""

from __future__ import annotations

import hashlib
import io
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from tempfile import SpooledTemporaryFile
from typing import IO, Any

from jinja2 import Environment, PackageLoader, StrictUndefined
from pydantic import AwareDatetime, BaseModel, ConfigDict, model_validator

from service.config.log_witnesses import WitnessSet
from service.decisions.bundle_log_proofs import (
    PROOFS_FILE,
    TIMESTAMPED_NOTE_FILE,
    WITNESSED_NOTE_FILE,
    LogEvidence,
    log_evidence,
)
from service.decisions.reader import DecisionLogReader
from service.decisions.shipped_verifier import shipped_verifier
from service.policy.input import PolicyAction
from store.canonical import canonical_digest, canonical_json
from store.chain.checkpoints import BUNDLE_MANIFEST_KIND, Checkpoint, CheckpointSigner
from store.chain.entry import parse_entry
from store.chain.head import NO_TENANT_CHAIN, SYSTEM_CHAIN, format_timestamp
from store.chain.log_note import LogSigner
from store.chain.signed_head import ChainUnverified, Verified, verified_checkpoint
from store.chain.walk import ChainVerification
from store.scope import ScopeId
from store.secrets import SecretsHome

_SPOOL_BYTES = 8 << 20  # entries beyond this go to a temporary file, not memory
_README = Environment(
    loader=PackageLoader("service", "templates"),
    autoescape=False,  # noqa: S701 (Markdown, never served as HTML)
    undefined=StrictUndefined,
    keep_trailing_newline=True,
).get_template("evidence/README.md")


class BundleSelection(BaseModel):
    """Which entries a bundle holds: one tenant's (or every tenant's), by decision, by time.

    Times compare with `decision.evaluated_at`, as the API's filters do: `since`
    inclusive, `until` exclusive.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)

    tenant_id: ScopeId | None = None
    action: PolicyAction | None = None
    allow: bool | None = None
    since: AwareDatetime | None = None
    until: AwareDatetime | None = None

    @model_validator(mode="after")
    def _until_after_since(self) -> BundleSelection:
        if self.since is not None and self.until is not None and self.until <= self.since:
            raise ValueError("until must be after since")
        return self

    def matches(self, entry: dict[str, Any]) -> bool:
        decision, target = _member(entry, "decision"), _member(entry, "target")
        if self.tenant_id is not None and target.get("tenant_id") != self.tenant_id:
            return False
        if self.action is not None and decision.get("action") != self.action:
            return False
        if self.allow is not None and decision.get("allow") is not self.allow:
            return False
        if self.since is None and self.until is None:
            return True
        try:
            evaluated = datetime.fromisoformat(decision["evaluated_at"])
        except (KeyError, TypeError, ValueError):
            return False  # no time to compare: not in any time range
        if self.since is not None and evaluated < self.since:
            return False
        return self.until is None or evaluated < self.until

    def document(self) -> dict[str, Any]:
        """The selection as the manifest states it; times in the chain's own UTC form."""
        return {
            "tenant_id": self.tenant_id,
            "action": self.action,
            "allow": self.allow,
            "since": None if self.since is None else format_timestamp(self.since),
            "until": None if self.until is None else format_timestamp(self.until),
        }


def _member(entry: dict[str, Any], name: str) -> dict[str, Any]:
    value = entry.get(name)
    return value if isinstance(value, dict) else {}


@dataclass(frozen=True)
class BundleTree:
    """Whose note the bundle's checkpoint note is (`SESSIONSTATE_LOG_ORIGIN`; None: the
    default origin) and the witnesses whose cosignatures it carries."""

    origin: str | None = None
    witnesses: WitnessSet = field(default_factory=WitnessSet)

    def log_signer(self, secrets: SecretsHome) -> LogSigner:
        return LogSigner.of(secrets, self.origin)


@dataclass(frozen=True)
class EvidenceBundle:
    """What was packed: the file name to offer, how many entries, and the checkpoint."""

    name: str
    entries: int
    checkpoint: Checkpoint

    @property
    def file_name(self) -> str:
        return self.name + ".tar.gz"


def write_bundle(
    sink: IO[bytes],
    reader: DecisionLogReader,
    secrets: SecretsHome,
    selection: BundleSelection,
    issued_at: datetime,
    tree: BundleTree,
) -> EvidenceBundle:
    """Verify the tenant's whole chain, sign its head, and write the bundle of the selected
    entries of that chain, with their Merkle proofs (`service.decisions.bundle_log_proofs`).

    Raises `ChainUnverified` (nothing written) when the chain does not verify, or when
    an entry to ship no longer hashes to its hash; `ValueError` when the selection names
    no tenant and the store holds more than one chain.
    """
    chain = bundle_chain(reader, selection)
    evidence_chain = reader.chain(chain)
    result, checkpoint = verified_checkpoint(evidence_chain, secrets, issued_at)
    if checkpoint is None:
        raise ChainUnverified.of(result, "evidence bundle")
    log = log_evidence(
        evidence_chain, Verified(result, checkpoint), tree.log_signer(secrets), tree.witnesses
    )
    signer = CheckpointSigner.of(secrets)
    verified_from = result.head_seq - result.entries - result.seqs_lost + 1
    with (
        SpooledTemporaryFile(max_size=_SPOOL_BYTES) as staged,
        SpooledTemporaryFile(max_size=_SPOOL_BYTES) as proofs,
    ):
        listed: list[list[int | str]] = []
        for seq, hash_, stored in _selected(reader, chain, selection, checkpoint.seq):
            staged.write(stored + b"\n")
            log.add_proof(proofs, seq, stored)
            listed.append([seq, hash_])
        readme = _readme(chain, selection, listed, checkpoint, result, verified_from, signer, log)
        contents = {
            "README.md": readme.encode(),
            "verify.py": shipped_verifier(),
            "checkpoint.json": checkpoint.model_dump_json().encode() + b"\n",
            "public-key.pem": signer.public_key_pem,
            **log.files,
        }
        streamed = {"entries.ndjson": _digest(staged)}
        if log.absent is None:
            streamed[PROOFS_FILE] = _digest(proofs)
        manifest = {
            "kind": BUNDLE_MANIFEST_KIND,
            "key_id": signer.key_id,
            "issued_at": checkpoint.issued_at,
            "head": {"seq": checkpoint.seq, "hash": checkpoint.head_hash},
            "verified_from_seq": verified_from,
            "selection": selection.document(),
            "entries": listed,
            "log": log.manifest_member(),
            "sha256": {
                **{name: hashlib.sha256(data).hexdigest() for name, data in contents.items()},
                **streamed,
            },
        }
        signed, signature = signer.sign_manifest(manifest)
        name = f"sessionstate-evidence-{chain.lstrip('~')}-{checkpoint.seq}"
        files: list[tuple[str, IO[bytes], int]] = [
            (member, io.BytesIO(data), 0o755 if member == "verify.py" else 0o644)
            for member, data in contents.items()
        ]
        files += [
            ("manifest.json", io.BytesIO(signed), 0o644),
            ("manifest.sig", io.BytesIO(signature), 0o644),
            ("entries.ndjson", staged, 0o644),
        ]
        if log.absent is None:
            files.append((PROOFS_FILE, proofs, 0o644))
        _pack(sink, name, files, issued_at)
    return EvidenceBundle(name=name, entries=len(listed), checkpoint=checkpoint)


def _digest(staged: IO[bytes]) -> str:
    """The sha256 of what was staged, read back in blocks."""
    staged.seek(0)
    digest = hashlib.sha256()
    while block := staged.read(1 << 16):
        digest.update(block)
    return digest.hexdigest()


def _readme(
    chain: str,
    selection: BundleSelection,
    listed: list[list[int | str]],
    checkpoint: Checkpoint,
    result: ChainVerification,
    verified_from: int,
    signer: CheckpointSigner,
    log: LogEvidence,
) -> str:
    return _README.render(
        tenant=f"`{chain}`",
        selection=_describe(selection),
        entries=len(listed),
        first_seq=listed[0][0] if listed else None,
        last_seq=listed[-1][0] if listed else None,
        head_seq=checkpoint.seq,
        head_hash=checkpoint.head_hash,
        verified_from_seq=verified_from,
        chain_entries=result.entries,
        issued_at=checkpoint.issued_at,
        key_id=signer.key_id,
        absent=log.absent,
        log=log.log,
        witnessed_note=WITNESSED_NOTE_FILE in log.files,
        timestamped_note=TIMESTAMPED_NOTE_FILE in log.files,
    )


def bundle_chain(reader: DecisionLogReader, selection: BundleSelection) -> str:
    """The chain a bundle is of: the selection's tenant's, else the only chain there is."""
    if selection.tenant_id is not None:
        return selection.tenant_id
    chains = [name for name in reader.chains() if name != SYSTEM_CHAIN]
    if len(chains) > 1:
        raise ValueError("each tenant's decisions are a chain of their own: name one with --tenant")
    return chains[0] if chains else NO_TENANT_CHAIN


def _selected(
    reader: DecisionLogReader, chain: str, selection: BundleSelection, head_seq: int
) -> Iterator[tuple[int, str, bytes]]:
    """(seq, hash, stored bytes) of each selected entry up to the head, re-checked as shipped."""
    for seq, stored in reader.stored(chain, until_seq=head_seq):
        entry = parse_entry(stored)
        if entry is None:
            raise ChainUnverified("entry_unreadable", seq, "evidence bundle")
        if not selection.matches(entry):
            continue
        body = {name: value for name, value in entry.items() if name != "hash"}
        try:
            holds = canonical_json(entry) == stored and canonical_digest(body) == entry["hash"]
        except Exception:  # no canonical form: the message may quote the content
            holds = False
        if not holds:
            raise ChainUnverified("hash_mismatch", seq, "evidence bundle")
        yield seq, entry["hash"], stored


def _describe(selection: BundleSelection) -> str:
    parts = []
    if selection.action is not None:
        parts.append(f"action `{selection.action}`")
    if selection.allow is not None:
        parts.append("allowed only" if selection.allow else "denied only")
    document = selection.document()
    if selection.since is not None:
        parts.append(f"evaluated at or after {document['since']}")
    if selection.until is not None:
        parts.append(f"evaluated before {document['until']}")
    return ", ".join(parts) or "every entry"


def _pack(
    sink: IO[bytes], name: str, files: list[tuple[str, IO[bytes], int]], issued_at: datetime
) -> None:
    """One directory of regular files, owned by no one, dated when the checkpoint was signed."""
    mtime = int(issued_at.timestamp())
    with tarfile.open(fileobj=sink, mode="w:gz") as archive:
        folder = tarfile.TarInfo(name)
        folder.type, folder.mode, folder.mtime = tarfile.DIRTYPE, 0o755, mtime
        archive.addfile(folder)
        for member, content, mode in files:
            size = content.seek(0, io.SEEK_END)
            content.seek(0)
            info = tarfile.TarInfo(f"{name}/{member}")
            info.size, info.mode, info.mtime = size, mode, mtime
            archive.addfile(info, content)
