"""The pytest-xdist groups tests name themselves (tests/conftest.py puts the others in theirs).

Every test that uses a reference Kafka is in the group of tests/jvm, whose Streams, Connect and Java transaction
cases have reference runs too: one worker runs them all, so a run starts each reference Kafka once. A test that
reaches a reference through request.getfixturevalue carries the mark itself: `on_reference`.
"""

import pytest

REFERENCE_GROUP = "jvm"
on_reference = pytest.mark.xdist_group(REFERENCE_GROUP)
