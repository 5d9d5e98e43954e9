"""Speculative decoding inside the packed step (docs/speculative.md).

A drafter (one file per kind, registered in ``drafters.DRAFTERS`` under its name in
``methods.py``) proposes a request's next tokens; the engine verifies them as one more varlen
chunk of the step's forward and keeps the run the target's own sampling agrees with (verify.py),
so outputs are the target's at any temperature. policy.py decides who speculates and how far.
This package's ``__init__`` imports nothing, so that the methods reach ``--help`` without MLX.
"""
