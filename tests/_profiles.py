"""Hypothesis settings profiles, loaded by ``tests/conftest.py`` before any test module is imported.

``ci`` (chosen when the ``CI`` environment variable is set, as ``.ci/run`` and hosted CI do) is
derandomized: every run of the suite draws the same examples, so a red CI run is reproducible and a
green one is not luck. Neither profile has a per-example deadline: a wall-clock limit is what a loaded
2-core machine breaks; pytest-timeout bounds a hang instead. No test sets its own seed,
``derandomize`` or ``database``: they inherit these (tests/test_fuzz.py checks it).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from hypothesis import settings

CI_PROFILE = "ci"
DEV_PROFILE = "dev"

settings.register_profile(CI_PROFILE, derandomize=True, database=None, deadline=None, print_blob=True)
settings.register_profile(DEV_PROFILE, database=None, deadline=None)


def profile_for(env: Mapping[str, str]) -> str:
    """``ci`` when ``CI`` is set to anything but an empty string, ``0`` or ``false``; else ``dev``."""
    value = env.get("CI", "").strip().lower()
    return CI_PROFILE if value not in ("", "0", "false", "no") else DEV_PROFILE


def load(env: Mapping[str, str] = os.environ) -> str:
    name = profile_for(env)
    settings.load_profile(name)
    return name
