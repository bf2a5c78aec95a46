"""The HTTP surface: the front that reads requests, blueprints by audience, the one way to a
decision (`authorize`), problem documents and body parsing."""
