"""`GroupCommits`: a line whose commit cannot finish holds only its own requests."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import pytest

from service.decisions.group_commit import GroupCommits, GroupCommitsClosed


@dataclass
class Item:
    line: str
    wake: threading.Event = field(default_factory=threading.Event)
    done: bool = False
    abandoned: bool = False

    @property
    def settled(self) -> bool:
        return self.done or self.abandoned


class Commits:
    """Commits that settle each item; line "stuck" waits for `release` first."""

    def __init__(self) -> None:
        self.stuck = threading.Event()  # a commit of line "stuck" is under way
        self.release = threading.Event()
        self.batches: list[list[str]] = []

    def commit(self, batch: list[Item]) -> None:
        if batch[0].line == "stuck":
            self.stuck.set()
            self.release.wait()
        self.batches.append([item.line for item in batch])
        for item in batch:
            item.done = True
            item.wake.set()

    @staticmethod
    def abandon(batch: list[Item]) -> None:
        for item in batch:
            item.abandoned = True
            item.wake.set()


def test_a_line_whose_commit_waits_holds_no_other_line() -> None:
    commits = Commits()
    lines: GroupCommits[Item] = GroupCommits(
        commits.commit, commits.abandon, max_batch=8, concurrent=2
    )
    stuck = Item("stuck")
    waiting = threading.Thread(target=lines.submit, args=("stuck", stuck))
    waiting.start()
    assert commits.stuck.wait(60)
    for _ in range(20):
        other = Item("other")
        lines.submit("other", other)  # returns while line "stuck" is still committing
        assert other.done
    assert not stuck.settled
    commits.release.set()
    waiting.join(60)
    assert stuck.done
    assert lines.close(60)


def test_a_commit_that_settles_nothing_fails_its_items_and_a_closed_one_takes_none() -> None:
    lines: GroupCommits[Item] = GroupCommits(
        lambda batch: None, Commits.abandon, max_batch=8, concurrent=1
    )
    item = Item("a")
    lines.submit("a", item)
    assert item.abandoned and not item.done
    assert lines.close(60)
    with pytest.raises(GroupCommitsClosed):
        lines.submit("a", Item("a"))
