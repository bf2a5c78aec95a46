"""The impact report's wire shape, and how it reads as text or in a pull request.

Only ids, actions, reason codes and counts: the logged inputs hold no raw text, and
nothing of them but their decision ids, tenants and actions reaches the report.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

ReportFormat = Literal["text", "json", "markdown"]
FailOn = Literal["none", "any", "allow-gained", "allow-lost"]


class Verdict(BaseModel):
    """A decision's answer: what it allowed and why."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    allow: bool
    reasons: list[str] = Field(description="reason codes, sorted")


class ImpactExample(BaseModel):
    """One decision the candidate would have answered differently."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    decision_id: str
    tenant_id: str | None
    action: str
    before: Verdict = Field(description="as logged")
    after: Verdict = Field(description="as the candidate decides")


class ChangeCounts(BaseModel):
    """Evaluated decisions of one action or tenant, and how they changed (each change a
    count named as `DecisionChange` names it)."""

    model_config = ConfigDict(extra="forbid")

    evaluated: int = 0
    changed: int = 0
    allow_gained: int = 0
    allow_lost: int = 0
    reasons_changed: int = 0


class ReasonCounts(BaseModel):
    """Evaluated decisions on which a reason code appears (gained) or goes (lost)."""

    model_config = ConfigDict(extra="forbid")

    gained: int = 0
    lost: int = 0


class Skipped(BaseModel):
    """Logged decisions not evaluated, and why."""

    model_config = ConfigDict(extra="forbid")

    total: int = 0
    why: dict[str, int] = Field(
        default_factory=dict,
        description="missing_input: the entry holds no input; input_schema_outdated: its "
        "input is not of the current input schema; decided_by_service: the service decided "
        "without OPA (a rate limit summary); engine_unavailable: OPA made no decision then",
    )


class ImpactReport(BaseModel):
    """`sessionstate policy impact --format json` prints exactly this."""

    model_config = ConfigDict(extra="forbid")

    candidate_revision: str = Field(description="the candidate's policy revision (content hash)")
    evaluated: int = 0
    unchanged: int = 0
    changed: int = Field(default=0, description="allow_gained + allow_lost + reasons_changed")
    allow_gained: int = Field(default=0, description="denied as logged, allowed by the candidate")
    allow_lost: int = Field(default=0, description="allowed as logged, denied by the candidate")
    reasons_changed: int = Field(default=0, description="same allow, other reason codes")
    skipped: Skipped = Field(default_factory=Skipped)
    by_action: dict[str, ChangeCounts] = Field(default_factory=dict)
    by_reason: dict[str, ReasonCounts] = Field(default_factory=dict)
    by_tenant: dict[str, ChangeCounts] = Field(
        default_factory=dict, description='by tenant id ("" for decisions that name none)'
    )
    examples: list[ImpactExample] = Field(default_factory=list)

    def fails(self, fail_on: FailOn) -> bool:
        """Whether the `--fail-on` condition holds."""
        if fail_on == "any":
            return self.changed > 0
        if fail_on == "allow-gained":
            return self.allow_gained > 0
        if fail_on == "allow-lost":
            return self.allow_lost > 0
        return False


_COLUMNS = tuple(ChangeCounts.model_fields)


def render(report: ImpactReport, form: ReportFormat) -> str:
    if form == "json":
        return report.model_dump_json()
    if form == "markdown":
        return _markdown(report)
    return _text(report)


def _verdict(verdict: Verdict) -> str:
    return ("allow" if verdict.allow else "deny") + (
        f" ({', '.join(verdict.reasons)})" if verdict.reasons else ""
    )


def _summary_rows(report: ImpactReport) -> list[tuple[str, str]]:
    skipped = ", ".join(f"{why} {count}" for why, count in sorted(report.skipped.why.items()))
    return [
        ("candidate revision", report.candidate_revision),
        ("evaluated", str(report.evaluated)),
        ("unchanged", str(report.unchanged)),
        ("changed", str(report.changed)),
        ("allow gained (deny -> allow)", str(report.allow_gained)),
        ("allow lost (allow -> deny)", str(report.allow_lost)),
        ("reasons changed (same allow)", str(report.reasons_changed)),
        ("skipped", f"{report.skipped.total}" + (f" ({skipped})" if skipped else "")),
    ]


def _count_rows(counts: dict[str, ChangeCounts]) -> list[list[str]]:
    return [
        [name or "(none)", *(str(getattr(count, column)) for column in _COLUMNS)]
        for name, count in sorted(counts.items())
    ]


def _reason_rows(report: ImpactReport) -> list[list[str]]:
    return [
        [code, str(count.gained), str(count.lost)]
        for code, count in sorted(report.by_reason.items())
    ]


def _example_rows(report: ImpactReport) -> list[list[str]]:
    return [
        [
            example.decision_id,
            example.tenant_id or "(none)",
            example.action,
            _verdict(example.before),
            _verdict(example.after),
        ]
        for example in report.examples
    ]


_EXAMPLE_HEADER = ["decision id", "tenant", "action", "before", "after"]


def _text(report: ImpactReport) -> str:
    width = max(len(label) for label, _ in _summary_rows(report))
    lines = [f"{label:<{width}}  {value}" for label, value in _summary_rows(report)]
    for title, header, rows in (
        ("by action", ["action", *_COLUMNS], _count_rows(report.by_action)),
        ("by tenant", ["tenant", *_COLUMNS], _count_rows(report.by_tenant)),
        ("by reason", ["reason", "gained", "lost"], _reason_rows(report)),
        ("examples", _EXAMPLE_HEADER, _example_rows(report)),
    ):
        if rows:
            lines += ["", title, *_table(header, rows)]
    return "\n".join(lines)


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(row[index]) for row in (header, *rows)) for index in range(len(header))]
    return [
        "  ".join(cell.ljust(widths[index]) for index, cell in enumerate(row)).rstrip()
        for row in (header, *rows)
    ]


def _markdown(report: ImpactReport) -> str:
    lines = [
        "### Policy impact",
        "",
        "| | |",
        "| --- | ---: |",
        *(f"| {label} | `{value}` |" for label, value in _summary_rows(report)),
    ]
    for title, header, rows in (
        ("By action", ["action", *_COLUMNS], _count_rows(report.by_action)),
        ("By tenant", ["tenant", *_COLUMNS], _count_rows(report.by_tenant)),
        ("By reason", ["reason", "gained", "lost"], _reason_rows(report)),
        ("Examples", _EXAMPLE_HEADER, _example_rows(report)),
    ):
        if rows:
            lines += ["", f"#### {title}", "", _markdown_row(header)]
            lines.append(_markdown_row(["---"] * len(header)))
            lines += [_markdown_row(row) for row in rows]
    return "\n".join(lines)


def _markdown_row(cells: list[str]) -> str:
    return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"
