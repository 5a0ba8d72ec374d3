import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
django.setup(set_prefix=False)

# Imported after Django is set up: the gateway uses the ORM (in threads) for keys and logging.
from django.conf import settings  # noqa: E402

from feedback.gateway.app import mount  # noqa: E402
from webapp.site.concurrency import bounded  # noqa: E402
from webapp.site.request_bodies import ReadAheadASGIHandler, body_gate  # noqa: E402

# Django's handler (as `get_asgi_application()` makes it), taking a body read ahead of it.
django_application = ReadAheadASGIHandler()

# `/v1/` (the OpenAI-compatible completion gateway) bypasses the Django request cycle; Django
# requests run at most WEB_MAX_CONCURRENT_REQUESTS at once, so the database connections a
# process opens stay bounded however many clients arrive, and a request takes its slot only
# once its body is in: checked for size and credentials first, read within a deadline.
application = mount(bounded(django_application, limit=settings.WEB_MAX_CONCURRENT_REQUESTS, admit=body_gate()))
