"""What this package relies on inside Keras and TensorFlow, pinned by release.

docs/development.md ("The package, floor by floor") says what each module holds.
"""
