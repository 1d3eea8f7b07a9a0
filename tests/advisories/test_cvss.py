from __future__ import annotations

import pytest

from advisories.cvss import base_score, severity


@pytest.mark.parametrize(("vector", "score"), [
    ("CVSS:3.1/AV:L/AC:L/PR:L/UI:N/S:U/C:H/I:H/A:H", 7.8),
    ("CVSS:3.1/AV:L/AC:L/PR:L/UI:R/S:C/C:H/I:H/A:H", 8.2),
    ("CVSS:3.1/AV:N/AC:L/PR:N/UI:N/S:C/C:H/I:H/A:H", 10.0),
    ("CVSS:3.1/AV:N/AC:L/PR:N/UI:N/S:U/C:H/I:H/A:H", 9.8),
    ("CVSS:3.1/AV:L/AC:L/PR:L/UI:N/S:U/C:N/I:N/A:H", 5.5),
    ("CVSS:3.0/AV:N/AC:H/PR:N/UI:R/S:U/C:L/I:N/A:N", 3.1),
    ("CVSS:3.1/AV:P/AC:H/PR:H/UI:R/S:U/C:N/I:N/A:N", 0.0),
])
def test_it_computes_base_scores_as_first_does(vector, score):
    assert base_score(vector) == score


def test_it_refuses_what_is_not_a_v3_vector_and_rates_scores():
    assert base_score("AV:N/AC:L/Au:N/C:P/I:P/A:P") is None
    assert base_score("CVSS:3.1/AV:X/AC:L/PR:L/UI:N/S:U/C:H/I:H/A:H") is None
    assert [severity(s) for s in (0.0, 3.9, 4.0, 7.0, 9.0)] == ["NONE", "LOW", "MEDIUM", "HIGH", "CRITICAL"]
