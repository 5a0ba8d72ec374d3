"""Account and role changes in the audit log, and the four-eyes rule they feed.

Every change a signed-in person makes to an account or a role, through any page (the Django
admin's user, password and group forms today), is an `AuditEvent` row: account created,
changed (`username`, `is_active`, `is_staff`, `is_superuser`), roles changed (groups or
permissions given or taken), password set, deleted; and a role's own permissions or name
changed. The model signals catch them whatever code writes; the person is the request's
(`webapp.kernel.actor`). Changes with no signed-in person (a migration, `createsuperuser`, the
shell) are not recorded: whoever runs them can write the database directly.

`account_ties` answers the four-eyes question the log makes possible: did the approver
create or change the requester's account or roles, or the requester the approver's? One
person then holds both accounts (a password they set, a role they gave), so the approval
is refused (`training.promotion.services.promotion`).

The log is the promotion audit log (`AuditEvent`, append-only, what the audit page and API
show), not Django's admin history (`LogEntry`), which any code may edit or delete and which
records only what the admin's own views do.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.db.models import Q
from django.db.models.signals import m2m_changed, post_delete, post_save, pre_save

from training.promotion.models import AuditAction, AuditEvent
from training.services.audit import audit_record
from webapp.kernel.actor import current_actor

ACCOUNT_ACTIONS = (
    AuditAction.ACCOUNT_CREATED,
    AuditAction.ACCOUNT_CHANGED,
    AuditAction.ROLES_CHANGED,
    AuditAction.PASSWORD_SET,
    AuditAction.ACCOUNT_DELETED,
)
TRACKED_FIELDS = ("username", "is_active", "is_staff", "is_superuser")


def account_event_record(*, action: str, actor, user, detail: str, data: dict[str, Any] | None = None) -> AuditEvent:
    """One row about `user`'s account, made by `actor`."""
    return audit_record(
        action=action,
        deployment=None,
        actor=actor,
        detail=detail,
        data={"user_id": user.pk, "username": user.get_username(), **(data or {})},
    )


def account_ties(*, requester, approver) -> list[AuditEvent]:
    """The account events where one of the two acted on the other's account or roles,
    oldest first."""
    return list(
        AuditEvent.objects.filter(action__in=ACCOUNT_ACTIONS)
        .filter(Q(actor=approver, data__user_id=requester.pk) | Q(actor=requester, data__user_id=approver.pk))
        .order_by("id")
    )


# Signals ---------------------------------------------------------------------------------


def _user_before_save(sender, instance, raw: bool = False, update_fields=None, **kwargs) -> None:
    instance._account_before = None
    if raw or instance.pk is None or current_actor() is None:
        return
    if update_fields is not None and not set(update_fields) & {*TRACKED_FIELDS, "password"}:
        return  # e.g. last_login on each sign-in
    instance._account_before = sender.objects.filter(pk=instance.pk).values(*TRACKED_FIELDS, "password").first()


def _user_saved(sender, instance, created: bool, raw: bool = False, **kwargs) -> None:
    actor = current_actor()
    if raw or actor is None:
        return
    if created:
        flags = {f: getattr(instance, f) for f in TRACKED_FIELDS if f != "username"}
        account_event_record(
            action=AuditAction.ACCOUNT_CREATED,
            actor=actor,
            user=instance,
            detail=f"account {instance.get_username()} created",
            data={**flags, "usable_password": instance.has_usable_password()},
        )
        return
    before = getattr(instance, "_account_before", None)
    if not before:
        return
    changes = {f: [before[f], getattr(instance, f)] for f in TRACKED_FIELDS if before[f] != getattr(instance, f)}
    if changes:
        account_event_record(
            action=AuditAction.ACCOUNT_CHANGED,
            actor=actor,
            user=instance,
            detail=", ".join(f"{f}: {old} → {new}" for f, (old, new) in changes.items()),
            data={"changes": changes},
        )
    if before["password"] != instance.password:
        own = actor.pk == instance.pk
        account_event_record(
            action=AuditAction.PASSWORD_SET,
            actor=actor,
            user=instance,
            detail="own password changed" if own else f"password set by {actor.get_username()}",
            data={"by_owner": own, "usable": instance.has_usable_password()},
        )


def _user_deleted(sender, instance, **kwargs) -> None:
    actor = current_actor()
    if actor is not None:
        account_event_record(
            action=AuditAction.ACCOUNT_DELETED,
            actor=actor,
            user=instance,
            detail=f"account {instance.get_username()} deleted",
        )


def _names(model, pks) -> list[str]:
    if model is Permission:
        rows = Permission.objects.filter(pk__in=pks).values_list("content_type__app_label", "codename")
        return sorted(f"{app}.{codename}" for app, codename in rows)
    return sorted(str(name) for name in model.objects.filter(pk__in=pks).values_list("name", flat=True))


