"""factory_boy factories for the models tests build on."""

from __future__ import annotations

import factory
from django.contrib.auth import get_user_model

from feedback.models import Message, Trace
from training.serving.models import Deployment


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = get_user_model()
        django_get_or_create = ("username",)

    username = factory.Sequence(lambda n: f"user{n}")
    password = factory.django.Password("pw-for-tests-1")


class DeploymentFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Deployment
        django_get_or_create = ("name",)

    name = factory.Sequence(lambda n: f"agent-{n}")


class TraceFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Trace

    deployment = factory.SubFactory(DeploymentFactory)
    external_id = factory.Sequence(lambda n: f"trace-{n}")
    environment = "support-desk"


class MessageFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Message

    trace = factory.SubFactory(TraceFactory)
    position = factory.Sequence(lambda n: n)
    role = "user"
    content = "hello"
    raw = factory.LazyAttribute(lambda m: {"role": m.role, "content": m.content})


def user_with_role(role: str, username: str | None = None, **kwargs):
    """A user in one of the role groups (operator, reviewer, approver, admin)."""
    from django.contrib.auth.models import Group

    user = UserFactory(username=username or f"{role}-{UserFactory._meta.model.objects.count() + 1}", **kwargs)
    user.groups.add(Group.objects.get(name=role))
    return user
