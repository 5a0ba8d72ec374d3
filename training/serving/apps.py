from django.apps import AppConfig

from webapp.kernel.roles import APPROVER, OPERATOR, AppRoles


class ServingConfig(AppConfig):
    name = "training.serving"
    label = "serving"
    verbose_name = "Deployments and model versions"
    # The versions an evaluation compares and a promotion request names, on the pages of both.
    roles = AppRoles(grants={OPERATOR: ["serving.view_modelversion"], APPROVER: ["serving.view_modelversion"]})
