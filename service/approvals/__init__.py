"""Operator approvals for durable writes: the approval and where it is stored (`model`), the
lookup a write makes (`lookup`), the one write path, through the decision journal
(`writes`), and the keeping of their index (`index`)."""
