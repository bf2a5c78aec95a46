"""The decision log: what an entry holds, the journal that orders and commits it, the readers,
offline review and evidence bundles, retention, the scrub, and which policy revisions
decided and when."""
