# METADATA
# title: Session tokens by token exchange
# description: >-
#   Decides `token.exchange`: whether `POST /v1/token` (OAuth 2.0 Token
#   Exchange, RFC 8693) issues a session-scoped token for the session its
#   `resource` names. Every request to the endpoint is decided here, even one
#   whose subject token did not verify or whose resource is unusable: the
#   service says what it found in `input.exchange` (one word per parameter,
#   never its value), so the refusal is a decision on the log like any other.
#   By default a model service's token scoped to a tenant and a workspace,
#   and to no session, obtains tokens for the sessions of exactly that
#   workspace; nothing else does. A tenant's settings may turn it off.
# schemas:
#   - input: schema.policy_input
package sessionstate.token

import data.sessionstate.lib

# METADATA
# title: Token exchange decision
# description: >-
#   `allow`, and `reasons`: the sorted, unique codes of every failing gate.
#   Always defined, so the service never has to guess.
# entrypoint: true
decision := {"allow": allow, "reasons": sort(reasons)}

default allow := false

allow if count(reasons) == 0

reasons := (_request_reasons | _subject_reasons) | _target_reasons

# --- The request: an exchange this service supports, well formed ---

_request_reasons contains "action_not_supported" if input.action != "token.exchange"

# With no exchange facts there is nothing to judge: refused.
_request_reasons contains "token_exchange_request_malformed" if object.get(input, "exchange", null) == null

_request_reasons contains "token_exchange_request_malformed" if input.exchange.form != "valid"

_request_reasons contains "token_exchange_parameter_missing" if {
	some parameter in ["grant_type", "subject_token_type", "subject_token"]
	input.exchange[parameter] == "missing"
}

_request_reasons contains "token_exchange_grant_type_unsupported" if input.exchange.grant_type == "unsupported"

# A JWT, or an OAuth access token that is one; nothing else is verified here.
_request_reasons contains "token_exchange_subject_token_type_unsupported" if {
	input.exchange.subject_token_type == "unsupported"
}

# Delegation (an actor token beside the subject token) is not supported.
_request_reasons contains "token_exchange_actor_token_unsupported" if input.exchange.actor_token != "absent"

_request_reasons contains "token_exchange_resource_missing" if input.exchange.resource == "missing"

_request_reasons contains "token_exchange_resource_malformed" if input.exchange.resource == "malformed"

# --- The subject token: verified as any request's bearer token is ---

_subject_reasons contains "token_exchange_subject_token_invalid" if input.exchange.subject_token == "invalid"

_subject_reasons contains "token_exchange_subject_token_expired" if input.exchange.subject_token == "expired"

# The identity provider's keys could not be had: the service answers 503.
_subject_reasons contains "token_exchange_subject_token_unverifiable" if {
	input.exchange.subject_token == "unverifiable"
}

# Only model services get session tokens: operators and auditors never, even
# a token that names the model-service role beside one of theirs.
_subject_reasons contains "role_not_permitted" if {
	_subject_verified
	not lib.has_role(input.actor, "model-service")
}

_subject_reasons contains "role_not_permitted" if {
	_subject_verified
	some role in {"operator", "auditor"}
	lib.has_role(input.actor, role)
}

# The subject must be scoped to a tenant and a workspace, and to no session: a
# tenant-wide token is too wide to act for a session, a session token (one
# issued by an exchange included) may not obtain tokens for any session.
_subject_reasons contains "token_exchange_subject_scope_unsupported" if {
	_subject_verified
	some claim in ["tenant_id", "workspace_id"]
	object.get(input.actor, claim, null) == null
}

_subject_reasons contains "token_exchange_subject_scope_unsupported" if {
	_subject_verified
	object.get(input.actor, "session_id", null) != null
}

# --- The target: a session of exactly the subject's workspace ---

_target_reasons contains "cross_tenant_scope_rejected" if {
	_judged
	not lib.same_tenant(input.actor, input.target)
}

# Reported only within the tenant: across tenants the tenant code says it all.
_target_reasons contains "cross_workspace_scope_rejected" if {
	_judged
	lib.same_tenant(input.actor, input.target)
	object.get(input.actor, "workspace_id", null) != input.target.workspace_id
}

# A session token asking for another session than its own.
_target_reasons contains "cross_session_scope_rejected" if {
	_judged
	lib.same_tenant(input.actor, input.target)
	object.get(input.actor, "session_id", null) != null
	input.actor.session_id != input.target.session_id
}

# A tenant may turn token exchange off for its sessions. Anything but `true`
# there counts as off: fail closed.
_target_reasons contains "token_exchange_tenant_disabled" if {
	_judged
	lib.tenant_settings(input.target.tenant_id).token_exchange != true
}

# The actor is a verified token's, not the anonymous one.
_subject_verified if input.exchange.subject_token == "valid"

# Scope is judged only for a verified subject and a session the resource named.
_judged if {
	_subject_verified
	input.exchange.resource == "valid"
}
