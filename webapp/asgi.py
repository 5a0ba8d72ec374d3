import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
django_application = get_asgi_application()

# Imported after Django is set up: the gateway uses the ORM (in threads) for keys and logging.
from django.conf import settings  # noqa: E402

from feedback.gateway.app import mount  # noqa: E402
from webapp.concurrency import bounded  # noqa: E402

# `/v1/` (the OpenAI-compatible completion gateway) bypasses the Django request cycle; Django
# requests run at most WEB_MAX_CONCURRENT_REQUESTS at once, so the database connections a
# process opens stay bounded however many clients arrive.
application = mount(bounded(django_application, limit=settings.WEB_MAX_CONCURRENT_REQUESTS))
