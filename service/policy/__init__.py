"""Everything that asks OPA and what it is asked: the input, the client, the gate, the sidecar."""
