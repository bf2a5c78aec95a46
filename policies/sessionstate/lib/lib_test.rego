package sessionstate.lib_test

import data.sessionstate.lib

session_a := {"tenant_id": "tenant-a", "workspace_id": "ws-a", "session_id": "session-a"}

test_has_role_when_token_carries_it if {
	lib.has_role({"roles": ["auditor", "operator"]}, "operator")
}

test_has_role_needs_an_exact_match if {
	not lib.has_role({"roles": ["Operator", "operators"]}, "operator")
	not lib.has_role({"roles": []}, "operator")
}

test_same_tenant_when_ids_equal if {
	lib.same_tenant(session_a, {"tenant_id": "tenant-a"})
}

test_same_tenant_compares_ids_byte_for_byte if {
	not lib.same_tenant(session_a, {"tenant_id": "tenant-A"})
	not lib.same_tenant(session_a, {"tenant_id": "tenant-a "})
}

test_actor_without_tenant_matches_no_tenant if {
	not lib.same_tenant({"tenant_id": null}, {"tenant_id": "tenant-a"})
	not lib.same_tenant({}, {"tenant_id": "tenant-a"})
	not lib.same_tenant({"tenant_id": null}, {"tenant_id": null})
}

test_same_session_when_workspace_and_session_equal if {
	lib.same_session(session_a, session_a)
}

test_other_workspace_or_session_is_not_same_session if {
	not lib.same_session(session_a, object.union(session_a, {"workspace_id": "ws-b"}))
	not lib.same_session(session_a, object.union(session_a, {"session_id": "session-b"}))
}

# A token scoped to a whole tenant or workspace is not scoped to a session.
test_wider_token_is_not_same_session if {
	not lib.same_session({"tenant_id": "tenant-a"}, session_a)
	not lib.same_session({"tenant_id": "tenant-a", "workspace_id": "ws-a", "session_id": null}, session_a)
}

test_missing_and_null_ids_are_the_same if {
	lib.same_session({"workspace_id": "ws-a"}, {"workspace_id": "ws-a", "session_id": null})
}
