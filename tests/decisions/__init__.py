"""Tests of `service.decisions`: the journal, group commit, the readers, evidence bundles, the
scrub and the policy revisions."""
