"""Reports read back what they write: one model per wire shape, both ways."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from store.record.reports import SessionStateWriteReport

KEY = "sha256:" + "ab" * 32


@pytest.mark.parametrize("applied", [True, False])
def test_a_write_report_round_trips_with_preview_only_derived(applied: bool) -> None:
    report = SessionStateWriteReport(applied=applied, durable_write_requested=True, key_digest=KEY)
    assert report.preview_only is (not applied)
    dumped = report.model_dump(mode="json")
    assert SessionStateWriteReport.model_validate(dumped) == report
    assert dumped["preview_only"] is (not applied)


def test_a_report_whose_preview_only_contradicts_applied_is_refused() -> None:
    document = {
        "applied": True,
        "durable_write_requested": True,
        "key_digest": KEY,
        "preview_only": True,
    }
    with pytest.raises(ValidationError) as refused:
        SessionStateWriteReport.model_validate(document)
    assert refused.value.errors()[0]["type"] == "preview_only_contradicts_applied"
    assert document["preview_only"] is True  # the caller's document is left as it was
