package system.authz_test

import data.system.authz

# A test-only token of the minimum length (32 characters).
token := "test-token-0123456789abcdefghijk"

runtime := {"env": {"SESSIONSTATE_OPA_TOKEN": token}}

decision_request(package_name) := {
	"identity": token,
	"method": "POST",
	"path": ["v1", "data", "sessionstate", package_name, "decision"],
}

write_request := decision_request("write")

test_service_may_ask_for_each_decision if {
	packages := [
		"write", "read", "replay", "approval", "audit", "token",
		"list", "erase", "history", "rewind", "fork", "batch",
	]
	every package_name in packages {
		authz.allow with input as decision_request(package_name) with opa.runtime as runtime
	}
}

test_anyone_may_check_liveness if {
	authz.allow with input as {"method": "GET", "path": ["health"]} with opa.runtime as runtime
}

test_liveness_served_without_a_configured_token if {
	authz.allow with input as {"method": "GET", "path": ["health"]} with opa.runtime as {"env": {}}
}

test_wrong_token_denied if {
	request := object.union(write_request, {"identity": concat("", [token, "x"])})
	not authz.allow with input as request with opa.runtime as runtime
}

test_missing_token_denied if {
	not authz.allow with input as object.remove(write_request, ["identity"]) with opa.runtime as runtime
}

test_unset_token_variable_denies_everyone if {
	not authz.allow with input as write_request with opa.runtime as {"env": {}}
}

# Even an identity that matches is refused when the configured token is weak.
test_short_token_variable_denies_everyone if {
	short := substring(token, 0, 31)
	request := object.union(write_request, {"identity": short})
	not authz.allow with input as request with opa.runtime as {"env": {"SESSIONSTATE_OPA_TOKEN": short}}
}

test_decisions_only_by_post if {
	every method in ["GET", "PUT", "PATCH", "DELETE"] {
		not authz.allow with input as object.union(write_request, {"method": method}) with opa.runtime as runtime
	}
}

test_no_other_data_paths if {
	every path in [
		["v1", "data"],
		["v1", "data", "sessionstate"],
		["v1", "data", "sessionstate", "write"],
		["v1", "data", "sessionstate", "write", "allow"],
		["v1", "data", "sessionstate", "write", "decision", "allow"],
		["v1", "data", "sessionstate", "lib", "decision"],
		["v1", "data", "system", "authz", "allow"],
		["v0", "data", "sessionstate", "write", "decision"],
	] {
		not authz.allow with input as object.union(write_request, {"path": path}) with opa.runtime as runtime
	}
}

# Policies, data, ad-hoc queries, partial evaluation and config stay closed,
# even to the service's own token.
test_no_management_or_query_api if {
	every request in [
		{"method": "GET", "path": ["v1", "policies"]},
		{"method": "PUT", "path": ["v1", "policies", "sessionstate", "write"]},
		{"method": "DELETE", "path": ["v1", "policies", "sessionstate", "write"]},
		{"method": "GET", "path": ["v1", "data", "sessionstate", "write", "decision"]},
		{"method": "PUT", "path": ["v1", "data", "sessionstate"]},
		{"method": "PATCH", "path": ["v1", "data"]},
		{"method": "POST", "path": ["v1", "query"]},
		{"method": "GET", "path": ["v1", "query"]},
		{"method": "POST", "path": ["v1", "compile"]},
		{"method": "GET", "path": ["v1", "config"]},
		{"method": "GET", "path": ["v1", "status"]},
		{"method": "POST", "path": []},
		{"method": "GET", "path": ["metrics"]},
	] {
		not authz.allow with input as object.union(request, {"identity": token}) with opa.runtime as runtime
	}
}

test_liveness_only_by_get if {
	not authz.allow with input as {"method": "POST", "path": ["health"]} with opa.runtime as runtime
	not authz.allow with input as {"method": "GET", "path": ["health", "plugins"]} with opa.runtime as runtime
}

test_decision_may_ask_for_provenance if {
	request := object.union(write_request, {"params": {"provenance": ["true"]}})
	authz.allow with input as request with opa.runtime as runtime
}

test_decision_may_not_ask_for_an_explanation if {
	every param in ["explain", "instrument", "metrics", "pretty"] {
		request := object.union(write_request, {"params": {param: ["full"]}})
		not authz.allow with input as request with opa.runtime as runtime
	}
}

test_liveness_may_ask_for_bundle_status if {
	request := {"method": "GET", "path": ["health"], "params": {"bundles": ["true"]}}
	authz.allow with input as request with opa.runtime as runtime
}

test_liveness_may_not_ask_for_plugin_status if {
	request := {"method": "GET", "path": ["health"], "params": {"plugins": ["true"]}}
	not authz.allow with input as request with opa.runtime as runtime
}
