"""Tests of `service.http`: every route over real HTTP, the front's bounded reads and the
reviewer's page."""
