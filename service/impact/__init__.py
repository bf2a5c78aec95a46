"""Impact analysis: what a candidate policy set would have decided on the logged decisions.

`sessionstate policy impact` reads logged decisions (`logged`), checks and serves the
candidate on a locked-down OPA of its own (`candidate`), compares each answer with the
logged one (`compare`) and prints the report (`report`).
"""
