"""The cluster as a worker sees it: ``membership`` and ``coordination``.

docs/development.md ("The package, floor by floor") says what each module holds.
"""
