"""Hypothesis profiles for the format's property tests: "ci" (the default) is derandomized
and small, so CI runs are reproducible and quick; "dev" explores more
(``HYPOTHESIS_PROFILE=dev``)."""

import os
from datetime import timedelta

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    max_examples=60,
    derandomize=True,
    database=None,
    deadline=timedelta(seconds=5),
    suppress_health_check=[HealthCheck.too_slow],
    print_blob=True,
)
settings.register_profile("dev", max_examples=1000, deadline=timedelta(seconds=5), print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
