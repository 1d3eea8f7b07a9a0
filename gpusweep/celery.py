"""The Celery application. Tasks live in each app's tasks.py and take ids, never objects."""

from __future__ import annotations

import os

from celery import Celery

from gpusweep import broker

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gpusweep.settings")

broker.register()  # filesystem:// writes each message atomically (gpusweep.broker)
app = Celery("gpusweep")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
