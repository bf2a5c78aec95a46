# METADATA
# title: OPA API authorization
# description: >-
#   Locks down OPA's own HTTP API (OPA runs with --authentication=token
#   --authorization=basic). The sessionstate service may only ask for the
#   decisions it serves (one per package the contract names, and several of
#   them at once through the service's own `sessionstate.batch`), with the
#   shared token from SESSIONSTATE_OPA_TOKEN;
#   anyone may check liveness. Nothing may read or change policies or data,
#   or run ad-hoc queries: a leaked token lets an attacker ask for decisions,
#   nothing more.
package system.authz

# METADATA
# title: allow
# description: Whether OPA serves this API request. Denied unless a rule below allows it.
# scope: document
# entrypoint: true
default allow := false

# The service asks for a decision.
allow if {
	_service_token_presented
	input.method == "POST"
	_only_params({"provenance"})
	some decision_package in _decision_packages
	input.path == ["v1", "data", "sessionstate", decision_package, "decision"]
}

# Liveness probe: answers "up" and reveals nothing else.
allow if {
	input.method == "GET"
	input.path == ["health"]
	_only_params({"bundles"})
}

# Only the query parameters the service uses: `explain` or `instrument` would
# reveal how a policy evaluated, and `pretty` or `metrics` serve no one here.
_only_params(permitted) if {
	every name, _ in object.get(input, "params", {}) {
		name in permitted
	}
}

_decision_packages := {
	"write", "read", "replay", "approval", "audit", "token",
	"list", "erase", "history", "rewind", "fork",
	"batch",
}

# A short token is as good as none: with the variable unset or weak, only
# the liveness probe is served.
_service_token_presented if {
	token := opa.runtime().env.SESSIONSTATE_OPA_TOKEN
	count(token) >= 32
	input.identity == token
}
