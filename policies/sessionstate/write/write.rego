# METADATA
# title: Session state writes and previews
# description: >-
#   Decides the actions `write` (store a session state record durably) and
#   `preview` (a dry run of that write). Access gates say whether the caller
#   may act on the target session at all; store gates say whether a real
#   write would be allowed to store the record. A write needs every gate to
#   pass. A preview needs only the access gates, and still lists every
#   failing store gate so the caller learns what would block a real write.
# schemas:
#   - input: schema.policy_input
package sessionstate.write

import data.sessionstate.lib

# METADATA
# title: Write decision
# description: >-
#   `allow`, and `reasons`: the sorted, unique codes of every failing gate.
#   Always defined, so the service never has to guess.
# entrypoint: true
decision := {"allow": allow, "reasons": sort(reasons)}

# Reasons from both kinds of gate; blockers may repeat a code, the set dedupes.
reasons := _access_reasons | _store_reasons

default allow := false

allow if {
	input.action == "write"
	count(reasons) == 0
}

# A preview never stores anything, so only access decides it.
allow if {
	input.action == "preview"
	count(_access_reasons) == 0
}

# --- Access gates: may this caller act on this session at all? ---

_access_reasons contains "action_not_supported" if not input.action in {"preview", "write"}

# Only model services write session state; operators approve, they do not write.
_access_reasons contains "role_not_permitted" if not lib.has_role(input.actor, "model-service")

_access_reasons contains "session_state_cross_tenant_write_rejected" if {
	not lib.same_tenant(input.actor, input.target)
}

# Reported only within the tenant: across tenants the tenant code says it all.
_access_reasons contains "session_state_cross_session_write_rejected" if {
	lib.same_tenant(input.actor, input.target)
	not lib.same_session(input.actor, input.target)
}

# --- Store gates: would a real write be allowed to store this record? ---

# Durable writes are off unless the deployment turns them on.
_store_reasons contains "session_state_durable_writes_disabled" if not input.deployment.durable_writes_enabled

_store_reasons contains "session_state_operator_approval_missing" if not _approval_covers_target

# --- Tenant settings (data.sessionstate.tenants): each one only ever restricts ---

# A tenant whose settings turn durable writes off stores nothing, whatever the
# deployment allows. Anything but `true` there counts as off: fail closed.
_store_reasons contains "session_state_tenant_durable_writes_disabled" if {
	_tenant_settings.durable_writes != true
}

# A tenant may limit the task profiles its model services write; a record of
# another profile (or a limit that is no list) is refused.
_store_reasons contains "session_state_task_profile_not_permitted" if {
	profiles := _tenant_settings.write_task_profiles
	not input.record.task_profile in profiles
}

# The record gates below read input.record; with no record they stay silent,
# and this gate alone reports it.
_store_reasons contains "session_state_record_missing" if object.get(input, "record", null) == null

# v2 records carry a summary of compacted turns; v1 records (written before
# compaction existed) are still read as they are, so both are known schemas.
_store_reasons contains "session_state_schema_mismatch" if not input.record.schema in _record_schemas

# A record must be anchored to memory and gene chains to be replayable.
_store_reasons contains "session_state_memory_anchor_missing" if input.record.counts.memory_anchors == 0

_store_reasons contains "session_state_gene_anchor_missing" if input.record.counts.gene_anchors == 0

# The store holds digests only, never transcripts.
_store_reasons contains "session_state_raw_messages_forbidden" if input.record.flags.raw_messages_stored

# A stored record must describe itself as inert: read-only, report-only,
# preview-only and not writable. Anything else claims powers it must not have.
_store_reasons contains "session_state_preview_flags_invalid" if {
	some flag in {"read_only", "report_only", "preview_only"}
	input.record.flags[flag] == false
}

_store_reasons contains "session_state_preview_flags_invalid" if input.record.flags.write_allowed

_store_reasons contains "session_state_digest_mismatch" if input.record.digest_valid == false

# The service's own validation blockers pass through, so they always block a write.
_store_reasons contains blocker if some blocker in input.record.blockers

# The target tenant's settings; undefined when it has none.
_tenant_settings := lib.tenant_settings(input.target.tenant_id)

# The record schemas a write may carry.
_record_schemas := {"sessionstate.record.v1", "sessionstate.record.v2"}

# --- Operator approval ---

# An approval counts only while live (issued, not yet expired, not revoked;
# a missing `revoked` flag does not count as "not revoked") and only for the
# target's exact tenant and workspace.
_approval_covers_target if {
	approval := input.approval
	approval.revoked == false
	approval.issued_at <= input.now
	input.now < approval.expires_at
	approval.tenant_id == input.target.tenant_id
	approval.workspace_id == input.target.workspace_id
	_covers_session(approval, input.target)
}

# An approval without a session covers the whole workspace ...
_covers_session(approval, _) if object.get(approval, "session_id", null) == null

# ... one with a session covers that session only.
_covers_session(approval, target) if approval.session_id == target.session_id
