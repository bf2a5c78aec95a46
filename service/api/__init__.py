"""The v1 HTTP contract users read in docs/api.md: its constants (`v1`), its reason codes
(`reasons`), its response envelopes (`wire`) and the OpenAPI document made from them
(`openapi`). The routes that serve it are `service.http`'s."""
