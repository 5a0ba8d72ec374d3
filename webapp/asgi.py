import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
django_application = get_asgi_application()

# Imported after Django is set up: the gateway uses the ORM (in threads) for keys and logging.
from feedback.gateway.app import mount  # noqa: E402

# `/v1/` (the OpenAI-compatible completion gateway) bypasses the Django request cycle.
application = mount(django_application)