def _m2m_changed(what: str):
    """A receiver for one many-to-many relation of users (`groups` or `user_permissions`)."""

    def receiver(sender, instance, action: str, reverse: bool, model, pk_set, **kwargs) -> None:
        actor = current_actor()
        if actor is None:
            return
        if action == "pre_clear":
            # What a clear() takes away is known only before it runs. Forward, `instance` is
            # a user and `model` groups or permissions (linked back as `user`); reverse, the
            # other way round.
            link = {what: instance} if reverse else {"user": instance}
            cleared = set(model.objects.filter(**link).values_list("pk", flat=True))
            instance.__dict__.setdefault("_account_cleared", {})[what] = cleared
            return
        if action == "post_clear":
            pk_set = instance.__dict__.get("_account_cleared", {}).pop(what, set())
        elif action not in ("post_add", "post_remove"):
            return
        if not pk_set:
            return
        removed = action != "post_add"
        if not reverse:
            _roles_changed(actor, instance, what, _names(model, pk_set), removed)
            return
        names = _names(type(instance), [instance.pk])
        for user in get_user_model().objects.filter(pk__in=pk_set):
            _roles_changed(actor, user, what, names, removed)

    return receiver


def _roles_changed(actor, user, what: str, names: list[str], removed: bool) -> None:
    verb = "removed" if removed else "given"
    account_event_record(
        action=AuditAction.ROLES_CHANGED,
        actor=actor,
        user=user,
        detail=f"{'roles' if what == 'groups' else 'permissions'} {verb}: {', '.join(names)}",
        data={"what": what, "added": [] if removed else names, "removed": names if removed else []},
    )


def _role_record(actor, group: Group, detail: str, **data: Any) -> None:
    audit_record(
        action=AuditAction.ROLE_CHANGED, deployment=None, actor=actor, detail=detail, data={"group": group.name, **data}
    )


def _role_before_save(sender, instance, raw: bool = False, **kwargs) -> None:
    instance._role_before = None
    if not raw and instance.pk is not None and current_actor() is not None:
        instance._role_before = sender.objects.filter(pk=instance.pk).values_list("name", flat=True).first()


def _role_saved(sender, instance, created: bool, raw: bool = False, **kwargs) -> None:
    actor = current_actor()
    if raw or actor is None:
        return
    before = getattr(instance, "_role_before", None)
    if created:
        _role_record(actor, instance, f"role {instance.name} created")
    elif before is not None and before != instance.name:
        _role_record(actor, instance, f"role {before} renamed to {instance.name}", renamed_from=before)


def _role_deleted(sender, instance, **kwargs) -> None:
    actor = current_actor()
    if actor is not None:
        _role_record(actor, instance, f"role {instance.name} deleted")


def _role_permissions_changed(sender, instance, action: str, reverse: bool, model, pk_set, **kwargs) -> None:
    actor = current_actor()
    if actor is None or action not in ("post_add", "post_remove") or not pk_set:
        return
    groups = list(Group.objects.filter(pk__in=pk_set)) if reverse else [instance]
    permissions = _names(Permission, [instance.pk] if reverse else pk_set)
    key, verb = ("added", "added to") if action == "post_add" else ("removed", "removed from")
    for group in groups:
        _role_record(
            actor, group, f"permissions {verb} role {group.name}: {', '.join(permissions)}", **{key: permissions}
        )


def account_signals_connect() -> None:
    """Connect the receivers (the training app's `ready`)."""
    User = get_user_model()
    pre_save.connect(_user_before_save, sender=User, dispatch_uid="account_audit_pre_save")
    post_save.connect(_user_saved, sender=User, dispatch_uid="account_audit_post_save")
    post_delete.connect(_user_deleted, sender=User, dispatch_uid="account_audit_post_delete")
    m2m_changed.connect(
        _m2m_changed("groups"), sender=User.groups.through, dispatch_uid="account_audit_groups", weak=False
    )
    m2m_changed.connect(
        _m2m_changed("user_permissions"),
        sender=User.user_permissions.through,
        dispatch_uid="account_audit_permissions",
        weak=False,
    )
    pre_save.connect(_role_before_save, sender=Group, dispatch_uid="role_audit_pre_save")
    post_save.connect(_role_saved, sender=Group, dispatch_uid="role_audit_post_save")
    post_delete.connect(_role_deleted, sender=Group, dispatch_uid="role_audit_post_delete")
    m2m_changed.connect(_role_permissions_changed, sender=Group.permissions.through, dispatch_uid="role_audit_perms")
