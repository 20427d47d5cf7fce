"""The coordinator's parts: what ``ClusterCoordinator`` (``coordinator.py``) runs on.

One floor below the API; docs/development.md ("The package, floor by floor") says what
each module holds and who imports it.
"""
