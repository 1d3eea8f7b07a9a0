import pytest
from django.core.cache import cache


@pytest.fixture(autouse=True)
def fresh_figures(settings):  # type: ignore[no-untyped-def]
    """Pages compute their fleet-wide figures afresh in these tests (no cache between requests)."""
    settings.GPUSWEEP_CONSOLE_FIGURES_S = 0
    cache.clear()
    yield
    cache.clear()
