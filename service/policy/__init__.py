"""Everything that asks OPA and what it is asked: the input, the client, the gate, the sidecar,
and the checks a policy set passes before it is served."""
