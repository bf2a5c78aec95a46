"""The decision log's evidence chain: one append-only, tamper-evident hash chain per tenant.

A compliance reviewer must be able to tell that no recorded entry was edited,
removed, inserted or reordered after the fact. So every entry carries its `seq`,
the previous entry's `hash`, and its own `hash` (the canonical digest of the
entry without `hash`): changing any entry breaks it or the link to it. Cutting
the newest entries leaves a shorter chain that still links; only a checkpoint
signed earlier (`store.chain.checkpoints`) shows that.

The package's modules: where a chain lives in the store (`keys`), the entry
format and its sealing (`entry`), entries added to a batch with what guards
them (`append`), the retention anchor as stored (`anchor`), the verification
walk (`walk`), and the chain over a lane store (`evidence`: `EvidenceChain`).
Around it: where a chain ends and when (`head`), signed checkpoints of a head
(`checkpoints`), the one rule for signing a head only after the walk up to it
held (`signed_head`), the chain's own record of a loss (`loss`), the scrub's
resumable walk of a whole chain (`scrub_pass`) and the last whole walk it or a
verify made (`full_walk`). The chain's Merkle tree: its RFC 9162 hashing and the
standard-library verifiers of its proofs (`rfc9162`), its stored nodes with the
heads and proofs built from them (`merkle_tree`), and what retention may delete
of them (`merkle_retention`); the tree in the lane store (`tree_store`), built
for chains older releases wrote (`tree_build`), its signed C2SP checkpoint
notes (`log_note`) and the proofs served against them (`log_proofs`).
"""
