"""Every models module of the training app is registered through the app's config
(training/apps.py), not by a module importing another for its side effect."""

from __future__ import annotations

from pathlib import Path

from django.apps import apps

from training.apps import MODEL_MODULES

TRAINING = Path(__file__).resolve().parents[2] / "training"
# Sub-packages that are apps of their own, with their own label and models module.
OWN_APPS = {"serving", "finetuning"}


def test_every_models_module_under_training_is_named_by_the_app_config():
    found = {
        ".".join(("training", *path.relative_to(TRAINING).with_suffix("").parts))
        for pattern in ("*/models.py", "*/*_models.py")
        for path in TRAINING.glob(pattern)
        if path.parent.name not in OWN_APPS | {"migrations"}
    }
    assert found == set(MODEL_MODULES)


def test_the_training_app_holds_the_models_of_those_modules():
    modules = {model.__module__ for model in apps.get_app_config("training").get_models()}
    assert modules == {"training.models", *MODEL_MODULES}
    assert "import training." not in (TRAINING / "models.py").read_text()
