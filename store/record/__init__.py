"""The sanitized session record and how one is made: what a model service sends
(`inputs`, with raw text still in it), the bounds on it (`bounds`), its rejections
as field paths (`violations`), the record built from it (`builder`) with its
compacted turns (`compaction`), the record itself (`state_record`:
`SessionStateRecord`), why one may not be written or trusted (`validation`,
`blockers`), and what a write or read did (`reports`)."""
