"""The web process must not import torch, transformers or vLLM: they cost seconds and
gigabytes per web worker and only workers and commands need them."""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import os, sys
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
import django
django.setup()
import webapp.asgi, webapp.wsgi
from django.urls import get_resolver
get_resolver().url_patterns
from django.contrib import admin
admin.autodiscover()
import importlib
for app in ("webapp", "feedback", "training"):
    for name in ("views", "apis", "admin", "selectors", "tasks", "urls"):
        try:
            importlib.import_module(f"{app}.{name}")
        except ModuleNotFoundError:
            pass
heavy = sorted(m for m in ("torch", "transformers", "vllm", "peft", "sentence_transformers") if m in sys.modules)
print(",".join(heavy))
"""


def test_loading_every_page_api_admin_and_task_module_imports_no_ml_library():
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip().splitlines()[-1:] in ([], [""]), f"imported by the web path: {out.stdout}"
