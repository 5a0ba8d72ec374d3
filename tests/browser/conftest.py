"""Fixtures the browser tests share with the tests of the parts they drive."""

from tests.training.policies import world  # noqa: F401 - the learning policy pages' deployment
