"""The HTTP surface: blueprints by audience, problems, body parsing."""
