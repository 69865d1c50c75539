"""Hypothesis profiles: ``ci`` (derandomized, few examples, no deadline), ``dev``, ``fuzz``."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

_SUPPRESS = (HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much)


def register_profiles() -> None:
    settings.register_profile(
        "ci",
        max_examples=10,
        derandomize=True,
        deadline=None,
        suppress_health_check=_SUPPRESS,
        print_blob=True,
    )
    settings.register_profile(
        "dev", max_examples=40, deadline=None, suppress_health_check=_SUPPRESS, print_blob=True
    )
    settings.register_profile(
        "fuzz", max_examples=2000, deadline=None, suppress_health_check=_SUPPRESS, print_blob=True
    )


def default_profile() -> str:
    """``ci`` when the ``CI`` variable is set (as CI sets it), else ``dev``."""
    return "ci" if os.environ.get("CI") else "dev"
