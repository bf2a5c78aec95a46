"""`service.runtime.serving_heap.settle`: what serves is frozen out of the collector, young
collections come less often, and garbage in cycles is still collected."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from service.runtime.serving_heap import YOUNG_THRESHOLD


def test_settle_freezes_the_built_heap_and_still_collects_cycles() -> None:
    # In a process of its own: freezing the test runner's heap would outlive this test.
    script = textwrap.dedent(
        """
        import gc, weakref
        from service.runtime import serving_heap
        before = gc.get_threshold()
        serving_heap.settle()
        print(gc.get_freeze_count() > 1000, gc.get_threshold()[0], gc.get_threshold()[1:] == before[1:])

        class Node:
            pass

        node = Node()
        node.self = node
        alive = weakref.ref(node)
        del node
        gc.collect()
        print(alive() is None)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    ).stdout.split()
    assert out == ["True", str(YOUNG_THRESHOLD), "True", "True"]
