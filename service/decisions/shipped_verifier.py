"""The `verify.py` bundles ship and `sessionstate decisions verifier` prints: one file.

The verifier (`service.decisions.bundle_verifier`) checks Merkle proofs with
`store.chain.rfc9162`, which imports only `hashlib` and is written to be shipped as
it is. A reviewer runs `python3 -I verify.py` in a directory of its own, where no
module beside it can be imported (`-I` leaves the script's directory off the path),
so the shipped file is the verifier with that module's code in place of its import
line: one source for both, and the file a reviewer runs needs nothing next to it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import store.chain.rfc9162

VERIFIER = Path(__file__).with_name("bundle_verifier.py")
MERKLE = Path(store.chain.rfc9162.__file__)
IMPORT_LINE = "from store.chain.rfc9162 import leaf_hash, verify_consistency, verify_inclusion\n"
_FUTURE = "from __future__ import annotations\n"


def shipped_verifier() -> bytes:
    """verify.py's bytes: the verifier, `store.chain.rfc9162` inlined."""
    verifier = VERIFIER.read_text(encoding="utf-8")
    if verifier.count(IMPORT_LINE) != 1:
        raise RuntimeError("bundle_verifier.py must import rfc9162 on one line, once")
    return verifier.replace(IMPORT_LINE, _inlined()).encode("utf-8")


def _inlined() -> str:
    """rfc9162's code without its docstring and future import, between two markers."""
    source = MERKLE.read_text(encoding="utf-8")
    docstring = ast.parse(source).body[0]
    body = "".join(source.splitlines(keepends=True)[docstring.end_lineno or 0 :])
    code = body.replace(_FUTURE, "", 1).strip("\n")
    return (
        "# --- store/chain/rfc9162.py, inlined: RFC 9162 Merkle hashing and proofs ---\n"
        f"{code}\n# --- end of store/chain/rfc9162.py ---\n"
    )
