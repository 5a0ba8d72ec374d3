"""Rows written once: the audit log (`training.promotion.models.AuditEvent`), a rollout's
change log (`training.promotion.rollout_models.RolloutChange`) and the trail of live moves
(`training.serving.models.LiveVersionChange`) refuse, through the ORM, to change or delete a
stored row. Here in the kernel because serving, below the audit log, keeps the trail."""

from __future__ import annotations

from django.db import models


class AuditImmutable(Exception):
    """An audit row was about to be changed or deleted."""


class AppendOnlyQuerySet(models.QuerySet):
    """Bulk updates and deletes refused, with `refused` as the reason."""

    refused = "append-only"

    def update(self, **kwargs):
        raise AuditImmutable(self.refused)

    def delete(self):
        raise AuditImmutable(self.refused)


class AppendOnly:
    """A model whose rows are written once: saving a stored row or deleting one is refused,
    with `edit_refused` / `delete_refused` as the reason (the database's trigger refuses it
    too, for what does not come through the model)."""

    edit_refused = "append-only: a row cannot be changed"
    delete_refused = "append-only: a row cannot be deleted"

    def save(self, *args, **kwargs) -> None:
        if self.pk is not None and not self._state.adding:
            raise AuditImmutable(self.edit_refused)
        super().save(*args, **kwargs)

    def delete(self, *args, **kwargs):
        raise AuditImmutable(self.delete_refused)
