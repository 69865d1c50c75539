"""Test support shared by every flashrt package: hypothesis strategies, seeded adversarial value
generators, assertion helpers and hypothesis profiles."""

from flashrt_kernels.testing.assertions import (
    assert_exact,
    assert_faithful,
    poison,
    poisoned_empty,
)
from flashrt_kernels.testing.chains import ScoreChain
from flashrt_kernels.testing.profiles import register_profiles
from flashrt_kernels.testing.strategies import (
    BOUNDARY_SIZES,
    dtypes,
    seeds,
    sizes,
    test_device,
    value_kinds,
)
from flashrt_kernels.testing.values import VALUE_KINDS, make_values

__all__ = [
    "BOUNDARY_SIZES",
    "VALUE_KINDS",
    "ScoreChain",
    "assert_exact",
    "assert_faithful",
    "dtypes",
    "make_values",
    "poison",
    "poisoned_empty",
    "register_profiles",
    "seeds",
    "sizes",
    "test_device",
    "value_kinds",
]
