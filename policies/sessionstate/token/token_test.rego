package sessionstate.token_test

import data.sessionstate.token

# A workspace-scoped model service asking for a session of its workspace.
# Tests change it with object.union.
valid_input := {
	"action": "token.exchange",
	"now": 1700000000,
	"actor": {
		"sub": "bot-a",
		"roles": ["model-service"],
		"tenant_id": "tenant-a",
		"workspace_id": "ws-a",
	},
	"target": {"tenant_id": "tenant-a", "workspace_id": "ws-a", "session_id": "user-42"},
	"deployment": {"durable_writes_enabled": false},
	"approval": null,
	"record": null,
	"exchange": {
		"form": "valid",
		"grant_type": "token_exchange",
		"subject_token_type": "jwt",
		"subject_token": "valid",
		"actor_token": "absent",
		"resource": "valid",
	},
}

anonymous := {"sub": "anonymous", "roles": []}

denied(reasons) := {"allow": false, "reasons": reasons}

with_exchange(facts) := object.union(valid_input, {"exchange": facts})

test_workspace_token_obtains_a_session_of_its_workspace if {
	token.decision == {"allow": true, "reasons": []} with input as valid_input
}

test_access_token_type_accepted if {
	token.decision.allow with input as with_exchange({"subject_token_type": "access_token"})
}

test_unsupported_action_rejected if {
	decision := token.decision with input as object.union(valid_input, {"action": "read"})
	decision == denied(["action_not_supported"])
}

test_missing_exchange_facts_rejected if {
	decision := token.decision with input as object.remove(valid_input, ["exchange"])
	decision == denied(["token_exchange_request_malformed"])
}

test_malformed_form_rejected if {
	decision := token.decision with input as with_exchange({"form": "malformed"})
	decision == denied(["token_exchange_request_malformed"])
}

test_each_missing_parameter_rejected if {
	every parameter in ["grant_type", "subject_token_type"] {
		decision := token.decision with input as with_exchange({parameter: "missing"})
		decision == denied(["token_exchange_parameter_missing"])
	}
}

test_missing_subject_token_rejected_for_the_anonymous_actor if {
	request := object.union(with_exchange({"subject_token": "missing"}), {"actor": anonymous})
	decision := token.decision with input as request
	decision == denied(["token_exchange_parameter_missing"])
}

test_unsupported_grant_type_rejected if {
	decision := token.decision with input as with_exchange({"grant_type": "unsupported"})
	decision == denied(["token_exchange_grant_type_unsupported"])
}

test_unsupported_subject_token_type_rejected if {
	decision := token.decision with input as with_exchange({"subject_token_type": "unsupported"})
	decision == denied(["token_exchange_subject_token_type_unsupported"])
}

test_actor_token_rejected if {
	decision := token.decision with input as with_exchange({"actor_token": "present"})
	decision == denied(["token_exchange_actor_token_unsupported"])
}

# Without a usable resource the target is the caller's own tenant: scope is not judged.
test_missing_resource_rejected if {
	request := object.union(with_exchange({"resource": "missing"}), {"target": {"tenant_id": "tenant-a"}})
	decision := token.decision with input as request
	decision == denied(["token_exchange_resource_missing"])
}

test_malformed_resource_rejected if {
	request := object.union(with_exchange({"resource": "malformed"}), {"target": {"tenant_id": "tenant-a"}})
	decision := token.decision with input as request
	decision == denied(["token_exchange_resource_malformed"])
}

# A subject token that did not verify: the anonymous actor, judged on nothing else.
test_unverified_subject_tokens_rejected if {
	every state in ["invalid", "expired", "unverifiable"] {
		request := object.union(with_exchange({"subject_token": state}), {"actor": anonymous})
		decision := token.decision with input as request
		decision == denied([concat("_", ["token_exchange_subject_token", state])])
	}
}

test_anonymous_actor_without_target_tenant_rejected if {
	request := object.union(
		with_exchange({"subject_token": "invalid", "resource": "malformed"}),
		{"actor": anonymous, "target": {"tenant_id": null}},
	)
	decision := token.decision with input as request
	decision == denied(["token_exchange_resource_malformed", "token_exchange_subject_token_invalid"])
}

test_operator_and_auditor_get_no_session_tokens if {
	every role in ["operator", "auditor"] {
		decision := token.decision with input as object.union(valid_input, {"actor": {"roles": [role]}})
		decision == denied(["role_not_permitted"])
	}
}

test_model_service_that_is_also_an_operator_rejected if {
	actor := {"actor": {"roles": ["model-service", "operator"]}}
	decision := token.decision with input as object.union(valid_input, actor)
	decision == denied(["role_not_permitted"])
}

test_tenant_wide_token_rejected if {
	request := object.union(valid_input, {"actor": {"workspace_id": null}})
	decision := token.decision with input as request
	decision == denied(["cross_workspace_scope_rejected", "token_exchange_subject_scope_unsupported"])
}

test_token_without_tenant_rejected if {
	request := object.union(valid_input, {"actor": {"tenant_id": null}})
	decision := token.decision with input as request
	decision == denied(["cross_tenant_scope_rejected", "token_exchange_subject_scope_unsupported"])
}

test_session_token_rejected_for_its_own_session if {
	request := object.union(valid_input, {"actor": {"session_id": "user-42"}})
	decision := token.decision with input as request
	decision == denied(["token_exchange_subject_scope_unsupported"])
}

test_session_token_rejected_for_another_session if {
	request := object.union(valid_input, {"actor": {"session_id": "user-43"}})
	decision := token.decision with input as request
	decision == denied(["cross_session_scope_rejected", "token_exchange_subject_scope_unsupported"])
}

test_session_of_another_workspace_rejected if {
	request := object.union(valid_input, {"target": {"workspace_id": "ws-b"}})
	decision := token.decision with input as request
	decision == denied(["cross_workspace_scope_rejected"])
}

test_session_of_another_tenant_rejected if {
	request := object.union(valid_input, {"target": {"tenant_id": "tenant-b"}})
	decision := token.decision with input as request
	decision == denied(["cross_tenant_scope_rejected"])
}

test_tenant_setting_turns_exchange_off if {
	settings := {"settings": [{"tenant_id": "tenant-a", "token_exchange": false}]}
	decision := token.decision with input as valid_input with data.sessionstate.tenants as settings
	decision == denied(["token_exchange_tenant_disabled"])
}

test_tenant_setting_true_keeps_the_default if {
	settings := {"settings": [{"tenant_id": "tenant-a", "token_exchange": true}]}
	token.decision.allow with input as valid_input with data.sessionstate.tenants as settings
}

test_another_tenants_setting_does_not_apply if {
	settings := {"settings": [{"tenant_id": "tenant-b", "token_exchange": false}]}
	token.decision.allow with input as valid_input with data.sessionstate.tenants as settings
}
