"""Tests of `store.chain`: the evidence chain, its checkpoints, signed heads, losses and
retention anchors."""
