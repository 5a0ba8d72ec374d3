"""Fixtures the browser tests share with the tests of the parts they drive."""

from tests.policy_notes.conftest import commented  # noqa: F401 - the policy note page's comments
from tests.training.policies import world  # noqa: F401 - the learning policy pages' deployment
