from __future__ import annotations

from django import forms

from advisories import services
from advisories.models import DeadlinePolicy


class DeadlinePolicyForm(forms.ModelForm):
    class Meta:
        model = DeadlinePolicy
        fields = list(services.POLICY_FIELDS)
