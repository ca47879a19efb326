"""Hypothesis profiles for the format's property tests: "ci" (the default) is derandomized
and small, so CI runs are reproducible and quick; "dev" explores more
(``HYPOTHESIS_PROFILE=dev``); "mutation" (set by scripts/mutation_run.py) is smaller still
and does not shrink: a mutant needs one failing example, not the simplest one."""

import os
from datetime import timedelta

from hypothesis import HealthCheck, Phase, settings

settings.register_profile(
    "ci",
    max_examples=60,
    derandomize=True,
    database=None,
    deadline=timedelta(seconds=5),
    suppress_health_check=[HealthCheck.too_slow],
    print_blob=True,
)
settings.register_profile(
    "mutation",
    max_examples=25,
    derandomize=True,
    database=None,
    deadline=None,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", max_examples=1000, deadline=timedelta(seconds=5), print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
